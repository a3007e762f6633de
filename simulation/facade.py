"""aiokafka-shaped clients over the in-memory log, for the parts not yet on the log port.

Temporary scaffolding of the simulation: the indexer and the reader still build aiokafka
clients through :mod:`bridge.kafka.clients`; :func:`patched` swaps those factories, in the
modules that call them and for the duration of one run only, for these thin wrappers over a
:class:`~bridge.kafka.memory.MemoryLog` (the port's in-memory log). As each part moves onto the
port and takes a ``log`` argument, its patch here goes away.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from bridge.kafka.clients import (
    OffsetOutOfRangeError,
    ProducerFenced,
    TopicPartition,
)
from bridge.kafka.memory import MemoryGroupTail, MemoryLog, MemoryTail, MemoryWriter
from bridge.kafka.port import OffsetOutOfRange, Record, Share, TopicPart, WriterFenced

__all__ = ["Consumer", "Producer", "Writer", "patched"]


def _tp(part: TopicPart) -> TopicPartition:
    return TopicPartition(part.topic, part.partition)


def _part(tp: TopicPartition) -> TopicPart:
    return TopicPart(tp.topic, tp.partition)


class _Listener:
    """A port group listener calling an aiokafka rebalance listener."""

    def __init__(self, listener: Any) -> None:
        self.listener = listener

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        await self.listener.on_partitions_revoked({_tp(p) for p in parts})

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        await self.listener.on_partitions_assigned({_tp(p) for p in parts})


class Sticky:
    """A sticky assignor over member ids: a member's static instance keeps its partitions."""

    name = "sim-sticky"

    def metadata(self) -> bytes:
        return b""

    def assign(self, parts: Sequence[TopicPart], members: Any) -> dict[str, Share]:
        ids = sorted(members, key=lambda m: (m.rsplit("-", 1)[0], m))
        shares: dict[str, list[TopicPart]] = {m: [] for m in ids}
        for i, part in enumerate(sorted(parts)):
            shares[ids[i % len(ids)]].append(part)
        return {m: Share(tuple(ps)) for m, ps in shares.items()}


class Consumer:
    """The aiokafka consumer calls the indexer and the reader make, over a memory tail."""

    def __init__(
        self,
        log: MemoryLog,
        group: str | None,
        instance_id: str | None,
        session_ms: int,
        owner: str,
    ) -> None:
        self.log = log
        self.group = group
        self.instance_id = instance_id
        self.session_ms = session_ms
        self.owner = owner  # the replica that made it (faults act on its clients)
        self.tail: MemoryTail | None = None
        self._started = False

    async def start(self) -> None:
        if self.group is None:
            self.tail = self.log.tail()

    async def stop(self) -> None:
        if self.tail is not None:
            await self.tail.close()

    def subscribe(self, topics: list[str], listener: Any) -> None:
        assert self.group is not None
        self.tail = self.log.group_tail(
            self.group,
            topics,
            _Listener(listener),
            assignor=Sticky(),
            instance_id=self.instance_id,
            session_timeout_ms=self.session_ms,
        )

    def _tail(self) -> MemoryTail:
        assert self.tail is not None, "not started"
        return self.tail

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        parts = [_part(tp) for tp in tps]
        self._tail().assign({p: self.log._partition(p).start for p in parts})

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._tail().seek(_part(tp), offset)

    def pause(self, *tps: TopicPartition) -> None:
        self._tail().pause(*map(_part, tps))

    def resume(self, *tps: TopicPartition) -> None:
        self._tail().resume(*map(_part, tps))

    def assignment(self) -> set[TopicPartition]:
        return {_tp(p) for p in self._tail().assignment()}

    async def position(self, tp: TopicPartition) -> int:
        return self._tail()._positions[_part(tp)]

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return self.log._partition(_part(tp)).stable

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        starts = await self.log.log_starts(map(_part, tps))
        return {_tp(p): o for p, o in starts.items()}

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        ends = await self.log.log_ends(map(_part, tps))
        return {_tp(p): o for p, o in ends.items()}

    async def getmany(
        self, *tps: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        tail = self._tail()
        if not self._started and isinstance(tail, MemoryGroupTail):
            self._started = True
            await tail.start()
        try:
            polled = await tail.poll(timeout_ms / 1000, max_records)
        except OffsetOutOfRange as exc:
            raise OffsetOutOfRangeError({_tp(p): -1 for p in exc.parts}) from None
        return {_tp(p): rs for p, rs in polled.records.items()}


class Producer:
    """An idempotent producer's ``send_and_wait``."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> Any:
        sent = await self.log.producer().send(
            topic,
            value,
            key=key,
            partition=partition,
            headers=headers or (),
            timestamp_ms=timestamp_ms,
        )
        return _Metadata(topic, sent.partition, sent.offset)


class _Metadata:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset


#: (transactional id, epoch) -> the replica whose writer committed under it.
Commits = dict[tuple[str, int], set[str]]


class Writer:
    """A transactional producer: fencing surfaces as aiokafka's ``ProducerFenced``."""

    def __init__(self, log: MemoryLog, txid: str, owner: str, commits: Commits) -> None:
        self.writer = MemoryWriter(log, txid)
        self.owner = owner
        self.commits = commits

    async def start(self) -> None:
        await self.writer.start()

    async def stop(self) -> None:
        pass

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        try:
            async with self.writer.transaction():
                yield
            epoch = self.writer._epoch
            assert epoch is not None
            self.commits.setdefault((self.writer.transactional_id, epoch), set()).add(self.owner)
        except WriterFenced:
            raise ProducerFenced() from None

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> None:
        try:
            await self.writer.send(topic, value, key=key, partition=partition)
        except WriterFenced:
            raise ProducerFenced() from None


class _LogHandle:
    """The indexer's own ``KafkaLog`` (its restores): the memory log, with a ``close``."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    async def close(self) -> None:
        pass


@contextlib.contextmanager
def patched(
    log: MemoryLog, owner: Callable[[], str], commits: Commits, session_ms: int
) -> Iterator[None]:
    """Swap the client factories of the indexer, the reader and the publisher for these.

    ``owner()`` names the replica being built (its clients are told apart by it).
    """
    import bridge.log.indexer as indexer
    import bridge.log.publisher as publisher
    import bridge.log.reader as reader

    def consumer(settings: Any, role: str = "", **kw: Any) -> Consumer:
        return Consumer(
            log,
            kw.get("group_id"),
            kw.get("group_instance_id"),
            kw.get("session_timeout_ms", session_ms),
            owner(),
        )

    async def partitions(settings: Any, topic: str) -> list[int]:
        return await log.partitions(topic)

    swaps: list[tuple[Any, str, Any]] = [
        (indexer, "committed_consumer", consumer),
        (
            indexer,
            "transactional_producer",
            lambda settings, txid: Writer(log, txid, owner(), commits),
        ),
        (indexer, "KafkaLog", lambda settings, pool_size=1: _LogHandle(log)),
        (indexer, "topic_partitions", partitions),
        (reader, "committed_consumer", consumer),
        (publisher, "idempotent_producer", lambda settings, role="": Producer(log)),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    try:
        for module, name, value in swaps:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)

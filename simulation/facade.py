"""aiokafka-shaped clients over the in-memory log, for the parts not yet on the log port.

Temporary scaffolding of the simulation: the reader and the producer SDK still build aiokafka
clients through :mod:`bridge.kafka.clients`; :func:`patched` swaps those factories, in the
modules that call them and for the duration of one run only, for thin wrappers over a
:class:`~bridge.kafka.memory.MemoryLog` (the port's in-memory log). As each part moves onto the
port and takes a ``log`` argument, its patch here goes away (the indexer's already has: it is
given a :class:`ReplicaLog`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from bridge.kafka.clients import (
    OffsetOutOfRangeError,
    TopicPartition,
)
from bridge.kafka.memory import MemoryLog, MemoryTail, MemoryWriter
from bridge.kafka.port import OffsetOutOfRange, Record, TopicPart

__all__ = ["Consumer", "Producer", "ReplicaLog", "patched"]


def _tp(part: TopicPart) -> TopicPartition:
    return TopicPartition(part.topic, part.partition)


def _part(tp: TopicPartition) -> TopicPart:
    return TopicPart(tp.topic, tp.partition)


class Consumer:
    """The aiokafka consumer calls the reader makes, over a memory tail."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.tail: MemoryTail | None = None

    async def start(self) -> None:
        self.tail = self.log.tail()

    async def stop(self) -> None:
        if self.tail is not None:
            await self.tail.close()

    def _tail(self) -> MemoryTail:
        assert self.tail is not None, "not started"
        return self.tail

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        parts = [_part(tp) for tp in tps]
        self._tail().assign({p: self.log._partition(p).start for p in parts})

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._tail().reposition(_part(tp), offset)

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


#: (transactional id, epoch) -> the replicas whose writer committed under it.
Commits = dict[tuple[str, int], set[str]]


class _Writer(MemoryWriter):
    """A fenced writer that notes who committed under which epoch."""

    def __init__(self, log: MemoryLog, txid: str, owner: str, commits: Commits) -> None:
        super().__init__(log, txid)
        self.owner = owner
        self.commits = commits

    def _end(self, commit: bool) -> None:
        super()._end(commit)
        if commit and self._epoch is not None:
            self.commits.setdefault((self.transactional_id, self._epoch), set()).add(self.owner)


class ReplicaLog:
    """One replica's handle on the shared memory log: its writers are told apart."""

    def __init__(self, log: MemoryLog, owner: str, commits: Commits) -> None:
        self._log = log
        self.owner = owner
        self.commits = commits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def transactional_writer(self, transactional_id: str) -> MemoryWriter:
        return _Writer(self._log, transactional_id, self.owner, self.commits)


@contextlib.contextmanager
def patched(log: MemoryLog) -> Iterator[None]:
    """Swap the client factories of the reader and the producer SDK for these."""
    import bridge.log.publisher as publisher
    import bridge.log.reader as reader

    swaps: list[tuple[Any, str, Any]] = [
        (reader, "committed_consumer", lambda settings, role="", **kw: Consumer(log)),
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

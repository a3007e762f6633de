"""The log port over aiokafka: every port call becomes the client calls that do it in Kafka.

Where it sits: below the domain, beside :mod:`bridge.kafka.memory` (the same port without a
broker). It builds its clients with :mod:`bridge.kafka.clients` (so security, sizes and
read_committed stay configured in one place) and translates aiokafka's objects and errors at
this edge: a ``ConsumerRecord`` becomes a :class:`~bridge.kafka.port.Record`,
``OffsetOutOfRangeError`` an :class:`~bridge.kafka.port.OffsetOutOfRange`, ``ProducerFenced``
a :class:`~bridge.kafka.port.WriterFenced`, any other ``KafkaError`` a
:class:`~bridge.kafka.port.LogError`. A port :class:`~bridge.kafka.port.Assignor` runs inside
aiokafka's group protocol through :class:`PortAssignor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import IllegalStateError, InvalidProducerEpoch

from bridge.config import Settings
from bridge.kafka.admin import delete_records_before, kafka_admin
from bridge.kafka.clients import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    KafkaError,
    OffsetOutOfRangeError,
    ProducerFenced,
    TopicPartition,
    committed_consumer,
    fence_timeout_s,
    idempotent_producer,
    retriable,
    transactional_producer,
)
from bridge.kafka.membership import remove_static_members
from bridge.kafka.pool import ConsumerPool
from bridge.kafka.port import (
    Assignor,
    Closable,
    Fetched,
    GroupListener,
    Header,
    LogError,
    OffsetOutOfRange,
    Polled,
    Reset,
    Sent,
    Share,
    TopicPart,
    UnknownTopic,
    WriterFenced,
)
from bridge.kafka.topics import TopicLayoutError, topic_partition_ids

__all__ = ["CLIENT_ERRORS", "KafkaLog", "PortAssignor", "as_log_error"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _tp(part: TopicPart) -> TopicPartition:
    return TopicPartition(part.topic, part.partition)


def _part(tp: TopicPartition) -> TopicPart:
    return TopicPart(tp.topic, tp.partition)


def _out_of_range(exc: OffsetOutOfRangeError, fallback: Iterable[TopicPart]) -> OffsetOutOfRange:
    named = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    parts = [_part(tp) for tp in named] or list(fallback)
    return OffsetOutOfRange(parts)


#: The Kafka client's own errors, for the edges that call the Kafka layer's admin helpers
#: directly (the command line, the wire's error table): :func:`as_log_error` translates them.
CLIENT_ERRORS: tuple[type[Exception], ...] = (KafkaError,)


def as_log_error(exc: Exception) -> LogError:
    """One of :data:`CLIENT_ERRORS` as the port's error (its kind and whether to retry)."""
    if not isinstance(exc, KafkaError):
        raise TypeError(f"not a Kafka client error: {exc!r}")
    return _log_error(exc)


def _log_error(exc: KafkaError) -> LogError:
    return LogError(
        f"{type(exc).__name__}: {exc}", retriable=retriable(exc), kind=type(exc).__name__
    )


async def _mapped(call: Awaitable[T]) -> T:
    """``call``, aiokafka's errors translated to the port's."""
    try:
        return await call
    except (ProducerFenced, InvalidProducerEpoch) as exc:
        raise WriterFenced(str(exc) or type(exc).__name__) from exc
    except OffsetOutOfRangeError as exc:
        raise _out_of_range(exc, ()) from exc
    except KafkaError as exc:
        raise _log_error(exc) from exc


class KafkaLog:
    """The log port on the cluster of ``settings`` (close it to release its readers).

    Fetches share one :class:`~bridge.kafka.pool.ConsumerPool` of ``pool_size`` consumers
    (named ``role``); offset lookups have consumers of their own, so they never queue behind
    fetches. ``consumer_options`` tune the pool's consumers (e.g. tiny fetch sizes for probes).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        pool_size: int = 4,
        role: str = "log",
        **consumer_options: Any,
    ) -> None:
        self.settings = settings
        self._fetches = ConsumerPool(settings, size=pool_size, role=role, **consumer_options)
        self._offsets = ConsumerPool(settings, size=2, role=f"{role}-offsets")

    async def close(self) -> None:
        """Stop the pooled readers (the tails and writers handed out close themselves)."""
        await self._fetches.close()
        await self._offsets.close()

    # --- reads --------------------------------------------------------------------------

    async def partitions(self, topic: str) -> list[int]:
        try:
            return await topic_partition_ids(self.settings, topic)
        except TopicLayoutError as exc:
            raise UnknownTopic(str(exc)) from None
        except KafkaError as exc:
            raise _log_error(exc) from exc

    async def fetch(self, part: TopicPart, offset: int, max_records: int = 500) -> Fetched:
        try:
            records, position = await _mapped(self._fetches.fetch(_tp(part), offset, max_records))
        except OffsetOutOfRange:
            raise OffsetOutOfRange([part]) from None
        return Fetched(records, position)

    async def log_starts(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        tps = [_tp(p) for p in parts]
        if not tps:
            return {}
        async with self._offsets.consumer() as consumer:
            begins = await _mapped(consumer.beginning_offsets(tps))
        return {_part(tp): int(o) for tp, o in begins.items()}

    async def log_ends(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        tps = [_tp(p) for p in parts]
        if not tps:
            return {}
        async with self._offsets.consumer() as consumer:
            ends = await _mapped(consumer.end_offsets(tps))
        return {_part(tp): int(o) for tp, o in ends.items()}

    async def offsets_for_times(
        self, times: Mapping[TopicPart, int]
    ) -> dict[TopicPart, int | None]:
        if not times:
            return {}
        async with self._offsets.consumer() as consumer:
            found = await _mapped(consumer.offsets_for_times({_tp(p): t for p, t in times.items()}))
        return {_part(tp): None if at is None else int(at.offset) for tp, at in found.items()}

    async def delete_records_before(self, part: TopicPart, offset: int) -> None:
        await _mapped(delete_records_before(self.settings, _tp(part), offset))

    async def remove_members(self, group: str, instance_ids: Sequence[str]) -> None:
        async def remove() -> None:
            async with kafka_admin(self.settings) as admin:
                await remove_static_members(admin, group, instance_ids)

        await _mapped(remove())

    # --- clients ------------------------------------------------------------------------

    def tail(self, role: str = "tail") -> KafkaTail:
        return KafkaTail(committed_consumer(self.settings, role=role))

    def group_tail(
        self,
        group: str,
        topics: Sequence[str],
        listener: GroupListener,
        *,
        assignor: Assignor | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int | None = None,
        max_poll_interval_ms: int | None = None,
        reset: Reset = "earliest",
        role: str = "group",
    ) -> KafkaGroupTail:
        wrapped = PortAssignor(assignor) if assignor is not None else None
        options: dict[str, Any] = {
            "group_id": group,
            "group_instance_id": instance_id,
            "session_timeout_ms": session_timeout_ms,
            # Survivors learn of a dead member's eviction at their next heartbeat: keep it short.
            "heartbeat_interval_ms": heartbeat_interval_ms or max(300, session_timeout_ms // 10),
            "auto_offset_reset": reset,
        }
        if max_poll_interval_ms is not None:
            options["max_poll_interval_ms"] = max_poll_interval_ms
        if wrapped is not None:
            options["partition_assignment_strategy"] = (wrapped,)
        consumer = committed_consumer(self.settings, role=role, **options)
        return KafkaGroupTail(consumer, list(topics), listener, wrapped)

    def producer(self, role: str = "producer") -> KafkaProducer:
        return KafkaProducer(idempotent_producer(self.settings, role=role))

    def transactional_writer(self, transactional_id: str) -> KafkaWriter:
        return KafkaWriter(
            transactional_producer(self.settings, transactional_id),
            transactional_id=transactional_id,
            fence_s=fence_timeout_s(self.settings),
        )


class KafkaTail(Closable):
    """A live reader over one aiokafka consumer."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self._closed = False

    async def start(self) -> None:
        await _mapped(self._consumer.start())

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await self._consumer.stop()
            except Exception:  # an error its fetcher kept: the consumer is closed all the same
                log.warning("closing a Kafka consumer reported an error", exc_info=True)

    def assign(self, positions: Mapping[TopicPart, int]) -> None:
        self._consumer.assign([_tp(p) for p in positions])
        for part, offset in positions.items():
            self._consumer.seek(_tp(part), offset)

    def reposition(self, part: TopicPart, offset: int) -> None:
        try:
            self._consumer.seek(_tp(part), offset)
        except IllegalStateError as exc:
            raise LogError(f"{part} is not assigned") from exc

    def assignment(self) -> frozenset[TopicPart]:
        return frozenset(_part(tp) for tp in self._consumer.assignment())

    def pause(self, *parts: TopicPart) -> None:
        self._consumer.pause(*(_tp(p) for p in parts))

    def resume(self, *parts: TopicPart) -> None:
        self._consumer.resume(*(_tp(p) for p in parts))

    async def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        if self._closed:
            raise LogError("the tail is closed")
        consumer = self._consumer
        try:
            batches = await consumer.getmany(
                timeout_ms=int(timeout_s * 1000), max_records=max_records
            )
        except OffsetOutOfRangeError as exc:
            raise _out_of_range(exc, self.assignment()) from exc
        except KafkaError as exc:
            raise _log_error(exc) from exc
        # aiokafka's records are handed on as they are (a LogRecord each): no copy per record.
        records = {_part(tp): rs for tp, rs in batches.items() if rs}
        return Polled(records, await self._positions())

    async def _positions(self) -> dict[TopicPart, int]:
        paused = self._consumer.paused()
        positions: dict[TopicPart, int] = {}
        for tp in self._consumer.assignment() - paused:
            # A partition revoked meanwhile, or without a position yet, has none to report.
            with contextlib.suppress(IllegalStateError, KafkaError, TimeoutError):
                async with asyncio.timeout(1):
                    positions[_part(tp)] = int(await self._consumer.position(tp))
        return positions


class KafkaGroupTail(KafkaTail):
    """A group member over one aiokafka consumer subscribed to its topics."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topics: list[str],
        listener: GroupListener,
        assignor: PortAssignor | None,
    ) -> None:
        super().__init__(consumer)
        self._topics = topics
        self._listener = _Listener(listener, assignor)

    async def start(self) -> None:
        await super().start()
        self._consumer.subscribe(self._topics, listener=self._listener)

    def assign(self, positions: Mapping[TopicPart, int]) -> None:
        raise LogError("a group member's partitions are assigned by its group")

    def rejoin(self) -> None:
        # aiokafka 0.14 has no public way to rejoin: a new subscription to the same topics
        # does rejoin, but its fetcher then dies asserting an active assignment. So its
        # coordinator is asked directly; the join evaluates the assignor's metadata anew.
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None:
            raise LogError("the group member was not started")
        coordinator.request_rejoin()

    async def commit(self, offsets: Mapping[TopicPart, int]) -> None:
        await _mapped(self._consumer.commit({_tp(p): o for p, o in offsets.items()}))

    async def committed(self, part: TopicPart) -> int | None:
        found = await _mapped(self._consumer.committed(_tp(part)))
        return None if found is None else int(found)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, listener: GroupListener, assignor: PortAssignor | None) -> None:
        self.listener = listener
        self.assignor = assignor

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.listener.revoked(frozenset(_part(tp) for tp in revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        user_data = self.assignor.user_data if self.assignor is not None else b""
        await self.listener.assigned(frozenset(_part(tp) for tp in assigned), user_data)


class PortAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """A port :class:`~bridge.kafka.port.Assignor` as aiokafka's group protocol calls it."""

    def __init__(self, assignor: Assignor) -> None:
        self.assignor = assignor
        #: The assignor's data of this member's last assignment.
        self.user_data = b""

    @property
    def name(self) -> str:
        return self.assignor.name

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(0, sorted(topics), self.assignor.metadata())

    def assign(
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        topics = sorted({t for meta in members.values() for t in meta.subscription})
        parts = [
            TopicPart(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())
        ]
        shares = self.assignor.assign(
            parts, {m: bytes(meta.user_data or b"") for m, meta in members.items()}
        )
        return {m: _assignment(shares.get(m, Share(()))) for m in members}

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.user_data = bytes(assignment.user_data or b"")


def _assignment(share: Share) -> ConsumerProtocolMemberAssignment:
    by_topic: dict[str, list[int]] = {}
    for part in share.parts:
        by_topic.setdefault(part.topic, []).append(part.partition)
    return ConsumerProtocolMemberAssignment(0, sorted(by_topic.items()), share.user_data)


class KafkaProducer(Closable):
    """An idempotent producer (acks=all); each send waits for its acknowledgement."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer

    async def start(self) -> None:
        await _mapped(self._producer.start())

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._producer.stop()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
        timestamp_ms: int | None = None,
    ) -> Sent:
        sent = await _mapped(
            self._producer.send_and_wait(
                topic,
                value,
                key=key,
                partition=partition,
                headers=list(headers) or None,
                timestamp_ms=timestamp_ms,
            )
        )
        return Sent(sent.partition, sent.offset)


class KafkaWriter(Closable):
    """A transactional producer (``start`` runs InitProducerId: the older writer is fenced).

    Once fenced it stays fenced: aiokafka's producer is then in a fatal state, and every later
    transaction is refused with :class:`~bridge.kafka.port.WriterFenced` here.
    """

    def __init__(
        self, producer: AIOKafkaProducer, *, transactional_id: str, fence_s: float
    ) -> None:
        self._producer = producer
        self._fenced: WriterFenced | None = None
        self._id = transactional_id
        self._fence_s = fence_s

    async def start(self) -> None:
        # aiokafka retries InitProducerId for ever while the coordinator answers
        # CONCURRENT_TRANSACTIONS, which it does until the older writer's open transaction is
        # aborted: never, while a partition that transaction wrote has no leader. Bounded here,
        # so a replica starting then fails saying why instead of hanging.
        try:
            async with asyncio.timeout(self._fence_s):
                await _mapped(self._producer.start())
        except TimeoutError:
            await self.close()
            raise LogError(
                f"could not become the writer of transactional id {self._id!r} within "
                f"{self._fence_s:g} s: the previous writer's transaction did not complete (a "
                "partition it wrote may have no leader)",
                retriable=True,
                kind="FenceTimeout",
            ) from None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._producer.stop()

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    async def _call(self, call: Awaitable[T]) -> T:
        if self._fenced is not None:
            if asyncio.iscoroutine(call):
                call.close()
            raise WriterFenced(str(self._fenced))
        try:
            return await _mapped(call)
        except WriterFenced as exc:
            self._fenced = exc
            raise

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
    ) -> None:
        delivery = await self._call(
            self._producer.send(
                topic, value, key=key, partition=partition, headers=list(headers) or None
            )
        )
        # The commit reports a failed delivery; retrieve it here so it is not logged as lost.
        delivery.add_done_callback(_retrieved)


def _retrieved(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled():
        delivery.exception()


class _Transaction:
    def __init__(self, writer: KafkaWriter) -> None:
        self._writer = writer

    async def __aenter__(self) -> None:
        await self._writer._call(self._writer._producer.begin_transaction())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self._writer._call(self._writer._producer.commit_transaction())
        else:
            with contextlib.suppress(Exception):  # a fenced writer cannot abort; it is done
                await self._writer._producer.abort_transaction()

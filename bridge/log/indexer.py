"""The indexer: tails every events partition and derives each record's seq.

Every bridge replica runs one :class:`Indexer`. On start it restores the seq index from the
compacted index topic (reading committed records up to the last stable offset, which is a
consistent cut because the index is only ever written in transactions), then tails each events
partition with ``read_committed`` from the restored ``through`` offset, applying every record
to :class:`~bridge.log.seqindex.PartitionIndex` and handing ``IndexedEvent``\\ s to listeners
(the stream hub).

One replica (``persist=True``; ``bridge index`` or the designated writer) also persists the
index: every ``flush_interval_s`` it encodes the dirty task entries and the partition markers at
one instant (a consistent cut, since records are applied between awaits) and writes them in one
Kafka transaction. A crash at any point leaves either the whole cut or none of it; a newer
writer with the same transactional id fences an older one, so a stale writer can never
overwrite newer counts. Replaying records at or below a task's ``last_offset`` is a no-op, so a
restart derives exactly the same seq for every record.

If retention deletes records before they were counted (``through`` below the log start
offset), the partition is marked lost: tasks known then become untrusted, and later tasks are
trusted only if their first record is the bridge's own ``task.created``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bridge.component import Component, NotStarted
from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.kafka.clients import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRecord,
    OffsetOutOfRangeError,
    ProducerFenced,
    TopicPartition,
    committed_consumer,
    partition_for_key,
    transactional_producer,
)
from bridge.kafka.topics import TopicLayoutError, topic_partition_ids
from bridge.log.records import LazyEvent, RecordDecoder, task_id_of
from bridge.log.seqindex import (
    IndexRecordError,
    MarkerRecord,
    PartitionIndex,
    TaskEntry,
    TaskRecord,
    decode_index_record,
    marker_key,
    task_key,
)

__all__ = [
    "IndexedEvent",
    "Indexer",
    "IndexerError",
    "load_index",
    "read_to_end",
    "topic_partitions",
]

log = logging.getLogger(__name__)


class IndexerError(Exception):
    """The indexer cannot start or go on (missing topic, unreadable index, fenced writer)."""


class IndexedEvent:
    """A committed record with its derived seq, as the tail hands it to listeners.

    ``event`` is decoded on first access (a :class:`~bridge.log.records.LazyEvent` until then):
    the tail decodes only the records whose payload the index folds, and a listener that reads
    just the task id (the fan-out, for tasks nobody watches) costs no decode. Ask
    :meth:`has_type` rather than ``event.type`` to test for the bridge's own created or status
    type: it answers those without decoding.
    """

    __slots__ = ("_event", "offset", "partition", "seq", "task_id")

    def __init__(
        self, task_id: str, partition: int, offset: int, seq: int, event: TaskEvent | LazyEvent
    ) -> None:
        self.task_id = task_id
        self.partition = partition
        self.offset = offset
        self.seq = seq
        self._event = event

    @property
    def event(self) -> TaskEvent:
        """The record's event, or the placeholder describing why it does not decode."""
        event = self._event
        if isinstance(event, LazyEvent):
            event = self._event = event.get()
        return event

    def has_type(self, event_type: str) -> bool:
        """``self.event.type == event_type``, without decoding when the tail already knows."""
        lazy = self._event
        if isinstance(lazy, LazyEvent) and lazy.cannot_be(event_type):
            return False
        return self.event.type == event_type

    def __repr__(self) -> str:
        return (
            f"IndexedEvent({self.task_id!r}, partition={self.partition}, "
            f"offset={self.offset}, seq={self.seq}, event={self._event!r})"
        )


Listener = Callable[[IndexedEvent], None]


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """Partition ids of ``topic``, or :class:`IndexerError` naming the fix."""
    try:
        return await topic_partition_ids(settings, topic)
    except TopicLayoutError as exc:
        raise IndexerError(str(exc)) from None


async def read_to_end(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    on_record: Callable[[ConsumerRecord[bytes, bytes]], None],
) -> None:
    """Read ``tps`` from their log start up to their current end (LSO under read_committed)."""
    consumer.assign(tps)
    begins = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    for tp in tps:
        consumer.seek(tp, begins[tp])
    remaining = {tp for tp in tps if ends[tp] > begins[tp]}
    while remaining:
        batches = await consumer.getmany(*remaining, timeout_ms=500)
        for records in batches.values():
            for record in records:
                on_record(record)
        for tp in list(remaining):
            if await consumer.position(tp) >= ends[tp]:
                remaining.discard(tp)


async def load_index(settings: Settings, partitions: list[int]) -> dict[int, PartitionIndex]:
    """Restore the persisted seq index (a consistent committed cut) for ``partitions``."""
    index = {p: PartitionIndex(p, settings.checkpoint_interval) for p in partitions}
    latest: dict[bytes, bytes | None] = {}

    def keep(record: ConsumerRecord[bytes, bytes]) -> None:
        if record.key is not None:
            latest[record.key] = record.value

    consumer = committed_consumer(settings, role="index-restore")
    await consumer.start()
    try:
        topic = settings.topics.index
        await read_to_end(
            consumer,
            [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)],
            keep,
        )
    finally:
        await consumer.stop()
    for key, value in latest.items():
        if value is None:  # a tombstone: the entry was deleted on purpose
            continue
        try:
            record = decode_index_record(key, value)
        except IndexRecordError as exc:
            raise IndexerError(
                f"the index topic {settings.topics.index!r} holds a record this version cannot "
                f"read ({exc}); refusing to guess seq counts"
            ) from None
        target = index.get(record.partition)
        if target is None:
            raise IndexerError(
                f"the index names events partition {record.partition}, which the events topic "
                "does not have: was the events topic recreated with fewer partitions?"
            )
        if isinstance(record, TaskRecord):
            target.restore_task(record.task_id, record.entry)
        elif isinstance(record, MarkerRecord):
            target.restore_marker(record.through, record.lost_before)
    return index


class Indexer(Component):
    """Derives seq for every committed record of the events topic; optionally persists it."""

    def __init__(
        self,
        settings: Settings,
        *,
        persist: bool = False,
        flush_interval_s: float = 0.5,
        transactional_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.persist = persist
        self.flush_interval_s = flush_interval_s
        self.transactional_id = transactional_id or f"{settings.topics.prefix}.indexer"
        self.partitions: dict[int, PartitionIndex] = {}
        self._decoder = RecordDecoder(
            settings.event_type_prefix, settings.max_event_bytes, settings.type_rule
        )
        self.fenced = False
        self._listeners: list[Listener] = []
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._progress = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._persisted_markers: dict[int, bytes] = {}
        self.restore_seconds = 0.0
        self.last_flush_records = 0

    # --- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """Restore the index, reconcile with retention, and start tailing (and persisting)."""
        topic = self.settings.topics.events
        consumer = committed_consumer(self.settings, role="indexer")
        await consumer.start()
        self._consumer = consumer
        try:
            parts = await topic_partitions(self.settings, topic)
            if self.persist:
                # Fence any older writer first: its open transaction is aborted, so the restore
                # below reads a cut that no zombie can still extend.
                self._producer = transactional_producer(self.settings, self.transactional_id)
                await self._producer.start()
            started = time.perf_counter()
            self.partitions = await load_index(self.settings, parts)
            self.restore_seconds = time.perf_counter() - started
            self._persisted_markers = {p: idx.marker() for p, idx in self.partitions.items()}
            for idx in self.partitions.values():
                idx.track_dirty = self.persist
            tps = [TopicPartition(topic, p) for p in parts]
            consumer.assign(tps)
            await self._reconcile_with_retention(consumer, tps, seek_all=True)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "indexer restored %d tasks over %d partitions in %.2fs (persist=%s)",
            sum(len(i) for i in self.partitions.values()),
            len(parts),
            self.restore_seconds,
            self.persist,
        )
        self._tasks.append(asyncio.create_task(self._tail(), name="indexer-tail"))
        if self.persist:
            self._tasks.append(asyncio.create_task(self._persist_loop(), name="indexer-persist"))

    async def stop(self) -> None:
        """Stop tailing; a persisting indexer flushes what it has first."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._producer is not None:
            if not self.fenced:
                with contextlib.suppress(Exception):
                    await self.flush()
            await self._producer.stop()
            self._producer = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    # --- queries -------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def partition_of(self, task_id: str) -> int:
        return partition_for_key(task_id.encode("utf-8"), len(self.partitions))

    def lookup(self, task_id: str) -> tuple[int, TaskEntry] | None:
        """The task's partition and index entry, or None if no record of it was indexed."""
        partition = self.partition_of(task_id)
        entry = self.partitions[partition].get(task_id)
        return None if entry is None else (partition, entry)

    def pause(self) -> None:
        """Stop fetching (operations drills); the lag metrics then grow."""
        consumer = self._started_consumer()
        consumer.pause(*consumer.assignment())

    def resume(self) -> None:
        consumer = self._started_consumer()
        consumer.resume(*consumer.assignment())

    def _started_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise NotStarted("the indexer")
        return self._consumer

    def head(self, task_id: str) -> int | None:
        """The task's next seq (the number of its events indexed so far), or None."""
        return self.partitions[self.partition_of(task_id)].next_seq_of(task_id)

    async def wait_indexed(self, partition: int, offset: int) -> None:
        """Return once the record at ``offset`` (and all before it) has been applied.

        Callers bound the wait with ``asyncio.timeout``.
        """
        while self.partitions[partition].through <= offset:
            await self._progress.wait()

    async def end_offsets(self) -> dict[int, int]:
        """The current end (last stable offset) of every events partition."""
        consumer = self._started_consumer()
        tps = [TopicPartition(self.settings.topics.events, p) for p in self.partitions]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}

    async def catch_up(self) -> None:
        """Return once everything committed before this call has been applied (bound it)."""
        ends = await self.end_offsets()
        while any(self.partitions[p].through < end for p, end in ends.items()):
            await self._progress.wait()

    # --- tailing -------------------------------------------------------------------------

    def _lost(self, idx: PartitionIndex, log_start: int) -> None:
        log.error(
            "events partition %d: retention deleted offsets [%d, %d) before they were indexed; "
            "tasks with records there can no longer be served with a trusted seq",
            idx.partition,
            idx.through,
            log_start,
        )
        idx.mark_lost(log_start)

    def _apply(self, idx: PartitionIndex, record: ConsumerRecord[bytes, bytes]) -> None:
        task_id = task_id_of(record)
        if task_id is None:
            idx.advance(record.offset + 1)
            return
        # Only the bridge's own created and status records are decoded here (the facts); the
        # rest is decoded when a listener reads the event, if one ever does.
        (created, status, identity), event = self._decoder.facts(record)
        seq = idx.apply(task_id, record.offset, created=created, status=status, identity=identity)
        if seq is None or not self._listeners:
            return
        indexed = IndexedEvent(
            task_id,
            idx.partition,
            record.offset,
            seq,
            event if event is not None else LazyEvent(record, self._decoder),
        )
        for listener in self._listeners:
            try:
                listener(indexed)
            except Exception:  # a listener bug must not stop indexing
                log.exception("indexer listener failed")

    async def _tail(self) -> None:
        consumer = self._started_consumer()
        tps = list(consumer.assignment())
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            except OffsetOutOfRangeError:
                await self._reconcile_with_retention(consumer, tps, seek_all=False)
                continue
            for tp, records in batches.items():
                idx = self.partitions[tp.partition]
                for record in records:
                    self._apply(idx, record)
            for tp in tps:
                # Transaction markers and aborted records move the position without records.
                self.partitions[tp.partition].advance(await consumer.position(tp))
            self._progress.set()
            self._progress = asyncio.Event()

    async def _reconcile_with_retention(
        self, consumer: AIOKafkaConsumer, tps: list[TopicPartition], *, seek_all: bool
    ) -> None:
        """Mark partitions whose uncounted records retention deleted as lost, and seek where
        counting goes on (every partition at start, only the lost ones after an out-of-range)."""
        begins = await consumer.beginning_offsets(tps)
        for tp in tps:
            idx = self.partitions[tp.partition]
            lost = idx.through < begins[tp]
            if lost:
                self._lost(idx, begins[tp])
            if lost or seek_all:
                consumer.seek(tp, idx.through)

    # --- persisting ----------------------------------------------------------------------

    def _cut(self) -> list[tuple[bytes, bytes]]:
        """Encode every dirty entry and changed marker at one instant (no await inside)."""
        batch: list[tuple[bytes, bytes]] = []
        for p, idx in self.partitions.items():
            for task_id in idx.dirty:
                batch.append((task_key(task_id), idx.encode_task(task_id)))
            idx.dirty.clear()
            marker = idx.marker()
            if marker != self._persisted_markers.get(p):
                batch.append((marker_key(p), marker))
        return batch

    async def flush(self) -> int:
        """Persist the current cut in one transaction; returns the number of index records."""
        producer = self._producer
        if producer is None or self.fenced:
            return 0
        async with self._flush_lock:
            batch = self._cut()
            if not batch:
                return 0
            topic = self.settings.topics.index
            try:
                async with producer.transaction():
                    for key, value in batch:
                        await producer.send(topic, key=key, value=value)
            except ProducerFenced:
                self.fenced = True
                log.error(
                    "indexer writer %r was fenced by a newer writer; no longer persisting",
                    self.transactional_id,
                )
                raise IndexerError("fenced by a newer index writer") from None
            except BaseException:
                self._redirty(batch)
                raise
            for key, value in batch:
                if key.startswith(b"p:"):
                    self._persisted_markers[int(key[2:])] = value
            self.last_flush_records = len(batch)
            return len(batch)

    def _redirty(self, batch: list[tuple[bytes, bytes]]) -> None:
        for key, _ in batch:
            if key.startswith(b"t:"):
                task_id = key[2:].decode("utf-8")
                self.partitions[self.partition_of(task_id)].dirty.add(task_id)
            else:
                self._persisted_markers.pop(int(key[2:]), None)

    async def _persist_loop(self) -> None:
        while not self.fenced:
            await asyncio.sleep(self.flush_interval_s)  # the flush cadence, not synchronisation
            try:
                await self.flush()
            except IndexerError:
                return
            except Exception:
                log.exception("index flush failed; will retry")

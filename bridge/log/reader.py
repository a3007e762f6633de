"""The reader: a task's retained events by seq, and earliestSeq from retention.

``read(task_id, after)`` seeks to the nearest usable checkpoint of the task and reads forward,
counting the task's records, so its cost is bounded by the checkpoint interval plus whatever
else is interleaved in the partition, whatever the partition's length. It reads up to the
task's indexed head at the time of the call; the stream hub continues live from there.

Retention: ``earliestSeq`` is the seq of the task's first record at or after the partition's
log start offset. When the checkpoint below that point was deleted, the records from the log
start to the next checkpoint (or the head) are counted and subtracted from that checkpoint's
seq; when retention moves the log start during that count, it is redone from the new one. A
cursor older than that raises :class:`NotRetained`; nothing is skipped silently.

Catch-up reads of many streams share Kafka reads (:mod:`bridge.log.catchup`): the task's records
come from a scan of the partition that serves every concurrent read of an overlapping range,
and the log start lookups of concurrent reads share one request. Every read still sees the log
start as it was when the read began (the shared request is always sent after the caller
asked): a remembered value was tried and dropped, because a stream opened right after
deleteRecords then served events that were already deleted.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import overload

from bridge.clock import SYSTEM_CLOCK, Clock
from bridge.component import Component
from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log, LogRecord, OffsetOutOfRange, TopicPart
from bridge.log.catchup import Coalescer, LogStarts, Read
from bridge.log.indexer import Indexer
from bridge.log.records import RecordDecoder
from bridge.log.seqindex import TaskEntry

__all__ = [
    "NotRetained",
    "ReadBatch",
    "ReadEvent",
    "Reader",
    "SeqUntrusted",
    "UnknownTask",
    "WireBatch",
]

_OFFSET = operator.attrgetter("offset")

#: Counts of a task's records from the log start before an OffsetOutOfRange is let
#: through: retention would have to move the log start this many times during one count.
_EARLIEST_ATTEMPTS = 5


class UnknownTask(LookupError):
    """No record of this task was ever indexed."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"unknown task {task_id!r}")
        self.task_id = task_id


class NotRetained(Exception):
    """The cursor is older than what retention kept; ``earliest_seq`` is the oldest retained."""

    def __init__(self, task_id: str, earliest_seq: int) -> None:
        super().__init__(
            f"events of task {task_id!r} before seq {earliest_seq} are no longer retained"
        )
        self.task_id = task_id
        self.earliest_seq = earliest_seq


class SeqUntrusted(Exception):
    """Retention deleted some of the task's records before they were counted."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"seq of task {task_id!r} cannot be trusted: retention deleted records of its "
            "partition before the indexer counted them (indexer lag exceeded retention)"
        )
        self.task_id = task_id


@dataclass(slots=True)
class ReadEvent:
    """A retained event with its seq and offset. Not frozen: a replay makes one per event, and
    a frozen dataclass's ``__init__`` costs four times as much (0.8 against 0.2 µs); nothing
    changes one after the read made it."""

    seq: int
    offset: int
    event: TaskEvent


class ReadBatch(Sequence[ReadEvent]):
    """The events of one fetch, in seq order from ``first``: what :meth:`Reader.read_batches`
    yields. Kept as columns, not a :class:`ReadEvent` per event: a replay's stream reads them
    through :meth:`triples` (the object per event was 4% of its CPU). Iterating or indexing it
    makes the :class:`ReadEvent` s, for everyone else.
    """

    __slots__ = ("events", "first", "offsets")

    def __init__(self, first: int, offsets: list[int], events: list[TaskEvent]) -> None:
        self.first = first
        self.offsets = offsets
        self.events = events

    def __len__(self) -> int:
        return len(self.events)

    @overload
    def __getitem__(self, index: int) -> ReadEvent: ...
    @overload
    def __getitem__(self, index: slice) -> list[ReadEvent]: ...
    def __getitem__(self, index: int | slice) -> ReadEvent | list[ReadEvent]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self.events))[index]]
        i = range(len(self.events))[index]  # negative indices as lists take them; IndexError
        return ReadEvent(self.first + i, self.offsets[i], self.events[i])

    def __iter__(self) -> Iterator[ReadEvent]:
        return map(ReadEvent, self._seqs(), self.offsets, self.events)

    def triples(self) -> Iterator[tuple[int, int, TaskEvent]]:
        """``(seq, offset, event)`` of each event, without a :class:`ReadEvent` each."""
        return zip(self._seqs(), self.offsets, self.events, strict=True)

    def _seqs(self) -> range:
        return range(self.first, self.first + len(self.events))


class WireBatch:
    """The events of one fetch as a stream sends them (:meth:`Reader.read_wire`), in seq
    order from ``first``: ``items[i]`` is seq ``first + i``, at ``offsets[i]``, either an event
    or, for a record of the usual shape, its checked wire JSON members (a str,
    :meth:`~bridge.log.records.RecordDecoder.wire_events`). ``full``: the indexes of the events,
    ascending. No str is one of the bridge's own created or status events.
    """

    __slots__ = ("first", "full", "items", "offsets")

    def __init__(
        self, first: int, offsets: list[int], items: list[TaskEvent | str], full: list[int]
    ) -> None:
        self.first = first
        self.offsets = offsets
        self.items = items
        self.full = full

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The task's index entry as of the start of a read (the tail keeps changing the index)."""

    partition: int
    entry: TaskEntry

    @property
    def next_seq(self) -> int:
        return self.entry.next_seq

    @property
    def last_offset(self) -> int:
        return self.entry.last_offset

    @property
    def first(self) -> tuple[int, int]:
        return 0, self.entry.first_offset

    def at_or_before(self, seq: int) -> tuple[int, int]:
        # Every indexed task has checkpoint 0, so there is always one at or before ``seq``.
        return self.entry.checkpoint_at_or_before(seq) or (0, self.entry.first_offset)

    def first_at_or_after_offset(self, offset: int) -> tuple[int, int] | None:
        return self.entry.checkpoint_after_offset(offset)


class Reader(Component):
    """Reads retained task events through a small pool of ``read_committed`` consumers."""

    def __init__(
        self,
        settings: Settings,
        indexer: Indexer,
        *,
        pool_size: int = 4,
        chunk: int = 2000,
        on_scan: Callable[[int], None] | None = None,
        on_detach: Callable[[], None] | None = None,
        on_lookup: Callable[[], None] | None = None,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``on_scan``, ``on_detach`` and ``on_lookup`` report each shared scan (with the reads
        it served), each read that left its scan to read alone, and each log-start request:
        given once, by the composition that owns the metrics (bridge.log knows none).
        ``log``: the log to read (the cluster of ``settings`` when None); ``clock``: what ages
        the catch-up's recent fetches."""
        self.settings = settings
        self.indexer = indexer
        # Reads decode every event they return, eagerly: a stream sends all of them (the tail
        # is the one that decodes only what it needs).
        self._decoder = RecordDecoder(
            settings.tasks.event_type_prefix, settings.tasks.max_event_bytes, settings.type_rule
        )
        self.chunk = chunk
        # The pool of ``pool_size`` consumers every read fetches through (bridge.kafka.pool),
        # and a one-consumer log with tiny fetch sizes for the metrics' timestamp probes.
        self._own_logs = log is None
        self._log: Log = (
            log if log is not None else KafkaLog(settings, pool_size=pool_size, role="reader")
        )
        self._probe: Log = (
            log
            if log is not None
            else KafkaLog(
                settings,
                pool_size=1,
                role="reader-probe",
                max_partition_fetch_bytes=1024,
                fetch_max_bytes=1024,
            )
        )
        self.records_scanned = 0
        #: Shared scans; one of the pool's consumers stays free for everything else.
        self.catchup = Coalescer(
            self._scan_fetch,
            member_limit=2 * chunk,
            on_scan=on_scan,
            on_detach=on_detach,
            clock=clock,
        )
        self.log_start_cache = LogStarts(self._shared_log_starts, on_request=on_lookup)

    async def stop(self) -> None:
        await self.close()

    async def close(self) -> None:
        await self.catchup.close()
        await self.log_start_cache.close()
        if self._own_logs:
            for owned in (self._log, self._probe):
                if isinstance(owned, KafkaLog):
                    await owned.close()

    # --- fetches -------------------------------------------------------------------------

    async def _fetch(
        self, tp: TopicPart, offset: int, limit: int | None = None
    ) -> tuple[list[LogRecord], int]:
        """Up to ``chunk`` committed records of ``tp`` from ``offset``, and the next position.

        The position can move without records (transaction markers, aborted batches). A
        read that goes on where the previous one ended keeps its prefetched data (the pool).
        """
        fetched = await self._log.fetch(tp, offset, limit or self.chunk)
        records = fetched.records
        return (records if isinstance(records, list) else list(records)), fetched.next_offset

    async def _scan_fetch(self, tp: TopicPart, offset: int) -> tuple[list[LogRecord], int]:
        records, position = await self._fetch(tp, offset)
        self.records_scanned += len(records)
        return records, position

    async def _log_start(self, tp: TopicPart) -> int:
        """The partition's log start, looked up after this call began (shared request)."""
        start = await self.log_start_cache.fresh(tp.partition)
        self.catchup.forget_before(tp, start)
        return start

    async def _shared_log_starts(self, partitions: list[int]) -> dict[int, int]:
        tps = [TopicPart(self.settings.topics.events, p) for p in partitions]
        begins = await self._log.log_starts(tps)
        return {tp.partition: offset for tp, offset in begins.items()}

    # --- the task's records ----------------------------------------------------------------

    def _snapshot(self, task_id: str) -> _Snapshot:
        found = self.indexer.lookup(task_id)
        if found is None:
            raise UnknownTask(task_id)
        partition, entry = found
        if not entry.trusted:
            raise SeqUntrusted(task_id)
        return _Snapshot(partition, entry)

    def _task_record_chunks(self, task_id: str, tp: TopicPart, start: int, end: int) -> Read:
        """The task's committed records with ``start <= offset < end``, one list per fetch
        that had any (from a scan shared with other reads, joined now). Close it when done."""
        return self.catchup.records(tp, task_id.encode("utf-8"), start, end)

    async def _task_records(
        self, task_id: str, tp: TopicPart, start: int, end: int
    ) -> AsyncGenerator[LogRecord, None]:
        """The task's committed records with ``start <= offset < end``."""
        async with aclosing(self._task_record_chunks(task_id, tp, start, end)) as chunks:
            async for chunk in chunks:
                for record in chunk:
                    yield record

    async def _earliest(
        self, task_id: str, snap: _Snapshot, tp: TopicPart, log_start: int
    ) -> tuple[int, int | None]:
        """``(earliest retained seq, its offset)``; offset None when nothing is retained.

        Retention (or deleteRecords) can move the log start past ``log_start`` while the
        task's records are counted from there: count again from the new log start. The log
        start only moves forward, so each attempt has less left to count.
        """
        for _ in range(_EARLIEST_ATTEMPTS - 1):
            try:
                return await self._earliest_from(task_id, snap, tp, log_start)
            except OffsetOutOfRange:
                log_start = await self._log_start(tp)
        return await self._earliest_from(task_id, snap, tp, log_start)

    async def _earliest_from(
        self, task_id: str, snap: _Snapshot, tp: TopicPart, log_start: int
    ) -> tuple[int, int | None]:
        """:meth:`_earliest` for one log start (OffsetOutOfRange if it has moved on)."""
        first = snap.first
        if first[1] >= log_start:
            return first
        if snap.last_offset < log_start:
            return snap.next_seq, None
        bound = snap.first_at_or_after_offset(log_start)
        end_seq, end_offset = bound if bound else (snap.next_seq, snap.last_offset + 1)
        count, first_offset = 0, None
        async with aclosing(self._task_records(task_id, tp, log_start, end_offset)) as records:
            async for record in records:
                count += 1
                if first_offset is None:
                    first_offset = record.offset
        if count == 0:
            return end_seq, end_offset if bound else None
        return end_seq - count, first_offset

    async def event_at(self, partition: int, offset: int) -> TaskEvent | None:
        """The event of the record at ``offset`` of ``partition``; None if it is gone."""
        tp = TopicPart(self.settings.topics.events, partition)
        try:
            records, _ = await self._fetch(tp, offset, limit=1)
        except OffsetOutOfRange:
            return None
        if not records or records[0].offset != offset:
            return None
        return self._decoder.event(records[0])

    async def record_timestamp(self, partition: int, offset: int) -> int | None:
        """The Kafka timestamp (ms) of the first committed record at or after ``offset``.

        Uses a consumer with tiny fetch sizes (the broker still returns one whole batch), so
        the metrics' once-in-a-while lookups do not pull a megabyte each.
        """
        tp = TopicPart(self.settings.topics.events, partition)
        try:
            fetched = await self._probe.fetch(tp, offset, 1)
        except OffsetOutOfRange:
            return None
        return fetched.records[0].timestamp if fetched.records else None

    async def log_starts(self, partitions: list[int]) -> dict[int, int]:
        """The log start offsets of ``partitions`` of the events topic (one request)."""
        return await self._shared_log_starts(partitions)

    async def earliest_seq(self, task_id: str) -> int:
        """The oldest seq of the task still retained (``next_seq`` if none is)."""
        seq, _ = await self.earliest(task_id)
        return seq

    async def earliest(self, task_id: str) -> tuple[int, int]:
        """:meth:`earliest_seq`, and the partition's log start it was derived from, looked up
        after this call began: a read that follows at once may take it as its own
        (:meth:`read_batches`' ``log_start``) instead of asking Kafka again."""
        snap = self._snapshot(task_id)
        tp = TopicPart(self.settings.topics.events, snap.partition)
        log_start = await self._log_start(tp)
        seq, _ = await self._earliest(task_id, snap, tp, log_start)
        return seq, log_start

    async def head(self, task_id: str) -> int:
        """The number of the task's events indexed so far (its next seq)."""
        return self._snapshot(task_id).next_seq

    async def read(self, task_id: str, after: int | None = None) -> AsyncIterator[ReadEvent]:
        """Retained events with seq > ``after`` (all retained when None), up to the indexed head.

        Raises :class:`NotRetained` when ``after + 1`` is older than the earliest retained seq,
        :class:`UnknownTask` and :class:`SeqUntrusted` as named.
        """
        async for batch in self.read_batches(task_id, after):
            for event in batch:
                yield event

    async def read_batches(
        self, task_id: str, after: int | None = None, *, log_start: int | None = None
    ) -> AsyncGenerator[ReadBatch, None]:
        """:meth:`read`, one :class:`ReadBatch` per Kafka fetch (what is at hand without waiting).

        ``log_start``: the partition's log start as looked up after the request this read
        serves arrived (:meth:`earliest`, when the cursor was checked), taken instead of a new
        lookup for the first pass: the read then sees retention as it was when its request
        had arrived, like any read, and a stream open costs one lookup, not two. A log start
        that moved on since is met as mid-read retention (the next pass looks it up again).
        """
        async with aclosing(self._read_chunks(task_id, after, log_start)) as chunks:
            async for seq, chunk in chunks:
                events = self._decoder.events(chunk)
                yield ReadBatch(seq, list(map(_OFFSET, chunk)), events)
                del events

    async def read_wire(
        self, task_id: str, after: int | None = None, *, log_start: int | None = None
    ) -> AsyncGenerator[WireBatch, None]:
        """:meth:`read_batches` for a stream that sends what it reads: each batch holds the
        usual records as wire JSON text, checked but not decoded
        (:meth:`~bridge.log.records.RecordDecoder.wire_events`), the others as events."""
        async with aclosing(self._read_chunks(task_id, after, log_start)) as chunks:
            async for seq, chunk in chunks:
                items, full = self._decoder.wire_events(chunk)
                yield WireBatch(seq, list(map(_OFFSET, chunk)), items, full)
                del items

    async def _read_chunks(
        self, task_id: str, after: int | None, log_start: int | None
    ) -> AsyncGenerator[tuple[int, list[LogRecord]], None]:
        """The records of :meth:`read_batches`, one list per fetch, with the seq of the first."""
        if after is not None and (
            not isinstance(after, int) or isinstance(after, bool) or after < 0
        ):
            raise ValueError("after must be a non-negative integer")
        snap = self._snapshot(task_id)
        target = 0 if after is None else after + 1
        if target >= snap.next_seq:
            return
        tp = TopicPart(self.settings.topics.events, snap.partition)
        end = snap.last_offset + 1
        known = log_start
        while True:
            seq, offset = snap.at_or_before(target)
            # The records are fetched while the log start is looked up (both cost a round
            # trip); none is used before the lookup says they are retained.
            chunks = self._task_record_chunks(task_id, tp, offset, end)
            if known is not None:
                log_start, known = known, None
            else:
                try:
                    log_start = await self._log_start(tp)
                except BaseException:
                    await chunks.aclose()
                    raise
            if offset < log_start:
                await chunks.aclose()
                earliest, earliest_offset = await self._earliest(task_id, snap, tp, log_start)
                if after is not None and target < earliest:
                    raise NotRetained(task_id, earliest)
                if earliest_offset is None:
                    return
                seq, offset, target = earliest, earliest_offset, max(target, earliest)
                chunks = self._task_record_chunks(task_id, tp, offset, end)
            # Closed below whatever happens: an abandoned read leaves its shared scan at once.
            try:
                async for chunk in chunks:
                    if seq < target:  # the records from the checkpoint up to the cursor
                        skip = min(target - seq, len(chunk))
                        seq += skip
                        chunk = chunk[skip:]
                    if not chunk:
                        continue
                    yield seq, chunk
                    seq += len(chunk)
                return
            except OffsetOutOfRange:
                # Retention moved past us mid-read: start again from the next seq wanted.
                target = seq
                if seq > (0 if after is None else after + 1):
                    after = seq - 1
            finally:
                await chunks.aclose()

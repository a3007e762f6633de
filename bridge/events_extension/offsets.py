"""Event sources read by Kafka offset: poll and push over some partitions of one topic.

Where it sits: :class:`OffsetSource` is the engine under the ``task.updated`` source
(:mod:`bridge.events_extension.taskupdates`: one partition of the updates topic) and the configured
sources (:mod:`bridge.events_extension.configured`: every partition of a pipeline's topic). A subclass
says what one subscription reads (:meth:`OffsetSource.select`: its partitions and which of
their records are occurrences) and how a cursor spells positions; the engine does the rest,
the same way for both:

* a cursor is the next offset to read in each partition, so it survives restarts and means the
  same on every replica; ``null`` is "now", the last stable offsets;
* a cursor older than the log start resumes at the log start, ``truncated``; ``maxAgeMs`` seeks
  with Kafka's offsets-for-times, ``truncated`` when it skipped past the cursor;
* poll reads partitions round robin, one fetch each, until ``maxEvents`` occurrences, the end
  offsets as they were when the poll began (``hasMore`` says whether it got there), or a scan
  budget of records (so one poll over a busy topic with few matches stays bounded);
* push registers on the process's live tail of the topic first, then reads from Kafka up to the
  end, then takes live chunks: back to Kafka after an overflow or a hole. Heartbeats carry the
  position checked up to, which moves with records that did not match as well, and are sent
  whenever nothing was sent for a heartbeat period, in the replay from Kafka as when live (a
  client far behind on a busy topic hears the position move, and a reconnect goes on from it).

No JSON-RPC here: bad arguments raise :class:`~bridge.events_extension.sources.InvalidArguments`, a
foreign cursor :class:`~bridge.events_extension.cursor.BadCursor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.events_extension.kafkalog import Chunk, LiveTopics, Record, TopicFeed, TopicReader
from bridge.events_extension.occurrences import Active, Heartbeat, Occurrence, PollBatch, StreamItem
from bridge.events_extension.pacing import Waiting, paced
from bridge.kafka.port import OffsetOutOfRange
from bridge.log.fanout import FeedClosed

__all__ = ["Found", "OffsetSource", "Selection"]

#: Records one poll looks at, at most, before it answers (with hasMore) whatever it found.
SCAN_LIMIT = 20_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Found:
    """What a matching record makes of an occurrence (the engine adds name and cursor)."""

    event_id: str
    timestamp_ms: int
    data: dict[str, Any]


def _never(data: dict[str, Any]) -> bool:
    return False


@dataclass(frozen=True)
class Selection:
    """What one subscription reads: which partitions, which of their records, when it ends."""

    partitions: tuple[int, ...]
    match: Callable[[Record], Found | None]
    #: After delivering an occurrence with this data, a push stream ends (nothing can follow).
    ends: Callable[[dict[str, Any]], bool] = _never
    #: Nothing can match any more: a push stream from "now" ends at once.
    over: bool = False


class _Skipped:
    """Retention deleted records between the position and what is read next."""


_SKIPPED = _Skipped()


class _Checked:
    """A fetch was read through: the positions moved past every record it held."""


_CHECKED = _Checked()

#: What the replay hands out: records, the markers above, and the pacing's.
_Replayed = Record | _Skipped | _Checked | Waiting


class OffsetSource:
    """An event type over a topic read by offset (see the module docstring); subclasses
    define :meth:`descriptor`, :meth:`select`, :meth:`encode` and :meth:`decode`."""

    def __init__(
        self,
        name: str,
        topic: str,
        reader: TopicReader,
        live: LiveTopics,
        *,
        next_poll_ms: int,
        queue_size: int,
        heartbeat_s: float,
        stopping: asyncio.Event | None = None,
        now_ms: Callable[[], int] = _now_ms,
        scan_limit: int = SCAN_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.topic = topic
        self.reader = reader
        self.live = live
        self.next_poll_ms = next_poll_ms
        self.queue_size = queue_size
        self.heartbeat_s = heartbeat_s
        self.stopping = stopping or asyncio.Event()
        self.now_ms = now_ms
        self.scan_limit = scan_limit
        #: The heartbeat's clock (seconds, monotonic), apart so that tests can drive it.
        self.clock = clock

    # --- what a subclass says ------------------------------------------------------------

    def descriptor(self) -> dict[str, Any]:
        raise NotImplementedError

    async def select(self, principal: str, arguments: dict[str, Any]) -> Selection:
        """The subscription of ``principal`` with ``arguments``, or raise why there is none."""
        raise NotImplementedError

    async def authorize(self, principal: str, arguments: dict[str, Any]) -> None:
        """Raise what :meth:`select` raises once ``principal`` may no longer read this."""
        await self.select(principal, arguments)

    def encode(self, positions: Mapping[int, int]) -> str:
        raise NotImplementedError

    def decode(self, cursor: str, partitions: Sequence[int]) -> dict[int, int]:
        """The positions in ``cursor`` (BadCursor when it is not one of this source's)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the Kafka clients (shared by the sources of a process: closing is idempotent)."""
        await self.live.close()
        await self.reader.close()

    # --- positions -----------------------------------------------------------------------

    async def _resumed(
        self,
        selection: Selection,
        cursor: str,
        max_age_ms: int | None,
        begins: Mapping[int, int],
        ends: Mapping[int, int],
    ) -> tuple[dict[int, int], bool]:
        """Where to read from for ``cursor``, and whether that skips anything after it.

        A partition the cursor does not name (one added to the topic since) is read from its
        start; a position past the end (a topic created anew) restarts at the end.
        """
        given = self.decode(cursor, selection.partitions)
        positions: dict[int, int] = {}
        truncated = False
        for p in selection.partitions:
            wanted = given.get(p, begins[p])
            positions[p] = min(max(wanted, begins[p]), ends[p])
            truncated = truncated or positions[p] != wanted
        if max_age_ms is not None:
            floor_ms = self._floor(max_age_ms)
            floors = await self.reader.offsets_at(self.topic, selection.partitions, floor_ms)
            for p, floor in floors.items():
                young = ends[p] if floor is None else min(floor, ends[p])
                if young > positions[p]:
                    positions[p], truncated = young, True
        return positions, truncated

    def _floor(self, max_age_ms: int | None) -> int:
        """The oldest record timestamp ``maxAgeMs`` lets through. Besides the seek by time,
        records are checked one by one: a producer may write an old timestamp after young ones,
        which offsets-for-times does not skip."""
        return -(2**63) if max_age_ms is None else self.now_ms() - max_age_ms

    def _occurrence(self, found: Found, positions: Mapping[int, int]) -> Occurrence:
        return Occurrence(
            event_id=found.event_id,
            name=self.name,
            timestamp_ms=found.timestamp_ms,
            data=found.data,
            cursor=self.encode(positions),
        )

    async def _fetch(self, partition: int, offset: int) -> AsyncGenerator[Chunk]:
        """The one fetch at ``offset`` (for :func:`~bridge.events_extension.pacing.paced`)."""
        yield await self.reader.fetch(self.topic, partition, offset)

    async def _replay(
        self,
        positions: dict[int, int],
        ends: Mapping[int, int],
        patience: Callable[[], float] | None = None,
    ) -> AsyncGenerator[_Replayed]:
        """Every committed record from ``positions`` up to ``ends``, partitions round robin
        (one fetch each), updating ``positions`` before each record is handed out; a
        :data:`_SKIPPED` when retention moved the log start past a position meanwhile, a
        :data:`_CHECKED` after each fetch (its records all handed out, the position past it),
        and with ``patience`` a :data:`~bridge.events_extension.pacing.WAITING` whenever a fetch keeps
        it waiting that long (a wait for a pooled consumer included)."""
        pending = [p for p in positions if positions[p] < ends[p]]
        while pending:
            for p in list(pending):
                try:
                    chunk = None
                    fetch = paced(self._fetch(p, positions[p]), patience)
                    async with contextlib.aclosing(fetch) as got:
                        async for answer in got:
                            if isinstance(answer, Waiting):
                                yield answer
                            else:
                                chunk = answer
                    assert chunk is not None, "a fetch answers or raises"
                except OffsetOutOfRange:
                    begins, _ = await self.reader.bounds(self.topic, [p])
                    if begins[p] <= positions[p]:
                        raise
                    positions[p] = begins[p]
                    yield _SKIPPED
                    continue
                for record in chunk.records:
                    positions[p] = record.offset + 1
                    yield record
                positions[p] = max(positions[p], chunk.end)
                yield _CHECKED
                if positions[p] >= ends[p] or chunk.end == chunk.start:
                    pending.remove(p)  # done, or no progress: the next poll goes on

    # --- poll ----------------------------------------------------------------------------

    async def poll(
        self,
        principal: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
        max_events: int,
    ) -> PollBatch:
        """Occurrences after ``cursor`` (``None``: none, a cursor at the end)."""
        selection = await self.select(principal, arguments)
        begins, ends = await self.reader.bounds(self.topic, selection.partitions)
        if cursor is None:
            return PollBatch([], self.encode(ends), False, False, self.next_poll_ms)
        positions, truncated = await self._resumed(selection, cursor, max_age_ms, begins, ends)
        resumed = self.encode(positions) if truncated else None
        floor = self._floor(max_age_ms)
        events: list[Occurrence] = []
        scanned = 0
        async with contextlib.aclosing(self._replay(positions, ends)) as items:
            async for item in items:
                if isinstance(item, _Checked | Waiting):
                    continue
                if isinstance(item, _Skipped):
                    truncated, resumed = True, self.encode(positions)
                    continue
                found = selection.match(item)
                if found is not None and item.timestamp < floor:
                    found = None  # one of ours, but older than asked for
                    truncated, resumed = True, self.encode(positions)
                if found is not None:
                    events.append(self._occurrence(found, positions))
                scanned += 1
                if len(events) >= max_events or scanned >= self.scan_limit:
                    break
        has_more = any(positions[p] < ends[p] for p in selection.partitions)
        cursor = self.encode(positions)
        return PollBatch(events, cursor, truncated, has_more, self.next_poll_ms, resumed)

    async def read_at(
        self, principal: str, arguments: dict[str, Any], partition: int, offset: int
    ) -> Occurrence | None:
        """The occurrence of the record at ``offset`` of ``partition`` for ``principal``'s
        subscription with ``arguments`` (:meth:`select` and its match applied, so
        authorization and filters hold as in a poll), or None: no such record, one the
        subscription does not match, or one retention deleted. It has no cursor (one record
        says nothing of the other partitions' positions)."""
        selection = await self.select(principal, arguments)
        if partition not in selection.partitions:
            return None
        begins, ends = await self.reader.bounds(self.topic, [partition])
        if not begins[partition] <= offset < ends[partition]:
            return None
        try:
            chunk = await self.reader.fetch(self.topic, partition, offset)
        except OffsetOutOfRange:
            return None
        record = next((r for r in chunk.records if r.offset == offset), None)
        found = None if record is None else selection.match(record)
        if found is None:
            return None
        return Occurrence(found.event_id, self.name, found.timestamp_ms, found.data, None)

    # --- push ----------------------------------------------------------------------------

    async def open_stream(
        self,
        principal: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
    ) -> AsyncIterator[StreamItem]:
        """Check the subscription and the cursor (raising before any byte is sent), then its
        stream items."""
        selection = await self.select(principal, arguments)
        if cursor is not None:
            self.decode(cursor, selection.partitions)
        return _Push(self, selection).run(cursor, max_age_ms)


class _Push:
    """One push stream: its positions, when it last sent something, whether it has ended."""

    def __init__(self, source: OffsetSource, selection: Selection) -> None:
        self.source = source
        self.selection = selection
        self.positions: dict[int, int] = {}
        self.sent_at = source.clock()
        self.ended = False
        #: Records older than this are skipped while the stream replays from its cursor.
        self.floor = -(2**63)
        self.skipping = False

    def _sent(self, item: StreamItem) -> StreamItem:
        self.sent_at = self.source.clock()
        if isinstance(item, Occurrence) and self.selection.ends(item.data):
            self.ended = True
        return item

    def _beat(self) -> StreamItem | None:
        """A heartbeat at the positions checked, when nothing was sent for a period."""
        if self.source.clock() - self.sent_at < self.source.heartbeat_s:
            return None
        return self._sent(Heartbeat(self.source.encode(self.positions)))

    def _patience(self) -> float:
        """How long a fetch may keep the stream quiet before a heartbeat is due."""
        return max(self.source.heartbeat_s - (self.source.clock() - self.sent_at), 0.0)

    def _item(self, record: _Replayed) -> StreamItem | None:
        """What to send for ``record`` (positions already moved past it)."""
        source = self.source
        if isinstance(record, _Checked | Waiting):
            return None
        if isinstance(record, _Skipped):
            return self._sent(Active(source.encode(self.positions), True))
        found = self.selection.match(record)
        if found is None:
            return None
        if record.timestamp < self.floor:  # one of ours, but older than asked for
            # Skipped, and said once per run of skipped records (before the stream ends, when
            # it is the one the stream ends with: nothing can follow it).
            self.ended = self.selection.ends(found.data)
            if self.skipping:
                return None
            self.skipping = True
            return self._sent(Active(source.encode(self.positions), True))
        self.skipping = False
        return self._sent(source._occurrence(found, self.positions))

    async def run(self, cursor: str | None, max_age_ms: int | None) -> AsyncIterator[StreamItem]:
        """``active`` first, then occurrences as they are committed, heartbeats when quiet;
        ends after an occurrence the selection ends with, or silently when the process stops."""
        source, selection = self.source, self.selection
        async with source.live.subscribe(source.topic, source.queue_size) as feed:
            begins, ends = await source.reader.bounds(source.topic, selection.partitions)
            if cursor is None:
                self.positions, truncated = dict(ends), False
            else:
                self.positions, truncated = await source._resumed(
                    selection, cursor, max_age_ms, begins, ends
                )
                self.floor = source._floor(max_age_ms)
            yield self._sent(Active(source.encode(self.positions), truncated))
            if selection.over and cursor is None:
                return
            while not source.stopping.is_set():
                feed.reset()  # from Kafka: at the start, after an overflow or a hole
                _, ends = await source.reader.bounds(source.topic, selection.partitions)
                replay = source._replay(self.positions, ends, self._patience)
                async with contextlib.aclosing(replay) as items:
                    async for record in items:
                        item = self._item(record) or self._beat()
                        if item is not None:
                            yield item
                        if self.ended:
                            return
                self.floor = -(2**63)  # maxAgeMs bounds the replay only: live is young
                try:
                    async for item in self._live(feed):
                        yield item
                except FeedClosed:
                    return  # the live tails closed: the process is stopping
                if self.ended:
                    return

    async def _live(self, feed: TopicFeed) -> AsyncIterator[StreamItem]:
        """Live chunks while they follow on from the positions; returns to read from Kafka
        after an overflow or a hole, and at the end."""
        source = self.source
        while not source.stopping.is_set():
            got = await feed.wait(self._patience())
            if feed.overflowed:
                return
            for chunk in feed.take() if got else []:
                at = self.positions.get(chunk.partition)
                if at is None or chunk.end <= at:
                    continue
                if chunk.start > at:
                    return  # a hole (the tail started past us, or restarted): read Kafka
                for record in chunk.records:
                    if record.offset < at:
                        continue
                    self.positions[chunk.partition] = record.offset + 1
                    item = self._item(record)
                    if item is not None:
                        yield item
                    if self.ended:
                        return
                self.positions[chunk.partition] = chunk.end
            beat = self._beat()
            if beat is not None:
                yield beat

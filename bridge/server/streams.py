"""tasks/stream (SEP-2694): resumable, gap-free task event streams served from Kafka.

The :class:`StreamHub` serves each stream from a feed of the process's fan-out of live
events (:mod:`bridge.log.fanout`, one Kafka tail for every stream): a stream first subscribes,
then reads history through the :class:`~bridge.log.reader.Reader` (checkpoint seek), then takes
what its bounded buffer collected. Both come as the one batch type,
:class:`~bridge.log.records.Batch`, and one rule (:func:`take_next`), applied in one place to
every batch, delivers exactly ``last + 1`` each time, so nothing is skipped or repeated across
the hand-off. What it delivers is written by :mod:`bridge.server.sse`. A stream whose buffer
overflows (its client reads slowly) drops back to catch-up reads from Kafka until it is level
again; no event is lost for anyone.

A stream ends with the empty result once the task's terminal status event (the first one, as
the index folds it) has been delivered. Closing the HTTP stream ends only the stream; the task
goes on. Who may open a stream (one per task per transport connection, and the DoS limits) is
:mod:`bridge.server.admission`'s business; a stream ends without its result when its client
cancels the request (``notifications/cancelled``) or the process drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar, cast, overload

from bridge.clock import SYSTEM_CLOCK, Clock
from bridge.config import Settings
from bridge.envelope import Item, TaskEvent
from bridge.log.fanout import DRAINING, MOVED, Fanout, FeedClosed, TaskFeed
from bridge.log.indexer import Indexer, NotOwner
from bridge.log.reader import NotRetained, Reader, SeqUntrusted
from bridge.log.records import Batch
from bridge.metrics import StreamMetrics
from bridge.server.admission import Admission, Caller, Limits, Ticket
from bridge.server.pacing import ReplayPace
from bridge.server.wire import (
    INTERNAL_ERROR,
    RpcError,
    cursor_ahead_error,
    events_gone_error,
    seq_untrusted_error,
)

__all__ = ["Step", "StreamHub", "take_next"]

log = logging.getLogger(__name__)

#: A head that no cursor can be ahead of (a seq is below 2**63, like the offsets it counts).
_UNBOUNDED = 2**63

T = TypeVar("T", bound=Item)


class Step(enum.Enum):
    """What :func:`take_next` found after its batch."""

    MORE = "more"  # the events ran out: wait for more
    ENDED = "ended"  # the task's terminal status event was reached: the stream is complete
    GAP = "gap"  # a seq beyond last + 1: something is missing, re-read from Kafka


def take_next(
    batch: Batch[T],
    last: int,
    ends: Callable[[int, TaskEvent], bool],
    *,
    any_first: bool = False,
    end_type: str | None = None,
) -> tuple[Batch[T], int, Step]:
    """The one delivery rule of a stream: take exactly ``last + 1``, then the next, and so on.

    Returns the items taken (a :class:`Batch` again), the new ``last`` and why it stopped.
    Items at or below ``last`` were delivered already (or the cursor is past them) and are
    skipped; when one of them is the task's terminal status event (``ends``), nothing more is
    owed: ENDED. ``any_first`` lets the first item taken have any seq (no cursor: the earliest
    retained event comes first). With ``end_type``, ``ends`` is asked only about events of
    that type (no other can end the stream; wire members never can).

    A batch of consecutive seqs (every read's) is taken in slices, without a step per item:
    a replay takes thousands of events per call. Any other (the live buffer's, which may hold
    a duplicate or miss one) item by item; both give the same answer (tests hold them equal).
    """
    if type(batch.seqs) is range:
        return _take_run(batch, last, ends, any_first, end_type)
    return _take_each(batch, last, ends, any_first, end_type)


def _take_run(
    batch: Batch[T],
    last: int,
    ends: Callable[[int, TaskEvent], bool],
    any_first: bool,
    end_type: str | None,
) -> tuple[Batch[T], int, Step]:
    """:func:`take_next` of consecutive seqs: what is skipped and what is taken are two slices,
    and only the events among the items (``full``) are asked whether they end the stream."""
    items, offsets, n = batch.items, batch.offsets, len(batch.items)
    first = batch.seqs[0] if n else last + 1
    skip = min(n, max(0, last + 1 - first))  # at or below last: delivered, or before the cursor
    stop, step = n, Step.MORE
    for i in range(n) if batch.full is None else batch.full:
        event = items[i]
        assert isinstance(event, TaskEvent)  # full holds the events' indexes
        if (end_type is None or event.type == end_type) and ends(offsets[i], event):
            if i < skip:
                return batch.slice(0, 0), last, Step.ENDED
            stop, step = i + 1, Step.ENDED
            break
    if skip == n:
        return batch.slice(0, 0), last, Step.MORE
    if skip == 0 and first != last + 1 and not any_first:
        return batch.slice(0, 0), last, Step.GAP
    return batch.slice(skip, stop), first + stop - 1, step


def _take_each(
    batch: Batch[T],
    last: int,
    ends: Callable[[int, TaskEvent], bool],
    any_first: bool,
    end_type: str | None,
) -> tuple[Batch[T], int, Step]:
    """:func:`take_next` of any seqs, one item at a time."""
    taken: list[int] = []
    step = Step.MORE
    for i, (seq, offset, item) in enumerate(
        zip(batch.seqs, batch.offsets, batch.items, strict=True)
    ):
        event = item if isinstance(item, TaskEvent) else None
        ending = (
            event is not None
            and (end_type is None or event.type == end_type)
            and ends(offset, event)
        )
        if seq <= last:
            if ending:
                step = Step.ENDED
                break
            continue
        if seq != last + 1 and not any_first:
            step = Step.GAP
            break
        any_first = False
        last = seq
        taken.append(i)
        if ending:
            step = Step.ENDED
            break
    if len(taken) == len(batch.items):
        return batch, last, step
    return _pick(batch, taken), last, step


def _pick(batch: Batch[T], indexes: list[int]) -> Batch[T]:
    """The items of ``batch`` at ``indexes`` (ascending)."""
    seqs, offsets, items = batch.seqs, batch.offsets, batch.items
    full = batch.full
    if full is not None:
        events = set(full)
        full = [j for j, i in enumerate(indexes) if i in events]
    return Batch(
        [seqs[i] for i in indexes], [offsets[i] for i in indexes], [items[i] for i in indexes], full
    )


@dataclass(slots=True)
class _Position:
    """Where a stream stands: the last seq delivered (or its cursor), and whether the first
    seq taken may be any (no cursor: the earliest retained event comes first)."""

    last: int
    any_first: bool


class StreamHub:
    """Fans the indexer's live events out to the active streams of this process."""

    def __init__(
        self,
        settings: Settings,
        indexer: Indexer,
        reader: Reader,
        fanout: Fanout,
        metrics: StreamMetrics,
        clock: Clock = SYSTEM_CLOCK,
        on_paced: Callable[[float], object] = lambda seconds: None,
    ) -> None:
        """``clock``: the admission windows', the latency samples' and the replay pace's (a
        simulation's is virtual); ``on_paced`` counts the seconds catch-ups waited for the
        replay pace (``recovery.replay_events_per_s``)."""
        self.settings = settings
        self._on_paced = on_paced
        self.clock = clock
        self.indexer = indexer
        self.reader = reader
        self.fanout = fanout
        self.metrics = metrics
        self.draining = asyncio.Event()
        self._streams: dict[TaskFeed, Ticket] = {}
        #: Each open stream's last delivered seq (its cursor's at first, -1 without one): what
        #: it needs next from the log, for the distance to data loss (bridge.metrics).
        self._positions: dict[TaskFeed, int] = {}
        indexer.add_ownership_listener(self._partitions_moved)
        self.admission = Admission(
            Limits(
                streams_per_client=settings.streams.max_per_principal,
                opens_per_minute=settings.streams.opens_per_minute,
                streams_total=settings.streams.max_total,
            ),
            clock.monotonic,
        )
        self._status_type = settings.own_types.status

    def drain(self) -> None:
        """SIGTERM: end every stream now, without its result, so clients resume elsewhere."""
        self.draining.set()
        # Only the streams: the fan-out also serves calls waiting for a status, which go on.
        for feed in list(self._streams):
            feed.close(DRAINING)

    def _partitions_moved(self, gained: set[int], lost: set[int]) -> None:
        """End the streams of partitions this replica no longer owns, without their result:
        their clients resume on the new owner from their cursor. Kept partitions' streams go on."""
        if not lost:
            return
        for feed, ticket in list(self._streams.items()):
            if self.indexer.partition_of(feed.task_id) in lost:
                ticket.moved = True
                feed.close(MOVED)

    # --- admission -----------------------------------------------------------------------

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket:
        """Take the stream's slot before any byte of it is sent (see :mod:`admission`)."""
        ticket = self.admission.admit(caller, task_id, request_id)
        self.metrics.stream_started()
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give the slot back when the response ends, however it ends (idempotent)."""
        if not ticket.released:
            self.metrics.stream_ended()
        self.admission.release(ticket)

    def count_gone(self) -> None:
        """A stream refused with events_gone before it started."""
        self.metrics.refused_gone()

    def cancel(self, client: str, request_id: str | int) -> int:
        """``notifications/cancelled``: end the client's streams of that request id."""
        return self.admission.cancel(client, request_id)

    async def check_cursor(self, task_id: str, after: int | None) -> int | None:
        """Refuse before any byte of the stream is sent: events_gone, untrusted seq, and a
        cursor ahead of the log (a seq the task never had). Returns the partition's log start
        it looked up for a cursor (None without one), for :meth:`events` to read from.

        A cursor at or past this replica's head may have been handed out a moment ago by a
        replica that is further along: the view is first caught up with the partition's end
        (bounded), and only a cursor still ahead of everything committed is refused. When the
        catch-up cannot finish in time the stream is admitted; it then waits and ends at the
        task's terminal status like any other.
        """
        try:
            if after is None:
                await self.reader.head(task_id)  # refuses a task whose seq cannot be trusted
                return None
            head = await self.reader.head(task_id)
            if after >= head:
                head = await self._head_after_catch_up(task_id, head)
                if after >= head:
                    raise cursor_ahead_error(task_id, head)
            earliest, log_start = await self.reader.earliest(task_id)
        except SeqUntrusted as exc:
            raise seq_untrusted_error(exc.task_id, str(exc)) from None
        if after + 1 < earliest:
            raise events_gone_error(task_id, earliest)
        return log_start

    async def _head_after_catch_up(self, task_id: str, head: int) -> int:
        try:
            async with asyncio.timeout(self.settings.streams.cursor_catch_up_s):
                await self.indexer.catch_up()
        except TimeoutError:
            log.warning("catch-up for a cursor at the head of task %s timed out", task_id)
            return _UNBOUNDED
        return await self.reader.head(task_id)

    @overload
    def events(
        self,
        ticket: Ticket,
        after: int | None,
        log_start: int | None = None,
        *,
        wire: Literal[False] = False,
    ) -> AsyncIterator[Batch[TaskEvent] | None]: ...
    @overload
    def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool
    ) -> AsyncIterator[Batch[Item] | None]: ...
    def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool = False
    ) -> AsyncIterator[Batch[TaskEvent] | None] | AsyncIterator[Batch[Item] | None]:
        """The stream's events in seq order, in batches; ``None`` items are keep-alive ticks.
        ``log_start``: what :meth:`check_cursor` returned (its first read takes it).

        Ends after the task's terminal status event, or at once for a terminal task with
        nothing after the cursor; ends early (without a result, see ``ticket.cancelled``) when
        the client cancels the request or the process drains. Raises :class:`RpcError` for
        events_gone found mid-stream.

        ``wire``: the stream sends what it reads as it is, so a catch-up read may hand over an
        event as its checked wire members instead (:meth:`Reader.read_wire`); live events, and
        every event without ``wire``, are :class:`TaskEvent` s.
        """
        if wire:
            return self._events(ticket, after, log_start, wire=True)
        return cast(
            "AsyncIterator[Batch[TaskEvent] | None]", self._events(ticket, after, log_start)
        )

    async def _events(
        self, ticket: Ticket, after: int | None, log_start: int | None, *, wire: bool = False
    ) -> AsyncIterator[Batch[Item] | None]:
        """The one place the delivery rule is applied, to every batch of the stream: what
        history reads and the live buffer hand over (:meth:`_batches`)."""
        task_id = ticket.task_id
        m = self.metrics
        (m.opened_fresh if after is None else m.opened_resume)()
        partition = self.indexer.partition_of(task_id)
        at = _Position(-1 if after is None else after, after is None)
        ends = functools.partial(self._ends, task_id)
        status = self._status_type
        pace = self._pace()
        with self.fanout.subscribe(task_id, self.settings.streams.queue_size) as feed:
            ticket.on_cancel.append(feed.close)
            self._streams[feed] = ticket
            self._positions[feed] = at.last
            batches = self._batches(feed, partition, at, log_start, wire)
            try:
                # Closed at once when the stream stops early: a read leaves its shared scan.
                async with contextlib.aclosing(batches):
                    async for batch, live in batches:
                        if batch is None:
                            yield None  # idle: keep-alive
                            continue
                        taken, at.last, step = take_next(
                            batch, at.last, ends, any_first=at.any_first, end_type=status
                        )
                        del batch  # up to a whole fetch of records: not held while waiting
                        at.any_first = at.any_first and not taken
                        if step is Step.GAP:
                            if not live:
                                m.seq_gap()  # the canary's alarm: never expected
                                raise RpcError(
                                    INTERNAL_ERROR,
                                    "internal error: a seq gap in catch-up",
                                    {"taskId": task_id},
                                )
                            feed.lose()  # one is missing from the buffer: re-read from Kafka
                        if taken:
                            # Live events are never held; a catch-up waits for its pace.
                            paced = live or pace is None or await self._paced(pace, feed, taken)
                            if not paced:
                                return  # drained or cancelled while it waited
                            self._delivered(task_id, partition, taken, live=live)
                            self._positions[feed] = at.last
                            yield taken
                        del taken  # not held while the stream waits, maybe for hours
                        if step is Step.ENDED:
                            return
            except NotOwner:
                ticket.moved = True  # the partition moved during a read: resume at its owner
            finally:
                self._streams.pop(feed, None)
                self._positions.pop(feed, None)

    def positions(self) -> list[tuple[str, int]]:
        """``(task id, last delivered seq)`` of every open stream (-1: nothing delivered yet
        and no cursor): the oldest of these is what retention must not pass."""
        return [(feed.task_id, seq) for feed, seq in self._positions.items()]

    def _terminal_offset(self, task_id: str) -> int | None:
        found = self.indexer.lookup(task_id)
        if found is None or not found[1].terminal:
            return None
        return found[1].status_offset

    async def _batches(
        self, feed: TaskFeed, partition: int, at: _Position, log_start: int | None, wire: bool
    ) -> AsyncGenerator[tuple[Batch[Item] | None, bool], None]:
        """The stream's batches before the rule, each with whether it came live: catch-up
        reads from Kafka (history, or what the buffer dropped while the client was slow),
        then what the buffer collects; ``None`` when idle for the keep-alive interval."""
        task_id = feed.task_id
        keepalive = self.settings.streams.keepalive_s
        while True:
            if feed.closed or self.draining.is_set():
                return
            feed.reset()
            self.metrics.catchup_read()
            # Terminal before the read: the read reaches the head, past the terminal event (or
            # that event is gone with retention), so nothing can follow it live.
            terminal_before = self._terminal_offset(task_id) is not None
            try:
                cursor = None if at.any_first else at.last
                reading = (
                    self.reader.read_wire(task_id, cursor, log_start=log_start)
                    if wire
                    else self.reader.read_batches(task_id, cursor, log_start=log_start)
                )
                log_start = None  # the cursor check's: good for the first read only
                # Closed at once when the stream stops early: it leaves its shared scan.
                async with contextlib.aclosing(reading):
                    async for chunk in reading:
                        yield chunk, False
                        del chunk  # dropped before the next fetch
                del reading  # the finished read, likewise
            except NotRetained as exc:
                raise events_gone_error(task_id, exc.earliest_seq) from None
            except SeqUntrusted as exc:
                raise seq_untrusted_error(exc.task_id, str(exc)) from None
            if at.any_first:
                # Nothing retained: the next event is the task's earliest retained seq (its
                # head when everything is gone), whatever arrives live from here.
                try:
                    at.last = await self.reader.earliest_seq(task_id) - 1
                except SeqUntrusted as exc:
                    raise seq_untrusted_error(exc.task_id, str(exc)) from None
                at.any_first = False
            if terminal_before:
                return  # a finished task: everything retained after the cursor was replayed
            # Live: what the tail buffered, until the buffer overflows or misses one.
            while True:
                try:
                    woke = await feed.wait(keepalive)
                except FeedClosed:
                    return  # moved (the ticket says so), drained or cancelled
                self._refuse_untrusted(task_id, partition)
                if not woke:
                    yield None, True
                    continue
                if self.draining.is_set():
                    return
                if feed.overflowed:
                    break  # fell behind, or a gap: catch up from Kafka
                yield Batch.of(feed.take()), True

    def _pace(self) -> ReplayPace | None:
        """This stream's catch-up pace (None: not paced, the default)."""
        recovery = self.settings.recovery
        if recovery.replay_events_per_s <= 0:
            return None
        return ReplayPace(
            recovery.replay_events_per_s,
            recovery.replay_burst,
            clock=self.clock.monotonic,
            wait=self._pace_wait,
            on_paced=self._on_paced,
        )

    async def _paced(self, pace: ReplayPace, feed: TaskFeed, batch: Batch[Item]) -> bool:
        """Wait for the pace before a catch-up batch; False when the stream should end."""
        return await pace.take(len(batch)) and not feed.closed

    async def _pace_wait(self, seconds: float) -> bool:
        """A pace's wait: ``seconds``, or less when the process drains (then False)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.draining.wait()
        return not self.draining.is_set()

    def _refuse_untrusted(self, task_id: str, partition: int) -> None:
        """End a live stream whose task retention made untrusted while it waited: records of
        its partition were deleted before they were counted, so the seqs of what follows are
        not known (and its terminal status may be among them: the stream would never end).
        Per wake-up, so one flag is read (no hash of the id, no snapshot of the entry); a
        partition no longer owned is the feed's closure to report."""
        idx = self.indexer.partitions.get(partition)
        if idx is not None and not idx.trusts(task_id):
            raise seq_untrusted_error(task_id, str(SeqUntrusted(task_id)))

    def _delivered(self, task_id: str, partition: int, batch: Batch[Item], *, live: bool) -> None:
        """Count a batch about to be written: one backlog and one latency sample per write."""
        m = self.metrics
        m.delivered(len(batch))
        idx = self.indexer.partitions.get(partition)
        head = idx.next_seq_of(task_id) if idx is not None else None
        if head is not None:
            m.backlog(max(0, head - 1 - batch.seqs[-1]))
        first = batch.items[0]
        if live and isinstance(first, TaskEvent):  # the oldest event of the batch waited longest
            m.latency(max(0.0, self.clock.wall() - first.timestamp_ms / 1000))

    def _ends(self, task_id: str, offset: int, event: TaskEvent) -> bool:
        return event.type == self._status_type and self._terminal_offset(task_id) == offset

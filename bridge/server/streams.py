"""tasks/stream (SEP-2694): resumable, gap-free task event streams served from Kafka.

The :class:`StreamHub` serves each stream from a subscription to the process's fan-out of live
events (:mod:`bridge.log.fanout`, one Kafka tail for every stream): a stream first subscribes,
then reads history through the :class:`~bridge.log.reader.Reader` (checkpoint seek), then takes
what its bounded buffer collected. One rule (:func:`take_next`) delivers exactly ``last + 1``
each time, so nothing is skipped or repeated across the hand-off. A stream whose buffer
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
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Literal, Protocol, cast, overload

from bridge.clock import SYSTEM_CLOCK, Clock
from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.log.fanout import DRAINING, MOVED, Fanout, Subscription, SubscriptionClosed
from bridge.log.indexer import Indexer, NotOwner
from bridge.log.reader import NotRetained, ReadBatch, Reader, SeqUntrusted, WireBatch
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

__all__ = ["Step", "StreamHub", "take_next", "take_wire"]

log = logging.getLogger(__name__)

Batch = list[tuple[int, TaskEvent]]
#: A batch as a stream that sends it takes it: each event, or its wire JSON members (a str,
#: :class:`~bridge.log.reader.WireBatch`).
WireItems = list[tuple[int, TaskEvent | str]]

#: A head that no cursor can be ahead of (a seq is below 2**63, like the offsets it counts).
_UNBOUNDED = 2**63


class Step(enum.Enum):
    """What :func:`take_next` found after its batch."""

    MORE = "more"  # the events ran out: wait for more
    ENDED = "ended"  # the task's terminal status event was reached: the stream is complete
    GAP = "gap"  # a seq beyond last + 1: something is missing, re-read from Kafka


class Sequenced(Protocol):
    """An event with its seq and offset (:class:`ReadEvent` from history, or live)."""

    @property
    def seq(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def event(self) -> TaskEvent: ...


def take_next(
    events: Iterable[Sequenced],
    last: int,
    ends: Callable[[int, TaskEvent], bool],
    *,
    any_first: bool = False,
    end_type: str | None = None,
) -> tuple[Batch, int, Step]:
    """The one delivery rule of a stream: take exactly ``last + 1``, then the next, and so on.

    Returns the events taken, the new ``last`` and why it stopped. Events at or below ``last``
    were delivered already (or the cursor is past them) and are skipped; when one of them is the
    task's terminal status event (``ends``), nothing more is owed: ENDED. ``any_first`` lets the
    first event taken have any seq (no cursor: the earliest retained event comes first). With
    ``end_type``, ``ends`` is asked only about events of that type (no other can end the
    stream): a replay takes thousands of events per call.
    """
    batch: Batch = []
    append = batch.append
    items = (
        events.triples()
        if isinstance(events, ReadBatch)  # a read's columns: no object per event
        else ((item.seq, item.offset, item.event) for item in events)
    )
    for seq, offset, event in items:
        if seq <= last:
            if (end_type is None or event.type == end_type) and ends(offset, event):
                return batch, last, Step.ENDED
            continue
        if seq != last + 1 and not any_first:
            return batch, last, Step.GAP
        any_first = False
        last = seq
        append((seq, event))
        if (end_type is None or event.type == end_type) and ends(offset, event):
            return batch, last, Step.ENDED
    return batch, last, Step.MORE


def take_wire(
    batch: WireBatch,
    last: int,
    ends: Callable[[int, TaskEvent], bool],
    *,
    end_type: str,
    any_first: bool = False,
) -> tuple[WireItems, int, Step]:
    """:func:`take_next` of a read's :class:`~bridge.log.reader.WireBatch`, the same rule and
    answer without a step per event: its seqs are consecutive, so what is skipped and what
    is taken are two slices, and only its events (``batch.full``, a few) can be of
    ``end_type``, which no wire text is. ``ends`` is asked only about those."""
    first, items, offsets, full = batch.first, batch.items, batch.offsets, batch.full
    n = len(items)
    skip = min(n, max(0, last + 1 - first))  # at or below last: delivered, or before the cursor
    stop, step = n, Step.MORE
    for i in full:
        event = items[i]
        assert not isinstance(event, str)  # full holds the events' indexes
        if event.type == end_type and ends(offsets[i], event):
            if i < skip:
                return [], last, Step.ENDED
            stop, step = i + 1, Step.ENDED
            break
    if skip == n:
        return [], last, Step.MORE
    if skip == 0 and first != last + 1 and not any_first:
        return [], last, Step.GAP
    taken = list(zip(range(first + skip, first + stop), items[skip:stop], strict=True))
    return taken, first + stop - 1, step


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
        self._streams: dict[Subscription, Ticket] = {}
        #: Each open stream's last delivered seq (its cursor's at first, -1 without one): what
        #: it needs next from the log, for the distance to data loss (bridge.metrics).
        self._positions: dict[Subscription, int] = {}
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
        for sub in list(self._streams):
            sub.close(DRAINING)

    def _partitions_moved(self, gained: set[int], lost: set[int]) -> None:
        """End the streams of partitions this replica no longer owns, without their result:
        their clients resume on the new owner from their cursor. Kept partitions' streams go on."""
        if not lost:
            return
        for sub, ticket in list(self._streams.items()):
            if self.indexer.partition_of(sub.task_id) in lost:
                ticket.moved = True
                sub.close(MOVED)

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
    ) -> AsyncIterator[Batch | None]: ...
    @overload
    def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool
    ) -> AsyncIterator[WireItems | None]: ...
    def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool = False
    ) -> AsyncIterator[Batch | None] | AsyncIterator[WireItems | None]:
        """The stream's events in seq order, in batches; ``None`` items are keep-alive ticks.
        ``log_start``: what :meth:`check_cursor` returned (its first read takes it).

        Ends after the task's terminal status event, or at once for a terminal task with
        nothing after the cursor; ends early (without a result, see ``ticket.cancelled``) when
        the client cancels the request or the process drains. Raises :class:`RpcError` for
        events_gone found mid-stream.

        ``wire``: the stream sends what it reads as it is, so a catch-up read may hand over an
        event as its wire JSON members instead (a str, :meth:`Reader.read_wire`); live events,
        and every event without ``wire``, are :class:`TaskEvent` s.
        """
        if wire:
            return self._events(ticket, after, log_start, wire=True)
        return cast("AsyncIterator[Batch | None]", self._events(ticket, after, log_start))

    async def _events(
        self, ticket: Ticket, after: int | None, log_start: int | None, *, wire: bool = False
    ) -> AsyncIterator[WireItems | None]:
        task_id = ticket.task_id
        m = self.metrics
        (m.opened_fresh if after is None else m.opened_resume)()
        partition = self.indexer.partition_of(task_id)
        with self.fanout.subscribe(task_id, self.settings.streams.queue_size) as sub:
            ticket.on_cancel.append(sub.close)
            self._streams[sub] = ticket
            self._positions[sub] = -1 if after is None else after
            try:
                async for item in self._run(sub, partition, after, log_start, wire):
                    if item:
                        self._positions[sub] = item[-1][0]
                    yield item
                    del item  # not held while the stream waits
            except NotOwner:
                ticket.moved = True  # the partition moved during a read: resume at its owner
            finally:
                self._streams.pop(sub, None)
                self._positions.pop(sub, None)

    def positions(self) -> list[tuple[str, int]]:
        """``(task id, last delivered seq)`` of every open stream (-1: nothing delivered yet
        and no cursor): the oldest of these is what retention must not pass."""
        return [(sub.task_id, seq) for sub, seq in self._positions.items()]

    def _terminal_offset(self, task_id: str) -> int | None:
        found = self.indexer.lookup(task_id)
        if found is None or not found[1].terminal:
            return None
        return found[1].status_offset

    async def _run(
        self,
        sub: Subscription,
        partition: int,
        after: int | None,
        log_start: int | None,
        wire: bool,
    ) -> AsyncIterator[WireItems | None]:
        task_id = sub.task_id
        last = -1 if after is None else after
        any_first = after is None  # without a cursor the earliest retained seq comes first
        keepalive = self.settings.streams.keepalive_s
        ends = functools.partial(self._ends, task_id)
        status = self._status_type
        pace = self._pace()
        while True:
            if sub.closed or self.draining.is_set():
                return
            # Catch up from Kafka: history, or what the buffer dropped while the client was slow.
            sub.reset()
            self.metrics.catchup_read()
            # Terminal before the read: the read reaches the head, past the terminal event (or
            # that event is gone with retention), so nothing can follow it live.
            terminal_before = self._terminal_offset(task_id) is not None
            try:
                cursor = None if any_first else last
                reading = (
                    self.reader.read_wire(task_id, cursor, log_start=log_start)
                    if wire
                    else self.reader.read_batches(task_id, cursor, log_start=log_start)
                )
                log_start = None  # the cursor check's: good for the first read only
                # Closed at once when the stream stops early: it leaves its shared scan.
                async with contextlib.aclosing(reading):
                    async for chunk in reading:
                        batch: WireItems
                        if isinstance(chunk, WireBatch):
                            batch, last, step = take_wire(
                                chunk, last, ends, any_first=any_first, end_type=status
                            )
                        else:
                            batch, last, step = take_next(  # type: ignore[assignment]
                                chunk, last, ends, any_first=any_first, end_type=status
                            )
                        any_first = False if batch else any_first
                        if step is Step.GAP:
                            self.metrics.seq_gap()  # the canary's alarm: never expected
                            raise RpcError(
                                INTERNAL_ERROR,
                                "internal error: a seq gap in catch-up",
                                {"taskId": task_id},
                            )
                        if batch:
                            if pace is not None and not await self._paced(pace, sub, batch):
                                return  # drained or cancelled while it waited
                            self._delivered(task_id, partition, batch, live=False)
                            yield batch
                        if step is Step.ENDED:
                            return
                        # Dropped before the next fetch, and never held by an idle stream
                        # afterwards: a chunk is up to a whole fetch of records.
                        del chunk, batch
                del reading  # the finished read, likewise
            except NotRetained as exc:
                raise events_gone_error(task_id, exc.earliest_seq) from None
            except SeqUntrusted as exc:
                raise seq_untrusted_error(exc.task_id, str(exc)) from None
            if any_first:
                # Nothing retained: the next event is the task's earliest retained seq (its
                # head when everything is gone), whatever arrives live from here.
                try:
                    last = await self.reader.earliest_seq(task_id) - 1
                except SeqUntrusted as exc:
                    raise seq_untrusted_error(exc.task_id, str(exc)) from None
                any_first = False
            if terminal_before:
                return  # a finished task: everything retained after the cursor was replayed
            # Live: take what the tail buffered, delivering exactly last + 1 each time.
            while True:
                try:
                    woke = await sub.wait(keepalive)
                except SubscriptionClosed:
                    return  # moved (the ticket says so), drained or cancelled
                self._refuse_untrusted(task_id, partition)
                if not woke:
                    yield None  # idle: keep-alive
                    continue
                if self.draining.is_set():
                    return
                if sub.overflowed:
                    break  # fell behind: catch up from Kafka
                live, last, step = take_next(sub.take(), last, ends, end_type=status)
                if live:
                    self._delivered(task_id, partition, live, live=True)
                    yield live  # type: ignore[misc]
                del live  # not held while the stream waits, maybe for hours
                if step is Step.ENDED:
                    return
                if step is Step.GAP:
                    break  # something is missing from the buffer: re-read from Kafka

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

    async def _paced(self, pace: ReplayPace, sub: Subscription, batch: WireItems) -> bool:
        """Wait for the pace before a catch-up batch; False when the stream should end."""
        return await pace.take(len(batch)) and not sub.closed

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
        partition no longer owned is the subscription's closure to report."""
        idx = self.indexer.partitions.get(partition)
        if idx is not None and not idx.trusts(task_id):
            raise seq_untrusted_error(task_id, str(SeqUntrusted(task_id)))

    def _delivered(
        self, task_id: str, partition: int, batch: WireItems | Batch, *, live: bool
    ) -> None:
        """Count a batch about to be written: one backlog and one latency sample per write."""
        m = self.metrics
        m.delivered(len(batch))
        idx = self.indexer.partitions.get(partition)
        head = idx.next_seq_of(task_id) if idx is not None else None
        if head is not None:
            m.backlog(max(0, head - 1 - batch[-1][0]))
        first = batch[0][1]
        if live and isinstance(first, TaskEvent):  # the oldest event of the batch waited longest
            m.latency(max(0.0, self.clock.wall() - first.timestamp_ms / 1000))

    def _ends(self, task_id: str, offset: int, event: TaskEvent) -> bool:
        return event.type == self._status_type and self._terminal_offset(task_id) == offset

"""Event sources of the Events extension (SEP-3415), read from the bridge's Kafka log.

:class:`TaskEvents` serves one task's own event stream as an event type: arguments
``{taskId}``, the same authorization as tasks/get, ``eventId`` ``<taskId>.<seq>`` (the same on
every replica and after restarts, because seq is derived from the log), ``data``
``{seq, type, payload}``. History comes from the reader (checkpoint seek), live events from the
process's fan-out; a cursor older than retention resumes at the earliest retained seq with
``truncated``. Poll and push share the one read rule (:meth:`TaskEvents._history`). A cursor
names its task and must not be past the task's head (:meth:`TaskEvents._resumed`). A push
stream heartbeats whenever it sent nothing for a period, in its replay from Kafka as live.

No JSON-RPC here: unknown or foreign tasks raise the task service's ``TaskNotFound`` and bad
arguments :class:`InvalidArguments`; :mod:`bridge.server.events` maps them to wire errors. When
replicas divide the partitions and the task's partition moves to another replica while a push
stream is open, the stream raises :class:`Moved`: it ends without its final result, so the
client resumes with its cursor wherever the task is served now. A task that retention made
untrusted (records of its partition deleted before they were counted) raises the reader's
``SeqUntrusted``, in its history read and, checked after each wait, in its live phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import jsonschema

from bridge.envelope import TaskEvent
from bridge.events_extension.cursor import decode_task, encode_task
from bridge.events_extension.occurrences import (
    Active,
    Heartbeat,
    Occurrence,
    PollBatch,
    StreamItem,
    task_event_id,
)
from bridge.events_extension.pacing import Waiting, paced
from bridge.log.fanout import FeedClosed
from bridge.log.indexer import NotOwner
from bridge.log.reader import NotRetained
from bridge.vocabulary import TERMINAL_WIRE

__all__ = [
    "CursorAhead",
    "EventSource",
    "InvalidArguments",
    "Moved",
    "TaskEvents",
    "TaskLog",
    "TaskLookup",
]

T = TypeVar("T")

#: Retention can move the log start again while a gap is being resumed from: retry this often.
_GAP_ATTEMPTS = 5


class InvalidArguments(ValueError):
    """Subscription arguments that do not match the event type's ``inputSchema``."""


class CursorAhead(ValueError):
    """A task event cursor past the task's last event: a seq the task never had."""

    def __init__(self, task_id: str, next_seq: int) -> None:
        super().__init__(
            f"the cursor is past the last event of the task (its next seq is {next_seq})"
        )
        self.task_id = task_id
        self.next_seq = next_seq


class Moved(Exception):
    """The task's partition moved to another replica while its push stream was open."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"the partition of task {task_id!r} moved to another replica")
        self.task_id = task_id


class Sequenced(Protocol):
    """An event with its seq (a reader's ``ReadEvent`` or a live ``IndexedEvent``)."""

    @property
    def seq(self) -> int: ...
    @property
    def event(self) -> TaskEvent: ...


class TaskView(Protocol):
    @property
    def poll_interval_ms(self) -> int: ...
    @property
    def status(self) -> str: ...


class TaskLookup(Protocol):
    """tasks/get's authorization (:class:`~bridge.tasks.service.TaskService`)."""

    async def get(self, task_id: str, principal: str) -> Any: ...


class TaskLog(Protocol):
    """A task's retained events by seq (:class:`~bridge.log.reader.Reader`)."""

    async def head(self, task_id: str) -> int:
        """The task's next seq; :class:`~bridge.log.reader.SeqUntrusted` once retention
        deleted records of its partition before they were counted."""
        ...

    def read_batches(
        self, task_id: str, after: int | None = None
    ) -> AsyncIterator[Iterable[Sequenced]]: ...


class LiveFeed(Protocol):
    """A task's live feed from the fan-out (:class:`~bridge.log.fanout.TaskFeed`)."""

    overflowed: bool
    closed: bool

    async def wait(self, idle_s: float | None = None) -> bool:
        """False when idle ``idle_s``; :class:`FeedClosed` once closed."""
        ...

    def take(self) -> Iterable[Sequenced]: ...

    def reset(self) -> None: ...


class LiveEvents(Protocol):
    """The process's fan-out of live events (:class:`~bridge.log.fanout.Fanout`)."""

    def subscribe(self, task_id: str, limit: int) -> AbstractContextManager[Any]: ...


class EventSource(Protocol):
    """One event type: its ``events/list`` entry, poll, and push."""

    name: str

    def descriptor(self) -> dict[str, Any]: ...

    async def authorize(self, principal: str, arguments: dict[str, Any]) -> None:
        """Raise what a new subscription would raise when ``principal`` may no longer read
        ``arguments`` (a push stream checks it again at each heartbeat)."""

    async def poll(
        self,
        principal: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
        max_events: int,
    ) -> PollBatch: ...

    async def open_stream(
        self,
        principal: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
    ) -> AsyncIterator[StreamItem]:
        """Authorize the caller and validate the arguments and the cursor (raising what the
        SEP answers at once), then the stream's items. Nothing is read from the log until they
        are iterated: the caller admits the stream in between."""
        ...


@dataclass(frozen=True, slots=True)
class _Gap:
    """History resumes after ``last``: what came before it is no longer retained."""

    last: int


TASK_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"taskId": {"type": "string", "minLength": 1, "description": "The task"}},
    "required": ["taskId"],
    "additionalProperties": False,
}

TASK_PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "seq": {"type": "integer", "minimum": 0, "description": "The event's seq in its task"},
        "type": {"type": "string", "description": "The task event's type"},
        "payload": {"type": "object", "description": "The task event's payload"},
    },
    "required": ["seq", "type", "payload"],
}


@contextlib.asynccontextmanager
async def _closing(items: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an async generator left early (its Kafka reads stop now, not at garbage time)."""
    try:
        yield items
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def validated(validator: jsonschema.protocols.Validator, arguments: dict[str, Any]) -> None:
    """Raise :class:`InvalidArguments` naming the first rule ``arguments`` break."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise InvalidArguments(f"arguments: {where} fails the '{error.validator}' rule")


class TaskEvents:
    """A task's own events as an event type (see the module docstring)."""

    def __init__(
        self,
        name: str,
        tasks: TaskLookup,
        log: TaskLog,
        live: LiveEvents,
        *,
        status_type: str,
        queue_size: int,
        heartbeat_s: float,
        stopping: asyncio.Event | None = None,
        now_ms: Callable[[], int] = _now_ms,
        clock: Callable[[], float] = time.monotonic,
        catch_up: Callable[[], Awaitable[None]] | None = None,
        catch_up_s: float = 5.0,
        bind_cursors: bool = True,
    ) -> None:
        self.name = name
        self.tasks = tasks
        self.log = log
        self.live = live
        self.status_type = status_type
        self.queue_size = queue_size
        self.heartbeat_s = heartbeat_s
        self.stopping = stopping or asyncio.Event()
        self.now_ms = now_ms
        #: The heartbeat's clock (seconds, monotonic), apart so that tests can drive it.
        self.clock = clock
        #: Catches this replica's index up with the log (:meth:`Indexer.catch_up`): a cursor
        #: at or past the head may come from a replica that is further along.
        self.catch_up = catch_up
        self.catch_up_s = catch_up_s
        #: Mint cursors that name their task (``t2``); False: the ``t1`` form of 8fd441c, while a
        #: rolling upgrade from it has replicas of both versions serving.
        self.bind_cursors = bind_cursors
        self._validator = jsonschema.Draft202012Validator(TASK_INPUT_SCHEMA)

    def cursor(self, task_id: str, last: int) -> str:
        """The cursor after seq ``last`` of ``task_id`` (the one place this source mints one)."""
        return encode_task(last, task_id if self.bind_cursors else None)

    def descriptor(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "Every event of one of your tasks, in seq order (tasks/stream's "
            "events); resumable from the cursor while the log retains them",
            "delivery": ["poll", "push"],
            "inputSchema": TASK_INPUT_SCHEMA,
            "payloadSchema": TASK_PAYLOAD_SCHEMA,
        }

    async def _authorized(self, principal: str, arguments: dict[str, Any]) -> tuple[str, Any]:
        """The task id and its view; TaskNotFound for a task the caller may not see."""
        validated(self._validator, arguments)
        task_id = str(arguments["taskId"])
        return task_id, await self.tasks.get(task_id, principal)

    async def authorize(self, principal: str, arguments: dict[str, Any]) -> None:
        """TaskNotFound once the caller may no longer see the task (tasks/get's answer)."""
        await self._authorized(principal, arguments)

    async def _resumed(self, task_id: str, cursor: str) -> int:
        """The last seq ``cursor`` names: BadCursor for another task's cursor, CursorAhead for
        one past the task's head, after this replica's index caught up (bounded: on timeout
        the cursor is taken, and a read from it finds nothing until the task gets there)."""
        last = decode_task(cursor, task_id)
        head = await self.log.head(task_id)
        if last < head or self.catch_up is None:
            if last >= head:
                raise CursorAhead(task_id, head)
            return last
        try:
            async with asyncio.timeout(self.catch_up_s):
                await self.catch_up()
        except TimeoutError:
            return last
        head = await self.log.head(task_id)
        if last >= head:
            raise CursorAhead(task_id, head)
        return last

    def occurrence(self, task_id: str, seq: int, event: TaskEvent) -> Occurrence:
        return Occurrence(
            event_id=task_event_id(task_id, seq),
            name=self.name,
            timestamp_ms=event.timestamp_ms,
            data={"seq": seq, "type": event.type, "payload": event.payload},
            cursor=self.cursor(task_id, seq),
        )

    def ends(self, event: TaskEvent) -> bool:
        return event.type == self.status_type and event.payload.get("status") in TERMINAL_WIRE

    async def _history(
        self, task_id: str, last: int, patience: Callable[[], float] | None = None
    ) -> AsyncIterator[Sequenced | _Gap | Waiting]:
        """Retained events after seq ``last`` up to the indexed head, in seq order; a
        :class:`_Gap` first when retention deleted some of them; with ``patience``, a
        :data:`~bridge.events_extension.pacing.WAITING` whenever a read keeps it waiting that long."""
        for _ in range(_GAP_ATTEMPTS):
            try:
                async with (
                    _closing(self.log.read_batches(task_id, last if last >= 0 else None)) as reads,
                    _closing(paced(reads, patience)) as batches,
                ):
                    async for batch in batches:
                        if isinstance(batch, Waiting):
                            yield batch
                            continue
                        for item in batch:
                            if item.seq > last + 1:
                                yield _Gap(item.seq - 1)
                            last = item.seq
                            yield item
                return
            except NotRetained as exc:
                last = exc.earliest_seq - 1
                yield _Gap(last)
        raise RuntimeError(f"retention kept moving while reading task {task_id!r}")

    # --- poll ----------------------------------------------------------------------------

    async def poll(
        self,
        principal: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
        max_events: int,
    ) -> PollBatch:
        """Events after ``cursor`` (``None``: none, a cursor at the head), at most
        ``max_events``; ``max_age_ms`` skips older ones (and says so with ``truncated``)."""
        task_id, view = await self._authorized(principal, arguments)
        next_poll_ms = max(int(view.poll_interval_ms), 1000)
        if cursor is None:
            head = await self.log.head(task_id)
            return PollBatch([], self.cursor(task_id, head - 1), False, False, next_poll_ms)
        last = await self._resumed(task_id, cursor)
        floor = None if max_age_ms is None else self.now_ms() - max_age_ms
        events: list[Occurrence] = []
        truncated, resumed = False, None
        async with _closing(self._history(task_id, last)) as history:
            async for item in history:
                if len(events) >= max_events:
                    break
                if isinstance(item, Waiting):
                    continue
                if isinstance(item, _Gap):
                    last = item.last
                elif floor is not None and item.event.timestamp_ms < floor:
                    last = item.seq  # older than the client asked for: skipped
                else:
                    last = item.seq
                    events.append(self.occurrence(task_id, item.seq, item.event))
                    continue
                truncated, resumed = True, self.cursor(task_id, last)
        has_more = last < await self.log.head(task_id) - 1
        cursor = self.cursor(task_id, last)
        return PollBatch(events, cursor, truncated, has_more, next_poll_ms, resumed)

    # --- push ----------------------------------------------------------------------------

    async def open_stream(
        self,
        principal: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
    ) -> AsyncIterator[StreamItem]:
        """Check the subscription (raising before any byte is sent), then its stream items."""
        task_id, _ = await self._authorized(principal, arguments)
        last = None if cursor is None else await self._resumed(task_id, cursor)
        floor = None if max_age_ms is None or last is None else self.now_ms() - max_age_ms
        return self._stream(task_id, principal, last, floor)

    async def _stream(
        self, task_id: str, principal: str, last: int | None, floor: int | None
    ) -> AsyncIterator[StreamItem]:
        """``active`` first, then events as they are committed, heartbeats when idle; ends
        after the task's terminal status event, or without a word when the process stops;
        raises :class:`Moved` when the task's partition goes to another replica."""
        with self.live.subscribe(task_id, self.queue_size) as sub:
            try:
                async for item in self._followed(task_id, principal, sub, last, floor):
                    yield item
            except NotOwner:
                raise Moved(task_id) from None

    async def _followed(
        self, task_id: str, principal: str, sub: LiveFeed, last: int | None, floor: int | None
    ) -> AsyncIterator[StreamItem]:
        """:meth:`_stream`'s items while the subscription is open and the process runs."""
        if last is None:
            last = await self.log.head(task_id) - 1
        yield Active(self.cursor(task_id, last), False)
        sent_at = self.clock()
        while not (self.stopping.is_set() or sub.closed):
            sub.reset()  # history from Kafka: at the start, and after the buffer overflowed
            finished = (await self.tasks.get(task_id, principal)).status in TERMINAL_WIRE
            tail = _Tail(self, task_id, last, floor, sent_at)
            async with _closing(self._history(task_id, last, tail.patience)) as history:
                async for item in history:
                    for out in [] if isinstance(item, Waiting) else tail.step(item):
                        yield out
                    if tail.ended:
                        return
                    if tail.due():  # a replay skipping old events still says where it is
                        yield tail.heartbeat()
            for out in tail.caught_up():
                yield out
            last, floor, sent_at = tail.last, None, tail.sent_at
            if finished:
                return  # the terminal status event was at or before the head just read
            async for out in self._live(task_id, sub, tail):
                yield out
            if tail.ended:
                return
            last, sent_at = tail.last, tail.sent_at
        if not self.stopping.is_set():
            # The fan-out closes a subscription only for a partition this replica lost.
            raise Moved(task_id)

    async def _live(self, task_id: str, sub: LiveFeed, tail: _Tail) -> AsyncIterator[StreamItem]:
        """Live events from the fan-out while they follow on; returns to re-read from Kafka
        after an overflow or a gap, and at the end."""
        while not self.stopping.is_set():
            try:
                woke = await sub.wait(max(tail.patience(), 0.0))
            except FeedClosed:
                return  # its partition moved: the caller says so
            await self._trusted(task_id)
            if not woke:
                yield tail.heartbeat()
                continue
            if sub.overflowed:
                return
            for item in sub.take():
                if item.seq <= tail.last:
                    continue
                if item.seq != tail.last + 1:
                    return  # a gap in the buffer: re-read from Kafka
                for out in tail.step(item):
                    yield out
                if tail.ended:
                    return
            if tail.due():  # only events already sent came: still say where the stream is
                yield tail.heartbeat()

    async def _trusted(self, task_id: str) -> None:
        """Raise :class:`~bridge.log.reader.SeqUntrusted` (as its history read would) once
        retention made the task untrusted while its stream waited live: records of its
        partition were deleted before they were counted, so the seqs of what follows are not
        known (and its terminal status may be among them: the stream would never end). The
        rule is the reader's: its ``head`` refuses an untrusted task (``NotOwner`` once the
        partition moved, which the stream reports as :class:`Moved`)."""
        await self.log.head(task_id)


class _Tail:
    """Where a push stream stands: the last seq sent, the age floor, whether it has ended, and
    when it last sent anything (for the heartbeat, in every phase)."""

    def __init__(
        self, source: TaskEvents, task_id: str, last: int, floor: int | None, sent_at: float
    ) -> None:
        self.source = source
        self.task_id = task_id
        self.last = last
        self.floor = floor
        self.ended = False
        self.skipped = False
        self.sent_at = sent_at

    def _cursor(self, last: int) -> str:
        return self.source.cursor(self.task_id, last)

    def _sent(self, out: list[StreamItem]) -> list[StreamItem]:
        if out:
            self.sent_at = self.source.clock()
        return out

    def due(self) -> bool:
        """Nothing sent for a heartbeat period."""
        return self.patience() <= 0

    def patience(self) -> float:
        """How long a read may keep the stream quiet before a heartbeat is due."""
        return self.source.heartbeat_s - (self.source.clock() - self.sent_at)

    def heartbeat(self) -> Heartbeat:
        """A heartbeat at the last seq checked (a reconnect with it goes on from there)."""
        self.sent_at = self.source.clock()
        return Heartbeat(self._cursor(self.last))

    def step(self, item: Sequenced | _Gap) -> list[StreamItem]:
        """What to send for ``item``: a fresh ``active`` for a gap or an age skip (also when
        the skipped event was the task's last: the skip is said before the stream ends)."""
        source = self.source
        if isinstance(item, _Gap):
            self.last = item.last
            return self._sent([Active(self._cursor(self.last), True)])
        self.last = item.seq
        self.ended = source.ends(item.event)
        if self.floor is not None and item.event.timestamp_ms < self.floor:
            self.skipped = True
            return self.caught_up() if self.ended else []
        out: list[StreamItem] = []
        if self.skipped:
            self.skipped = False
            out.append(Active(self._cursor(item.seq - 1), True))
        out.append(source.occurrence(self.task_id, item.seq, item.event))
        return self._sent(out)

    def caught_up(self) -> list[StreamItem]:
        """At the end of history: a skip not yet announced is announced now."""
        if not self.skipped:
            return []
        self.skipped = False
        return self._sent([Active(self._cursor(self.last), True)])

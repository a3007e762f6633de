"""Events of one task from now on: the indexer's live events fanned out to bounded buffers.

One :class:`Fanout` listens on the process's indexer (whose tail is the only Kafka reader of live
events) and offers every indexed event to the feeds of its task, never waiting: a
:class:`TaskFeed` is a bounded buffer that, when it overflows, drops what it holds and says
so (``overflowed``). Its owner then re-reads from Kafka (a stream) or re-reads the task's state
(a call waiting for a status): no reader is ever slowed by a slow consumer, and nothing is
lost, because the log still has it.

A closed feed (its partition moved to another replica, the process is draining, its
owner cancelled it) cannot be missed: :meth:`TaskFeed.wait` first hands out what was
buffered before the close (a task's final status may arrive in the same loop turn as the move),
then raises :class:`FeedClosed`, before suspending and on waking, so no waiter can loop
on it without an await that suspends.

The fan-out looks only at an event's task id, never at the event: the tail hands over records
of other types undecoded (:class:`~bridge.log.indexer.IndexedEvent` decodes on first access), so
an event is decoded only when a subscriber reads it, and most tasks have no subscriber.

The stream hub and the task service both subscribe here; this module knows nothing of either.
The buffer itself, :class:`LiveBuffer`, is the bridge's one bounded live buffer: the Events
topic tail (:mod:`bridge.events_extension.kafkalog`) offers its chunks to the same class, weighed by
their records.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from bridge.log.indexer import IndexedEvent, Indexer

__all__ = [
    "CANCELLED",
    "DRAINING",
    "MOVED",
    "Fanout",
    "FeedClosed",
    "LiveBuffer",
    "TaskFeed",
]

T = TypeVar("T")

#: Why a feed was closed (:attr:`FeedClosed.reason`).
MOVED = "moved"
DRAINING = "draining"
CANCELLED = "cancelled"


class FeedClosed(Exception):
    """Nothing more will arrive on a feed: :meth:`TaskFeed.wait` raises this
    once it is closed. ``reason`` is :data:`MOVED` when the task's partition moved to another
    replica (its owner serves the task now), :data:`DRAINING` when this process is draining,
    :data:`CANCELLED` when its owner ended it."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(task_id, reason)
        self.task_id = task_id
        self.reason = reason

    @property
    def moved(self) -> bool:
        """True when the task's partition moved to another replica."""
        return self.reason == MOVED

    def __str__(self) -> str:
        return f"the live events of task {self.task_id} ended here ({self.reason})"


class LiveBuffer(Generic[T]):
    """One subscriber's bounded buffer of live items, closed explicitly: the one bounded live
    buffer of the bridge (a task's events here, a topic's chunks in
    :mod:`bridge.events_extension.kafkalog`).

    ``limit`` bounds the total ``weigh`` of what it holds (each item weighs 1 when ``weigh``
    is None). Past it, it drops everything and says ``overflowed``: the owner reads the log
    again instead of the producer waiting for it; nothing more is buffered until
    :meth:`reset`. ``name`` is what it follows (a task id, a topic), named by
    :class:`FeedClosed`.
    """

    __slots__ = (
        "buffer",
        "closed",
        "limit",
        "name",
        "overflowed",
        "reason",
        "size",
        "waiter",
        "weigh",
    )

    def __init__(self, name: str, limit: int, weigh: Callable[[T], int] | None = None) -> None:
        self.name = name
        self.limit = limit
        self.weigh = weigh
        #: Made by the first offer: a deque allocates a 64-slot block (~600 B) at once, and most
        #: feeds (idle streams) never hold an event.
        self.buffer: deque[T] | None = None
        #: The weight held (the number of items when ``weigh`` is None).
        self.size = 0
        self.overflowed = False
        self.closed = False
        #: Why it was closed (:data:`MOVED`, :data:`DRAINING`, :data:`CANCELLED`), once it is.
        self.reason: str | None = None
        self.waiter: asyncio.Future[bool] | None = None

    def offer(self, item: T) -> bool:
        """Buffer a live item; False (and overflowed) when the subscriber is too far behind."""
        if self.overflowed:
            return False
        weight = 1 if self.weigh is None else self.weigh(item)
        if self.size + weight > self.limit:
            self.lose()
            return False
        if self.buffer is None:
            self.buffer = deque()
        self.buffer.append(item)
        self.size += weight
        self._wake()
        return True

    def lose(self) -> None:
        """Drop what is buffered and say ``overflowed`` (what was offered, or is about to be,
        cannot be trusted: the owner reads the log again); wakes the waiter."""
        self.overflowed = True
        self._clear()
        self._wake()

    def take(self) -> list[T]:
        """Everything buffered, oldest first; the buffer is empty afterwards."""
        if not self.buffer:
            return []
        taken = list(self.buffer)
        self._clear()
        return taken

    def reset(self) -> None:
        """Forget the buffer and the overflow (the owner is about to re-read from Kafka)."""
        self.overflowed = False
        self._clear()

    def _clear(self) -> None:
        if self.buffer is not None:
            self.buffer.clear()
        self.size = 0

    def close(self, reason: str = CANCELLED) -> None:
        """End the feed from outside (a move, a drain, a cancellation): its waiter
        wakes and raises :class:`FeedClosed`. The first reason given is kept."""
        if not self.closed:
            self.closed, self.reason = True, reason
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(True)

    async def wait(self, idle_s: float | None = None) -> bool:
        """Wait up to ``idle_s`` seconds (for ever if None) for something to do; False when
        idle that long. Once the feed is closed: True while it still holds items to
        :meth:`take` (what arrived before the close is delivered, not lost), then
        :class:`FeedClosed`, at once, without suspending: a loop around it that takes
        what it is given ends instead of spinning."""
        if self._ready():
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiter = waiter
        # A bare timer that resolves the future, not asyncio.timeout: that one cancels and
        # un-cancels the task, and with a thousand live streams this wait runs for each of
        # them on every event of their tasks.
        timer = None if idle_s is None else loop.call_later(idle_s, _idle, waiter)
        try:
            woke = await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()
        return self._ready() or woke

    def _ready(self) -> bool:
        """True when there is something to take; :class:`FeedClosed` when closed and
        there is not. A closed feed that overflowed has nothing to take: what it
        dropped is re-read from the task's new owner, not from here."""
        if self.closed:
            if self.buffer and not self.overflowed:
                return True
            raise FeedClosed(self.name, self.reason or CANCELLED)
        return bool(self.buffer) or self.overflowed


class TaskFeed(LiveBuffer[IndexedEvent]):
    """One subscriber's place in the fan-out: a bounded buffer of one task's events (a task
    stream's, a call's waiting for a status, a listen's), named for what it carries."""

    __slots__ = ()

    def __init__(self, task_id: str, limit: int) -> None:
        super().__init__(task_id, limit)

    @property
    def task_id(self) -> str:
        """The task whose events it holds."""
        return self.name


def _idle(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Fanout:
    """Offers each indexed event to the feeds of its task, never blocking the tail."""

    def __init__(self, indexer: Indexer, on_overflow: Callable[[], None] | None = None) -> None:
        # Dicts used as ordered sets: subscribers are offered events and closed in the order
        # they subscribed, so a simulated run replays exactly (a set of objects iterates in
        # memory-address order, which differs from run to run).
        self._feeds: dict[str, dict[TaskFeed, None]] = defaultdict(dict)
        self._on_overflow = on_overflow
        self._partition_of = indexer.partition_of
        indexer.add_listener(self._on_event)
        indexer.add_ownership_listener(self._partitions_moved)

    @contextlib.contextmanager
    def subscribe(self, task_id: str, limit: int) -> Iterator[TaskFeed]:
        """Events of ``task_id`` indexed from now on, while in the block."""
        feed = TaskFeed(task_id, limit)
        self._feeds[task_id][feed] = None
        try:
            yield feed
        finally:
            feeds = self._feeds[task_id]
            feeds.pop(feed, None)
            if not feeds:
                del self._feeds[task_id]

    def _partitions_moved(self, gained: set[int], lost: set[int]) -> None:
        """Close the feeds of tasks in partitions this process no longer indexes:
        nothing more will arrive on them here (their owner serves them now)."""
        if not lost:
            return
        for task_id, feeds in self._feeds.items():
            if self._partition_of(task_id) in lost:
                for feed in feeds:
                    feed.close(MOVED)

    def _on_event(self, indexed: IndexedEvent) -> None:
        for feed in self._feeds.get(indexed.task_id, ()):
            if not feed.overflowed and not feed.offer(indexed) and self._on_overflow is not None:
                self._on_overflow()

"""Events of one task from now on: the indexer's live events fanned out to bounded buffers.

One :class:`Fanout` listens on the process's indexer (whose tail is the only Kafka reader of live
events) and offers every indexed event to the subscriptions of its task, never waiting: a
:class:`Subscription` is a bounded buffer that, when it overflows, drops what it holds and says
so (``overflowed``). Its owner then re-reads from Kafka (a stream) or re-reads the task's state
(a call waiting for a status): no reader is ever slowed by a slow consumer, and nothing is
lost, because the log still has it.

A closed subscription (its partition moved to another replica, the process is draining, its
owner cancelled it) cannot be missed: :meth:`Subscription.wait` first hands out what was
buffered before the close (a task's final status may arrive in the same loop turn as the move),
then raises :class:`SubscriptionClosed`, before suspending and on waking, so no waiter can loop
on it without an await that suspends.

The fan-out looks only at an event's task id, never at the event: the tail hands over records
of other types undecoded (:class:`~bridge.log.indexer.IndexedEvent` decodes on first access), so
an event is decoded only when a subscriber reads it, and most tasks have no subscriber.

The stream hub and the task service both subscribe here; this module knows nothing of either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterator

from bridge.log.indexer import IndexedEvent, Indexer

__all__ = ["CANCELLED", "DRAINING", "MOVED", "Fanout", "Subscription", "SubscriptionClosed"]

#: Why a subscription was closed (:attr:`SubscriptionClosed.reason`).
MOVED = "moved"
DRAINING = "draining"
CANCELLED = "cancelled"


class SubscriptionClosed(Exception):
    """Nothing more will arrive on a subscription: :meth:`Subscription.wait` raises this
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


class Subscription:
    """One subscriber's place in the fan-out: a bounded buffer the tail appends to."""

    __slots__ = ("buffer", "closed", "limit", "overflowed", "reason", "task_id", "waiter")

    def __init__(self, task_id: str, limit: int) -> None:
        self.task_id = task_id
        self.limit = limit
        #: Made by the first offer: a deque allocates a 64-slot block (~600 B) at once, and most
        #: subscriptions (idle streams) never hold an event.
        self.buffer: deque[IndexedEvent] | None = None
        self.overflowed = False
        self.closed = False
        #: Why it was closed (:data:`MOVED`, :data:`DRAINING`, :data:`CANCELLED`), once it is.
        self.reason: str | None = None
        self.waiter: asyncio.Future[bool] | None = None

    def offer(self, indexed: IndexedEvent) -> bool:
        """Buffer a live event; False (and overflowed) when the subscriber is too far behind."""
        if self.buffer is None:
            self.buffer = deque()
        if len(self.buffer) >= self.limit:
            self.overflowed = True
            self.buffer.clear()
        else:
            self.buffer.append(indexed)
        self._wake()
        return not self.overflowed

    def take(self) -> list[IndexedEvent]:
        """Everything buffered, oldest first; the buffer is empty afterwards."""
        if not self.buffer:
            return []
        taken = list(self.buffer)
        self.buffer.clear()
        return taken

    def reset(self) -> None:
        """Forget the buffer and the overflow (the owner is about to re-read from Kafka)."""
        self.overflowed = False
        if self.buffer is not None:
            self.buffer.clear()

    def close(self, reason: str = CANCELLED) -> None:
        """End the subscription from outside (a move, a drain, a cancellation): its waiter
        wakes and raises :class:`SubscriptionClosed`. The first reason given is kept."""
        if not self.closed:
            self.closed, self.reason = True, reason
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(True)

    async def wait(self, idle_s: float | None = None) -> bool:
        """Wait up to ``idle_s`` seconds (for ever if None) for something to do; False when
        idle that long. Once the subscription is closed: True while it still holds events to
        :meth:`take` (what arrived before the close is delivered, not lost), then
        :class:`SubscriptionClosed`, at once, without suspending: a loop around it that takes
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
        """True when there is something to take; :class:`SubscriptionClosed` when closed and
        there is not. A closed subscription that overflowed has nothing to take: what it
        dropped is re-read from the task's new owner, not from here."""
        if self.closed:
            if self.buffer and not self.overflowed:
                return True
            raise SubscriptionClosed(self.task_id, self.reason or CANCELLED)
        return bool(self.buffer) or self.overflowed


def _idle(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Fanout:
    """Offers each indexed event to the subscriptions of its task, never blocking the tail."""

    def __init__(self, indexer: Indexer, on_overflow: Callable[[], None] | None = None) -> None:
        # Dicts used as ordered sets: subscribers are offered events and closed in the order
        # they subscribed, so a simulated run replays exactly (a set of objects iterates in
        # memory-address order, which differs from run to run).
        self._subs: dict[str, dict[Subscription, None]] = defaultdict(dict)
        self._on_overflow = on_overflow
        self._partition_of = indexer.partition_of
        indexer.add_listener(self._on_event)
        indexer.add_ownership_listener(self._partitions_moved)

    @contextlib.contextmanager
    def subscribe(self, task_id: str, limit: int) -> Iterator[Subscription]:
        """Events of ``task_id`` indexed from now on, while in the block."""
        sub = Subscription(task_id, limit)
        self._subs[task_id][sub] = None
        try:
            yield sub
        finally:
            subs = self._subs[task_id]
            subs.pop(sub, None)
            if not subs:
                del self._subs[task_id]

    def _partitions_moved(self, gained: set[int], lost: set[int]) -> None:
        """Close the subscriptions of tasks in partitions this process no longer indexes:
        nothing more will arrive on them here (their owner serves them now)."""
        if not lost:
            return
        for task_id, subs in self._subs.items():
            if self._partition_of(task_id) in lost:
                for sub in subs:
                    sub.close(MOVED)

    def _on_event(self, indexed: IndexedEvent) -> None:
        for sub in self._subs.get(indexed.task_id, ()):
            if not sub.overflowed and not sub.offer(indexed) and self._on_overflow is not None:
                self._on_overflow()

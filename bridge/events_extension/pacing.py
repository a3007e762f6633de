"""Pacing a push stream's reads: a read that keeps the stream waiting must not silence it.

Where it sits: the replay loops of the push streams (:mod:`bridge.events_extension.sources` for a
task's history, :mod:`bridge.events_extension.offsets` for a topic's records) read from Kafka through
:func:`paced`, which hands out what the read yields and, whenever the next item has not come
within the stream's patience (the time left before a heartbeat is due), a :data:`WAITING`
marker: the stream then sends a heartbeat with the position it has checked, and the read goes
on. SEP-3415 has a client treat a stream silent for twice the heartbeat period as dead; without
this, a read waiting for one of the shared pool's consumers (many streams replaying at once)
could make every such client reconnect, and so add to the wait.

The read runs in a task of its own while the stream waits on it, and is cancelled (and waited
for) when the stream leaves early: nothing is left running. No Kafka, no JSON-RPC here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

from bridge.component import cancel_and_wait

__all__ = ["WAITING", "Waiting", "paced"]

T = TypeVar("T")


class Waiting:
    """The read has not answered within the stream's patience; it goes on."""


WAITING = Waiting()


async def _next(items: AsyncIterator[T]) -> T:
    return await anext(items)


async def paced(
    items: AsyncIterator[T], patience: Callable[[], float] | None
) -> AsyncGenerator[T | Waiting]:
    """``items``, with a :data:`WAITING` each time the next one takes longer than
    ``patience()`` seconds (asked anew for each wait); ``None``: no patience needed (a poll),
    ``items`` as they are."""
    if patience is None:
        async for item in items:
            yield item
        return
    pending: asyncio.Task[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.create_task(_next(items))
            done, _ = await asyncio.wait({pending}, timeout=patience())
            if not done:
                yield WAITING
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        await cancel_and_wait(pending)  # left early: the read stops now, not at garbage time

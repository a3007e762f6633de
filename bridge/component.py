"""Long-lived components and the few ways the package starts, stops and waits for them.

* :class:`Component`: ``start``/``stop``, usable as ``async with`` (the indexer, reader,
  publisher, worker, ...);
* :func:`cancel_and_wait`: stop background tasks and wait until they are gone;
* :func:`stop_signal`: an event set by SIGINT or SIGTERM, for the commands that run until told;
* :class:`NotStarted`: what a component raises when it is used before ``start`` (never an
  ``assert``, which ``python -O`` removes and an ``except Exception`` would swallow).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

__all__ = ["Component", "NotStarted", "cancel_and_wait", "stop_signal"]


class NotStarted(RuntimeError):
    """A component was used before ``start()`` (or after ``stop()``)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is not started")


class Component:
    """Subclasses implement ``start`` and ``stop``; ``async with`` calls them."""

    async def start(self) -> None:
        """Acquire connections and start background work."""

    async def stop(self) -> None:
        """Release everything; safe to call more than once."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel ``tasks`` and wait until each has finished; their errors are not re-raised
    (they were logged where they happened, and stopping must go on)."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def stop_signal(
    signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets, in the running loop (a command's "run until told")."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop

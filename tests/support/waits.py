"""Bounded waits on conditions: the one way tests wait for something to become true.

A test never sleeps for synchronisation; it names what it waits for, and a wait that runs out
fails with that name (and the last value the condition gave), not with a bare timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["BOUND", "POLL_S", "wait_until", "wait_until_sync"]

T = TypeVar("T")

#: Seconds any one wait may take before the test fails (a loaded CI machine included).
BOUND = 60.0
#: Poll interval of a condition nothing signals.
POLL_S = 0.05

What = str | Callable[[], str]


def _not_reached(what: What, timeout: float, last: object) -> AssertionError:
    text = what() if callable(what) else what
    return AssertionError(f"not reached within {timeout:g} s: {text} (last seen: {last!r})")


async def _value(condition: Callable[[], T | Awaitable[T]]) -> T:
    value = condition()
    return await value if inspect.isawaitable(value) else value


async def wait_until(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = BOUND,  # noqa: ASYNC109 - the bound is what this helper adds
    *,
    what: What,
    wakeup: asyncio.Event | None = None,
    poll_s: float = POLL_S,
) -> T:
    """The first truthy value of ``condition`` (a function or a coroutine function).

    ``wakeup``: an event its producer sets after each change, waited on instead of polling.
    Fails with an AssertionError naming ``what`` after ``timeout`` seconds.
    """
    last: T | None = None
    try:
        async with asyncio.timeout(timeout) as bound:
            while True:
                if wakeup is not None:
                    wakeup.clear()  # before the check: a change after it sets it again
                last = await _value(condition)
                if last:
                    return last
                await (wakeup.wait() if wakeup is not None else asyncio.sleep(poll_s))
    except TimeoutError:
        if not bound.expired():
            raise  # the condition's own timeout, not ours
        raise _not_reached(what, timeout, last) from None


def wait_until_sync(
    condition: Callable[[], T], timeout: float = BOUND, *, what: What, poll_s: float = POLL_S
) -> T:
    """:func:`wait_until` for code without an event loop (fixtures, sync tests, subprocesses)."""
    deadline = time.monotonic() + timeout
    while not (last := condition()):
        if time.monotonic() > deadline:
            raise _not_reached(what, timeout, last)
        time.sleep(poll_s)  # the poll interval of a bounded wait
    return last

"""A virtual-time asyncio event loop: time jumps to the next timer, nothing ever blocks.

An ordinary :class:`asyncio.SelectorEventLoop` whose selector never waits: when the loop has
nothing ready it asks the selector to wait until its next timer, and this selector moves the
loop's clock there instead. So ``asyncio.sleep``, ``asyncio.timeout`` and every ``call_at``
run in virtual time, an hour of it in milliseconds, and a run is as deterministic as the
callbacks it schedules (FIFO, as asyncio runs them). No socket is ever opened by the
simulation, so the self-pipe is the only registered file and nothing arrives on it.

Failures of liveness are turned into errors instead of hangs:

* :class:`Stuck`: nothing is ready and no timer is set, so nothing can ever happen again;
* :class:`Spinning`: the loop ran ``spin_limit`` iterations without time moving (some task
  loops on awaits that complete at once), or one callback ran for ``wall_limit_s`` seconds
  of real time without returning (a loop whose awaits never suspend, such as a wait on a
  closed subscription that returns at once): a watchdog (``SIGALRM``, main thread only)
  raises it inside the looping code.

Why our own loop and not ``looptime``: looptime patches a running loop's ``time()`` and
selector for one test function and runs idle no-op cycles before each jump; here the whole
program (several replicas, clients, faults) is the unit, started by :func:`run` with
``asyncio.Runner(loop_factory=...)``, and the spin check needs the loop's own step count.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

__all__ = ["Spinning", "Stuck", "VirtualLoop", "run"]

T = TypeVar("T")

#: Where virtual time starts (loop seconds): far from 0, as a monotonic clock is.
START = 1_000.0


class Stuck(RuntimeError):
    """No callback is ready and no timer is set: the program can never move again."""


class Spinning(RuntimeError):
    """The loop iterated too often without time moving on."""


class _Selector(selectors.SelectSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        loop = self.loop
        assert loop is not None
        if timeout is None:
            raise Stuck(f"nothing ready and no timer set at t={loop.time() - START:.3f}s")
        if timeout > 0:
            loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """See the module docstring. ``spin_limit``: iterations allowed without time moving."""

    def __init__(self, spin_limit: int = 200_000) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = START
        self.spin_limit = spin_limit
        self._still = 0
        self.steps = 0
        #: What the loop's exception handler was given: a callback that raised, a task whose
        #: exception nobody retrieved. A simulation counts each as a failure.
        self.errors: list[str] = []
        self.set_exception_handler(_note_error)

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._still = 0

    def _run_once(self) -> None:
        self.steps += 1
        self._still += 1
        if self._still > self.spin_limit:
            raise Spinning(
                f"{self.spin_limit} loop iterations at t={self._now - START:.3f}s without "
                "time moving: a task loops without suspending"
            )
        super()._run_once()  # type: ignore[misc]


def _note_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    what = context.get("message", "error")
    assert isinstance(loop, VirtualLoop)
    loop.errors.append(f"{what}: {exc!r}" if exc is not None else str(what))


@contextlib.contextmanager
def _watchdog(loop: VirtualLoop, wall_limit_s: float) -> Iterator[None]:
    """Raise :class:`Spinning` in the main thread when the loop makes no step for
    ``wall_limit_s`` real seconds (checked twice per period)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    last = [-1]

    def check(signum: int, frame: object) -> None:
        if loop.steps == last[0]:
            raise Spinning(
                f"one callback ran for {wall_limit_s:.0f} s of real time at "
                f"t={loop.time() - START:.3f}s: a loop whose awaits never suspend"
            )
        last[0] = loop.steps

    previous = signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, wall_limit_s / 2, wall_limit_s / 2)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run(
    main: Callable[[], Awaitable[T]], spin_limit: int = 200_000, wall_limit_s: float = 10.0
) -> T:
    """Run ``main()`` to completion on a fresh :class:`VirtualLoop`."""
    loop = VirtualLoop(spin_limit)
    with _watchdog(loop, wall_limit_s), asyncio.Runner(loop_factory=lambda: loop) as runner:
        try:
            return runner.run(main())  # type: ignore[arg-type]
        finally:
            loop.spin_limit = 2**62  # let the runner cancel what is left

"""Time and randomness as the domain asks for them: injectable, real by default.

Where it sits: under everything that reads a clock or draws random bits to decide something
(the stream hub's admission windows and latency samples, the task service's creation times
and task ids, the event sources' warning cadence). Production passes nothing and gets
:data:`SYSTEM_CLOCK` and :data:`SYSTEM_ENTROPY` (``time`` and ``secrets``); the simulation
passes a :class:`LoopClock` on its virtual-time loop and a :class:`SeededEntropy`, so that a
seed replays exactly.

What it does not cover: waits. ``asyncio.sleep`` and timeouts already run on the event loop's
clock, which the simulation replaces as a whole; secrets that must stay unpredictable in
production (keys, nonces) never come from a seeded source outside a simulation.
"""

from __future__ import annotations

import asyncio
import base64
import random
import secrets
import time
from typing import Protocol

__all__ = [
    "SYSTEM_CLOCK",
    "SYSTEM_ENTROPY",
    "Clock",
    "Entropy",
    "LoopClock",
    "SeededEntropy",
    "SystemClock",
    "SystemEntropy",
]


class Clock(Protocol):
    """Two clocks: the wall's (epoch seconds) and a monotonic one (seconds, never back)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch (what timestamps and expiries compare with)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (what durations are measured on)."""


class SystemClock:
    """The process's clocks: ``time.time`` and ``time.monotonic``."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class LoopClock:
    """The running event loop's clock as the monotonic one, and the wall clock ``epoch``
    seconds ahead of it: under a virtual-time loop both move only as the loop's time does."""

    def __init__(self, epoch: float = 1_700_000_000.0) -> None:
        self.epoch = epoch

    def wall(self) -> float:
        return self.epoch + self.monotonic()

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


class Entropy(Protocol):
    """Random bits for identifiers."""

    def token_bytes(self, n: int) -> bytes:
        """``n`` random bytes."""

    def token_urlsafe(self, n: int) -> str:
        """``n`` random bytes as unpadded URL-safe base64 (as :func:`secrets.token_urlsafe`)."""


class SystemEntropy:
    """The operating system's randomness (:mod:`secrets`)."""

    def token_bytes(self, n: int) -> bytes:
        return secrets.token_bytes(n)

    def token_urlsafe(self, n: int) -> str:
        return secrets.token_urlsafe(n)


class SeededEntropy:
    """Reproducible bits from a seed: for simulations and tests only, never for a secret."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def __repr__(self) -> str:
        return "SeededEntropy(<seed>)"

    def token_bytes(self, n: int) -> bytes:
        return self._random.randbytes(n)

    def token_urlsafe(self, n: int) -> str:
        return base64.urlsafe_b64encode(self.token_bytes(n)).rstrip(b"=").decode("ascii")


#: The real clocks, the default of every constructor that takes a clock.
SYSTEM_CLOCK: Clock = SystemClock()
#: The real randomness, the default of every constructor that takes entropy.
SYSTEM_ENTROPY: Entropy = SystemEntropy()

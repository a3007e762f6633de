"""Counting the records an event source skips: any bytes a producer can write must never crash
a poll or a stream, and must not pass silently either.

Counts are kept per reason on the source (``skips.counts``); a warning names the source and
the counts at most once a minute, never a record's content.
"""

from __future__ import annotations

import logging
from collections import Counter

from bridge.clock import SYSTEM_CLOCK, Clock

__all__ = ["Skips"]

log = logging.getLogger(__name__)

#: Seconds between two warnings of one source.
WARN_EVERY_S = 60.0


class Skips:
    """Records of one source skipped so far, by reason."""

    def __init__(self, source: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self._clock = clock
        self.counts: Counter[str] = Counter()
        self._warned_at: float | None = None

    def add(self, reason: str) -> None:
        self.counts[reason] += 1
        now = self._clock.monotonic()
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            counts = ", ".join(f"{name}={n}" for name, n in sorted(self.counts.items()))
            log.warning("event source %s skipped records since start: %s", self.source, counts)

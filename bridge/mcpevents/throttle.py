"""Token buckets per key, in bounded memory: how often webhook verifications may be sent.

Where it sits: ``events/subscribe`` asks :class:`TokenBuckets` before it POSTs a verification
challenge (:meth:`bridge.mcpevents.delivery.WebhookService.verify`), keyed by (principal,
callback host): one principal cannot make the bridge hammer a host, and one principal's budget
is never spent by another's, although one host may serve many users.

Memory is bounded: at most ``max_keys`` buckets are held. A bucket that has refilled to its burst
is the same as no bucket, so it is dropped first (least recently used first); when every held
bucket is still refilling, a new key is refused rather than given a fresh burst, so cycling
through keys never buys more than the limit.

Pure: no I/O; the clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["TokenBuckets"]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """``burst`` tokens per key, refilled at ``rate_per_s``; :meth:`take` spends one."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("a token bucket needs a positive rate, burst and key bound")
        self.rate = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: Hashable) -> float | None:
        """Spend one token of ``key``: None when granted, else the seconds until one is due."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if not self._room(now):
                return 1.0 / self.rate
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        self._buckets.move_to_end(key)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens < 1:
            return (1 - bucket.tokens) / self.rate
        bucket.tokens -= 1
        return None

    def _room(self, now: float) -> bool:
        """Make room for one more key by dropping full buckets, oldest first."""
        while len(self._buckets) >= self.max_keys:
            key, oldest = next(iter(self._buckets.items()))
            if oldest.tokens + (now - oldest.at) * self.rate < self.burst:
                return False  # every bucket is still refilling: refuse, never reset one
            del self._buckets[key]
        return True

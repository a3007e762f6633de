"""Token buckets per key, in bounded memory: how often webhook verifications may be sent.

Where it sits: ``events/subscribe`` asks :class:`VerificationThrottle` before it POSTs a
verification challenge (:meth:`bridge.events_extension.delivery.WebhookService.verify`). Two kinds of
:class:`TokenBuckets` are asked, the principal's own first: per principal (one principal cannot
make the bridge send many challenges by naming many hosts), then per (principal, callback host)
(one principal cannot make the bridge hammer a host, and one principal's budget is never spent
by another's, although one host may serve many users).

The principal's bucket also bounds the (principal, host) buckets one principal holds: a new pair
costs a token of the principal's, and a pair's bucket is dropped once refilled, so a principal
holds at most ``principal burst + principal rate x host refill time`` pairs that are still
refilling. Cycling through hosts fills the principal's own bucket, not the table every principal
shares.

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

__all__ = ["TokenBuckets", "VerificationThrottle"]


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

    def refund(self, key: Hashable) -> None:
        """Give back the token :meth:`take` spent for ``key`` (the next step refused)."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.tokens = min(float(self.burst), bucket.tokens + 1)

    def _room(self, now: float) -> bool:
        """Make room for one more key by dropping full buckets, oldest first."""
        while len(self._buckets) >= self.max_keys:
            key, oldest = next(iter(self._buckets.items()))
            if oldest.tokens + (now - oldest.at) * self.rate < self.burst:
                return False  # every bucket is still refilling: refuse, never reset one
            del self._buckets[key]
        return True


class VerificationThrottle:
    """A principal's bucket, then its (principal, host) bucket; both bounded in keys."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        principal_rate_per_s: float,
        principal_burst: int,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.principals = TokenBuckets(
            principal_rate_per_s, principal_burst, max_keys=max_keys, clock=clock
        )
        self.hosts = TokenBuckets(rate_per_s, burst, max_keys=max_keys, clock=clock)

    def take(self, principal: str, host: str) -> float | None:
        """Spend one verification of ``principal`` to ``host``: None when granted, else the
        seconds until one is due. A refusal spends nothing of either bucket."""
        wait = self.principals.take(principal)
        if wait is not None:
            return wait
        wait = self.hosts.take((principal, host))
        if wait is not None:
            self.principals.refund(principal)
        return wait

"""The verification throttle (bridge.mcpevents.throttle): token buckets in bounded memory.

Pure, with a fake clock: a burst, then the refill rate; keys apart; never more than the key
bound held, and a full table refuses a new key rather than reset one.
"""

from __future__ import annotations

import pytest

from bridge.mcpevents.throttle import TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_gets_its_burst_then_one_token_per_refill_period() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=0.5, burst=3, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [None, None, None]
    assert buckets.take("a") == pytest.approx(2.0)  # one token every 2 s
    clock.now = 1.0
    assert buckets.take("a") == pytest.approx(1.0)
    clock.now = 2.0
    assert buckets.take("a") is None and buckets.take("a") is not None


def test_a_refused_take_spends_nothing() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=1.0, burst=1, clock=clock)
    assert buckets.take("a") is None
    for _ in range(10):
        assert buckets.take("a") is not None
    clock.now = 1.0
    assert buckets.take("a") is None


def test_keys_have_budgets_of_their_own() -> None:
    buckets = TokenBuckets(rate_per_s=0.001, burst=1, clock=Clock())
    assert buckets.take(("ann", "hooks.example")) is None
    assert buckets.take(("ann", "hooks.example")) is not None
    assert buckets.take(("ben", "hooks.example")) is None  # one host, many users
    assert buckets.take(("ann", "other.example")) is None


def test_the_buckets_never_exceed_their_bound_and_refilled_ones_go_first() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=1.0, burst=2, max_keys=3, clock=clock)
    for key in "abc":
        assert buckets.take(key) is None
    clock.now = 1.0  # every bucket is full again: the same as no bucket
    for key in "def":
        assert buckets.take(key) is None
    assert len(buckets) == 3


def test_a_full_table_of_refilling_buckets_refuses_a_new_key_instead_of_resetting_one() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=1.0, burst=2, max_keys=2, clock=clock)
    assert buckets.take("a") is None and buckets.take("b") is None
    assert buckets.take("c") is not None  # cycling through keys buys nothing
    assert len(buckets) == 2
    clock.now = 1.0
    assert buckets.take("c") is None


@pytest.mark.parametrize(("rate", "burst", "keys"), [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_a_bucket_needs_a_positive_rate_burst_and_bound(rate: float, burst: int, keys: int) -> None:
    with pytest.raises(ValueError):
        TokenBuckets(rate, burst, max_keys=keys)

"""The verification throttle (bridge.events_extension.throttle): token buckets in bounded memory.

Pure, with a fake clock: a burst, then the refill rate; keys apart; never more than the key
bound held, and a full table refuses a new key rather than reset one.
"""

from __future__ import annotations

import pytest

from bridge.events_extension.throttle import TokenBuckets, VerificationThrottle


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


def throttle(clock: Clock, *, max_keys: int = 10_000) -> VerificationThrottle:
    """The defaults: 10 then 12/min per (principal, host); 30 then 60/min per principal."""
    return VerificationThrottle(
        12 / 60, 10, principal_rate_per_s=1.0, principal_burst=30, max_keys=max_keys, clock=clock
    )


def test_one_principal_cycling_through_hosts_cannot_lock_another_out() -> None:
    # Review F4: 10,000 (attacker, host) pairs filled the shared table; the victim's first
    # verification was refused for seconds after.
    clock = Clock()
    buckets = throttle(clock)
    granted = sum(buckets.take("attacker", f"h{i}.evil.example") is None for i in range(10_000))
    assert granted == 30  # its own burst, whatever the hosts
    clock.now += 4.0
    assert buckets.take("victim", "hooks.victim.example") is None
    assert len(buckets.hosts) <= 30 + 4 + 1


def test_a_principal_s_hosts_share_its_budget_and_it_refills() -> None:
    clock = Clock()
    buckets = throttle(clock)
    assert all(buckets.take("p", f"h{i}") is None for i in range(30))
    assert buckets.take("p", "other") == pytest.approx(1.0)
    clock.now += 1.0
    assert buckets.take("p", "other") is None


def test_a_host_refusal_spends_nothing_of_the_principal_s_budget() -> None:
    clock = Clock()
    buckets = throttle(clock)
    assert all(buckets.take("p", "one") is None for _ in range(10))
    for _ in range(100):
        assert buckets.take("p", "one") is not None
    assert all(buckets.take("p", f"h{i}") is None for i in range(20))


def test_many_principals_attacking_stay_in_the_key_bound() -> None:
    clock = Clock()
    buckets = throttle(clock, max_keys=100)
    for p in range(50):
        for i in range(40):
            buckets.take(f"p{p}", f"h{i}")
    assert len(buckets.hosts) <= 100 and len(buckets.principals) <= 100

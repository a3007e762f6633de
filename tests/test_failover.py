"""Crash fail-over: an owner whose peer port keeps refusing is dropped from the group now, by
the instance id the group's own ownership map names, guarded (an owner only, never this
replica, one at a time, rate limited, counted); the ownership map carries the instance ids.

In-process: the guard over a fake clock and a recording ``remove``; one run through real
sockets (a port nothing listens on) from the first refused hop to the removal.
"""

from __future__ import annotations

import asyncio
import json
from typing import get_args

import pytest
from support.procs import free_port

from bridge.kafka.ownership import Claim, OwnershipAssignor, OwnershipMap, _claim
from bridge.kafka.port import TopicPart
from bridge.metrics import REMOVAL_OUTCOMES, Metrics
from bridge.server.failover import RemovalOutcome, Removals
from bridge.server.hops import PeerAuth, PeerIdentity
from bridge.server.peers import Peers
from bridge.server.wire import RpcError

DEAD = "http://replica-1.peers:8081"
HERE = "http://replica-0.peers:8081"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def owners(*urls: str) -> OwnershipMap:
    return OwnershipMap(
        {i: url for i, url in enumerate(urls)},
        generation=1,
        instances={DEAD: "replica-1", HERE: "replica-0", "http://idle:8081": "idle"},
    )


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.removed: list[str] = []
        self.done = asyncio.Event()
        self.fail = fail

    async def __call__(self, instance_id: str) -> None:
        self.removed.append(instance_id)
        self.done.set()
        if self.fail:
            raise RuntimeError("the coordinator did not answer")


def removals(
    recorder: Recorder, clock: Clock, outcomes: list[str], *, enabled: bool = True
) -> Removals:
    return Removals(
        lambda: owners(HERE, DEAD),
        recorder,
        own_url=HERE,
        interval_s=30.0,
        clock=clock,
        enabled=enabled,
        on_outcome=outcomes.append,
    )


async def test_a_dead_owner_is_removed_by_the_instance_id_of_the_ownership_map() -> None:
    recorder, outcomes = Recorder(), []
    guard = removals(recorder, Clock(), outcomes)
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    await guard.close()
    assert recorder.removed == ["replica-1"] and outcomes == ["removed"]


@pytest.mark.parametrize(
    "url",
    [HERE, "http://idle:8081", "http://stranger:8081"],
    ids=["this-replica", "owns-nothing", "not-in-the-map"],
)
async def test_only_another_replica_that_owns_a_partition_now_is_ever_removed(url: str) -> None:
    recorder, outcomes = Recorder(), []
    guard = removals(recorder, Clock(), outcomes)
    guard.refusing(url)
    await guard.close()
    assert recorder.removed == [] and outcomes == ["not_owner"]


async def test_removals_are_rate_limited_and_can_be_turned_off() -> None:
    clock, recorder, outcomes = Clock(), Recorder(), []
    guard = removals(recorder, clock, outcomes)
    guard.refusing(DEAD)
    guard.refusing(DEAD)  # one in flight (or just done): not again
    async with asyncio.timeout(5):
        await recorder.done.wait()
    clock.now += 29.0
    guard.refusing(DEAD)
    assert recorder.removed == ["replica-1"]
    clock.now += 1.0  # the interval has passed
    recorder.done.clear()
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    await guard.close()
    assert recorder.removed == ["replica-1", "replica-1"]
    assert outcomes.count("rate_limited") == 2
    off, off_outcomes = Recorder(), []
    disabled = removals(off, Clock(), off_outcomes, enabled=False)
    disabled.refusing(DEAD)
    assert off.removed == [] and off_outcomes == ["off"]


async def test_a_failed_removal_is_counted_and_nothing_else_happens() -> None:
    recorder, outcomes = Recorder(fail=True), []
    guard = removals(recorder, Clock(), outcomes)
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    await guard.close()
    assert outcomes == ["failed"]


def test_every_removal_outcome_is_a_metric_label() -> None:
    assert set(get_args(RemovalOutcome)) == set(REMOVAL_OUTCOMES)
    metrics = Metrics()
    metrics.peer_removal("removed")
    metrics.peer_removal("no such outcome")
    sample = metrics.registry.get_sample_value
    assert sample("bridge_peer_removals_total", {"outcome": "removed"}) == 1
    assert sample("bridge_peer_removals_total", {"outcome": "off"}) == 0


def test_the_ownership_map_names_each_owner_s_instance_id_and_old_members_name_none() -> None:
    topic = "events"
    parts = [TopicPart(topic, p) for p in range(4)]
    new = OwnershipAssignor(DEAD, topic, "replica-1")
    old = json.dumps({"url": HERE, "owned": []}).encode()  # a replica of 0.2.0: no instance
    assert _claim(new.metadata()) == Claim(DEAD, frozenset(), "replica-1")
    assert _claim(old).instance is None
    shares = new.assign(parts, {"m1": new.metadata(), "m0": old})
    new.on_assignment(shares["m1"].parts, shares["m1"].user_data)
    assert new.map.instances == {DEAD: "replica-1"}
    assert new.map.instance_owning(DEAD) == "replica-1"
    assert new.map.instance_owning(HERE) is None  # owns partitions, claims no instance id
    # A leader of 0.2.0 sends no instance ids: nothing can be removed, forwarding works.
    before = json.dumps({"owners": {"0": DEAD}}).encode()
    new.on_assignment(parts[:1], before)
    assert new.map.owners == {0: DEAD} and new.map.instances == {}
    for junk in (b'{"owners": {}, "instances": ["x"]}', b'{"owners": {}, "instances": {"u": 1}}'):
        new.on_assignment((), junk)
        assert new.map.instances == {}


async def test_an_owner_whose_port_refuses_is_removed_after_a_run_of_refusals() -> None:
    """From the first refused hop to the group removal, through real sockets: a port on this
    host that nothing listens on refuses at once, as a dead pod's address does."""
    dead = f"http://127.0.0.1:{free_port()}"
    recorder, outcomes = Recorder(), []
    guard = Removals(
        lambda: OwnershipMap({0: dead}, 1, {dead: "replica-1"}),
        recorder,
        own_url=HERE,
        interval_s=30.0,
        clock=Clock(),
        on_outcome=outcomes.append,
    )
    # The probes back off from 10 ms: the run of three refusals takes a few tens of ms.
    peers = Peers(PeerAuth("s" * 40, HERE), suspect_s=0.02, refusals=3, on_refusing=guard.refusing)
    with pytest.raises(RpcError):
        await peers.call(dead, "tasks/get", {"taskId": "t1"}, PeerIdentity("alice", "alice"))
    async with asyncio.timeout(10):
        await recorder.done.wait()
    await peers.close()
    await guard.close()
    assert recorder.removed == ["replica-1"] and outcomes == ["removed"]


async def test_a_removed_owner_that_rejoined_is_not_removed_again_until_it_answers() -> None:
    """Replicas cut off from each other's peer ports (a network policy that rejects) but not
    from Kafka: each removal is followed by the live member rejoining. Without this guard
    they removed each other every ``interval_s``, forever: a group rebalance each time."""
    clock, recorder, outcomes = Clock(), Recorder(), []
    current = [owners(HERE, DEAD)]
    guard = Removals(
        lambda: current[0],
        recorder,
        own_url=HERE,
        interval_s=30.0,
        clock=clock,
        on_outcome=outcomes.append,
    )
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    recorder.done.clear()
    # It rejoined (its process talks to Kafka): a newer map names it again, still refusing.
    rejoined = owners(HERE, DEAD)
    rejoined.generation = 2
    current[0] = rejoined
    clock.now += 60.0  # past the rate limit
    guard.refusing(DEAD)
    assert recorder.removed == ["replica-1"] and outcomes == ["removed", "rejoined"]
    # Once it has answered this replica, a later run of refusals is a crash again.
    guard.answered(DEAD)
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    await guard.close()
    assert recorder.removed == ["replica-1", "replica-1"]


async def test_an_owner_is_found_by_the_origin_its_requests_go_to_not_its_spelling() -> None:
    """The hops (and so the refusals) name an owner by its origin (``scheme://host:port``,
    lower case); the map by the URL its replica advertised, which may be spelt otherwise."""
    spelt = "HTTP://Replica-1.Peers:8081"
    recorder, outcomes = Recorder(), []
    guard = Removals(
        lambda: OwnershipMap({0: spelt}, 1, {spelt: "replica-1"}),
        recorder,
        own_url=HERE,
        interval_s=30.0,
        clock=Clock(),
        on_outcome=outcomes.append,
        origin=str.lower,
    )
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    await guard.close()
    assert recorder.removed == ["replica-1"] and outcomes == ["removed"]


async def test_a_rejoined_owner_s_pardon_lapses_when_nothing_has_refused_for_long() -> None:
    """The guard must not last forever: a member removed once, back and serving (this replica
    never happened to ask it), that crashes weeks later is removed again. While the refusals
    go on (the replicas stay cut off), the pardon goes on too."""
    clock, recorder, outcomes = Clock(), Recorder(), []
    current = [owners(HERE, DEAD)]
    guard = Removals(
        lambda: current[0],
        recorder,
        own_url=HERE,
        interval_s=30.0,
        clock=clock,
        on_outcome=outcomes.append,
    )
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    recorder.done.clear()
    rejoined = owners(HERE, DEAD)
    rejoined.generation = 2
    current[0] = rejoined
    for _ in range(3):  # still cut off: a run of refusals every few minutes, never a removal
        clock.now += 200.0
        guard.refusing(DEAD)
    assert outcomes == ["removed", "rejoined", "rejoined", "rejoined"]
    clock.now += 301.0  # nothing refused for longer than ten intervals: a new crash
    guard.refusing(DEAD)
    async with asyncio.timeout(5):
        await recorder.done.wait()
    await guard.close()
    assert recorder.removed == ["replica-1", "replica-1"]

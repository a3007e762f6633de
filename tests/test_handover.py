"""Partitions move between replicas without users noticing (issue 30, items 1 and 2).

In-process replicas (``replicas.ownership = "group"``: an indexer each, a fan-out, a task
service) on one in-memory log, no HTTP: the group's eager rebalances, the planned hand-over of a
draining replica, and its return.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.inmemory import memory_log
from support.layout import fresh_prefix, make_settings, merged
from support.waits import wait_until

from bridge.config import Settings, ToolSpec
from bridge.kafka import ownership as ownership_kafka
from bridge.kafka.acls import bridge_group
from bridge.kafka.memory import MemoryGroupTail, MemoryLog
from bridge.kafka.ownership import (
    Claim,
    OwnershipAssignor,
    name_standbys,
    sticky_assign,
)
from bridge.kafka.port import TopicPart
from bridge.log import ownership
from bridge.log.fanout import MOVED, Fanout, TaskFeed
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.log.standby import Standbys
from bridge.tasks.messages import new_task_id
from bridge.tasks.service import TaskService

PARTITIONS = 3
HOLD = ToolSpec(name="hold", description="Never picked up", task="required")


def replica_settings(prefix: str, name: str, **overrides: object) -> Settings:
    values: dict[str, Any] = {
        "replicas": {"ownership": "group", "instance_id": name, "session_timeout_ms": 6_000},
        "peers": {
            "advertised_url": f"http://{name}.test:8081",
            "secret": "handover-test-peer-secret-0123456789abcdef",
        },
    }
    return make_settings("127.0.0.1:9", prefix, **merged(values, overrides))


@dataclass
class Replica:
    indexer: Indexer
    fanout: Fanout
    service: TaskService

    def task_in(self, partition: int) -> str:
        """A fresh task id of ``partition``."""
        while True:
            task_id = new_task_id()
            if self.indexer.partition_of(task_id) == partition:
                return task_id


@contextlib.asynccontextmanager
async def replica(settings: Settings, log: MemoryLog) -> AsyncIterator[Replica]:
    """A started replica: an indexer (persisting its index), a fan-out and a task service."""
    indexer = Indexer(settings, persist=True, flush_interval_s=0.05, log=log)
    await indexer.start()
    try:
        fanout = Fanout(indexer)
        reader = Reader(settings, indexer, log=log)
        service = TaskService(settings, indexer, reader, {HOLD.name: HOLD}, fanout, log=log)
        await service.start()
        try:
            yield Replica(indexer, fanout, service)
        finally:
            await service.stop()
            await reader.close()
    finally:
        await indexer.stop()


def group_log(settings: Settings) -> MemoryLog:
    log = memory_log(settings)
    log.create_topic(settings.topics.jobs(HOLD.name), 1)
    return log


# --- item 1: kept partitions survive the eager revoke ----------------------------------------


async def test_a_rebalance_ends_no_stream_of_a_partition_its_replica_keeps() -> None:
    prefix = fresh_prefix("ho")
    a_settings = replica_settings(prefix, "a")
    log = group_log(a_settings)
    async with replica(a_settings, log) as a:
        assert set(a.indexer.partitions) == set(range(PARTITIONS))
        before = dict(a.indexer.partitions)
        with contextlib.ExitStack() as subs:
            live: dict[int, TaskFeed] = {
                p: subs.enter_context(a.fanout.subscribe(a.task_in(p), 16))
                for p in range(PARTITIONS)
            }
            async with replica(replica_settings(prefix, "b"), log) as b:
                await wait_until(
                    lambda: b.indexer.partitions and len(a.indexer.partitions) < PARTITIONS,
                    what="b takes a share from a",
                )
                kept = set(a.indexer.partitions)
                lost = set(range(PARTITIONS)) - kept
                assert kept and lost
                # Every partition was revoked (eager), yet what a keeps was never dropped:
                # the same state, not restored again, and its subscriptions open.
                assert all(a.indexer.partitions[p] is before[p] for p in kept)
                assert all(not live[p].closed for p in kept)
                # A lost partition's streams end once b serves it.
                await wait_until(lambda: all(live[p].closed for p in lost), what="moved")
                assert all(live[p].reason == MOVED for p in lost)
                # A kept partition goes on being indexed: a task created in it is found.
                p = min(kept)
                task_id = a.task_in(p)
                sub = subs.enter_context(a.fanout.subscribe(task_id, 16))
                await a.service.create(HOLD, {}, "alice", task_id=task_id)
                await wait_until(
                    lambda: a.indexer.lookup(task_id) is not None, what="a indexes the new task"
                )
                assert sub.take() and not live[p].closed


# --- item 2: the planned hand-over -------------------------------------------------------------


def test_a_draining_member_is_given_nothing_and_its_partitions_go_to_the_others() -> None:
    claims = {
        "m-a": Claim("http://a", frozenset({0, 1, 2}), draining=True),
        "m-b": Claim("http://b", frozenset({3, 4, 5})),
        "m-c": Claim("http://c", frozenset()),
    }
    shares = sticky_assign(range(6), claims)
    assert shares["m-a"] == []
    assert sorted(shares["m-b"] + shares["m-c"]) == list(range(6))
    assert shares["m-b"] == [3, 4, 5]  # the others keep what they own


def test_when_every_member_drains_the_partitions_stay_where_they_are() -> None:
    claims = {
        "m-a": Claim("http://a", frozenset({0, 1}), draining=True),
        "m-b": Claim("http://b", frozenset({2}), draining=True),
    }
    assert sticky_assign(range(3), claims) == {"m-a": [0, 1], "m-b": [2]}


def test_a_member_of_an_older_version_or_a_garbled_flag_counts_as_not_draining() -> None:
    assignor = OwnershipAssignor("http://a", "events")
    members = {
        "old": json.dumps({"url": "http://old", "owned": [0]}).encode(),
        "odd": json.dumps({"url": "http://odd", "owned": [1], "draining": "yes"}).encode(),
    }
    shares = assignor.assign([TopicPart("events", p) for p in range(2)], members)
    assert [tp.partition for tp in shares["old"].parts] == [0]
    assert [tp.partition for tp in shares["odd"].parts] == [1]
    assert "draining" not in json.loads(shares["old"].user_data)
    assert "draining" not in json.loads(assignor.metadata())  # 0.2.0 reads the same claim


async def test_a_stopping_replica_hands_every_partition_over_before_its_streams_end() -> None:
    prefix = fresh_prefix("ho")
    a_settings, b_settings = replica_settings(prefix, "a"), replica_settings(prefix, "b")
    log = group_log(a_settings)
    async with replica(a_settings, log) as a, replica(b_settings, log) as b:
        group = log.group(bridge_group(a_settings.topics))
        await wait_until(
            lambda: a.indexer.partitions and b.indexer.partitions and not a.indexer.handovers.held,
            what="a and b share, b's share handed over",
        )
        a_parts, b_parts = set(a.indexer.partitions), set(b.indexer.partitions)
        # When a tells its streams that a partition moved, b must serve it already.
        served_at_loss: dict[int, bool] = {}
        a.indexer.add_ownership_listener(
            lambda gained, lost: served_at_loss.update({p: b.indexer.owns(p) for p in lost})
        )
        with contextlib.ExitStack() as subs:
            a_subs = {p: subs.enter_context(a.fanout.subscribe(a.task_in(p), 16)) for p in a_parts}
            b_subs = {p: subs.enter_context(b.fanout.subscribe(b.task_in(p), 16)) for p in b_parts}
            rebalances = group.rebalances
            assert await a.indexer.hand_over()
            assert group.rebalances == rebalances + 1  # one rebalance hands everything over
            assert not a.indexer.partitions
            assert set(b.indexer.partitions) == set(range(PARTITIONS))
            assert served_at_loss == {p: True for p in a_parts}
            assert all(sub.reason == MOVED for sub in a_subs.values())
            assert not any(sub.closed for sub in b_subs.values())
            assert not a.indexer.handovers.held


async def share_then_hand_over(settings: Settings, log: MemoryLog) -> tuple[Any, int]:
    """Replica ``settings`` joins the group beside a running one, takes a share and stops
    with a hand-over; returns the group and its rebalances before the hand-over."""
    group = log.group(bridge_group(settings.topics))
    async with replica(settings, log) as a:
        await wait_until(lambda: a.indexer.partitions, what="a takes a share")
        rebalances = group.rebalances
        assert await a.indexer.hand_over()
    return group, rebalances


async def test_a_restarted_replica_gets_partitions_again_in_at_most_two_rebalances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = fresh_prefix("ho")
    a_settings, b_settings = replica_settings(prefix, "a"), replica_settings(prefix, "b")
    log = group_log(a_settings)
    async with replica(b_settings, log) as b:
        group, rebalances = await share_then_hand_over(a_settings, log)
        # a stopped (a static member: it stays in the group, draining, owning nothing); the
        # same instance comes back on the replace path with the old metadata, warms copies of
        # what it gave away (the assignment named it their standby), and rejoins.
        # Its copies are held back: it must not rejoin (a rebalance) before they are warm.
        gate, held = asyncio.Event(), asyncio.Event()
        real_restore = Standbys._restore

        async def restore(self: Standbys, parts: set[int]) -> None:
            held.set()
            await gate.wait()
            await real_restore(self, parts)

        monkeypatch.setattr(Standbys, "_restore", restore)
        with full_restores(monkeypatch) as restored:
            async with replica(a_settings, log) as a:
                await wait_until(held.is_set, what="the restarted a restores its copies")
                assert a.indexer.assignor is not None and a.indexer.assignor.thought_draining
                assert group.rebalances - rebalances == 1 and group.round is None
                gate.set()
                await wait_until(
                    lambda: a.indexer.partitions and b.indexer.partitions,
                    what="the restarted a has a share again",
                )
                assert group.rebalances - rebalances == 2  # the hand-over, and the return
                assert a.indexer.assignor is not None and not a.indexer.assignor.thought_draining
        assert not set(restored) & set(range(PARTITIONS))  # a took its share from its copies


async def test_a_restarted_replica_whose_copies_never_warm_still_gets_its_share_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait for warm copies is bounded; the rejoin after it must still rebalance. Kafka
    stores a static member's new metadata on the replace path (without a rebalance), so a
    rejoin claiming nothing new (no warm copy) is no change to it: the replica was handed its
    empty share again, for good (bench_rollout saw it under load, where the copies never
    looked warm). Each deliberate rejoin claims a new ``rejoin`` count."""
    prefix = fresh_prefix("ho")
    a_settings = replica_settings(prefix, "a", handover={"timeout_s": 1.0})
    b_settings = replica_settings(prefix, "b")
    log = group_log(a_settings)
    async with replica(b_settings, log) as b:
        group, rebalances = await share_then_hand_over(a_settings, log)
        never = asyncio.Event()

        async def restore(self: Standbys, parts: set[int]) -> None:
            await never.wait()  # the copies never warm

        monkeypatch.setattr(Standbys, "_restore", restore)
        async with replica(a_settings, log) as a:
            await wait_until(
                lambda: a.indexer.partitions and b.indexer.partitions,
                what="the restarted a has a share again without warm copies",
            )
            assert group.rebalances - rebalances == 2  # the hand-over, and the return


async def test_a_lost_partition_whose_new_owner_is_never_seen_is_told_lost_at_the_bound() -> None:
    prefix = fresh_prefix("ho")
    a_settings = replica_settings(prefix, "a", handover={"timeout_s": 0.2})
    log = group_log(a_settings)
    outcomes: list[bool] = []
    async with replica(a_settings, log) as a:
        a.indexer.handovers.on_done = lambda seconds, served: outcomes.append(served)
        with contextlib.ExitStack() as subs:
            live = {
                p: subs.enter_context(a.fanout.subscribe(a.task_in(p), 16))
                for p in range(PARTITIONS)
            }
            # b persists nothing: it never writes the index, so a cannot see it serve.
            b = Indexer(replica_settings(prefix, "b"), persist=False, log=log)
            await b.start()
            try:
                await wait_until(lambda: b.partitions, what="b takes a share")
                lost = set(range(PARTITIONS)) - set(a.indexer.partitions)
                await wait_until(
                    lambda: all(live[p].closed for p in lost), what="a ends the lost streams"
                )
                assert outcomes == [False] * len(lost)
                assert all(live[p].reason == MOVED for p in lost)
            finally:
                await b.stop()


# --- items 3 and 4: warm standbys ---------------------------------------------------------------


def test_each_partition_gets_a_standby_that_is_not_its_owner_and_a_drainer_its_old_share() -> None:
    shares = {"m-a": [], "m-b": [0, 1, 2], "m-c": [3, 4, 5]}
    claims = {
        "m-a": Claim("http://a", frozenset({0, 1}), draining=True),
        "m-b": Claim("http://b", frozenset({2})),
        "m-c": Claim("http://c", frozenset({3, 4, 5})),
    }
    named = name_standbys(shares, claims, 1)
    assert named[0] == ["m-a"] and named[1] == ["m-a"]  # what it gave away: its share back
    assert all(
        len(ms) == 1 and m not in ms for m, ps in shares.items() for p in ps for ms in [named[p]]
    )
    assert name_standbys(shares, claims, 0) == {p: [] for p in range(6)}


@contextlib.contextmanager
def full_restores(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The partitions gains restored from their whole index slice (not from a standby)."""
    restored: list[int] = []
    real = ownership.load_index

    async def load_index(settings: Settings, partitions: Any, **kwargs: Any) -> Any:
        restored.extend(partitions)
        return await real(settings, partitions, **kwargs)

    monkeypatch.setattr(ownership, "load_index", load_index)
    yield restored


async def created_in(r: Replica, partitions: set[int]) -> dict[int, str]:
    """A task created by ``r`` in each of ``partitions`` (which it owns), indexed."""
    ids = {p: r.task_in(p) for p in partitions}
    for task_id in ids.values():
        await r.service.create(HOLD, {}, "alice", task_id=task_id)
    await wait_until(lambda: all(r.indexer.lookup(t) for t in ids.values()), what="indexed")
    return ids


async def test_a_handed_over_partition_is_served_from_a_warm_standby_without_a_restore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = fresh_prefix("ho")
    a_settings, b_settings = replica_settings(prefix, "a"), replica_settings(prefix, "b")
    log = group_log(a_settings)
    async with replica(a_settings, log) as a, replica(b_settings, log) as b:
        await wait_until(lambda: a.indexer.partitions and b.indexer.partitions, what="shared")
        a_parts = set(a.indexer.partitions)
        ids = await created_in(a, a_parts)
        # b stands by for a's partitions, and its copies follow a's flushes.
        await wait_until(
            lambda: (
                b.indexer.standbys.warm() == a_parts
                and all(ids[p] in b.indexer.standbys.copies[p] for p in a_parts)
            ),
            what="b's copies of a's partitions are warm and hold a's new tasks",
        )
        await a.indexer.flush()
        expected = {p: a.indexer.partitions[p].entries() for p in a_parts}
        with full_restores(monkeypatch) as restored:
            assert await a.indexer.hand_over()
        assert restored == []  # served from the copies: no slice read in full
        assert {p: b.indexer.partitions[p].entries() for p in a_parts} == expected


async def test_a_crashed_owner_s_partitions_are_served_from_the_survivor_s_standby(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = fresh_prefix("ho")
    a_settings = replica_settings(prefix, "a", replicas={"session_timeout_ms": 1_000})
    b_settings = replica_settings(prefix, "b", replicas={"session_timeout_ms": 1_000})
    log = group_log(a_settings)
    async with replica(b_settings, log) as b, replica(a_settings, log) as a:
        await wait_until(lambda: a.indexer.partitions and b.indexer.partitions, what="shared")
        a_parts = set(a.indexer.partitions)
        ids = await created_in(a, a_parts)
        await a.indexer.flush()
        expected = {p: a.indexer.partitions[p].entries() for p in a_parts}
        await wait_until(
            lambda: (
                b.indexer.standbys.warm() == a_parts
                and all(ids[p] in b.indexer.standbys.copies[p] for p in a_parts)
            ),
            what="b's copies of a's partitions are warm",
        )
        with full_restores(monkeypatch) as restored:
            member = a.indexer._member
            assert isinstance(member, MemoryGroupTail)
            member.crash()  # no goodbye: a's session expires, then b takes its partitions
            await wait_until(
                lambda: set(b.indexer.partitions) == set(range(PARTITIONS)),
                what="b takes the crashed a's partitions",
            )
        assert restored == []
        assert {p: b.indexer.partitions[p].entries() for p in a_parts} == expected


def test_an_owner_over_its_share_gives_away_first_what_another_member_has_warm() -> None:
    owner = Claim("http://a", frozenset({0, 1, 2, 3}))
    back = Claim("http://b", warm=frozenset({2, 3}))  # a replica back, its copies warm
    assert sticky_assign(range(4), {"m-a": owner, "m-b": back}) == {"m-a": [0, 1], "m-b": [2, 3]}
    cold = Claim("http://b")
    assert sticky_assign(range(4), {"m-a": owner, "m-b": cold}) == {"m-a": [0, 1], "m-b": [2, 3]}
    back = Claim("http://b", warm=frozenset({0, 1}))
    assert sticky_assign(range(4), {"m-a": owner, "m-b": back}) == {"m-a": [2, 3], "m-b": [0, 1]}


async def test_a_lagging_standby_copy_is_caught_up_after_the_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = fresh_prefix("ho")
    a_settings, b_settings = replica_settings(prefix, "a"), replica_settings(prefix, "b")
    log = group_log(a_settings)
    stalled = asyncio.Event()

    async def stall(self: Standbys, tail: object) -> None:  # the copies stop following
        stalled.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(Standbys, "_step", stall)
    async with replica(a_settings, log) as a, replica(b_settings, log) as b:
        await wait_until(lambda: a.indexer.partitions and b.indexer.partitions, what="shared")
        a_parts = set(a.indexer.partitions)
        await wait_until(lambda: set(b.indexer.standbys.copies) == a_parts, what="b's copies")
        await wait_until(stalled.is_set, what="b's copies stalled")
        ids = await created_in(a, a_parts)  # written after b's copies stopped following
        await a.indexer.flush()
        assert not any(ids[p] in b.indexer.standbys.copies[p] for p in a_parts)
        expected = {p: a.indexer.partitions[p].entries() for p in a_parts}
        # b's state the moment it takes the partitions (before its tail reads on: a stale
        # state would be made good from the events, slower, and not past retention).
        taken: dict[int, Any] = {}
        b.indexer.add_ownership_listener(
            lambda gained, lost: taken.update(
                {p: b.indexer.partitions[p].entries() for p in gained}
            )
        )
        with full_restores(monkeypatch) as restored:
            assert await a.indexer.hand_over()
        assert restored == []
        assert taken == expected


async def test_the_wait_for_warm_copies_is_bounded_with_the_hand_over_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator turns the hand-over off (``timeout_s`` 0) while a replica is stopped
    draining: back on the replace path, it must not wait for ever for copies that never warm
    (the index topic's leader is away) before it rejoins for its share."""
    prefix = fresh_prefix("ho")
    a_settings = replica_settings(prefix, "a")
    b_settings = replica_settings(prefix, "b")
    log = group_log(a_settings)
    async with replica(b_settings, log) as b:
        async with replica(a_settings, log) as a:
            await wait_until(lambda: a.indexer.partitions, what="a takes a share")
            assert await a.indexer.hand_over()
        never = asyncio.Event()

        async def restore(self: Standbys, parts: set[int]) -> None:
            await never.wait()  # the copies never warm

        monkeypatch.setattr(Standbys, "_restore", restore)
        monkeypatch.setattr(ownership, "REJOIN_WAIT_S", 0.5)
        off = replica_settings(prefix, "a", handover={"timeout_s": 0})
        async with replica(off, log) as a:
            await wait_until(
                lambda: a.indexer.partitions and b.indexer.partitions,
                what="the restarted a has a share again with the hand-over off",
            )


def test_a_replica_given_partitions_or_done_rejoining_is_not_thought_draining() -> None:
    """Another member claiming this replica's URL and draining (a forged claim, or a crashed
    dynamic member of the same pod not yet expired) must not make it rejoin at every
    assignment: a rebalance each, for as long as that member stays. Only an empty share can be
    the drained one, and a few rejoins are enough (the first one carries the new claim)."""
    url = "http://b.test:8081"
    assignor = OwnershipAssignor(url, "events")
    data = json.dumps({"owners": {"0": url}, "draining": [url]}).encode()
    assignor.on_assignment([TopicPart("events", 0)], data)
    assert not assignor.thought_draining  # it was given a share: it is not drained
    assignor.on_assignment([], data)
    assert assignor.thought_draining  # the replace path's empty share: rejoin
    for _ in range(ownership_kafka.DRAINING_REJOINS):
        assignor.bump()
    assert not assignor.thought_draining  # rejoining did not help: someone else claims it


async def test_a_stopping_replica_s_own_last_cut_is_not_taken_for_its_new_owner_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seq tail applies records between the revoke's flush (where the index slices' ends
    are noted) and the loss, whose flush writes them: that write of the stopping replica's own
    moved the slice's end, and its streams ended "moved" (reported served) while the new owner
    had not even fenced the partition. Here the new owner's gain waits for that false news."""
    prefix = fresh_prefix("ho")
    a_settings = replica_settings(prefix, "a", handover={"timeout_s": 1.0})
    b_settings = replica_settings(prefix, "b")
    log = group_log(a_settings)
    async with replica(a_settings, log) as a, replica(b_settings, log) as b:
        await wait_until(
            lambda: a.indexer.partitions and b.indexer.partitions and not a.indexer.handovers.held,
            what="a and b share, b's share handed over",
        )
        a_parts = set(a.indexer.partitions)
        for p in a_parts:
            await a.service.create(HOLD, {}, "alice", task_id=a.task_in(p))
        await wait_until(
            lambda: all(len(a.indexer.partitions[p]) for p in a_parts), what="a indexes them"
        )
        real_note = a.indexer.handovers.note_ends

        async def note_ends(parts: set[int]) -> None:
            await real_note(parts)
            for p in parts:  # as the seq tail applying a record after the revoke's flush
                idx = a.indexer.partitions[p]
                idx.dirty.update(idx.rows)

        monkeypatch.setattr(a.indexer.handovers, "note_ends", note_ends)
        told = asyncio.Event()
        served_early: list[int] = []

        def on_done(seconds: float, served: bool) -> None:
            if served and not set(a_parts) <= set(b.indexer.partitions):
                served_early.append(1)
            told.set()

        a.indexer.handovers.on_done = on_done
        real_gain = ownership.Ownership.gain

        async def gain(self: ownership.Ownership, parts: set[int]) -> None:
            if self is b.indexer._ownership:
                await told.wait()
            await real_gain(self, parts)

        monkeypatch.setattr(ownership.Ownership, "gain", gain)
        await a.indexer.hand_over()
        assert not served_early


async def test_an_assignment_arriving_after_the_stop_starts_no_task() -> None:
    """aiokafka calls the group's callbacks from its coordinator, which runs until the
    consumer closes, after the indexer's own tasks are stopped: an assignment there (another
    replica of the rollout joins) must start nothing (a gain retried with back-off for ever,
    standby copies followed from a closed log, a rejoin)."""
    prefix = fresh_prefix("ho")
    settings = replica_settings(prefix, "a", handover={"timeout_s": 0})
    log = group_log(settings)
    async with replica(settings, log) as a:
        callbacks = a.indexer._callbacks
        assert callbacks is not None
    url = "http://a.test:8081"
    data = json.dumps({"owners": {"0": url}, "standbys": {"1": [url]}, "draining": [url]}).encode()
    topic = settings.topics.events
    await callbacks.revoked(frozenset())
    await callbacks.assigned(frozenset({TopicPart(topic, 0)}), data)
    own = a.indexer._ownership
    assert own._retrying is None or own._retrying.done()
    assert a.indexer.standbys._task is None
    assert callbacks._waiting is None


def test_a_garbled_claim_cannot_swell_the_assignment_or_the_leader_s_work() -> None:
    """Any group member writes its own claim: a URL of megabytes is copied into the owner map
    once per partition it owns and sent to every member (past the broker's limit, no round
    completes: nothing is served); owned and warm lists of millions of partitions cost the
    leader their size at every pass. A claim's URL is bounded (longer: garbled, claims
    nothing) and its lists count only the topic's partitions."""
    assignor = OwnershipAssignor("http://a", "events")
    huge = "http://" + "x" * 100_000
    members = {
        "big": json.dumps({"url": huge, "owned": [0, 1]}).encode(),
        "many": json.dumps(
            {"url": "http://m", "owned": list(range(200_000)), "warm": list(range(200_000))}
        ).encode(),
    }
    seen: list[Claim] = []
    real = ownership_kafka.sticky_assign

    def spy(partitions: Any, claims: Any) -> Any:
        seen.extend(claims.values())
        return real(partitions, claims)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ownership_kafka, "sticky_assign", spy)
        shares = assignor.assign([TopicPart("events", p) for p in range(4)], members)
    assert all(len(share.user_data) < 4_096 for share in shares.values())
    assert all(c.owned <= set(range(4)) and c.warm <= set(range(4)) for c in seen)
    assert sorted(p.partition for s in shares.values() for p in s.parts) == [0, 1, 2, 3]


def test_when_every_member_drains_none_is_given_what_another_holds() -> None:
    """Every replica stops at once (a scale to zero, a node drained), one after the other's
    hand-over: the first, drained and owning nothing, must not be given half back by the
    balance (a gain, fencing the owner, while it stops; each stream moved twice)."""
    claims = {
        "m-a": Claim("http://a", frozenset(), draining=True),
        "m-b": Claim("http://b", frozenset({0, 1, 2}), draining=True),
    }
    assert sticky_assign(range(4), claims) == {"m-a": [3], "m-b": [0, 1, 2]}


def test_a_claim_of_another_member_s_instance_id_names_no_instance() -> None:
    """A survivor has the group drop an unreachable owner by the instance id the map names for
    its URL: a member claiming another's instance id (the broker keeps them unique among its
    members, so two claims of one are a forgery) would have the healthy one removed instead,
    at each suspicion. An instance id claimed twice is named for neither URL."""
    assignor = OwnershipAssignor("http://a", "events")
    members = {
        "real": json.dumps({"url": "http://y", "owned": [0], "instance": "y"}).encode(),
        "fake": json.dumps({"url": "http://x", "owned": [1], "instance": "y"}).encode(),
        "other": json.dumps({"url": "http://z", "instance": "z"}).encode(),
    }
    shares = assignor.assign([TopicPart("events", p) for p in range(3)], members)
    data = json.loads(shares["real"].user_data)
    assert data["instances"] == {"http://z": "z"}

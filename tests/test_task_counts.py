"""The active-task limit counts what the replica's index holds: across restarts, partition moves,
task ends and expiry, and for tasks 8fd441c persisted with a 64-bit owner.

The first tests need no broker: an indexer that was never started is handed a partition index
directly, and a create that passes the limit then fails at the unstarted publisher (nothing is
written), which tells "refused by the limit" from "allowed". The others run real replicas
(persisting indexers, so a restart or a new owner restores the index instead of re-reading the
log).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest
from support.layout import create_topics, fresh_prefix, make_settings
from support.services import HOLD, create_many, task_service
from support.waits import wait_until

from bridge.clock import SYSTEM_CLOCK, Clock
from bridge.config import Settings, ToolSpec
from bridge.log.indexer import Indexer
from bridge.log.publisher import Published
from bridge.log.reader import Reader
from bridge.log.seqindex import FLAG_OWNER_PREFIX, PartitionIndex, TaskEntry, owner_key
from bridge.tasks.messages import new_task_id, owner_digest
from bridge.tasks.service import TaskService, TaskView, TooManyTasks
from bridge.vocabulary import StatusPayload, TaskStatus

HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def entry(owner: int, *, ttl_ms: int = -1, flags: int = 0, status: TaskStatus) -> TaskEntry:
    """An index entry as a restored index holds it: created now, seq 0 at offset 0."""
    made = TaskEntry()
    made.owner, made.flags, made.status = owner, flags, status
    made.created_ms, made.ttl_ms, made.poll_ms = now_ms(), ttl_ms, 1000
    made.next_seq, made.last_offset = 1, 0
    made.checkpoints.extend((0, 0))
    return made


class MovableClock:
    """The real clocks, moved ahead by ``ahead_s``."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def wall(self) -> float:
        return SYSTEM_CLOCK.wall() + self.ahead_s

    def monotonic(self) -> float:
        return SYSTEM_CLOCK.monotonic() + self.ahead_s


def offline_service(
    limit: int, *tasks: tuple[str, TaskEntry], clock: Clock = SYSTEM_CLOCK
) -> TaskService:
    """A task service over an indexer that owns partition 0 of 1, restored with ``tasks``."""
    settings = make_settings(
        "127.0.0.1:9", fresh_prefix("cnt"), tasks={"max_active_per_principal": limit}
    )
    indexer = Indexer(settings)
    indexer.partition_count = 1
    idx = PartitionIndex(0, settings.tasks.checkpoint_interval, through=len(tasks))
    for task_id, restored in tasks:
        idx.restore_task(task_id, restored)
    indexer.partitions = {0: idx}
    reader = Reader(settings, indexer)
    return TaskService(settings, indexer, reader, {HOLD.name: HOLD}, clock=clock)


async def refused(service: TaskService, principal: str = "alice") -> bool:
    """Whether the limit refuses ``principal``'s next create (the service is not started)."""
    try:
        await service.create(HOLD, {}, principal)
    except TooManyTasks:
        return True
    except RuntimeError as exc:  # past the limit; the unstarted publisher wrote nothing
        assert "not started" in str(exc), exc
        return False
    raise AssertionError("a task was created without a publisher")


ALICE = owner_key(owner_digest("alice"))


async def test_a_restored_index_counts_its_active_tasks() -> None:
    service = offline_service(
        2,
        ("t1", entry(ALICE, status=TaskStatus.WORKING)),
        ("t2", entry(ALICE, status=TaskStatus.INPUT_REQUIRED)),
        ("t3", entry(ALICE, status=TaskStatus.COMPLETED)),  # ended: no place
    )
    assert await refused(service)
    assert not await refused(service, "bob")  # a budget of its own


async def test_a_legacy_64_bit_entry_counts_against_the_same_principals_creates() -> None:
    legacy = (ALICE >> 64) << 64  # what 8fd441c persisted: the first 64 bits only
    service = offline_service(
        1, ("old", entry(legacy, flags=FLAG_OWNER_PREFIX, status=TaskStatus.WORKING))
    )
    assert await refused(service)
    assert not await refused(service, "bob")
    # The same 64 bits without the legacy flag are another (128-bit) owner.
    other = offline_service(1, ("new", entry(legacy, status=TaskStatus.WORKING)))
    assert not await refused(other)


async def test_an_expired_task_frees_its_place() -> None:
    clock = MovableClock()
    service = offline_service(
        1, ("t1", entry(ALICE, ttl_ms=HOUR_MS, status=TaskStatus.WORKING)), clock=clock
    )
    assert await refused(service)
    clock.ahead_s = 2 * HOUR_MS / 1000
    assert not await refused(service)


async def test_a_create_written_elsewhere_is_released_unless_this_replica_owns_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def written(_publisher: object, _types: object, *args: object) -> Published:
        return Published(partition=1, offset=0)  # a partition this replica does not index

    async def queued(
        self: TaskService, tool: ToolSpec, args: object, task_id: str, *_: object
    ) -> TaskView:
        return TaskView(task_id, "working", 0, 0, None, 1000)

    monkeypatch.setattr("bridge.tasks.service.publish_created", written)
    monkeypatch.setattr(TaskService, "_queue", queued)
    service = offline_service(1)
    service.indexer.partition_count = 2
    ids = (t for t in iter(new_task_id, None) if service.indexer.partition_of(t) == 1)
    for _ in range(3):  # partition 1's owner counts them: each create frees its place here
        await service.create(HOLD, {}, "alice", task_id=next(ids))
    service.indexer.partitions = {}  # owning nothing, nothing here would ever stop the count
    await service.create(HOLD, {}, "alice", task_id=next(ids))
    with pytest.raises(TooManyTasks):
        await service.create(HOLD, {}, "alice", task_id=next(ids))


# --- real replicas ---------------------------------------------------------------------------


@pytest.mark.kafka
async def test_after_a_restart_the_limit_counts_the_persisted_tasks(kafka_bootstrap: str) -> None:
    settings = make_settings(
        kafka_bootstrap, fresh_prefix("cnt"), tasks={"max_active_per_principal": 2}
    )
    await create_topics(settings, [HOLD.name])
    async with task_service(settings, persist=True) as service:
        views = await create_many(service, "alice", 2)
        assert len(views) == 2
    # A new process restores the index (the stop flushed it): alice is at her limit already.
    async with task_service(settings, persist=True) as service:
        assert await create_many(service, "alice", 3) == []
        # A restored task that ends frees its place.
        published = await service.publisher.publish(
            views[0].task_id,
            settings.own_types.status,
            StatusPayload(status="completed", result={"content": []}).payload(),
        )
        async with asyncio.timeout(30):
            await service.indexer.wait_indexed(published.partition, published.offset)
        assert len(await create_many(service, "alice", 3)) == 1


@pytest.mark.kafka
async def test_a_moved_partition_counts_at_its_new_owner_only(kafka_bootstrap: str) -> None:
    prefix, secret, limit = fresh_prefix("cnt"), secrets.token_urlsafe(32), 4

    def replica(i: int) -> Settings:
        return make_settings(
            kafka_bootstrap,
            prefix,
            topics={"prefix": prefix, "partitions": 4, "min_insync_replicas": 1},
            tasks={"max_active_per_principal": limit},
            replicas={
                "ownership": "group",
                "instance_id": f"counts-{i}",
                "session_timeout_ms": 6000,
            },
            peers={
                "hosts": ["127.0.0.2", "127.0.0.3"],
                # No hop is made here; the owner URLs only need to be valid peer listeners' URLs.
                "advertised_url": f"http://127.0.0.{2 + i}:8081",
                "secret": secret,
            },
        )

    await create_topics(replica(0), [HOLD.name])
    async with task_service(replica(0), persist=True) as one:
        assert set(one.indexer.partitions) == {0, 1, 2, 3}
        # One task of alice's in each partition, so whichever partitions move take some along.
        for partition in range(4):
            task_id = next(
                t for t in iter(one.new_task_id, None) if one.indexer.partition_of(t) == partition
            )
            await one.create(HOLD, {}, "alice", task_id=task_id)
        assert await create_many(one, "alice", 1) == []
        async with task_service(replica(1), persist=True) as two:

            def divided() -> list[set[int]] | None:
                owned = [set(s.indexer.partitions) for s in (one, two)]
                split = all(owned) and owned[0] | owned[1] == {0, 1, 2, 3}
                return owned if split and not owned[0] & owned[1] else None

            owned = await wait_until(divided, what="the two replicas divide the partitions")
            # Each counts alice's tasks in the partitions it owns now, and nothing else.
            made = await asyncio.gather(
                create_many(one, "alice", 2 * limit), create_many(two, "alice", 2 * limit)
            )
            assert [len(m) for m in made] == [limit - len(owned[0]), limit - len(owned[1])]

            # A creation in a partition another replica owns holds its place here only while
            # it runs: its owner counts it from then on.
            elsewhere = next(
                t for t in iter(new_task_id, None) if two.indexer.owns(two.indexer.partition_of(t))
            )
            await one.create(HOLD, {}, "carol", task_id=elsewhere)
            await wait_until(
                lambda: two.indexer.lookup(elsewhere) is not None, what="the owner indexes it"
            )
            made = await asyncio.gather(
                create_many(one, "carol", 2 * limit), create_many(two, "carol", 2 * limit)
            )
            assert [len(m) for m in made] == [limit, limit - 1]

"""Partitions move between replicas without users noticing (issue 30, items 1 and 2).

In-process replicas (``ownership = "group"``: an indexer each, a fan-out, a task service) on
one in-memory log, no HTTP: the group's eager rebalances, the planned hand-over of a draining
replica, and its return.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from support.inmemory import memory_log
from support.layout import fresh_prefix, make_settings
from support.waits import wait_until

from bridge.config import Settings, ToolSpec
from bridge.kafka.memory import MemoryLog
from bridge.log.fanout import MOVED, Fanout, Subscription
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.tasks.messages import new_task_id
from bridge.tasks.service import TaskService

PARTITIONS = 3
HOLD = ToolSpec(name="hold", description="Never picked up", task="required")


def replica_settings(prefix: str, name: str, **overrides: object) -> Settings:
    return make_settings(
        "127.0.0.1:9",
        prefix,
        ownership="group",
        instance_id=name,
        advertised_url=f"http://{name}.test:8081",
        peer_secret="handover-test-peer-secret-0123456789abcdef",
        group_session_timeout_ms=6_000,
        **overrides,
    )


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
            live: dict[int, Subscription] = {
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

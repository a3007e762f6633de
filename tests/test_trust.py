"""The events topic's trust model on the real broker: records never change a task's identity.

Any pipeline that can write to the events topic writes records; here a hostile one writes, for
a task it learned the id of, a status the bridge does not know and then a second
``task.created`` naming itself as the owner. The task must stay its creator's, and the hostile
records must still be ordinary events with their own seq.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from support.layout import changed, create_topics

from bridge.config import Settings, ToolSpec
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.log.seqindex import owner_key
from bridge.tasks.messages import owner_digest
from bridge.tasks.service import TaskNotFound, TaskService, TooManyTasks
from bridge.vocabulary import EventSuffix

pytestmark = pytest.mark.kafka

BOUND = 30  # seconds any single wait may take before the test fails
TOOL = ToolSpec(name="parked", ttl_ms=3_600_000)  # no worker: its tasks stay working


@dataclass
class Side:
    settings: Settings
    indexer: Indexer
    reader: Reader
    service: TaskService


@contextlib.asynccontextmanager
async def bridge_side(settings: Settings) -> AsyncIterator[Side]:
    await create_topics(settings, [TOOL.name])
    async with Indexer(settings) as indexer:
        reader = Reader(settings, indexer)
        service = TaskService(settings, indexer, reader, {TOOL.name: TOOL})
        await service.start()
        try:
            yield Side(settings, indexer, reader, service)
        finally:
            await service.stop()
            await reader.close()


async def write_raw(side: Side, task_id: str, records: list[dict[str, Any]]) -> None:
    """Write JSON records as any producer could (no SDK checks), and wait until indexed."""
    producer = AIOKafkaProducer(bootstrap_servers=side.settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for record in records:
            where = await producer.send_and_wait(
                side.settings.topics.events, key=task_id.encode(), value=json.dumps(record).encode()
            )
    finally:
        await producer.stop()
    async with asyncio.timeout(BOUND):
        await side.indexer.wait_indexed(where.partition, where.offset)


def hostile_records(prefix: str, owner: str) -> list[dict[str, Any]]:
    now = time.time_ns() // 1_000_000
    created = {"tool": TOOL.name, "owner": owner, "createdMs": now, "ttlMs": None}
    return [
        {"type": f"{prefix}.{EventSuffix.STATUS}", "payload": {"status": "Working"}},
        {"type": f"{prefix}.{EventSuffix.STATUS}", "payload": {"status": "UNKNOWN"}},
        {"type": f"{prefix}.{EventSuffix.CREATED}", "payload": {**created, "pollIntervalMs": 1}},
    ]


async def test_a_hostile_producer_cannot_take_over_a_task_and_its_records_keep_their_seq(
    topics: Settings,
) -> None:
    settings = changed(topics, tasks={"max_active_per_principal": 1})
    prefix = settings.tasks.event_type_prefix
    async with bridge_side(settings) as side:
        task = await side.service.create(TOOL, {}, "alice")
        hostile = hostile_records(prefix, owner_digest("mallory"))
        await write_raw(side, task.task_id, hostile)

        view = await side.service.get(task.task_id, "alice")
        assert view.status == "working"
        assert (view.created_ms, view.ttl_ms, view.poll_interval_ms) == (
            task.created_ms,
            TOOL.ttl_ms,
            TOOL.poll_interval_ms,
        )
        with pytest.raises(TaskNotFound):
            await side.service.get(task.task_id, "mallory")
        found = side.indexer.lookup(task.task_id)
        assert found is not None and found[1].owner == owner_key(owner_digest("alice"))

        # The hostile records are ordinary events at seq 1..3, delivered as written.
        async with asyncio.timeout(BOUND):
            events = [
                (e.seq, e.event.type, e.event.payload) async for e in side.reader.read(task.task_id)
            ]
        assert [seq for seq, _, _ in events] == [0, 1, 2, 3]
        assert [(t, p) for _, t, p in events[1:]] == [(r["type"], r["payload"]) for r in hostile]

        # The task still counts against alice's active tasks, not mallory's.
        with pytest.raises(TooManyTasks):
            await side.service.create(TOOL, {}, "alice")
        await side.service.create(TOOL, {}, "mallory")

"""Identity records on the real broker: only the bridge's signed ``task.created`` defines a task.

A pipeline holds WRITE on the events topic and nothing else. It can append events to any task
it knows the id of (statuses included: workers are such pipelines), but a ``task.created`` it
writes names no owner: not for a new id (a fake task of a victim's), and not in an index
rebuilt after retention deleted a task's real first record.

This file uses only interfaces 8fd441c already had, so it runs against it too (and fails).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from support.layout import changed
from test_trust import BOUND, TOOL, bridge_side

from bridge.config import Settings
from bridge.kafka.admin import delete_records_before
from bridge.kafka.clients import TopicPartition
from bridge.log.indexer import Indexer
from bridge.log.seqindex import owner_key
from bridge.tasks.messages import new_task_id, owner_digest
from bridge.tasks.service import TaskNotFound
from bridge.vocabulary import EventSuffix

pytestmark = pytest.mark.kafka


async def append_raw(settings: Settings, task_id: str, records: list[dict[str, Any]]) -> int:
    """Append JSON records as a pipeline with plain WRITE would; the last one's offset."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for record in records:
            where = await producer.send_and_wait(
                settings.topics.events, key=task_id.encode(), value=json.dumps(record).encode()
            )
    finally:
        await producer.stop()
    return where.offset


def forged_created(prefix: str, principal: str) -> dict[str, Any]:
    """A well-formed ``task.created`` naming ``principal``, as anyone can compute it."""
    payload = {
        "tool": TOOL.name,
        "owner": owner_digest(principal),
        "createdMs": time.time_ns() // 1_000_000,
        "ttlMs": None,
        "pollIntervalMs": 1000,
    }
    return {"type": f"{prefix}.{EventSuffix.CREATED}", "payload": payload}


async def test_a_forged_task_created_is_no_task_of_the_victim_and_takes_none_of_its_slots(
    topics: Settings,
) -> None:
    settings = changed(topics, tasks={"max_active_per_principal": 1})
    async with bridge_side(settings) as side:
        fake = new_task_id()
        offset = await append_raw(
            settings, fake, [forged_created(settings.tasks.event_type_prefix, "alice")]
        )
        async with asyncio.timeout(BOUND):
            await side.indexer.wait_indexed(side.indexer.partition_of(fake), offset)

        found = side.indexer.lookup(fake)
        assert found is not None and found[1].owner == 0  # a record, with its seq: no owner
        with pytest.raises(TaskNotFound):
            await side.service.get(fake, "alice")
        # The victim's only slot is still free.
        task = await side.service.create(TOOL, {}, "alice")
        assert (await side.service.get(task.task_id, "alice")).status == "working"


async def test_a_pipeline_with_plain_write_still_appends_events_and_statuses_to_a_task(
    topics: Settings,
) -> None:
    prefix = topics.tasks.event_type_prefix
    async with bridge_side(topics) as side:
        task = await side.service.create(TOOL, {}, "alice")
        step = {"type": "com.example.step", "payload": {"n": 1}}
        done = {"type": f"{prefix}.{EventSuffix.STATUS}", "payload": {"status": "completed"}}
        offset = await append_raw(topics, task.task_id, [step, done])
        async with asyncio.timeout(BOUND):
            await side.indexer.wait_indexed(side.indexer.partition_of(task.task_id), offset)
            events = [(e.seq, e.event.type) async for e in side.reader.read(task.task_id)]
        assert events == [
            (0, f"{prefix}.{EventSuffix.CREATED}"),
            (1, step["type"]),
            (2, done["type"]),
        ]
        assert (await side.service.get(task.task_id, "alice")).status == "completed"


async def test_an_index_rebuilt_after_retention_takes_no_owner_from_a_later_task_created(
    topics: Settings,
) -> None:
    prefix = topics.tasks.event_type_prefix
    async with bridge_side(topics) as side:
        task = await side.service.create(TOOL, {}, "alice")
        partition = side.indexer.partition_of(task.task_id)
        step = {"type": "com.example.step", "payload": {}}
        await append_raw(topics, task.task_id, [step])
        # A pipeline writes a task.created of its own, naming itself, for the same task id ...
        forged = await append_raw(topics, task.task_id, [forged_created(prefix, "mallory")])
    # ... and retention deletes every record of the task before it, its real seq 0 included.
    await delete_records_before(topics, TopicPartition(topics.topics.events, partition), forged)

    # No index was persisted: a new process rebuilds the partition from what is left, where
    # the forged record is the task's first.
    async with Indexer(topics) as rebuilt:
        async with asyncio.timeout(BOUND):
            await rebuilt.wait_indexed(partition, forged)
        found = rebuilt.lookup(task.task_id)
        assert found is not None and found[1].next_seq == 1  # counted, as an ordinary event
        assert found[1].owner != owner_key(owner_digest("mallory"))
        assert found[1].owner == 0

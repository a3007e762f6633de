"""Upgrading a topic layout populated by 8fd441c: old tasks keep their owners, forgeries do not.

The fixture (tests/fixtures/upgrade-8fd441c/, made by tests/support/upgrade_8fd441c.py with
8fd441c's code) holds every committed record of the events, index and task-updates topics:
three tasks created through 8fd441c's tools/call path and persisted in its index (version 2,
64-bit owners), and one (carol's) that 8fd441c wrote after its last index flush. It is replayed
into fresh topics and served by the current code, twice (the second start restores the index
the first one persisted, with its upgrade offset).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.layout import create_topics, fresh_prefix, make_settings
from support.upgrade_8fd441c import dump, load_fixture, replay
from test_identity_records import append_raw, forged_created

from bridge.config import Settings, ToolSpec
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.log.seqindex import FLAG_OWNER_PREFIX, MarkerRecord, decode_index_record, owner_key
from bridge.log.updates import decode_update
from bridge.log.verify import verify_index
from bridge.tasks.messages import new_task_id, owner_digest
from bridge.tasks.service import TaskNotFound, TaskService

pytestmark = pytest.mark.kafka

BOUND = 30
FIXTURE = load_fixture()
TOOL = ToolSpec(name=FIXTURE["tool"], ttl_ms=None)
PRINCIPALS = ("alice", "bob", "carol", "mallory")


def upgrade_settings(bootstrap: str) -> Settings:
    prefix = fresh_prefix("upgrade")
    return make_settings(
        bootstrap,
        prefix,
        topics={
            "prefix": prefix,
            "partitions": FIXTURE["partitions"],
            "min_insync_replicas": 1,
            "retention_ms": -1,  # the records keep their 8fd441c timestamps
        },
        tasks={"event_type_prefix": FIXTURE["eventTypePrefix"]},
    )


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[Indexer, TaskService]]:
    """The current code's indexer (persisting, as `bridge serve` runs it) and task service."""
    async with Indexer(settings, persist=True) as indexer:
        reader = Reader(settings, indexer)
        service = TaskService(settings, indexer, reader, {TOOL.name: TOOL})
        await service.start()
        try:
            async with asyncio.timeout(BOUND):
                await indexer.catch_up()
            yield indexer, service
        finally:
            await service.stop()
            await reader.close()


async def assert_owners_kept(service: TaskService) -> None:
    for task in FIXTURE["tasks"]:
        view = await service.get(task["taskId"], task["owner"])
        assert view.status == task["status"]
        for other in set(PRINCIPALS) - {task["owner"]}:
            with pytest.raises(TaskNotFound):
                await service.get(task["taskId"], other)


async def forge(settings: Settings, indexer: Indexer, victim: str) -> str:
    fake = new_task_id()
    offset = await append_raw(
        settings, fake, [forged_created(settings.tasks.event_type_prefix, victim)]
    )
    async with asyncio.timeout(BOUND):
        await indexer.wait_indexed(indexer.partition_of(fake), offset)
    return fake


async def test_tasks_created_by_8fd441c_keep_their_owners_and_new_forgeries_are_refused(
    kafka_bootstrap: str,
) -> None:
    settings = await create_topics(upgrade_settings(kafka_bootstrap), [TOOL.name])
    await replay(FIXTURE, settings)

    async with serving(settings) as (indexer, service):
        await assert_owners_kept(service)
        legacy = {t["taskId"]: indexer.lookup(t["taskId"]) for t in FIXTURE["tasks"]}
        carol = next(t["taskId"] for t in FIXTURE["tasks"] if t["owner"] == "carol")
        for task_id, found in legacy.items():
            assert found is not None
            # 8fd441c's index held 64 bits of each owner; carol's came from the log, whole.
            assert bool(found[1].flags & FLAG_OWNER_PREFIX) == (task_id != carol)
        fake = await forge(settings, indexer, "alice")
        with pytest.raises(TaskNotFound):
            await service.get(fake, "alice")
        assert indexer.refused_identities == 1
        fresh = await service.create(TOOL, {}, "alice")  # a signed one
        assert (await service.get(fresh.task_id, "alice")).status == "working"

    # The forged task gave its victim no task-updates record (no task.updated, no listen).
    updates = [
        decode_update(_b(r["key"]), _b(r["value"])) for r in await _records(settings, "updates")
    ]
    assert fresh.task_id in {u.task_id for u in updates}
    assert fake not in {u.task_id for u in updates}

    async with serving(settings) as (indexer, service):  # restored from what the first persisted
        await assert_owners_kept(service)
        with pytest.raises(TaskNotFound):
            await service.get(fake, "alice")
        assert (await service.get(fresh.task_id, "alice")).status == "working"
        again = await forge(settings, indexer, "bob")
        found = indexer.lookup(again)
        assert found is not None and found[1].owner == 0
    # `bridge verify` agrees with the upgraded index (64-bit owners included).
    report = await verify_index(settings)
    assert report.ok, report.mismatches[:5]
    # Each partition 8fd441c had indexed now has a current marker whose upgrade offset is the
    # end 8fd441c left (carol's task.created, never indexed by it, is below it).
    latest = {}
    for record in await _records(settings, "index"):
        if _b(record["key"]).startswith(b"p:"):
            marker = decode_index_record(_b(record["key"]), _b(record["value"]))
            latest[marker.partition] = marker
    ends: dict[int, int] = {}
    for record in FIXTURE["records"]["events"]:
        ends[record["partition"]] = record["offset"] + 1
    legacy = {
        int(_b(r["key"])[2:]) for r in FIXTURE["records"]["index"] if _b(r["key"])[:2] == b"p:"
    }
    assert legacy
    for partition in legacy:
        marker = latest[partition]
        assert isinstance(marker, MarkerRecord) and marker.version == 3
        assert marker.unsigned_below == ends[partition]


def test_task_updates_written_by_8fd441c_are_matched_to_their_owner() -> None:
    owners = {t["taskId"]: t["owner"] for t in FIXTURE["tasks"]}
    updates = [decode_update(_b(r["key"]), _b(r["value"])) for r in FIXTURE["records"]["updates"]]
    assert updates and not any(u.full_owner for u in updates)
    for update in updates:
        for principal in PRINCIPALS:
            mine = owners[update.task_id] == principal
            assert update.matches(owner_key(owner_digest(principal))) == mine


async def _records(settings: Settings, role: str) -> list[dict[str, Any]]:
    return await dump(settings, getattr(settings.topics, role))


def _b(text: str) -> bytes:
    return base64.b64decode(text)

"""The rolling upgrade from 0.1.0 (8fd441c), in two steps (CHANGELOG.md "Upgrade").

Step 1 runs this version with ``upgrade.from = "0.1"`` next to replicas of 8fd441c: it writes
what they read (index version 2, clear subscription records) and honours the unsigned
``task.created`` records they keep writing. Step 2 runs it without the setting: the first take
of each partition fixes its upgrade offset, and unsigned records after it define nothing.

The fixtures hold what 8fd441c wrote (tests/fixtures/upgrade-8fd441c/ and
tests/fixtures/upgrade-8fd441c-subscriptions/), so "readable by 8fd441c" is checked as "byte
for byte what 8fd441c wrote".
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from support.inmemory import NO_BROKER, memory_log
from support.layout import create_topics, fresh_prefix, make_settings
from support.topics import TopicRecord, replay_records, topic_records
from support.upgrade_8fd441c import dump, load_fixture, replay
from test_upgrade_8fd441c import TOOL, serving, upgrade_settings

from bridge import config
from bridge.config import Settings
from bridge.events_extension import registry as subscriptions_topic
from bridge.events_extension.registry import SubscriptionRegistry
from bridge.events_extension.subscriptions import parse_record
from bridge.kafka.clients import AIOKafkaProducer, ConsumerRecord, partition_for_key
from bridge.log.seqindex import (
    FLAG_OWNER_PREFIX,
    UNSIGNED_UNDECIDED,
    MarkerRecord,
    PartitionIndex,
    TaskIdentity,
    TaskRecord,
    decode_index_record,
    owner_key,
)
from bridge.sealing import KeyRing, Sealer
from bridge.tasks.messages import new_task_id, owner_digest
from bridge.tasks.service import TaskNotFound
from bridge.vocabulary import TaskStatus

FIXTURE = load_fixture()
SUBSCRIPTIONS = Path(__file__).parent / "fixtures" / "upgrade-8fd441c-subscriptions"
BOUND = 30


def _b(text: str) -> bytes:
    return base64.b64decode(text)


def rolling(settings: Settings) -> Settings:
    """``settings`` for step 1 of the upgrade (``BRIDGE_UPGRADE__FROM=0.1``)."""
    return settings.model_copy(
        update={"upgrade": settings.upgrade.model_copy(update={"from_": "0.1"})}
    )


# --- what 8fd441c reads -----------------------------------------------------------------------


def test_index_records_written_during_the_upgrade_are_those_8fd441c_writes() -> None:
    owners = {t["taskId"]: t["owner"] for t in FIXTURE["tasks"]}
    checked = 0
    for record in FIXTURE["records"]["index"]:
        key, value = _b(record["key"]), _b(record["value"])
        decoded = decode_index_record(key, value)
        if isinstance(decoded, TaskRecord):
            entry = decoded.entry
            # The same task as this version knows it live: its whole 128-bit owner.
            entry.owner = owner_key(owner_digest(owners[decoded.task_id]))
            entry.flags &= ~FLAG_OWNER_PREFIX
            assert entry.encode(decoded.partition, legacy=True) == value
            again = decode_index_record(key, value)  # as restored: 64 bits of the owner
            assert isinstance(again, TaskRecord)
            restored = PartitionIndex(decoded.partition, 4)
            restored.restore_task(again.task_id, again.entry)
            restored.legacy = True
            assert restored.encode_task(decoded.task_id) == value
        else:
            assert isinstance(decoded, MarkerRecord)
            idx = PartitionIndex(decoded.partition, 4)
            idx.restore_marker(decoded.through, decoded.lost_before, UNSIGNED_UNDECIDED, 2)
            idx.legacy = True
            assert idx.marker() == value
            idx.legacy = False
            assert idx.marker() != value  # version 3 otherwise
        checked += 1
    assert checked == len(FIXTURE["records"]["index"]) >= 4


def test_subscription_records_written_during_the_upgrade_are_those_8fd441c_writes() -> None:
    stored = json.loads((SUBSCRIPTIONS / "records.json").read_text())
    values = [_b(r["value"]) for r in stored if r["value"] is not None]
    assert values
    for value in values:
        parsed = parse_record(value)
        assert parsed.sealed is None
        assert subscriptions_topic.clear_record(parsed.subscription(parsed.clear)) == value


def test_task_event_cursors_are_of_version_1_during_the_upgrade_unless_set() -> None:
    settings = Settings()
    assert config.task_cursor_version(settings) == 2
    assert config.task_cursor_version(rolling(settings)) == 1
    explicit = Settings(events={"cursors": {"task_version": 2}}, upgrade={"from": "0.1"})
    assert config.task_cursor_version(explicit) == 2
    assert config.task_cursor_version(Settings(events={"cursors": {"task_version": 1}})) == 1
    assert not Settings(upgrade={"from": ""}).upgrade.legacy  # a template's empty value


# --- the tasks of 8fd441c's replicas still running (F1) ----------------------------------------


async def append_as_8fd441c(settings: Settings, partition: int) -> str:
    """A ``task.created`` as a replica of 8fd441c writes it (carol's, from the fixture: same
    bytes, unsigned) under a new task id of ``partition``; returns the id."""
    carol = next(t["taskId"] for t in FIXTURE["tasks"] if t["owner"] == "carol")
    record = next(r for r in FIXTURE["records"]["events"] if _b(r["key"]) == carol.encode())
    task_id = new_task_id()
    while partition_for_key(task_id.encode(), FIXTURE["partitions"]) != partition:
        task_id = new_task_id()
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topics.events,
            key=task_id.encode(),
            value=_b(record["value"]),
            headers=[(name, _b(value)) for name, value in record["headers"]],
        )
    finally:
        await producer.stop()
    return task_id


async def indexed(indexer: Any, settings: Settings, task_id: str) -> None:
    partition = indexer.partition_of(task_id)
    ends = await indexer.end_offsets()
    async with asyncio.timeout(BOUND):
        await indexer.wait_indexed(partition, ends[partition] - 1)


async def index_records(settings: Settings) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes] = {}
    for record in await dump(settings, settings.topics.index):
        if record["value"] is not None:
            latest[_b(record["key"])] = _b(record["value"])
    return latest


@pytest.mark.kafka
async def test_unsigned_tasks_of_8fd441c_replicas_define_their_task_until_the_second_step(
    kafka_bootstrap: str,
) -> None:
    settings = await create_topics(upgrade_settings(kafka_bootstrap), [TOOL.name])
    await replay(FIXTURE, settings)

    # Step 1: this version took the partitions; a replica of 8fd441c still creates tasks.
    async with serving(rolling(settings)) as (indexer, service):
        during = await append_as_8fd441c(settings, 0)
        await indexed(indexer, settings, during)
        assert (await service.get(during, "carol")).status == "working"
        with pytest.raises(TaskNotFound):
            await service.get(during, "alice")
        assert indexer.refused_identities == 0
        signed = await service.create(TOOL, {}, "alice")
        await indexer.flush()
    # Everything it persisted is in 8fd441c's format: version 2, markers without an offset.
    for key, value in (await index_records(settings)).items():
        assert value[0] == 2, key
        if key.startswith(b"p:"):
            assert len(value) == 17, key

    # Step 2: the setting removed; the first take fixes the upgrade offset.
    async with serving(settings) as (indexer, service):
        end = (await indexer.end_offsets())[0]
        assert (await service.get(during, "carol")).status == "working"
        assert (await service.get(signed.task_id, "alice")).status == "working"
        after = await append_as_8fd441c(settings, 0)
        await indexed(indexer, settings, after)
        with pytest.raises(TaskNotFound):
            await service.get(after, "carol")
        assert indexer.refused_identities == 1
    marker = decode_index_record(b"p:0", (await index_records(settings))[b"p:0"])
    assert isinstance(marker, MarkerRecord) and marker.version == 3
    assert marker.unsigned_below == end


@pytest.mark.kafka
async def test_a_partition_8fd441c_never_indexed_keeps_its_tasks_and_refuses_later_forgeries(
    kafka_bootstrap: str,
) -> None:
    """8fd441c stopped before its first index flush (no marker): its records still count."""
    settings = await create_topics(upgrade_settings(kafka_bootstrap), [TOOL.name])
    events_only = {**FIXTURE, "records": {**FIXTURE["records"], "index": [], "updates": []}}
    await replay(events_only, settings)
    async with serving(settings) as (indexer, service):
        for task in FIXTURE["tasks"]:
            assert (await service.get(task["taskId"], task["owner"])).status == task["status"]
        later = await append_as_8fd441c(settings, 0)
        await indexed(indexer, settings, later)
        with pytest.raises(TaskNotFound):
            await service.get(later, "carol")
        assert indexer.refused_identities == 1


def test_in_a_partition_without_a_marker_the_first_signed_task_created_ends_the_unsigned_ones() -> (
    None
):
    who = TaskIdentity(owner_key(owner_digest("carol")), 1, -1, 1000)
    idx = PartitionIndex(0, 4, unsigned_below=10)
    idx.provisional = True  # what the indexer sets for records found without a marker
    idx.apply("old", 0, created=True, identity=who)
    idx.apply("new", 3, created=True, identity=who, signed=True)
    idx.apply("forged", 5, created=True, identity=who)
    assert idx.unsigned_below == 3
    assert [idx.get(t).owner for t in ("old", "new", "forged")] == [who.owner, who.owner, 0]  # type: ignore[union-attr]
    assert idx.refused == 1


def test_an_owner_of_8fd441c_is_found_under_its_legacy_key() -> None:
    """F11: what the active-task count adds for entries that hold 64 bits of their owner."""
    from bridge.log.seqindex import legacy_owner_key  # new in this change

    full = owner_key(owner_digest("alice"))
    key = f"t:{FIXTURE['tasks'][0]['taskId']}".encode()
    value = next(_b(r["value"]) for r in FIXTURE["records"]["index"] if _b(r["key"]) == key)
    restored = decode_index_record(key, value)
    assert isinstance(restored, TaskRecord)
    assert restored.entry.owner == legacy_owner_key(full) != full


# --- a copy of a signed task.created in another partition (F9) ----------------------------------


@pytest.mark.kafka
async def test_a_signed_task_created_copied_into_another_partition_defines_nothing(
    kafka_bootstrap: str,
) -> None:
    settings = await create_topics(upgrade_settings(kafka_bootstrap), [TOOL.name])
    async with serving(settings) as (indexer, service):
        task = await service.create(TOOL, {}, "alice")
        home = indexer.partition_of(task.task_id)
        original = next(
            r
            for r in await dump(settings, settings.topics.events)
            if _b(r["key"]) == task.task_id.encode()
        )
        other = (home + 1) % FIXTURE["partitions"]
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await producer.start()
        try:
            sent = await producer.send_and_wait(
                settings.topics.events,
                key=task.task_id.encode(),
                value=_b(original["value"]),
                partition=other,
                headers=[(name, _b(value)) for name, value in original["headers"]],
            )
        finally:
            await producer.stop()
        async with asyncio.timeout(BOUND):
            await indexer.wait_indexed(other, sent.offset)
        copy = indexer.partitions[other].get(task.task_id)
        assert copy is not None and copy.owner == 0 and copy.status != TaskStatus.WORKING
        assert indexer.refused_identities == 1
        assert (await service.get(task.task_id, "alice")).status == "working"


def test_after_a_loss_a_task_created_stamped_far_from_its_created_time_is_a_copy() -> None:
    """The after-retention copy (F9): the bridge stamps a task.created with its createdMs; a
    copy appended later carries another time unless its producer forged it (security.md)."""
    from bridge.log.indexer import CREATED_SKEW_MS, out_of_place  # new in this change

    task_id = new_task_id()
    home = partition_for_key(task_id.encode(), 3)
    who = TaskIdentity(owner_key(owner_digest("alice")), 1_000_000, -1, 1000)

    def record(partition: int, timestamp: int) -> Any:
        return ConsumerRecord(
            "t", partition, 0, timestamp, 0, task_id.encode(), b"", None, 0, 0, []
        )

    whole, lost = PartitionIndex(home, 4), PartitionIndex(home, 4, lost_before=10)
    far = 1_000_000 + CREATED_SKEW_MS + 1
    assert not out_of_place(task_id, record(home, far), 3, whole, who)
    assert out_of_place(task_id, record(home, far), 3, lost, who)
    assert not out_of_place(task_id, record(home, 1_000_000), 3, lost, who)
    assert out_of_place(task_id, record((home + 1) % 3, 1_000_000), 3, whole, who)


# --- subscriptions (F7) ----------------------------------------------------------------------


async def test_subscriptions_are_written_in_clear_and_not_resealed_during_the_upgrade() -> None:
    stored = [
        TopicRecord.from_json(r) for r in json.loads((SUBSCRIPTIONS / "records.json").read_text())
    ]
    settings = rolling(make_settings(NO_BROKER, fresh_prefix("uroll")))
    log = memory_log(settings)
    await replay_records(settings, settings.topics.subscriptions, stored, log=log)
    registry = SubscriptionRegistry(settings, Sealer(KeyRing("k1", {"k1": b"k" * 32})), log=log)
    async with registry:
        async with asyncio.timeout(BOUND):
            await registry.restored.wait()
        partitions = list(range(settings.topics.partitions))
        assert await registry.reseal(partitions) == 0
        sub_id = sorted(registry.table.in_partitions(partitions))[0]
        sub = registry.table.get(sub_id)
        assert sub is not None
        refreshed = dataclasses.replace(
            sub, refreshed_ms=sub.refreshed_ms + 1, expires_ms=sub.expires_ms + 1
        )
        await registry.put(refreshed)
    latest = {r.key: r.value for r in await topic_records(settings, log=log)}
    assert len(latest) == len({r.key for r in stored})
    for value in latest.values():
        assert value is not None and json.loads(value)["v"] == 1  # what 8fd441c reads
    assert latest[sub_id.encode()] == subscriptions_topic.clear_record(refreshed)

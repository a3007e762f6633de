"""Topics as code against the real broker, and the codec through a real produce/consume."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import NewTopic

from bridge.cli import main
from bridge.envelope import TaskEvent, decode_event
from bridge.kafka.admin import kafka_admin
from bridge.kafka.clients import partition_for_key
from bridge.kafka.topics import (
    TopicLayoutError,
    create_layout,
    describe_topic_configs,
    ensure_topics,
)
from bridge.log.publisher import EventTooLarge, TaskEventPublisher, UnprefixedEventType

pytestmark = pytest.mark.kafka


async def test_topic_creation_is_idempotent_and_sets_the_design_configs(settings):
    first = await create_layout(settings)
    async with kafka_admin(settings) as admin:
        second = await ensure_topics(admin, settings)
        configs = await describe_topic_configs(
            admin, [settings.topics.events, settings.topics.index, settings.topics.subscriptions]
        )
    roles = ["events", "index", "updates", "control", "subscriptions"]
    assert [r.spec.role for r in first] == roles
    assert [r.created for r in first] == [True] * 5
    assert [(r.created, r.differences) for r in second] == [(False, [])] * 5
    events, index = configs[settings.topics.events], configs[settings.topics.index]
    assert events["cleanup.policy"] == "delete"
    assert events["retention.ms"] == str(settings.topics.retention_ms)
    assert index["cleanup.policy"] == "compact"
    assert configs[settings.topics.subscriptions]["cleanup.policy"] == "compact"
    # The index and updates topics are co-partitioned with the events topic.
    assert [r.partitions for r in second] == [3, 3, 3, 3, 3]


@pytest.mark.parametrize(
    ("role", "policy"),
    [
        ("events", "compact"),
        ("events", "compact,delete"),
        ("index", "delete"),
        ("subscriptions", "delete"),
    ],
)
async def test_existing_topics_that_would_break_seq_are_refused(settings, role, policy):
    name = {
        "events": settings.topics.events,
        "index": settings.topics.index,
        "subscriptions": settings.topics.subscriptions,
    }[role]
    async with kafka_admin(settings) as admin:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs={"cleanup.policy": policy})])
    with pytest.raises(TopicLayoutError, match=f"refusing to use {role} topic"):
        await create_layout(settings)


def test_the_cli_creates_topics_and_refuses_a_compacted_events_topic(settings, monkeypatch, capsys):
    monkeypatch.setenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", settings.kafka.bootstrap_servers)
    monkeypatch.setenv("BRIDGE_TOPICS__PREFIX", settings.topics.prefix)
    assert main(["topics", "create"]) == 0
    assert f"{settings.topics.events} (events): created" in capsys.readouterr().out
    assert main(["topics", "create"]) == 0
    assert f"{settings.topics.events} (events): exists" in capsys.readouterr().out

    async def make_compacted() -> None:
        name = "c" + settings.topics.prefix + ".task-events"
        async with kafka_admin(settings) as admin:
            await admin.create_topics(
                [NewTopic(name, 1, 1, topic_configs={"cleanup.policy": "compact"})]
            )

    asyncio.run(make_compacted())
    monkeypatch.setenv("BRIDGE_TOPICS__PREFIX", "c" + settings.topics.prefix)
    assert main(["topics", "create"]) == 2
    assert "refusing to use events topic" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["avro", "json"])
async def test_events_round_trip_through_the_broker_in_the_key_partition(topics, fmt):
    settings = topics
    sent = {
        f"task-{i}": TaskEvent("com.example.step", {"i": i, "text": "é" * i}, {"m": i}, 1000 + i)
        for i in range(20)
    }
    async with TaskEventPublisher(settings, fmt=fmt) as publisher:
        placed = {
            task: await publisher.publish(
                task, e.type, e.payload, meta=e.meta, timestamp_ms=e.timestamp_ms
            )
            for task, e in sent.items()
        }
    for task, where in placed.items():
        assert where.partition == partition_for_key(task.encode(), 3)

    consumer = AIOKafkaConsumer(
        settings.topics.events,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    received = {}
    try:
        async with asyncio.timeout(30):
            while len(received) < len(sent):
                record = await consumer.getone()
                received[record.key.decode()] = decode_event(record.value, record.headers)
    finally:
        await consumer.stop()
    assert received == sent


async def test_the_publisher_refuses_unprefixed_types_and_oversized_events(topics):
    async with TaskEventPublisher(topics) as publisher:
        with pytest.raises(UnprefixedEventType, match="no vendor prefix"):
            await publisher.publish("t", "content.partial", {})
        with pytest.raises(EventTooLarge, match="over the 4096-byte limit"):
            await publisher.publish("t", "com.example.big", {"x": "y" * 5000})

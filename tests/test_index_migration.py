"""An index written by an older version (one writer, records wherever their key hashed) is
refused at start with the way out, and `bridge index migrate` moves it without losing a count."""

from __future__ import annotations

import asyncio

import pytest
from support.layout import make_settings
from support.legacy_index import legacy_marker_value, legacy_task_value
from support.waits import BOUND, wait_until

from bridge.cli import main
from bridge.kafka.admin import delete_records_before, kafka_admin
from bridge.kafka.clients import TopicPartition, plain_producer
from bridge.kafka.topics import ensure_topics
from bridge.log.indexer import Indexer, IndexerError
from bridge.log.publisher import TaskEventPublisher
from bridge.log.seqindex import marker_key, task_key

pytestmark = pytest.mark.kafka

PARTITIONS = 3


async def _old_layout_index(settings, *, index_partitions: int) -> dict[int, dict]:
    """Events for a few tasks, and their index written the way versions before 2 wrote it:
    version 1 records, each in the partition its key hashes to. Returns the counts."""
    async with kafka_admin(settings) as admin:
        await ensure_topics(admin, settings)
    async with TaskEventPublisher(settings) as pub:
        for i in range(60):
            await pub.publish(f"task-{i % 7}", "com.example.e", {"i": i})
    async with Indexer(settings) as counted:
        await counted.catch_up()
        expected = {p: idx.entries() for p, idx in counted.partitions.items()}
        markers = {p: (idx.through, idx.lost_before) for p, idx in counted.partitions.items()}
    if index_partitions != PARTITIONS:
        await _recreate_index_topic(settings, index_partitions)
    producer = plain_producer(settings)
    await producer.start()
    try:
        for p, entries in expected.items():
            for task_id, entry in entries.items():
                await producer.send_and_wait(
                    settings.topics.index,
                    key=task_key(task_id),
                    value=legacy_task_value(entry, p, version=1),
                )
            await producer.send_and_wait(
                settings.topics.index,
                key=marker_key(p),
                value=legacy_marker_value(*markers[p], version=1),
            )
    finally:
        await producer.stop()
    return expected


async def _recreate_index_topic(settings, partitions: int) -> None:
    """The index topic of an older layout, with fewer partitions than the events topic."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    name = settings.topics.index
    async with kafka_admin(settings) as admin:
        await admin.delete_topics([name])

        async def recreated() -> bool:  # deletion completes in the background
            new = NewTopic(name, partitions, 1, topic_configs={"cleanup.policy": "compact"})
            try:
                response = await admin.create_topics([new])
            except TopicAlreadyExistsError:
                return False
            return not any(code for _, code, *_ in response.topic_errors)

        await wait_until(recreated, BOUND, what="the index topic recreated", poll_s=0.2)


@pytest.mark.parametrize("index_partitions", [PARTITIONS, 1])
async def test_an_old_index_is_refused_then_migrated_with_every_count_kept(
    kafka_bootstrap, topic_prefix, monkeypatch, capsys, index_partitions
) -> None:
    settings = make_settings(
        kafka_bootstrap, topic_prefix,
        topics={"prefix": topic_prefix, "partitions": PARTITIONS, "min_insync_replicas": 1},
    )  # fmt: skip
    expected = await _old_layout_index(settings, index_partitions=index_partitions)
    with pytest.raises(IndexerError, match="bridge index migrate"):
        async with Indexer(settings, persist=True):
            pass

    monkeypatch.setenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("BRIDGE_TOPICS__PREFIX", topic_prefix)
    monkeypatch.setenv("BRIDGE_TOPICS__PARTITIONS", str(PARTITIONS))
    monkeypatch.setenv("BRIDGE_TOPICS__MIN_INSYNC_REPLICAS", "1")
    assert await asyncio.to_thread(main, ["index", "migrate"]) == 0
    assert "index migrated" in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["index", "migrate"]) == 0
    assert "already in the current layout" in capsys.readouterr().out

    # The counts come from the migrated index, not from a recount: delete the events the
    # counts were taken from, so that only the index can still know them.
    for p in range(PARTITIONS):
        tp = TopicPartition(settings.topics.events, p)
        await delete_records_before(settings, tp, (expected[p] and max(
            e.last_offset for e in expected[p].values()) + 1) or 0)  # fmt: skip
    async with Indexer(settings, persist=True) as restored:
        await restored.catch_up()
        assert {p: idx.entries() for p, idx in restored.partitions.items()} == expected
        assert not any(idx.lost_before >= 0 for idx in restored.partitions.values())

"""The checker's ground truth read from a real broker: seq by counting each key's committed
records, and after retention deleted the start of the log, the first retained seq taken from
the persisted index, or reported unprovable when the index never counted what was deleted."""

from __future__ import annotations

import asyncio

import pytest
from support.layout import create_topics, delete_events_before, make_settings

from bridge.log.indexer import Indexer
from bridge.log.publisher import TaskEventPublisher
from bridgedev.checker import Recording, check, event_digest, ground_truth

pytestmark = pytest.mark.kafka

STEP = "com.example.step"


async def test_truth_counts_seq_and_after_retention_takes_the_base_from_the_index(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    settings = make_settings(
        kafka_bootstrap,
        topic_prefix,
        topics={"prefix": topic_prefix, "partitions": 1, "min_insync_replicas": 1},
    )
    await create_topics(settings)
    offsets: dict[str, list[int]] = {"a": [], "b": [], "c": [], "e": []}

    async def publish(pub: TaskEventPublisher, task: str, i: int) -> None:
        where = await pub.publish(task, STEP, {"task": task, "i": i})
        offsets[task].append(where.offset)

    async with TaskEventPublisher(settings) as pub:
        for i in range(10):  # a and b interleaved in the one partition
            await publish(pub, "a", i)
            if i < 8:
                await publish(pub, "b", i)
        full = await ground_truth(settings)
        assert [len(full.tasks[t].digests) for t in "ab"] == [10, 8]
        assert full.tasks["a"].first_seq == 0
        assert full.tasks["a"].digests[3] == event_digest(STEP, {"task": "a", "i": 3})

        async with Indexer(settings, persist=True) as indexer:
            async with asyncio.timeout(60):
                await indexer.catch_up()
            await indexer.flush()
        # Retention by hand: the first four records of a and of b are gone; then more
        # records the index has not counted (a's, and a new task c).
        await delete_events_before(settings, 0, offsets["a"][4])
        await publish(pub, "a", 10)
        await publish(pub, "c", 0)
        truth = await ground_truth(settings, ["a", "b", "c"])
        a, b, c = (truth.tasks[t] for t in "abc")
        assert (a.first_seq, b.first_seq, c.first_seq) == (4, 4, 0)
        new = event_digest(STEP, {"task": "a", "i": 10})
        assert a.digests == [*full.tasks["a"].digests[4:], new]
        recording = Recording()
        recording.gone("viewer", "a", -1, 4)  # what a stream from the start is answered now
        for seq in range(4, 11):
            recording.record("viewer", "a", seq, STEP, {"task": "a", "i": seq})
        recording.finished("viewer", "a")
        report = check(truth, recording)
        assert report.ok, report.summary()
        # A task retention deleted whole: its count from the index, what was handed unjudged
        # (not phantoms: the log had those events).
        await delete_events_before(settings, 0, offsets["b"][-1] + 1)
        truth = await ground_truth(settings, ["a", "b"])
        assert (truth.tasks["b"].first_seq, truth.tasks["b"].digests) == (8, [])
        recording = Recording()
        for seq in range(8):
            recording.record("viewer", "b", seq, STEP, {"task": "b", "i": seq})
        recording.finished("viewer", "b")
        report = check(truth, recording)
        assert report.ok and report.unjudged == 8, report.summary()

        # Records of a task retention deleted before any index counted them: no provable base.
        for i in range(3):
            await publish(pub, "e", i)
        await delete_events_before(settings, 0, offsets["e"][2])
        truth = await ground_truth(settings, ["e"])
        assert truth.tasks["e"].first_seq is None
        recording = Recording()
        recording.record("viewer", "e", 2, STEP, {"task": "e", "i": 2})
        report = check(truth, recording)
        assert report.counts["unverifiable"] == 1 and not report.ok

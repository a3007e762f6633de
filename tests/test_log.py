"""The event log core on the real broker: derived seq, retention, crash safety, reads."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition
from support.layout import create_topics, delete_events_before, make_settings
from support.procs import bridge_env
from support.waits import wait_until

from bridge.kafka.clients import partition_for_key
from bridge.kafka.topics import topic_partition_ids
from bridge.log.indexer import Indexer, load_index
from bridge.log.publisher import TaskEventPublisher
from bridge.log.reader import NotRetained, Reader, UnknownTask
from bridge.log.verify import verify_index
from bridge.vocabulary import TaskStatus

pytestmark = pytest.mark.kafka

BOUND = 60  # seconds any single wait may take before the test fails


async def caught_up(indexer: Indexer) -> None:
    async with asyncio.timeout(BOUND):
        await indexer.catch_up()


async def collect(
    reader: Reader, task: str, after: int | None = None
) -> list[tuple[int, str, dict]]:
    async with asyncio.timeout(BOUND):
        return [(e.seq, e.event.type, e.event.payload) async for e in reader.read(task, after)]


def same_partition_ids(n: int, partitions: int = 3) -> list[str]:
    ids, wanted = [], None
    i = 0
    while len(ids) < n:
        candidate = f"task-{i}"
        p = partition_for_key(candidate.encode(), partitions)
        if wanted is None:
            wanted = p
        if p == wanted:
            ids.append(candidate)
        i += 1
    return ids


async def test_three_concurrent_writers_on_one_task_get_seq_0_1_2_in_log_order(topics):
    settings, task, n = topics, "task-writers", 30

    async def aiokafka_writer(fmt: str, name: str) -> None:
        async with TaskEventPublisher(settings, fmt=fmt) as pub:
            for i in range(n):
                await pub.publish(task, "com.example.write", {"writer": name, "n": i})

    async def kcat_writer() -> None:
        lines = "".join(
            json.dumps({"type": "com.example.write", "payload": {"writer": "kcat", "n": i}}) + "\n"
            for i in range(n)
        )
        proc = await asyncio.create_subprocess_exec(
            "kcat", "-P", "-b", settings.kafka.bootstrap_servers, "-t", settings.topics.events,
            "-k", task, "-X", "partitioner=murmur2_random", "-H", "content-type=application/json",
            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate(lines.encode())
        assert proc.returncode == 0, err.decode()

    await asyncio.gather(
        aiokafka_writer("avro", "avro"), aiokafka_writer("json", "json"), kcat_writer()
    )
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        events = await collect(reader, task)
    assert [seq for seq, _, _ in events] == list(range(3 * n))
    for writer in ("avro", "json", "kcat"):
        assert [p["n"] for _, _, p in events if p["writer"] == writer] == list(range(n))


async def test_aborted_transactions_get_no_seq_and_committed_ones_do(topics):
    settings, task = topics, "task-txn"
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        transactional_id=f"{settings.topics.prefix}-t",
    )
    await producer.start()
    try:
        async with TaskEventPublisher(settings) as pub:
            await pub.publish(task, "com.example.e", {"n": "before"})
            for outcome in ("abort", "commit", "abort"):
                await producer.begin_transaction()
                for i in range(3):
                    value, headers = pub.encode("com.example.e", {"n": f"{outcome}-{i}"})
                    await producer.send(
                        settings.topics.events, key=task.encode(), value=value, headers=headers
                    )
                if outcome == "abort":
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
            await pub.publish(task, "com.example.e", {"n": "after"})
    finally:
        await producer.stop()
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        events = await collect(reader, task)
        assert [(s, p["n"]) for s, _, p in events] == [
            (0, "before"), (1, "commit-0"), (2, "commit-1"), (3, "commit-2"), (4, "after")
        ]  # fmt: skip
        # resuming inside and after the committed transaction skips the aborted records too
        assert [s for s, _, _ in await collect(reader, task, after=2)] == [3, 4]


async def test_other_tasks_interleaved_in_the_partition_do_not_disturb_a_tasks_seq(topics):
    settings = topics
    tasks = same_partition_ids(3)
    rng = random.Random(7)
    order = [rng.choice(tasks) for _ in range(60)]
    async with TaskEventPublisher(settings) as pub:
        for i, task in enumerate(order):
            await pub.publish(task, "com.example.e", {"i": i})
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        for task in tasks:
            expected = [i for i, t in enumerate(order) if t == task]
            events = await collect(reader, task)
            assert [s for s, _, _ in events] == list(range(len(expected)))
            assert [p["i"] for _, _, p in events] == expected


async def test_every_cursor_position_resumes_with_exactly_the_remaining_events(topics):
    settings, task = topics, "task-resume"
    async with TaskEventPublisher(settings) as pub:
        for i in range(11):
            await pub.publish(task, "com.example.e", {"i": i})
            await pub.publish("task-other", "com.example.noise", {"i": i})
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        assert [s for s, _, _ in await collect(reader, task)] == list(range(11))
        for after in range(11):
            events = await collect(reader, task, after)
            assert [(s, p["i"]) for s, _, p in events] == [(i, i) for i in range(after + 1, 11)]
        with pytest.raises(UnknownTask):
            await collect(reader, "task-never-seen")
        with pytest.raises(ValueError):
            await collect(reader, task, -1)


async def test_undecodable_and_oversized_records_keep_their_seq_as_prefixed_placeholders(topics):
    settings, task = topics, "task-bad"
    raw = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, max_request_size=2_000_000
    )
    await raw.start()
    try:
        async with TaskEventPublisher(settings) as pub:
            await pub.publish(task, "com.example.e", {"i": 0})
            await raw.send_and_wait(
                settings.topics.events, key=task.encode(), value=b"\xc3\x01garbage"
            )
            oversized = json.dumps(
                {"type": "com.example.e", "payload": {"x": "y" * 10_000}}
            ).encode()
            await raw.send_and_wait(settings.topics.events, key=task.encode(), value=oversized)
            await raw.send_and_wait(settings.topics.events, key=None, value=b"keyless")
            await pub.publish(task, "com.example.e", {"i": 3})
    finally:
        await raw.stop()
    prefix = settings.tasks.event_type_prefix
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        events = await collect(reader, task)
    assert [(s, t) for s, t, _ in events] == [
        (0, "com.example.e"), (1, f"{prefix}.event.undecodable"), (2, f"{prefix}.event.oversized"), (3, "com.example.e")
    ]  # fmt: skip
    assert events[1][2]["reason"] == "malformed"
    assert events[2][2]["limitBytes"] == 4096


async def test_delete_records_moves_earliest_seq_exactly_and_events_gone_carries_it(topics):
    settings, task = topics, "task-gone"
    offsets = []
    async with TaskEventPublisher(settings) as pub:
        for i in range(10):
            offsets.append((await pub.publish(task, "com.example.e", {"i": i})).offset)
            await pub.publish("task-gone-neighbour", "com.example.e", {"i": i})
        partition = (await pub.publish(task, "com.example.e", {"i": 10})).partition
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        assert await reader.earliest_seq(task) == 0
        # checkpoints sit at seq 0, 4, 8: delete into the middle of an interval (seq 5 first kept)
        await delete_events_before(settings, partition, offsets[5])
        assert await reader.earliest_seq(task) == 5
        with pytest.raises(NotRetained) as gone:
            await collect(reader, task, after=3)
        assert gone.value.earliest_seq == 5
        assert [s for s, _, _ in await collect(reader, task, after=4)] == list(range(5, 11))
        assert [s for s, _, _ in await collect(reader, task)] == list(range(5, 11))
        # exactly on a checkpoint
        await delete_events_before(settings, partition, offsets[8])
        assert await reader.earliest_seq(task) == 8
        # everything of the task gone: earliest is its next seq
        await delete_events_before(
            settings, partition, offsets[9] + 100 if False else offsets[9] + 3
        )
        assert await reader.earliest_seq(task) == 11
        with pytest.raises(NotRetained) as gone:
            await collect(reader, task, after=9)
        assert gone.value.earliest_seq == 11
        assert await collect(reader, task, after=10) == []
        assert await collect(reader, task) == []


async def test_time_based_retention_moves_earliest_seq(kafka_bootstrap, topic_prefix):
    settings = make_settings(kafka_bootstrap, topic_prefix, topics={
        "prefix": topic_prefix, "partitions": 1, "min_insync_replicas": 1,
        "retention_ms": 1000, "segment_ms": 200,
    })  # fmt: skip
    await create_topics(settings)
    task = "task-retained"
    async with TaskEventPublisher(settings) as pub:
        for i in range(5):
            await pub.publish(task, "com.example.e", {"i": i})
        async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
            await caught_up(indexer)
            assert await reader.earliest_seq(task) == 0

            # Retention deletes closed segments older than retention.ms; a segment closes when a
            # record arrives after segment.ms. Keep appending filler until the log start moves.
            async def log_start_moved() -> bool:
                if await reader.earliest_seq(task) != 0:
                    return True
                await pub.publish("task-filler", "com.example.filler", {})
                return False

            what = "retention deletes the task's records (the broker's cleaner ran)"
            await wait_until(log_start_moved, BOUND, what=what, poll_s=0.5)
            assert await reader.earliest_seq(task) == 5
            with pytest.raises(NotRetained) as gone:
                await collect(reader, task, after=1)
            assert gone.value.earliest_seq == 5


async def test_two_indexers_built_independently_agree(topics):
    settings = topics
    async with TaskEventPublisher(settings) as pub:
        for i in range(200):
            await pub.publish(f"task-{i % 13}", "com.example.e", {"i": i})
        await pub.publish(
            "task-1", f"{settings.tasks.event_type_prefix}.task.status", {"status": "completed"}
        )
    async with Indexer(settings, persist=True, flush_interval_s=0.05) as first:
        await caught_up(first)
        await first.flush()
    async with Indexer(settings) as restored, Indexer(settings) as second:
        await caught_up(restored)
        await caught_up(second)
        for p in restored.partitions:
            assert (
                restored.partitions[p].entries()
                == first.partitions[p].entries()
                == second.partitions[p].entries()
            )
        assert restored.lookup("task-1")[1].status is TaskStatus.COMPLETED
    report = await verify_index(settings)
    assert report.ok, report.mismatches
    assert report.tasks_checked == 13


def _index_proc(settings) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "support.index_writer", "0.02"],
        env=bridge_env(settings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=Path(__file__).parent,
    )  # fmt: skip


class IndexWrites:
    """Counts records written to the index topic (committed or not) with one probe consumer."""

    def __init__(self, settings) -> None:
        self.settings = settings

    async def __aenter__(self):
        from bridge.kafka.clients import committed_consumer

        ids = await topic_partition_ids(self.settings, self.settings.topics.index)
        self.tps = [TopicPartition(self.settings.topics.index, p) for p in ids]
        self.consumer = committed_consumer(
            self.settings, role="probe", isolation_level="read_uncommitted"
        )
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.consumer.stop()

    async def count(self) -> int:
        return sum((await self.consumer.end_offsets(self.tps)).values())

    async def until(self, wanted: int, writer: subprocess.Popen[bytes]) -> None:
        """Until ``wanted`` records were written by ``writer``, which must keep running."""

        async def written() -> bool:
            assert writer.poll() is None, writer.stdout.read().decode() if writer.stdout else ""
            return await self.count() >= wanted

        await wait_until(written, BOUND, what=f"{wanted} index records written", poll_s=0.01)


async def test_sigkill_of_the_indexer_while_persisting_never_changes_any_seq(topics):
    settings = topics
    rng = random.Random(2694)
    stop = asyncio.Event()

    async def produce() -> None:
        async with TaskEventPublisher(settings) as pub:
            i = 0
            while not stop.is_set() or i < 1500:
                await pub.publish(f"task-{rng.randrange(40)}", "com.example.e", {"i": i})
                i += 1

    producer = asyncio.create_task(produce())
    kills = 0
    try:
        async with IndexWrites(settings) as writes:
            for _ in range(5):
                proc = _index_proc(settings)
                try:
                    # kill at a random point of persisting: after a random number of index writes
                    await writes.until(await writes.count() + rng.randrange(1, 60), proc)
                    proc.send_signal(signal.SIGKILL)
                    kills += 1
                finally:
                    proc.kill()
                    proc.wait(timeout=BOUND)
    finally:
        stop.set()
        await producer
    # a last writer restores what the killed ones left, catches up and persists
    async with Indexer(settings, persist=True) as last:
        await caught_up(last)
        await last.flush()
        final = {p: idx.entries() for p, idx in last.partitions.items()}
    report = await verify_index(settings)
    assert kills == 5
    assert report.ok, report.mismatches[:10]
    assert report.records_read >= 1500
    persisted = await load_index(settings, sorted(final))
    assert {p: idx.entries() for p, idx in persisted.items()} == final


async def test_a_foreign_unprefixed_type_is_served_under_our_prefix_and_keeps_its_seq(topics):
    settings, task = topics, "task-foreign"
    raw = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await raw.start()
    try:
        value = json.dumps({"type": "task.status", "payload": {"status": "done"}}).encode()
        await raw.send_and_wait(settings.topics.events, key=task.encode(), value=value)
        async with TaskEventPublisher(settings) as pub:
            await pub.publish(task, "com.example.e", {"i": 1})
    finally:
        await raw.stop()
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        await caught_up(indexer)
        events = await collect(reader, task)
    assert events == [
        (
            0,
            f"{settings.tasks.event_type_prefix}.event.unprefixed",
            {"type": "task.status", "payload": {"status": "done"}},
        ),
        (1, "com.example.e", {"i": 1}),
    ]

"""Shared catch-up scans on the real broker: many tasks interleaved in one partition, read at
once through one reader, each getting exactly its own events in seq order (checked against the
topic read back), with retention moving during a shared scan and with a reader that is slow."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiokafka.structs import TopicPartition
from support.layout import delete_events_before
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.kafka.clients import committed_consumer, partition_for_key
from bridge.kafka.port import TopicPart
from bridge.log.indexer import Indexer
from bridge.log.publisher import TaskEventPublisher
from bridge.log.reader import NotRetained, Reader, ReadEvent

pytestmark = pytest.mark.kafka

ROUNDS = 12  # events per task; checkpoints every 4 (make_settings)


def same_partition(n: int, partitions: int) -> list[str]:
    """``n`` task ids that all land in the partition of the first."""
    ids: list[str] = []
    i = 0
    while len(ids) < n:
        candidate = f"task-storm-{i}"
        if not ids or partition_for_key(candidate.encode(), partitions) == partition_for_key(
            ids[0].encode(), partitions
        ):
            ids.append(candidate)
        i += 1
    return ids


async def publish_interleaved(settings: Settings, tasks: list[str], pad: int = 0) -> int:
    """ROUNDS events of every task, round-robin (each task's records spread over the whole
    partition); returns the partition."""
    async with TaskEventPublisher(settings) as pub:
        for i in range(ROUNDS):
            sent = await asyncio.gather(
                *(
                    pub.publish(t, "com.example.e", {"task": t, "i": i, "pad": "x" * pad})
                    for t in tasks
                )
            )
    return sent[0].partition


async def topic_read_back(settings: Settings, partition: int) -> dict[str, list[dict]]:
    """Every task's payloads in log order, read with a plain consumer: the expected answer."""
    tp = TopicPartition(settings.topics.events, partition)
    consumer = committed_consumer(settings, role="test-read-back")
    await consumer.start()
    try:
        consumer.assign([tp])
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, start)
        found: dict[str, list[dict]] = defaultdict(list)
        reader = Reader(settings, None)  # type: ignore[arg-type]  # only its decoder
        async with asyncio.timeout(BOUND):
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    event = reader._decoder.event(record)
                    found[record.key.decode()].append(event.payload)
        return found
    finally:
        await consumer.stop()


@asynccontextmanager
async def reader_over(settings: Settings) -> AsyncIterator[Reader]:
    async with Indexer(settings) as indexer, Reader(settings, indexer, chunk=50) as reader:
        async with asyncio.timeout(BOUND):
            await indexer.catch_up()
        yield reader


async def read_all(reader: Reader, task: str, after: int | None) -> list[tuple[int, dict]]:
    return [(e.seq, e.event.payload) async for e in reader.read(task, after)]


async def interleaved(topics: Settings, n: int) -> tuple[list[str], int, dict[str, list[dict]]]:
    """``n`` tasks of one partition with ROUNDS interleaved events each: (tasks, partition,
    every task's payloads read back)."""
    tasks = same_partition(n, topics.topics.partitions)
    partition = await publish_interleaved(topics, tasks)
    return tasks, partition, await topic_read_back(topics, partition)


async def read_batched(
    reader: Reader, task: str, after: int, log_start: int | None
) -> list[ReadEvent]:
    async with asyncio.timeout(BOUND):
        return [
            e
            async for batch in reader.read_batches(task, after, log_start=log_start)
            for e in batch
        ]


async def test_concurrent_catch_ups_share_scans_and_each_gets_exactly_its_events(
    topics: Settings,
) -> None:
    tasks, _, expected = await interleaved(topics, 40)
    async with reader_over(topics) as reader:
        afters = [None if i % 3 == 0 else i % ROUNDS for i in range(len(tasks))]
        async with asyncio.timeout(BOUND):
            got = await asyncio.gather(
                *(read_all(reader, t, a) for t, a in zip(tasks, afters, strict=True))
            )
        for task, after, events in zip(tasks, afters, got, strict=True):
            first = 0 if after is None else after + 1
            assert [s for s, _ in events] == list(range(first, ROUNDS))
            assert [p for _, p in events] == expected[task][first:]
        # 40 reads of ~480 records each, in chunks of 50: alone they would fetch ~400 times.
        assert reader.catchup.scans < 10
        assert reader.records_scanned <= 3 * ROUNDS * len(tasks)


async def test_retention_moving_during_a_shared_scan_loses_nothing_and_skips_nothing_silently(
    topics: Settings,
) -> None:
    # 2.6 MB: a consumer's first fetch (1 MiB) buffers only the start of it, so the scan
    # meets retention at the broker, not in what a consumer already holds.
    tasks = same_partition(60, topics.topics.partitions)
    partition = await publish_interleaved(topics, tasks, pad=3000)
    tp = TopicPart(topics.topics.events, partition)
    kept = 9  # retention moves to each task's event 9
    expected = await topic_read_back(topics, partition)
    async with reader_over(topics) as reader:
        # Hold the scan after its first fetch; retention then moves past what the consumer
        # holds, to round 9 of 12, and the scan goes on.
        fetch = reader._fetch
        first_done, moved = asyncio.Event(), asyncio.Event()

        async def held_fetch(
            at: TopicPart, offset: int, limit: int | None = None
        ) -> tuple[list, int]:
            answer = await fetch(at, offset, limit)
            if at == tp and not first_done.is_set():
                first_done.set()
                await moved.wait()
            return answer

        reader._fetch = held_fetch  # type: ignore[method-assign]
        afters = [None if i % 2 == 0 else 2 for i in range(len(tasks))]
        reads = [
            asyncio.create_task(read_all(reader, t, a)) for t, a in zip(tasks, afters, strict=True)
        ]
        async with asyncio.timeout(BOUND):
            await first_done.wait()
        await delete_events_before(topics, partition, kept * len(tasks))
        moved.set()
        results = await asyncio.gather(*reads, return_exceptions=True)
        # retention really overtook the shared scan: some readers were refused mid-read
        assert any(isinstance(r, NotRetained) for r in results)
        for task, after, result in zip(tasks, afters, results, strict=True):
            if isinstance(result, NotRetained):
                # Overtaken by retention (a fresh read too, once it has delivered events: it
                # cannot go on without a gap): refused, with the exact earliest seq.
                assert result.earliest_seq == kept
                continue
            assert not isinstance(result, BaseException), result
            seqs = [s for s, _ in result]
            # Whatever was read, it is gap-free, in order, ends at the head, and each
            # seq carries exactly that event of the task.
            assert seqs == list(range(seqs[0], ROUNDS)), seqs
            assert [p for _, p in result] == expected[task][seqs[0] :]
            if after is not None:
                assert seqs[0] == after + 1
        # Read again after the move: every task from its earliest retained seq.
        for task in tasks[:5]:
            assert await reader.earliest_seq(task) == kept
            events = await read_all(reader, task, None)
            assert [s for s, _ in events] == list(range(kept, ROUNDS))


async def test_a_slow_reader_leaves_the_shared_scan_and_the_others_are_not_held_up(
    topics: Settings,
) -> None:
    tasks = same_partition(6, topics.topics.partitions)
    partition = await publish_interleaved(topics, tasks)
    expected = await topic_read_back(topics, partition)
    async with reader_over(topics) as reader:
        reader.catchup.member_limit = 2  # records a reader may have waiting before it leaves
        slow = reader.read(tasks[0], None)
        first = await anext(slow)  # the slow reader takes one event, then stops reading
        async with asyncio.timeout(BOUND):
            others = await asyncio.gather(*(read_all(reader, t, None) for t in tasks[1:]))
        for task, events in zip(tasks[1:], others, strict=True):
            assert [p for _, p in events] == expected[task]
        await wait_until(lambda: reader.catchup.detached >= 1, what="the slow reader left")
        rest = [e async for e in slow]
        assert [first.seq] + [e.seq for e in rest] == list(range(ROUNDS))
        assert [first.event.payload] + [e.event.payload for e in rest] == expected[tasks[0]]


async def test_a_read_given_the_cursor_checks_log_start_asks_kafka_for_no_other(
    topics: Settings,
) -> None:
    tasks, partition, expected = await interleaved(topics, 3)
    async with reader_over(topics) as reader:
        task = tasks[1]
        earliest, log_start = await reader.earliest(task)  # what check_cursor looks up
        assert earliest == 0
        asked = reader.log_start_cache.requests
        got = await read_batched(reader, task, 3, log_start)
        assert reader.log_start_cache.requests == asked  # one lookup for the whole open
        assert [e.seq for e in got] == list(range(4, ROUNDS))
        assert [e.event.payload for e in got] == expected[task][4:]
        # Without it, the read looks the log start up itself.
        again = await read_batched(reader, task, 3, None)
        assert reader.log_start_cache.requests == asked + 1
        assert [e.seq for e in again] == [e.seq for e in got]

        # A log start that retention has moved past since is met as retention mid-read: the
        # read looks again and refuses the cursor it can no longer serve, never skipping.
        kept = 6
        await delete_events_before(topics, partition, kept * len(tasks))
        # as the next fresh lookup of any read would: the recent chunks forget the deleted records
        reader.catchup.forget_before(TopicPart(topics.topics.events, partition), kept * len(tasks))
        with pytest.raises(NotRetained) as gone:
            await read_batched(reader, task, 2, log_start)
        assert gone.value.earliest_seq == kept
        late = await read_batched(reader, task, 7, log_start)
        assert [e.seq for e in late] == list(range(8, ROUNDS))
        assert [e.event.payload for e in late] == expected[task][8:]


async def test_a_reader_consumer_left_at_the_end_of_the_log_stops_fetching_until_its_next_read(
    topics: Settings,
) -> None:
    tasks, partition, expected = await interleaved(topics, 2)
    tp = TopicPartition(topics.topics.events, partition)
    async with reader_over(topics) as reader:
        last = tasks[-1]  # its last record is the partition's last
        async with asyncio.timeout(BOUND):
            first = await read_all(reader, last, None)
        assert [s for s, _ in first] == list(range(ROUNDS))
        # At the end of the log an idle consumer would fetch again every few milliseconds.
        pool = reader._log._fetches  # type: ignore[attr-defined]  # the adapter's consumer pool
        at_end = [c for c in pool._all if tp in c.assignment()]
        assert at_end and all(c.paused() == {tp} for c in at_end), [c.paused() for c in at_end]
        # Its next read resumes it, from where it stands or anywhere else.
        async with asyncio.timeout(BOUND):
            assert await read_all(reader, last, 5) == first[6:]
            other = await read_all(reader, tasks[0], None)
        assert [p for _, p in other] == expected[tasks[0]]

"""The Events topic readers (bridge/events_extension/kafkalog.py) on the in-memory log: history through
the port, the one live tail per topic, and the feeds (the bridge's one bounded live buffer)
with their explicit closure. No broker: tests/test_event_sources.py keeps the path on Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.imports import BRIDGE
from support.waits import BOUND, wait_until

from bridge.events_extension.kafkalog import Chunk, LiveTopics, TopicFeed, TopicReader, UnknownTopic
from bridge.events_extension.occurrences import Active, Occurrence
from bridge.events_extension.offsets import Found, OffsetSource, Selection
from bridge.kafka.memory import MemoryLog
from bridge.kafka.port import OffsetOutOfRange, Tail, TopicPart
from bridge.log.fanout import DRAINING, FeedClosed

TOPIC = "orders"


def memory() -> MemoryLog:
    log = MemoryLog()
    log.create_topic(TOPIC, 2)
    return log


async def send(log: MemoryLog, value: bytes, partition: int = 0) -> int:
    return (await log.producer().send(TOPIC, value, partition=partition)).offset


# --- history ---------------------------------------------------------------------------------


async def test_history_reads_through_the_log_port_and_keeps_its_errors() -> None:
    log = memory()
    reader = TopicReader(log)
    for i in range(3):
        await send(log, b"v%d" % i)
    assert await reader.partitions(TOPIC) == [0, 1]
    with pytest.raises(UnknownTopic):
        await reader.partitions("nope")
    assert await reader.bounds(TOPIC, [0, 1]) == ({0: 0, 1: 0}, {0: 3, 1: 0})
    chunk = await reader.fetch(TOPIC, 0, 1)
    assert (chunk.start, chunk.end) == (1, 3) and [r.value for r in chunk.records] == [b"v1", b"v2"]
    assert await reader.offsets_at(TOPIC, [0, 1], 0) == {0: 0, 1: None}
    await log.delete_records_before(TopicPart(TOPIC, 0), 2)
    with pytest.raises(OffsetOutOfRange):
        await reader.fetch(TOPIC, 0, 1)


async def test_an_aborted_transaction_moves_a_fetch_without_records() -> None:
    log = memory()
    writer = log.transactional_writer("pipeline")
    await writer.start()
    with contextlib.suppress(RuntimeError):
        async with writer.transaction():
            await writer.send(TOPIC, b"aborted", partition=0)
            raise RuntimeError("abort")
    chunk = await TopicReader(log).fetch(TOPIC, 0, 0)
    assert chunk == Chunk(0, 0, 2, [])  # the record and its abort marker: passed, nothing read


async def test_closing_the_reader_releases_only_a_log_it_owns() -> None:
    released: list[str] = []

    async def release() -> None:
        released.append("log")

    await TopicReader(memory()).close()
    owner = TopicReader(memory(), on_close=release)
    await owner.close()
    await owner.close()
    assert released == ["log"]


# --- the feed: the one bounded live buffer ---------------------------------------------------


def test_a_feed_counts_records_and_a_chunk_of_markers_as_one() -> None:
    feed = TopicFeed(TOPIC, limit=3)
    assert feed.offer(Chunk(0, 0, 2, ["a", "b"]))  # type: ignore[list-item]
    assert feed.offer(Chunk(0, 2, 3))  # markers only: weighs one
    assert not feed.offer(Chunk(0, 3, 4))  # over the limit: everything dropped
    assert feed.overflowed and feed.take() == [] and feed.size == 0
    assert not feed.offer(Chunk(0, 4, 5))  # nothing buffered until the owner resets it
    feed.reset()
    assert feed.offer(Chunk(0, 5, 6)) and [c.start for c in feed.take()] == [5]


# --- the live tail ---------------------------------------------------------------------------


async def next_chunks(feed: TopicFeed) -> list[Chunk]:
    async with asyncio.timeout(BOUND):
        while not await feed.wait(BOUND):
            pass
    return feed.take()


async def started(feed: TopicFeed) -> list[Chunk]:
    """The tail's first offer: where it starts, an empty chunk per partition."""
    chunks = await next_chunks(feed)
    assert all(not c.records and c.start == c.end for c in chunks), chunks
    return chunks


async def test_one_tail_offers_each_committed_chunk_to_every_feed() -> None:
    log = memory()
    live = LiveTopics(log, TopicReader(log))
    async with live.subscribe(TOPIC, 10) as first, live.subscribe(TOPIC, 10) as second:
        assert len(live._tails) == 1
        assert sorted((c.partition, c.start) for c in await started(first)) == [(0, 0), (1, 0)]
        await started(second)
        await send(log, b"x", partition=1)
        for feed in (first, second):
            (chunk,) = await next_chunks(feed)
            assert (chunk.partition, chunk.start, chunk.end) == (1, 0, 1)
            assert [r.value for r in chunk.records] == [b"x"]
    assert live._tails == {}  # the last subscriber left: the tail stopped
    await live.close()


async def test_a_tail_that_starts_past_a_subscriber_says_where_it_starts() -> None:
    """Found on the broker: the tail's first position is the log end when it starts, which
    may be after the end its subscriber read up to; it then offers nothing the subscriber can
    take and the stream waited for ever. Its first offer names where it starts: a hole."""
    log = memory()
    live = LiveTopics(log, TopicReader(log))
    async with live.subscribe(TOPIC, 10) as feed:
        _, ends = await live.reader.bounds(TOPIC, [0, 1])  # the subscriber's end: 0
        await send(log, b"written before the tail ran")  # no await suspended so far
        chunks = await next_chunks(feed)
        assert ends[0] == 0 and Chunk(0, 1, 1) in chunks
    await live.close()


async def test_closing_the_live_topics_wakes_a_waiting_feed_at_once() -> None:
    log = memory()
    live = LiveTopics(log, TopicReader(log))
    async with live.subscribe(TOPIC, 10) as feed:
        await started(feed)
        waiting = asyncio.create_task(feed.wait(None))
        await wait_until(lambda: feed.waiter is not None, what="the feed's waiter suspended")
        await live.close()
        async with asyncio.timeout(BOUND):
            with pytest.raises(FeedClosed) as closed:
                await waiting
        assert closed.value.reason == DRAINING
    async with live.subscribe(TOPIC, 10) as late:  # after the close: closed from the start
        async with asyncio.timeout(BOUND):
            with pytest.raises(FeedClosed):
                await late.wait(None)
    assert live._tails == {}


async def test_a_tail_stopped_before_it_ran_closes_its_feeds_too() -> None:
    log = memory()
    live = LiveTopics(log, TopicReader(log))
    async with live.subscribe(TOPIC, 10) as feed:
        await live.close()  # its task is cancelled before its first step: no finally ran
        async with asyncio.timeout(BOUND):
            with pytest.raises(FeedClosed):
                await feed.wait(None)


async def test_a_dead_tail_closes_its_feeds_and_the_next_subscriber_gets_a_new_one() -> None:
    log = memory()
    live = LiveTopics(log, TopicReader(log))
    async with live.subscribe(TOPIC, 10) as feed:
        await started(feed)
        dead = live._tails[TOPIC]
        dead._task.cancel()  # what an error it cannot retry would do
        async with asyncio.timeout(BOUND):
            with pytest.raises(FeedClosed):
                await feed.wait(None)
        async with live.subscribe(TOPIC, 10) as other:
            assert live._tails[TOPIC] is not dead
            await started(other)
    await live.close()


class FailingOnce:
    """The memory log, whose first tail fails on its first poll (a broker error)."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.tails = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)

    def tail(self, role: str = "tail") -> Tail:
        self.tails += 1
        tail = self.log.tail(role)
        if self.tails == 1:

            async def fail(timeout_s: float, max_records: int | None = None) -> Any:
                raise RuntimeError("the broker went away")

            tail.poll = fail  # type: ignore[method-assign]
        return tail


async def test_a_failed_tail_makes_its_feeds_read_the_log_again_and_restarts() -> None:
    log = FailingOnce(memory())
    live = LiveTopics(log, TopicReader(log), retry_s=0)  # type: ignore[arg-type]
    async with live.subscribe(TOPIC, 10) as feed:
        async with asyncio.timeout(BOUND):
            while not feed.overflowed:
                await feed.wait(BOUND)
                feed.take()
        feed.reset()
        await started(feed)  # the second tail
        assert log.tails == 2
    await live.close()


# --- a push stream over them -----------------------------------------------------------------


class Everything(OffsetSource):
    """Every record of partition 0 is an occurrence."""

    def descriptor(self) -> dict[str, Any]:
        return {}

    async def select(self, principal: str, arguments: dict[str, Any]) -> Selection:
        def match(record: Any) -> Found:
            return Found(str(record.offset), record.timestamp, {"v": record.value.decode()})

        return Selection((0,), match)

    def encode(self, positions: Any) -> str:
        return str(positions[0])

    def decode(self, cursor: str, partitions: Any) -> dict[int, int]:
        return {0: int(cursor)}


def source(log: MemoryLog) -> Everything:
    reader = TopicReader(log)
    live = LiveTopics(log, reader)
    return Everything("e", TOPIC, reader, live, next_poll_ms=1000, queue_size=8, heartbeat_s=BOUND)


async def test_a_push_stream_delivers_what_is_written_as_it_opens_and_ends_on_close() -> None:
    log = memory()
    events = source(log)
    stream: AsyncIterator[Any] = await events.open_stream("alice", {}, None, None)
    async with asyncio.timeout(BOUND), contextlib.aclosing(stream):  # type: ignore[type-var]
        assert isinstance(await anext(stream), Active)
        await send(log, b"first")  # read from the log (the stream replays up to the end first)
        got = await anext(stream)
        assert isinstance(got, Occurrence) and got.data == {"v": "first"}
        await send(log, b"live")
        got = await anext(stream)
        assert isinstance(got, Occurrence) and got.data == {"v": "live"}
        waiting = asyncio.ensure_future(anext(stream))
        await wait_until(lambda: _waits(events), what="the stream waits on its feed")
        await events.close()
        with pytest.raises(StopAsyncIteration):  # the process stops: the stream just ends
            await waiting


def _waits(events: Everything) -> bool:
    tail = events.live._tails.get(TOPIC)
    return tail is not None and any(feed.waiter is not None for feed in tail.feeds)


# --- the seam --------------------------------------------------------------------------------

#: Issue 28's count of Kafka client calls and aiokafka types outside bridge/kafka/.
KAFKA_CALLS = re.compile(
    r"getmany\(|\.seek\(|\.position\(|ConsumerRecord|TopicPartition|begin_transaction"
    r"|send_and_wait|AIOKafka"
)


@pytest.mark.parametrize("module", ["kafkalog.py", "offsets.py"])
def test_the_events_log_reader_goes_through_the_port_only(module: str) -> None:
    source = (BRIDGE / "events_extension" / module).read_text()
    assert [line for line in source.splitlines() if KAFKA_CALLS.search(line)] == []
    assert "bridge.kafka.clients" not in source and "aiokafka" not in source

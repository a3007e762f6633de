"""Any Kafka topic read by offset, for the event sources that are not a task's own events.

Where it sits: between the Kafka client layer (:mod:`bridge.kafka.clients`) and the offset
sources (:mod:`bridge.mcpevents.offsets`). Two readers, both of committed records only:

* :class:`TopicReader`: history. A small pool of group-less consumers (shared by every poll
  and every catch-up of the process) answers "the records of partition p from offset o", the
  log start and end offsets, and offsets-for-times.
* :class:`LiveTopics`: live records. One consumer per topic in the process, assigned all its
  partitions from their end, started by the first push stream on that topic and stopped after
  the last; it offers each fetch to every subscriber's bounded :class:`Feed`. A subscriber that
  falls behind (its feed overflowed) or sees a hole (the tail restarted) reads from Kafka again
  through the pool, so Kafka load does not grow with the number of streams and a slow stream
  never holds up the others.

Chunks carry the positions a fetch went from and to, so a subscriber can tell "nothing of
mine" (a chunk without its records still moves its position) from "missed" (a chunk starting
after its position): offsets are not contiguous under transactions (commit markers), so the
offsets of records alone cannot say that.

What it does not do: decode or filter records (the sources do), or know MCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.kafka.clients import (
    AIOKafkaConsumer,
    ConsumerRecord,
    OffsetOutOfRangeError,
    TopicPartition,
    committed_consumer,
)
from bridge.kafka.topics import TopicLayoutError, topic_partition_ids

__all__ = ["Chunk", "Feed", "LiveTopics", "Record", "TopicReader", "UnknownTopic"]

log = logging.getLogger(__name__)

Record: TypeAlias = ConsumerRecord[bytes, bytes]

#: Records one history fetch returns at most.
FETCH_RECORDS = 500


class UnknownTopic(LookupError):
    """The topic does not exist on the cluster."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


@dataclass(frozen=True, slots=True)
class Chunk:
    """The committed records of one partition that one fetch returned, read from position
    ``start`` to position ``end`` (``end`` may move without records: commit markers)."""

    partition: int
    start: int
    end: int
    records: Sequence[Record] = ()


class TopicReader:
    """History of any topic through a pool of ``read_committed`` consumers."""

    def __init__(self, settings: Settings, *, pool_size: int = 4) -> None:
        self.settings = settings
        self._slots = asyncio.Semaphore(pool_size)
        self._idle: list[AIOKafkaConsumer] = []
        self._partitions: dict[str, list[int]] = {}

    @contextlib.asynccontextmanager
    async def _consumer(self) -> AsyncIterator[AIOKafkaConsumer]:
        """An idle consumer of the pool (a new one if none is idle); one that failed other
        than by a retention race is closed, not reused."""
        async with self._slots:
            if self._idle:
                consumer = self._idle.pop()
            else:
                # Reads must not long-poll at the log end: they only read below it.
                consumer = committed_consumer(
                    self.settings, role="event-sources", fetch_max_wait_ms=5
                )
                await consumer.start()
            try:
                yield consumer
            except OffsetOutOfRangeError:
                self._idle.append(consumer)
                raise
            except BaseException:
                await consumer.stop()
                raise
            self._idle.append(consumer)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for consumer in idle:
            await consumer.stop()

    async def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic`` (looked up once per process); UnknownTopic."""
        known = self._partitions.get(topic)
        if known is None:
            try:
                known = await topic_partition_ids(self.settings, topic)
            except TopicLayoutError:
                raise UnknownTopic(topic) from None
            self._partitions[topic] = known
        return known

    async def bounds(
        self, topic: str, partitions: Sequence[int]
    ) -> tuple[dict[int, int], dict[int, int]]:
        """Log start and last stable offset of each of ``partitions``."""
        tps = [TopicPartition(topic, p) for p in partitions]
        async with self._consumer() as consumer:
            begins = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
        return (
            {tp.partition: int(begins[tp]) for tp in tps},
            {tp.partition: int(ends[tp]) for tp in tps},
        )

    async def offsets_at(
        self, topic: str, partitions: Sequence[int], timestamp_ms: int
    ) -> dict[int, int | None]:
        """Per partition, the first offset whose record timestamp is at or after
        ``timestamp_ms`` (Kafka's offsets-for-times); None where no record is that young."""
        tps = [TopicPartition(topic, p) for p in partitions]
        async with self._consumer() as consumer:
            found = await consumer.offsets_for_times(dict.fromkeys(tps, timestamp_ms))
        return {tp.partition: None if found[tp] is None else int(found[tp].offset) for tp in tps}

    async def fetch(self, topic: str, partition: int, offset: int) -> Chunk:
        """Committed records of ``partition`` from ``offset`` (what one fetch brings, up to
        :data:`FETCH_RECORDS`). OffsetOutOfRangeError when retention deleted ``offset``."""
        tp = TopicPartition(topic, partition)
        async with self._consumer() as consumer:
            if consumer.assignment() != {tp}:
                consumer.assign([tp])
                consumer.seek(tp, offset)
            elif await consumer.position(tp) != offset:
                consumer.seek(tp, offset)  # else: keep what the consumer has prefetched
            batches = await consumer.getmany(tp, timeout_ms=1000, max_records=FETCH_RECORDS)
            end = int(await consumer.position(tp))
        return Chunk(partition, offset, end, batches.get(tp, []))


@dataclass(eq=False)
class Feed:
    """One subscriber's bounded buffer of a topic's live chunks.

    Past ``limit`` records it drops everything and says ``overflowed``: the subscriber reads
    from Kafka again instead of the tail waiting for it.
    """

    limit: int
    overflowed: bool = False
    _chunks: deque[Chunk] = field(default_factory=deque)
    _size: int = 0
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, chunk: Chunk) -> None:
        if self.overflowed:
            return
        if self._size + len(chunk.records) > self.limit:
            self.lose()
            return
        self._chunks.append(chunk)
        self._size += len(chunk.records)
        self._ready.set()

    async def wait(self, idle_s: float) -> bool:
        """True once something was offered (or the feed overflowed); False after ``idle_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(idle_s):
                await self._ready.wait()
        return self._ready.is_set()

    def take(self) -> list[Chunk]:
        """The chunks offered since the last take, oldest first."""
        self._ready.clear()
        chunks = list(self._chunks)
        self._chunks.clear()
        self._size = 0
        return chunks

    def lose(self) -> None:
        """Mark everything buffered as suspect: the subscriber reads from Kafka again."""
        self.overflowed = True
        self._chunks.clear()
        self._size = 0
        self._ready.set()

    def reset(self) -> None:
        """Forget what was buffered and the overflow (the subscriber reads Kafka now)."""
        self.take()
        self.overflowed = False


class LiveTopics:
    """The process's live tails, one per topic with at least one subscriber."""

    def __init__(self, settings: Settings, reader: TopicReader, *, retry_s: float = 1.0) -> None:
        self.settings = settings
        self.reader = reader
        self.retry_s = retry_s
        self._tails: dict[str, _Tail] = {}

    @contextlib.asynccontextmanager
    async def subscribe(self, topic: str, limit: int) -> AsyncIterator[Feed]:
        """A feed of ``topic``'s live chunks while the block runs (registered at once, so a
        read of Kafka started inside the block misses nothing the feed then gets)."""
        tail = self._tails.get(topic)
        if tail is None:
            tail = self._tails[topic] = _Tail(self, topic)
        feed = Feed(limit)
        tail.feeds.add(feed)
        try:
            yield feed
        finally:
            tail.feeds.discard(feed)
            if not tail.feeds and self._tails.get(topic) is tail:
                del self._tails[topic]
                await tail.stop()

    async def close(self) -> None:
        tails, self._tails = list(self._tails.values()), {}
        for tail in tails:
            await tail.stop()


class _Tail:
    """One consumer following every partition of a topic from its end, offering each fetch."""

    def __init__(self, owner: LiveTopics, topic: str) -> None:
        self.owner = owner
        self.topic = topic
        self.feeds: set[Feed] = set()
        self._task = asyncio.create_task(self._run(), name=f"event-source-tail-{topic}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def _offer(self, chunk: Chunk) -> None:
        for feed in list(self.feeds):
            feed.offer(chunk)

    def _lost(self) -> None:
        for feed in list(self.feeds):
            feed.lose()

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()
            except Exception as exc:  # Kafka trouble: subscribers catch up, the tail restarts
                log.warning(
                    "live tail of %s failed (%s); restarting", self.topic, type(exc).__name__
                )
                self._lost()
            await asyncio.sleep(self.owner.retry_s)  # the retry cadence, not synchronisation

    async def _follow(self) -> None:
        partitions = await self.owner.reader.partitions(self.topic)
        tps = [TopicPartition(self.topic, p) for p in partitions]
        consumer = committed_consumer(self.owner.settings, role="event-sources-tail")
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            at = {tp: int(await consumer.position(tp)) for tp in tps}
            while True:
                batches = await consumer.getmany(*tps, timeout_ms=1000)
                for tp in tps:
                    end = int(await consumer.position(tp))
                    records = batches.get(tp, [])
                    if records or end != at[tp]:
                        self._offer(Chunk(tp.partition, at[tp], end, records))
                        at[tp] = end
        finally:
            await consumer.stop()

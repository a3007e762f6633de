"""Any Kafka topic read by offset, for the event sources that are not a task's own events.

Where it sits: between the log port (:mod:`bridge.kafka.port`) and the offset sources
(:mod:`bridge.events_extension.offsets`). Two readers, both of committed records only, both on a
:class:`~bridge.kafka.port.Log` given by the composition (the Kafka adapter in production,
the in-memory log in tests and the simulation):

* :class:`TopicReader`: history. "The records of partition p from offset o" through
  :meth:`Log.fetch <bridge.kafka.port.Log.fetch>` (on Kafka, the adapter's one consumer pool),
  the log start and end offsets, and offsets-for-times.
* :class:`LiveTopics`: live records. One port :class:`~bridge.kafka.port.Tail` per topic in the
  process, assigned all its partitions from their end, started by the first push stream on that
  topic and stopped after the last; it offers each poll to every subscriber's bounded
  :class:`~bridge.log.fanout.LiveBuffer` (the bridge's one live buffer). A subscriber that falls
  behind (its buffer overflowed) or sees a hole (the tail restarted) reads the log again through
  :class:`TopicReader`, so Kafka load does not grow with the number of streams and a slow stream
  never holds up the others. Closing :class:`LiveTopics` (the process stops) closes every
  buffer: its waiter wakes at once with :class:`~bridge.log.fanout.FeedClosed`.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from bridge.component import cancel_and_wait
from bridge.kafka.port import Log, LogRecord, Polled, TopicPart
from bridge.kafka.port import UnknownTopic as UnknownLogTopic
from bridge.log.fanout import DRAINING, LiveBuffer

__all__ = ["Chunk", "LiveTopics", "Record", "TopicFeed", "TopicReader", "UnknownTopic"]

log = logging.getLogger(__name__)

Record: TypeAlias = LogRecord

#: Records one history fetch returns at most.
FETCH_RECORDS = 500
#: How long one poll of a live tail waits for records.
TAIL_POLL_S = 1.0


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


def _weight(chunk: Chunk) -> int:
    """A chunk's share of a feed's limit: its records, and at least one (a run of chunks of
    markers only is bounded too)."""
    return max(1, len(chunk.records))


class TopicFeed(LiveBuffer[Chunk]):
    """One subscriber's bounded buffer of a topic's live chunks: at most ``limit`` records
    (a chunk of markers only counts as one)."""

    __slots__ = ()

    def __init__(self, topic: str, limit: int) -> None:
        super().__init__(topic, limit, _weight)


class TopicReader:
    """History of any topic through the log port (read_committed)."""

    def __init__(self, log: Log, *, on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        """``on_close``: what :meth:`close` releases (the composition's dedicated log)."""
        self.log = log
        self._on_close = on_close
        self._partitions: dict[str, list[int]] = {}

    async def close(self) -> None:
        """Release the log when this reader owns it; idempotent."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()

    async def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic`` (looked up once per process); UnknownTopic."""
        known = self._partitions.get(topic)
        if known is None:
            try:
                known = await self.log.partitions(topic)
            except UnknownLogTopic:
                raise UnknownTopic(topic) from None
            self._partitions[topic] = known
        return known

    async def bounds(
        self, topic: str, partitions: Sequence[int]
    ) -> tuple[dict[int, int], dict[int, int]]:
        """Log start and last stable offset of each of ``partitions``."""
        parts = [TopicPart(topic, p) for p in partitions]
        begins = await self.log.log_starts(parts)
        ends = await self.log.log_ends(parts)
        return (
            {part.partition: begins[part] for part in parts},
            {part.partition: ends[part] for part in parts},
        )

    async def offsets_at(
        self, topic: str, partitions: Sequence[int], timestamp_ms: int
    ) -> dict[int, int | None]:
        """Per partition, the first offset whose record timestamp is at or after
        ``timestamp_ms`` (Kafka's offsets-for-times); None where no record is that young."""
        parts = [TopicPart(topic, p) for p in partitions]
        found = await self.log.offsets_for_times(dict.fromkeys(parts, timestamp_ms))
        return {part.partition: found[part] for part in parts}

    async def fetch(self, topic: str, partition: int, offset: int) -> Chunk:
        """Committed records of ``partition`` from ``offset`` (what one fetch brings, up to
        :data:`FETCH_RECORDS`). The port's OffsetOutOfRange when retention deleted ``offset``."""
        fetched = await self.log.fetch(TopicPart(topic, partition), offset, FETCH_RECORDS)
        return Chunk(partition, offset, fetched.next_offset, fetched.records)


class LiveTopics:
    """The process's live tails, one per topic with at least one subscriber."""

    def __init__(self, log: Log, reader: TopicReader, *, retry_s: float = 1.0) -> None:
        self.log = log
        self.reader = reader
        self.retry_s = retry_s
        self._tails: dict[str, _Tail] = {}
        self._closed = False

    @contextlib.asynccontextmanager
    async def subscribe(self, topic: str, limit: int) -> AsyncIterator[TopicFeed]:
        """A feed of ``topic``'s live chunks while the block runs (registered at once, so a
        read of Kafka started inside the block misses nothing the feed then gets). Once
        :meth:`close` ran, the feed comes closed: its first wait raises FeedClosed."""
        feed = TopicFeed(topic, limit)
        if self._closed:
            feed.close(DRAINING)
            yield feed
            return
        tail = self._tails.get(topic)
        if tail is None or not tail.alive:  # a dead tail closed its feeds: start another
            tail = self._tails[topic] = _Tail(self, topic)
        tail.feeds[feed] = None
        try:
            yield feed
        finally:
            tail.feeds.pop(feed, None)
            if not tail.feeds and self._tails.get(topic) is tail:
                del self._tails[topic]
                await tail.stop()

    async def close(self) -> None:
        """Stop every tail and close its feeds (their waiters wake at once); idempotent."""
        self._closed = True
        tails, self._tails = list(self._tails.values()), {}
        for tail in tails:
            await tail.stop()


class _Tail:
    """One port tail following every partition of a topic from its end, offering each poll.

    Its feeds are closed when it stops, however it stops (its owner closed, or the task ended
    by an error it could not retry): a subscriber never waits on a dead tail.
    """

    def __init__(self, owner: LiveTopics, topic: str) -> None:
        self.owner = owner
        self.topic = topic
        # A dict as an ordered set: feeds are offered chunks in the order they subscribed.
        self.feeds: dict[TopicFeed, None] = {}
        self._task = asyncio.create_task(self._run(), name=f"event-source-tail-{topic}")

    @property
    def alive(self) -> bool:
        """False once its task ended (and closed its feeds)."""
        return not self._task.done()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._close_feeds()

    def _close_feeds(self) -> None:
        for feed in list(self.feeds):
            feed.close(DRAINING)

    def _offer(self, chunk: Chunk) -> None:
        for feed in list(self.feeds):
            feed.offer(chunk)

    def _lost(self) -> None:
        for feed in list(self.feeds):
            feed.lose()

    async def _run(self) -> None:
        try:
            while True:
                try:
                    await self._follow()
                except Exception as exc:  # Kafka trouble: subscribers catch up, the tail restarts
                    log.warning(
                        "live tail of %s failed (%s); restarting", self.topic, type(exc).__name__
                    )
                    self._lost()
                await asyncio.sleep(self.owner.retry_s)  # the retry cadence, not synchronisation
        finally:
            self._close_feeds()

    async def _follow(self) -> None:
        partitions = await self.owner.reader.partitions(self.topic)
        parts = [TopicPart(self.topic, p) for p in partitions]
        at = await self.owner.log.log_ends(parts)
        async with self.owner.log.tail("event-sources-tail") as tail:
            tail.assign(at)
            # Where it starts, said as an empty chunk per partition: a subscriber that read the
            # log only up to an earlier end (the tail started after it subscribed, or restarted)
            # sees a hole there and reads the log again, instead of waiting for records the
            # tail will never offer.
            for part, start in at.items():
                self._offer(Chunk(part.partition, start, start))
            while True:
                self._offer_polled(await tail.poll(TAIL_POLL_S), at)

    def _offer_polled(self, polled: Polled, at: dict[TopicPart, int]) -> None:
        """Offer what one poll read, a chunk per partition whose position moved."""
        for part, start in list(at.items()):
            records = polled.records.get(part, ())
            end = polled.positions.get(part, start)
            if records:
                end = max(end, records[-1].offset + 1)
            if records or end != start:
                self._offer(Chunk(part.partition, start, end, records))
                at[part] = end

"""Retention racing the reader on the real broker: the log start moves between its lookup and
the count of the task's records from there, which must give the right earliest seq (and
events_gone for an overtaken cursor), never an OffsetOutOfRangeError."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiokafka.structs import TopicPartition
from support.layout import delete_events_before
from support.waits import BOUND

from bridge.config import Settings
from bridge.log.indexer import Indexer
from bridge.log.publisher import TaskEventPublisher
from bridge.log.reader import NotRetained, Reader

pytestmark = pytest.mark.kafka

TASK = "task-raced"


async def publish_interleaved(settings: Settings, n: int) -> tuple[int, list[int]]:
    """``n`` events of TASK, each followed by a neighbour's; (partition, TASK's offsets)."""
    offsets = []
    async with TaskEventPublisher(settings) as pub:
        for i in range(n):
            meta = await pub.publish(TASK, "com.example.e", {"i": i})
            offsets.append(meta.offset)
            await pub.publish(f"{TASK}-neighbour", "com.example.e", {"i": i})
    return meta.partition, offsets


@asynccontextmanager
async def reader_over(settings: Settings) -> AsyncIterator[Reader]:
    """A reader over an indexer caught up before any deletion (else the seq is untrusted)."""
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        async with asyncio.timeout(BOUND):
            await indexer.catch_up()
        yield reader


def delete_after_first_lookup(reader: Reader, delete: Callable[[], Awaitable[None]]) -> None:
    """Make retention move once, right after the reader has looked up the log start."""
    lookup = reader._log_start
    pending = [delete]

    async def stale_lookup(tp: TopicPartition) -> int:
        start = await lookup(tp)
        while pending:
            await pending.pop()()
        return start

    reader._log_start = stale_lookup  # type: ignore[method-assign]


@asynccontextmanager
async def retention_racing(settings: Settings, first: int, then: int) -> AsyncIterator[Reader]:
    """A reader over 11 events of TASK whose log start is at its event ``first`` and moves to
    its event ``then`` right after the reader's next look at it."""
    partition, offsets = await publish_interleaved(settings, 11)
    async with reader_over(settings) as reader:
        await delete_events_before(settings, partition, offsets[first])
        later = functools.partial(delete_events_before, settings, partition, offsets[then])
        delete_after_first_lookup(reader, later)
        yield reader


async def test_earliest_seq_counts_again_from_the_new_log_start_when_retention_moves_mid_count(
    topics: Settings,
) -> None:
    # checkpoints at seq 0, 4, 8: a log start inside the first interval makes it count
    async with retention_racing(topics, 1, 5) as reader:
        async with asyncio.timeout(BOUND):
            assert await reader.earliest_seq(TASK) == 5


async def test_a_cursor_overtaken_while_earliest_seq_is_computed_gets_events_gone(
    topics: Settings,
) -> None:
    async with retention_racing(topics, 1, 6) as reader:
        with pytest.raises(NotRetained) as gone:
            async with asyncio.timeout(BOUND):
                _ = [event async for event in reader.read(TASK, after=1)]
        assert gone.value.earliest_seq == 6

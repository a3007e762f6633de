"""A task feed (the fan-out's bounded buffer) as pure logic: waking, idling, overflow, closure."""

from __future__ import annotations

import asyncio

import pytest
from support.waits import BOUND, wait_until

from bridge.envelope import TaskEvent
from bridge.log.fanout import DRAINING, MOVED, FeedClosed, TaskFeed
from bridge.log.indexer import IndexedEvent


def live(seq: int) -> IndexedEvent:
    return IndexedEvent("t", 0, 10 * seq, seq, TaskEvent("com.example.e", {"i": seq}, None, 0))


async def test_wait_wakes_on_an_offer_and_says_idle_when_nothing_came() -> None:
    feed = TaskFeed("t", limit=3)
    async with asyncio.timeout(BOUND):
        assert await feed.wait(0.01) is False  # idle: the caller sends a keep-alive
        waiting = asyncio.create_task(feed.wait(BOUND))
        await wait_until(lambda: feed.waiter is not None, what="the task waits on its waiter")
        feed.offer(live(0))
        assert await waiting is True
        assert [e.seq for e in feed.take()] == [0]
        waiting = asyncio.create_task(feed.wait(None))
        await wait_until(lambda: feed.waiter is not None, what="the task waits again")
        feed.close(MOVED)
        with pytest.raises(FeedClosed) as closed:
            await waiting
        assert closed.value.moved and closed.value.task_id == "t" and feed.waiter is None


async def test_a_closed_feed_cannot_be_waited_on_in_a_loop() -> None:
    """The loop of every waiter (wait, take, look): once the feed is closed and what
    it held was taken, the next wait raises instead of returning at once, so the loop ends
    after one round per buffered batch, never spins."""
    feed = TaskFeed("t", limit=3)
    feed.offer(live(0))
    feed.close(DRAINING)
    feed.close(MOVED)  # the first reason is kept
    rounds, taken = 0, []
    with pytest.raises(FeedClosed) as closed:
        async with asyncio.timeout(BOUND):
            for rounds in range(1000):  # noqa: B007  (counted: a spinning waiter reaches 999)
                await feed.wait(None)
                taken += feed.take()
    assert rounds == 1 and [e.seq for e in taken] == [0]
    assert closed.value.reason == DRAINING and not closed.value.moved


async def test_a_closed_feed_hands_out_what_arrived_before_the_close() -> None:
    """A task's final status and the move of its partition can land in one loop turn (the tail
    applies a fetch, then the rebalance callback runs): the status is delivered, then the
    closure raised, whether the waiter was already suspended or not yet waiting."""
    async with asyncio.timeout(BOUND):
        feed = TaskFeed("t", limit=3)
        feed.offer(live(0))
        feed.close(MOVED)  # before the waiter runs
        assert await feed.wait(None) is True and [e.seq for e in feed.take()] == [0]
        with pytest.raises(FeedClosed):
            await feed.wait(None)

        feed = TaskFeed("t", limit=3)
        waiting = asyncio.create_task(feed.wait(None))
        await wait_until(lambda: feed.waiter is not None, what="the task waits on its waiter")
        feed.offer(live(1))
        feed.close(MOVED)  # while the waiter is woken but has not run yet
        assert await waiting is True and [e.seq for e in feed.take()] == [1]
        with pytest.raises(FeedClosed) as closed:
            await feed.wait(None)
        assert closed.value.moved


async def test_a_closed_feed_that_overflowed_has_nothing_to_hand_out() -> None:
    """What an overflow dropped is re-read from the task's owner, not from here: a closed and
    overflowed feed raises at once (a waiter that does not reset cannot spin)."""
    feed = TaskFeed("t", limit=1)
    feed.offer(live(0))
    feed.offer(live(1))
    feed.close(MOVED)
    async with asyncio.timeout(BOUND):
        with pytest.raises(FeedClosed):
            await feed.wait(None)


async def test_an_overflowing_buffer_drops_everything_and_says_so() -> None:
    feed = TaskFeed("t", limit=2)
    assert feed.offer(live(0)) and feed.offer(live(1))
    assert not feed.offer(live(2))
    assert feed.overflowed and feed.take() == []
    async with asyncio.timeout(BOUND):
        assert await feed.wait(BOUND) is True  # overflowed: something to do at once
    feed.reset()
    assert not feed.overflowed

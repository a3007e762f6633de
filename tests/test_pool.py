"""The adapter's consumer pool (bridge.kafka.pool) closing, with fake consumers: no broker."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from bridge.kafka import pool as pool_module
from bridge.kafka.pool import ConsumerPool
from bridge.kafka.port import LogError

#: Every wait of these tests is bounded by this.
BOUND_S = 10.0


class FakeConsumer:
    """What the pool does with a consumer when no read runs: start and stop it."""

    ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self.ids)
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


class WatchedCondition(asyncio.Condition):
    """The pool's condition, telling when a read begins to wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def wait(self) -> bool:
        self.waiting.set()  # the wait below registers before this task yields
        return await super().wait()


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> ConsumerPool:
    def fake(settings: Any, role: str, **options: Any) -> FakeConsumer:
        return FakeConsumer()

    monkeypatch.setattr(pool_module, "committed_consumer", fake)
    made = ConsumerPool(None, size=1, role="test")  # type: ignore[arg-type]
    made._free = WatchedCondition()
    return made


async def _holding(pool: ConsumerPool, held: asyncio.Event, release: asyncio.Event) -> Any:
    async with pool.consumer() as consumer:
        held.set()
        await release.wait()
        return consumer


async def test_closing_the_pool_wakes_a_read_waiting_for_a_consumer_with_an_error(
    pool: ConsumerPool,
) -> None:
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_holding(pool, held, release))
    await held.wait()

    async def waiting() -> None:
        async with pool.consumer():
            pass

    waiter = asyncio.create_task(waiting())
    assert isinstance(pool._free, WatchedCondition)
    async with asyncio.timeout(BOUND_S):
        await pool._free.waiting.wait()
    await pool.close()
    with pytest.raises(LogError, match="closed"):
        async with asyncio.timeout(BOUND_S):
            await waiter
    release.set()
    async with asyncio.timeout(BOUND_S):
        lent = await holder
    assert lent.stopped


async def test_a_consumer_returned_after_the_close_is_stopped_and_never_lent_again(
    pool: ConsumerPool,
) -> None:
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_holding(pool, held, release))
    await held.wait()
    await pool.close()
    release.set()
    async with asyncio.timeout(BOUND_S):
        lent = await holder
    assert lent.stopped and pool._idle == []
    with pytest.raises(LogError, match="closed"):
        async with pool.consumer():
            pass


async def test_a_read_after_the_close_is_refused_and_opens_no_consumer(
    pool: ConsumerPool,
) -> None:
    async with pool.consumer() as first:
        pass
    await pool.close()
    assert first.stopped
    with pytest.raises(LogError, match="closed"):
        async with pool.consumer():
            pass
    assert pool._all == [] and pool._idle == []

"""Replay pacing: a reconnecting stream's catch-up is held to ``recovery.replay_events_per_s``
(a token bucket per stream, on the hub's clock, ``replay_burst`` at once), live events are
never held, nothing is lost or reordered, and a drain ends a paced wait at once.

In-process: the pace over a fake clock whose waits are recorded (no time passes), and the real
stream hub over the fake log of tests/test_stream_rule.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_stream_rule import TASK, FakeLog

from bridge.config import load_settings
from bridge.log.fanout import Fanout
from bridge.metrics import StreamMetrics
from bridge.server.admission import Caller
from bridge.server.pacing import ReplayPace
from bridge.server.streams import StreamHub


class Clock:
    """A monotonic clock that moves only when a recorded wait "passes"."""

    def __init__(self) -> None:
        self.now = 50.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now

    async def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return True


async def test_the_bucket_lets_a_burst_through_then_holds_the_rate() -> None:
    clock = Clock()
    paced: list[float] = []
    pace = ReplayPace(10.0, 5, clock=clock.monotonic, wait=clock.wait, on_paced=paced.append)
    sent = 0
    for _ in range(6):
        assert await pace.take(5)
        sent += 5
    # The burst pays for the first batch; the second goes in debt (a batch goes whole); each
    # later one waits until the debt of the one before is paid: 0.5 s each.
    assert clock.waits == [0.5] * 4 and paced == clock.waits
    elapsed = clock.now - 50.0
    assert sent <= 5 + 10.0 * elapsed + 5, "at most the burst, the rate and one batch"
    clock.now += 100.0  # idle: the bucket refills to its burst, no more
    assert await pace.take(5) and clock.waits == [0.5] * 4
    assert await pace.take(5) and await pace.take(5) and clock.waits == [0.5] * 5


async def test_a_batch_larger_than_the_bucket_goes_whole_and_the_next_pays_for_it() -> None:
    clock = Clock()
    pace = ReplayPace(100.0, 10, clock=clock.monotonic, wait=clock.wait)
    assert await pace.take(500)
    assert clock.waits == []
    assert await pace.take(1)
    assert clock.waits == [pytest.approx(4.9)]


async def test_a_pace_whose_wait_is_cut_short_says_stop() -> None:
    clock = Clock()

    async def drained(seconds: float) -> bool:
        return False

    pace = ReplayPace(1.0, 1, clock=clock.monotonic, wait=drained)
    assert await pace.take(3)
    assert not await pace.take(1)


def test_a_pace_needs_a_rate_and_a_burst() -> None:
    clock = Clock()
    for rate, burst in ((0.0, 5), (-1.0, 5), (1.0, 0)):
        with pytest.raises(ValueError):
            ReplayPace(rate, burst, clock=clock.monotonic, wait=clock.wait)


def paced_hub(log: FakeLog, clock: Clock, rate: float, burst: int) -> tuple[StreamHub, list[Any]]:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        streams={"queue_size": 100, "keepalive_s": 60},
        recovery={"replay_events_per_s": rate, "replay_burst": burst},
    )
    paced: list[float] = []
    hub = StreamHub(
        settings,
        log,  # type: ignore[arg-type]
        log,  # type: ignore[arg-type]
        Fanout(log),  # type: ignore[arg-type]
        StreamMetrics(),
        clock,  # type: ignore[arg-type]
        on_paced=paced.append,
    )
    hub._pace_wait = clock.wait  # type: ignore[method-assign]  # recorded, no time passes
    return hub, paced


async def test_a_reconnecting_stream_s_catch_up_is_paced_and_its_live_events_are_not() -> None:
    log = FakeLog(lambda: 10)  # history fetched 10 events at a time
    for _ in range(100):
        log.append()
    clock = Clock()
    hub, paced = paced_hub(log, clock, rate=50.0, burst=20)
    ticket = hub.admit(Caller("p", "p", None), TASK, 1)
    delivered: list[int] = []
    times: list[float] = []
    caught_up = asyncio.Event()

    async def consume() -> None:
        async for batch in hub.events(ticket, 9):  # a reconnect: after seq 9
            for seq, _ in batch or []:
                delivered.append(seq)
                times.append(clock.now)
            if delivered and delivered[-1] == 99:
                caught_up.set()

    stream = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await caught_up.wait()
        waits_after_catch_up = len(clock.waits)
        for _ in range(30):  # live events: many at once, never held
            log.append()
        log.append(terminal=True)
        await stream
    assert delivered == list(range(10, 131)), "nothing lost, repeated or reordered"
    # 90 events replayed: the first 20 (the burst) at once, the rest at 50 per second.
    assert times[19] == 50.0
    assert times[delivered.index(99)] == pytest.approx(50.0 + (90 - 20) / 50.0, abs=0.21)
    assert len(clock.waits) == waits_after_catch_up, "live delivery waited for nothing"
    assert paced == clock.waits


async def test_pacing_is_off_by_default() -> None:
    log = FakeLog(lambda: 10)
    for _ in range(50):
        log.append()
    log.append(terminal=True)
    settings = load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"})
    assert settings.recovery.replay_events_per_s == 0
    hub = StreamHub(settings, log, log, Fanout(log), StreamMetrics())  # type: ignore[arg-type]
    assert hub._pace() is None


async def test_a_drain_ends_a_paced_wait_at_once() -> None:
    log = FakeLog(lambda: 5)
    for _ in range(20):
        log.append()
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        recovery={"replay_events_per_s": 0.001, "replay_burst": 1},  # a wait of hours
    )
    hub = StreamHub(settings, log, log, Fanout(log), StreamMetrics())  # type: ignore[arg-type]
    ticket = hub.admit(Caller("p", "p", None), TASK, 1)
    delivered: list[int] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for batch in hub.events(ticket, None):
            delivered.extend(seq for seq, _ in batch or [])
            first.set()

    stream = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await first.wait()  # the first batch went (the burst); the next waits for the pace
        hub.drain()
        await stream
    assert delivered == [0, 1, 2, 3, 4]

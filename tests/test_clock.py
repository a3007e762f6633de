"""bridge/clock.py: the injectable clocks and randomness, and the places that take them."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from support.layout import make_settings

from bridge.clock import SYSTEM_CLOCK, SYSTEM_ENTROPY, LoopClock, SeededEntropy
from bridge.events_extension.skips import Skips
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.metrics import StreamMetrics
from bridge.server.admission import Caller
from bridge.server.streams import StreamHub
from bridge.server.wire import RpcError
from bridge.tasks.messages import new_task_id

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # simulation/ (dev tooling)
from simulation import loop


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now

    def monotonic(self) -> float:
        return self.now


def test_the_system_clock_and_entropy_are_the_real_ones() -> None:
    assert abs(SYSTEM_CLOCK.wall() - time.time()) < 60
    assert SYSTEM_CLOCK.monotonic() <= time.monotonic()
    assert len(SYSTEM_ENTROPY.token_bytes(16)) == 16
    assert SYSTEM_ENTROPY.token_urlsafe(24) != SYSTEM_ENTROPY.token_urlsafe(24)


def test_seeded_entropy_repeats_its_draws_and_draws_task_ids_of_the_usual_form() -> None:
    ids = [new_task_id(SeededEntropy(7)) for _ in range(2)]
    assert ids[0] == ids[1]
    assert len(ids[0]) == 32 and not ids[0].startswith("-")
    assert new_task_id(SeededEntropy(8)) != ids[0]
    assert "seed" not in repr(SeededEntropy(7)).replace("<seed>", "")


def test_a_loop_clock_moves_with_the_virtual_loop() -> None:
    clock = LoopClock(epoch=1_700_000_000.0)

    async def an_hour() -> tuple[float, float]:
        wall, mono = clock.wall(), clock.monotonic()
        await asyncio.sleep(3600)
        return clock.wall() - wall, clock.monotonic() - mono

    assert loop.run(an_hour) == (3600.0, 3600.0)


def test_skips_warn_on_the_clock_they_are_given(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    skips = Skips("source", clock)
    with caplog.at_level(logging.WARNING):
        skips.add("garbage")
        skips.add("garbage")
        clock.now += 60
        skips.add("garbage")
    assert len([r for r in caplog.records if "skipped records" in r.getMessage()]) == 2


def test_the_stream_hubs_open_rate_window_runs_on_its_clock() -> None:
    clock = FakeClock()
    settings = make_settings("127.0.0.1:1", "clock", streams={"opens_per_minute": 1})
    indexer = SimpleNamespace(add_ownership_listener=lambda listener: None)
    hub = StreamHub(
        settings,
        cast(Indexer, indexer),
        cast(Reader, None),
        cast(Any, None),
        StreamMetrics(),
        clock,
    )
    caller = Caller("alice", "alice")
    hub.release(hub.admit(caller, "t1", 1))
    with pytest.raises(RpcError):
        hub.admit(caller, "t1", 2)
    clock.now += 61
    hub.release(hub.admit(caller, "t1", 3))

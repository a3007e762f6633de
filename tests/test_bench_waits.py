"""A bench stage that waits too long fails with what it waited for, never a bare TimeoutError
(the 1,000-stream stage once failed with nothing but ``TimeoutError``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from common import NotReached, within


def test_a_stage_that_waits_too_long_says_what_it_waited_for() -> None:
    async def stage() -> None:
        async with within(0.01, "1,000 streams counted"):
            await asyncio.Event().wait()

    with pytest.raises(NotReached, match=r"^not reached within 0.01 s: 1,000 streams counted$"):
        asyncio.run(stage())


def test_a_stage_within_its_bound_is_untouched() -> None:
    async def stage() -> int:
        async with within(5, "nothing"):
            return 7

    assert asyncio.run(stage()) == 7

"""The fuzz targets' work bound (tests/support/fuzz.py): near the linear cost, not 25x over it.

The CPU clock is faked: each case "costs" what a parser of a given shape would, so the test
says which shapes the bound lets through, with no timing of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from support import fuzz
from support.fuzz import TooMuchWork, work_bound, work_bound_s


@dataclass
class Case:
    size: int

    def input_bytes(self) -> int:
        return self.size


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The thread CPU clock work_bound reads; a case adds its cost to it."""
    clock = [0.0]
    monkeypatch.setattr(fuzz.time, "thread_time", lambda: clock[0])
    return clock


def costs(cpu: list[float], size: int, cost: Callable[[int], float]) -> None:
    """Run a case of ``size`` bytes that spends ``cost(size)`` CPU seconds."""
    with work_bound(Case(size)):
        cpu[0] += cost(size)


def test_a_parser_costing_10_us_per_byte_fails_the_bound(cpu: list[float]) -> None:
    # Review F16: 10 us/byte (10 s of frozen event loop per MiB) passed 0.5 s + 10 ms/KiB.
    with pytest.raises(TooMuchWork):
        costs(cpu, 64 * 1024, lambda n: n * 10e-6)


def test_issue_26_s_quadratic_scan_fails_the_bound_at_4_kib(cpu: list[float]) -> None:
    # 8fd441c's depth scan: 2.84 s for 12,477 bytes, quadratic; at 4 KiB about 0.3 s, which
    # the old 0.5 s floor let through.
    quadratic = 2.84 / 12_477**2
    with pytest.raises(TooMuchWork):
        costs(cpu, 4096, lambda n: quadratic * n * n)


@pytest.mark.parametrize(
    ("size", "measured_s"),
    [
        (12_477, 0.033),  # the first record case: cold caches (0.0005 s once warm)
        (200 * 1024, 0.008),  # a record decoded on every path: 0.04 ms/KiB
        (400, 0.003),  # a request through the endpoint: its fixed cost
        (12_499, 0.0042),  # the largest per-KiB cost of a request over 8 KiB
        (1024 * 1024, 0.35),  # a request body at the 1 MiB limit, at that rate
    ],
)
def test_the_measured_linear_costs_pass_with_a_margin_of_three(
    size: int, measured_s: float
) -> None:
    assert work_bound_s(Case(size)) >= 3 * measured_s

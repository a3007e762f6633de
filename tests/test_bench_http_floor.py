"""bench/bench_http_floor.py --small runs to its end with a row per variant and the budget.

The bench has no target of its own; what every run must show is that it exited 0, that each
event loop x HTTP parser variant was really the one uvicorn ran (its label carries no
"(runs ...)"), and that its numbers hold together.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.bench import run_small

pytestmark = pytest.mark.slow

BOUND_S = 180  # about 10 s on two quiet cores
VARIANTS = ("asyncio+h11", "asyncio+httptools", "uvloop+h11", "uvloop+httptools")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("floor") / "out.json"
    return run_small("bench_http_floor.py", None, out, BOUND_S)


def rows(data: dict[str, Any], bench: str) -> dict[str, dict[str, Any]]:
    return {r["metric"].strip(): r for r in data["rows"] if r["bench"] == bench}


def test_every_variant_ran_as_named_and_served_every_stream(measured: dict[str, Any]) -> None:
    floor = rows(measured, "floor")
    for variant in VARIANTS:
        took = floor[f"{variant}: 300 streams at once, every first event in"]
        assert took["unit"] == "s" and 0 < took["value"] < 60, took
        cpu = floor[f"{variant}: 300 at once: CPU per connection server / this process"]
        server_ms, client_ms = (float(x) for x in cpu["value"].split(" / "))
        # utime + stime over the storm: more than nothing, less than the whole storm's wall
        # time on every core for each connection (a misread /proc field lands outside)
        assert 0 < server_ms < took["value"] * 1e3 * 2 and client_ms > 0, cpu
    assert not [m for m in floor if "(runs" in m], list(floor)


def test_the_budget_is_the_storm_targets_and_each_floor_has_its_share(
    measured: dict[str, Any],
) -> None:
    budget = rows(measured, "budget")
    head = next(r for m, r in budget.items() if m.startswith("bridge CPU per open"))
    assert head["value"] == "1.00" and head["unit"] == "ms", head
    shares = [m for m in budget if m.endswith("the bare app's share of it")]
    assert sorted(m.split(" ")[0] for m in shares) == sorted(VARIANTS), shares

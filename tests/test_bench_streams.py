"""bench/bench_streams.py --small runs to its end, and its summary table has every stage's rows.

The targets are not checked here (a smoke run on a shared machine); what every run must show
is: the process exited 0 (``run_small`` asserts it), each stage produced the rows the summary
table is made of, every target row carries a verdict, and the numbers hold together.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.bench import run_small

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BOUND_S = 420  # the small run takes about two and a half minutes on two shared cores

#: (stage, a part of the metric) of every row with a target, as the summary table prints them.
TARGET_ROWS = (
    ("latency", "bridge / Kafka, p50"),
    ("latency", "bridge / Kafka, p99"),
    ("scale", "bridge / Kafka, p99"),
    ("bytes", "ratio N=1,000 / N=1"),
    ("rss", "VmRSS per idle stream"),
    ("storm", "1,000 resumes at once"),
    ("opens", "fresh streams opened"),
    ("hot", "tasks/stream / raw consumer"),
    ("run", "wall time"),
)


@pytest.fixture(scope="module")
def measured(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("streams") / "out.json"
    return run_small("bench_streams.py", kafka_bootstrap, out, BOUND_S)


def row(data: dict[str, Any], stage: str, metric_start: str) -> dict[str, Any]:
    """The one row of ``stage`` whose metric starts so (detail rows start with spaces)."""
    found = [
        r for r in data["rows"] if r["bench"] == stage and r["metric"].startswith(metric_start)
    ]
    assert len(found) == 1, f"{len(found)} {stage} rows starting {metric_start!r}"
    return found[0]


def test_every_target_has_its_row_with_a_verdict(measured: dict[str, Any]) -> None:
    for stage, metric in TARGET_ROWS:
        found = row(measured, stage, metric)
        assert found["target"], found
        # --small prints "(PASS - target is for full size)" for the targets of the full size
        assert "PASS" in found["status"] or "MISS" in found["status"], found


def test_the_table_is_in_stage_order_and_names_the_machine(measured: dict[str, Any]) -> None:
    stages = list(dict.fromkeys(r["bench"] for r in measured["rows"]))
    assert stages == ["latency", "scale", "bytes", "rss", "storm", "opens", "fanout", "hot", "run"]
    env = measured["environment"]
    assert env["size"] == "small" and env["nproc"] >= 1 and env["cpu"]
    assert {"aiokafka", "uvicorn"} <= env["versions"].keys()
    assert env["bridge_hot_path"] in {
        f"{a}+{b}" for a in ("asyncio", "uvloop") for b in ("h11", "httptools")
    }


def test_fanout_counts_the_bridges_cpu(measured: dict[str, Any]) -> None:
    delivered = row(measured, "fanout", "1,000 streams over 20 tasks")
    per_core = row(measured, "fanout", "  per core")
    share = row(measured, "fanout", "  bridge CPU over the window")
    assert delivered["value"] > 0 and per_core["value"] > 0, (delivered, per_core)
    # utime + stime of a process over a window: more than nothing, at most every core's time
    # (a misread /proc/PID/stat field or clock-tick scale lands outside)
    assert 0 < share["value"] <= 100 * measured["environment"]["nproc"], share
    ratio = per_core["value"] * share["value"] / 100 / delivered["value"]
    assert 0.99 < ratio < 1.01, (delivered, per_core, share)  # all three from one window


def test_the_replay_got_every_event(measured: dict[str, Any]) -> None:
    assert not [n for n in measured["notes"] if n.startswith("hot:")], measured["notes"]

"""bench/bench_rollout.py --smoke runs to its end, and what it measured holds together.

The timing targets are not checked here (a smoke run on a shared machine); the facts every
size must show are: every phase produced its rows, the replicas were restarted and came back,
and the checker found every stream's deliveries whole (nothing lost, doubled or reordered
through a rolling restart and a SIGKILL).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.bench import run_small

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BOUND_S = 300  # the smoke run takes 45-60 s on two shared cores


@pytest.fixture(scope="module")
def measured(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("rollout") / "out.json"
    return run_small("bench_rollout.py", kafka_bootstrap, out, BOUND_S)


def row(data: dict[str, Any], bench: str, metric_part: str) -> dict[str, Any]:
    found = [r for r in data["rows"] if r["bench"] == bench and metric_part in r["metric"]]
    assert len(found) == 1, f"no single {bench} row with {metric_part!r}: {found}"
    return found[0]


def test_every_phase_of_the_bench_reports(measured: dict[str, Any]) -> None:
    for bench, metric in (
        ("rollout", "requests failed beyond one retry"),
        ("rollout", "stream longest gap p99"),
        ("rollout", "stream longest gap worst"),
        ("rollout", "group rebalances per restarted replica"),
        ("sigkill", "kill -> every stream handed an event"),
        ("webhooks", "rollout: longest gap"),
    ):
        assert row(measured, bench, metric)["value"] not in ("", None)


def test_each_replica_was_restarted_once_and_came_back(measured: dict[str, Any]) -> None:
    exits = str(row(measured, "rollout", "SIGTERM -> exited")["value"]).split(" / ")
    readies = str(row(measured, "rollout", "start -> ready")["value"]).split(" / ")
    assert len(exits) == len(readies) == 3, (exits, readies)
    assert all(float(s) > 0 for s in [*exits, *readies])
    resumed = float(row(measured, "sigkill", "kill -> every stream")["value"])
    assert resumed > 0


def test_the_checker_finds_every_stream_whole(measured: dict[str, Any]) -> None:
    for category in ("lost", "duplicated", "out_of_order", "other findings"):
        found = row(measured, "checker", category)
        assert found["value"] == 0 and found["status"] == "(PASS)", found
    streams = str(row(measured, "checker", "deliveries judged")["value"])
    judged, finished = streams.split(" / ")[1].rstrip(")").split(" (")
    assert int(finished) == int(judged) > 0, streams

"""bench/bench_replicas.py --small runs to its end, and what it measured holds together.

The size-dependent targets are not checked here (a smoke run on a shared machine); the facts
every size must show are: the replicas divided the load exactly (each indexed its share of
the records), every part of the bench produced its rows, and the clients that resumed after
the SIGKILL got every event in seq order.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.bench import run_small

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BOUND_S = 480  # the small run takes about two minutes on two shared cores


@pytest.fixture(scope="module")
def measured(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("replicas") / "out.json"
    return run_small("bench_replicas.py", kafka_bootstrap, out, BOUND_S)


def rows(data: dict[str, Any], bench: str, metric_part: str) -> list[dict[str, Any]]:
    found = [r for r in data["rows"] if r["bench"] == bench and metric_part in r["metric"]]
    assert found, f"no {bench} row with {metric_part!r}"
    return found


def test_each_replica_indexes_exactly_its_share_of_the_records(measured: dict[str, Any]) -> None:
    (single,) = rows(measured, "divide", "N=1: records indexed")
    assert str(single["value"]).replace(",", "").isdigit()
    divided = rows(measured, "divide", "records indexed per replica")
    assert [r["metric"][:3] for r in divided] == ["N=2", "N=3"]
    for row in divided:
        ratios = re.findall(r"(\d+\.\d+)x?", str(row["value"]).split("(")[1])
        assert ratios and all(float(x) == 1.0 for x in ratios), row["value"]


def test_every_part_of_the_bench_reports(measured: dict[str, Any]) -> None:
    for bench, metric in (
        ("divide", "bytes received from Kafka"),
        ("divide", "VmRSS growth while indexing"),
        ("capacity", "CPU s per million records"),
        ("hop", "tasks/get: forwarded p50 - direct p50"),
        ("hop", "tasks/stream first event: forwarded p50 - direct p50"),
        ("failover", "kill -> first event on a resumed stream"),
        ("tail", "speed-up this tree / before"),
    ):
        for row in rows(measured, bench, metric):
            assert row["value"] not in ("", None), row


def test_resumed_clients_get_every_event_in_order_after_the_kill(
    measured: dict[str, Any],
) -> None:
    (order,) = rows(measured, "failover", "events in seq order")
    assert order["value"] == "yes" and order["status"] == "PASS", order
    (failover,) = rows(measured, "failover", "kill -> first event")
    median, worst = (float(x) for x in str(failover["value"]).split(" / "))
    assert 0 < median <= worst, failover

"""bench/bench_open_questions.py --small runs to its end and what it measured holds together.

The bench only reports (it has no targets); this test reads its JSON and checks the facts the
doc (docs/sep-2694-open-questions.md) builds on: every client of the busy task, slow ones
included, got every event gap-free; each channel delivered every event; a cursor behind
retention gets events_gone with earliestSeq on tasks/stream and ``truncated`` on the Events
extension.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from support.bench import run_small

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BOUND_S = 420  # the small run takes about a minute on two shared cores


@pytest.fixture(scope="module")
def measured(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("openq") / "out.json"
    return run_small("bench_open_questions.py", kafka_bootstrap, out, BOUND_S)


def values(data: dict[str, Any], bench: str, metric_part: str) -> list[str]:
    rows = [r for r in data["rows"] if r["bench"] == bench and metric_part in r["metric"]]
    assert rows, f"no {bench} row with {metric_part!r}"
    return [str(r["value"]) for r in rows]


def test_every_client_of_the_busy_task_slow_ones_included_gets_every_event_gap_free(
    measured: dict[str, Any],
) -> None:
    for value in values(measured, "fanout", "gap-free, result received"):
        found = re.fullmatch(r"(\d+) / (\d+) of (\d+)", value)
        assert found is not None, value
        whole, complete, n = map(int, found.groups())
        assert whole == complete == n, value


def test_slow_clients_fell_back_to_catch_up_reads(measured: dict[str, Any]) -> None:
    for value in values(measured, "fanout", "slow-consumer fallbacks")[1:]:  # N=1 has none
        reads, fallbacks = map(int, value.split(" / "))
        assert fallbacks >= 1 and reads >= fallbacks, value


def test_each_channel_delivers_every_event_of_the_task(measured: dict[str, Any]) -> None:
    for value in values(measured, "cost", "events / requests / other messages"):
        found = re.match(r"(\d+) of (\d+)", value)
        assert found is not None, value
        got, owed = found.groups()
        assert got == owed, value


def test_a_cursor_behind_retention_is_events_gone_on_tasks_stream_and_truncated_on_events(
    measured: dict[str, Any],
) -> None:
    notes = "\n".join(measured["notes"])
    gone = re.search(r"tasks/stream after=10 -> (\{.*\})", notes)
    assert gone is not None, notes
    error = json.loads(gone.group(1))["error"]
    assert error["code"] == -32010
    assert error["data"]["reason"] == "events_gone"
    earliest = error["data"]["earliestSeq"]
    (polled,) = values(measured, "retention", "events/poll cursor=seq 10")
    assert polled.startswith("True, ") and polled.endswith(f".{earliest}")
    (pushed,) = values(measured, "retention", "active truncated flags")
    assert "True" in pushed
    (resumed,) = values(measured, "retention", "after=earliestSeq-1")
    assert resumed.endswith("True"), resumed

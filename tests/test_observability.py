"""Observability as code: the Grafana dashboard and the PrometheusRule, checked for real.

The static tests read grafana/dashboards/mcp-kafka-bridge.json (its shape against Grafana's model
and the project's dashboard rules are tests/test_grafana.py), k8s/base/prometheusrule.yaml and
docs/operations.md, and run promtool (Debian package ``prometheus``) on the rules: ``check rules``
and unit tests that every alert fires on its condition and stays silent on a healthy look-alike.
The live tests start a real bridge (``bridge serve`` + ``bridge workers`` on the test Kafka), a
real Prometheus scraping it every second with the alert rules loaded, put load on the bridge, and
require every panel expression of the dashboard to return data; they also drive the indexer lag
(admin pause/resume) and the retention headroom (deleteRecords) and watch the gauges move.

Without prometheus/promtool the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import secrets
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.layout import fresh_prefix, make_settings
from support.mcp import StreamRead, call, cancel, create_task, read_stream, request, result
from support.procs import free_port, running_bridge
from support.unavailable import unavailable
from support.waits import BOUND, wait_until, wait_until_sync

from bridge.config import Settings
from bridge.kafka.admin import delete_records_before
from bridge.kafka.clients import TopicPartition, idempotent_producer
from bridge.log.publisher import Published, TaskEventPublisher
from bridge.metrics import Metrics
from bridge.vocabulary import EVENTS_GONE

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "grafana" / "dashboards" / "mcp-kafka-bridge.json"
RULES = ROOT / "k8s" / "base" / "prometheusrule.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"

ALERTS = {
    "BridgeIndexerStalled": "critical",
    "BridgeIndexerBehindRetention": "critical",
    "BridgeIndexerLostPartitions": "critical",
    "BridgeStreamSeqGap": "critical",
    "BridgeDeliveryLatencyHigh": "warning",
    "BridgeRetentionHeadroomLow": "warning",
    "BridgePartitionWithoutOwner": "critical",
    "BridgeRebalanceStorm": "warning",
    "BridgeCanaryLost": "warning",
    "BridgeCanaryLatencyHigh": "warning",
    "BridgePartitionUnavailable": "warning",
    "BridgeDataLossNear": "warning",
}
JOB = "mcp-kafka-bridge"
#: Grafana's variables, as concrete values: windows long enough to cover the whole test run.
GRAFANA_VALUES = {"$__rate_interval": "2m", "$__interval": "1m", "$__range": "5m", "$job": ".+"}
#: Poll interval of the waits on Prometheus and the gauges (scraped and evaluated every second).
POLL_S = 0.2


# --- the files -----------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def panel_targets() -> list[tuple[str, str]]:
    """``(panel title, expression)`` of every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def concrete(expr: str) -> str:
    """The expression as Grafana would send it, with the dashboard's variables filled in."""
    for name, value in GRAFANA_VALUES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def rules_spec() -> str:
    """The PrometheusRule's ``spec`` (a Prometheus rules file); ``spec`` is its last key."""
    head, sep, spec = RULES.read_text().partition("\nspec:\n")
    assert sep, "k8s/base/prometheusrule.yaml has no top-level spec"
    assert "apiVersion: monitoring.coreos.com/v1" in head and "kind: PrometheusRule" in head
    return textwrap.dedent(spec)


def without_annotations(rules: str) -> str:
    """The rules with their annotation blocks dropped (promtool unit tests compare labels only;
    the annotations are checked on the rules a live Prometheus loaded)."""
    out, skip_deeper = [], -1
    for line in rules.splitlines():
        indent = len(line) - len(line.lstrip())
        if skip_deeper >= 0 and (indent > skip_deeper or not line.strip()):
            continue
        skip_deeper = indent if line.strip() == "annotations:" else -1
        if skip_deeper < 0:
            out.append(line)
    return "\n".join(out) + "\n"


def exposed_names() -> set[str]:
    """Every sample name a bridge's /metrics can carry (counters with _total, histogram series)."""
    names = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def base_name(sample: str) -> str:
    return re.sub(r"_(bucket|count|sum)$", "", sample)


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a markdown document."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(
            f"{name} not found: install the Debian package `prometheus`, which has promtool "
            "(run `make system-deps`)"
        )
    return path


# --- static checks -------------------------------------------------------------------------


def test_dashboard_and_alerts_use_only_bridge_metrics_and_every_metric_is_shown_and_documented():
    exposed = exposed_names()
    families = {base_name(n).removesuffix("_total") for n in exposed}
    exprs = " ".join(e for _, e in panel_targets())
    used = set(re.findall(r"\bbridge_[a-z_]+", exprs))
    assert used <= exposed, used - exposed
    assert {base_name(n).removesuffix("_total") for n in used} == families
    alert_metrics = set(re.findall(r"\bbridge_[a-z_]+", rules_spec()))
    assert alert_metrics <= exposed, alert_metrics - exposed
    table = OPERATIONS.read_text()
    for name in exposed:
        if not name.endswith(("_count", "_sum")):
            assert f"`{base_name(name)}" in table, f"{name} is not in docs/operations.md"


def test_every_alert_has_for_severity_summary_description_and_a_runbook_section():
    spec = rules_spec()
    blocks = re.split(r"\n\s*- alert: ", spec)[1:]
    found = {}
    doc_anchors = anchors(OPERATIONS.read_text())
    for block in blocks:
        name = block.split("\n", 1)[0].strip()
        severity = re.search(r"severity: (\w+)", block)
        url = re.search(r"runbook_url: (\S+)", block)
        assert severity and url, name
        found[name] = severity[1]
        assert re.search(r"\n\s*for: \d+[smh]\n", block), name
        assert re.search(r"\n\s*summary: \S", block), name
        assert re.search(r"\n\s*description: \S", block), name
        assert url[1].endswith(f"/docs/operations.md#{name.lower()}"), url[1]
        assert name.lower() in doc_anchors, f"no runbook section for {name} in docs/operations.md"
    assert found == ALERTS


def test_alert_rules_pass_promtool_check(tmp_path):
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_spec())
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


def _bridge(**labels: str) -> dict[str, str]:
    """The labels of a series scraped from one bridge process, plus ``labels``."""
    return {"instance": "bridge-0:8080", "job": JOB, **labels}


def _alert(name: str, at: str, *expected: dict[str, str]) -> dict[str, Any]:
    return {
        "eval_time": at,
        "alertname": name,
        "exp_alerts": [{"exp_labels": {**e, "severity": ALERTS[name]}} for e in expected],
    }


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ", ".join(f'{k}="{v}"' for k, v in _bridge(**labels).items())
    return {"series": f"{name}{{{selector}}}", "values": values}


# One promtool unit test per alert: the condition fires (after its `for:`), a healthy
# look-alike on another partition/job does not. Series are sampled every minute.
RULE_TESTS: list[dict[str, Any]] = [
    {  # stalled: lag stuck at 5 records from 2m, its age growing 1 s/s; p1 a busy, working indexer
        "interval": "1m",
        "input_series": [
            _series("bridge_indexer_lag_records", "0 0 5x20", partition="0"),
            _series("bridge_indexer_lag_seconds", "0 0 60+60x20", partition="0"),
            _series("bridge_indexer_lag_records", "0 3 0 2 0 4 0 1 0 2 0 3 0 1 0", partition="1"),
            _series("bridge_indexer_lag_seconds", "0 0.2 0 0.1 0 0.3 0 0.1 0 0.2", partition="1"),
        ],
        "alert_rule_test": [
            _alert("BridgeIndexerStalled", "5m"),
            _alert("BridgeIndexerStalled", "10m", _bridge(partition="0")),
        ],
    },
    {  # behind retention: p0 lag 4000 s vs headroom ~7000 s; p1 a young topic; p2 a long one
        "interval": "1m",
        "input_series": [
            _series("bridge_retention_headroom_seconds", "7000+60x10", partition="0"),
            _series("bridge_indexer_lag_seconds", "0 0 4000+60x8", partition="0"),
            _series("bridge_retention_headroom_seconds", "100+60x10", partition="1"),
            _series("bridge_indexer_lag_seconds", "0.2x10", partition="1"),
            _series("bridge_retention_headroom_seconds", "604800+60x10", partition="2"),
            _series("bridge_indexer_lag_seconds", "0 0 4000+60x8", partition="2"),
        ],
        "alert_rule_test": [
            _alert("BridgeIndexerBehindRetention", "1m"),
            _alert("BridgeIndexerBehindRetention", "5m", _bridge(partition="0")),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            _series("bridge_indexer_lost_partitions", "0 0 1x10"),
            _series("bridge_indexer_lost_partitions", "0x12", instance="bridge-1:8080"),
        ],
        "alert_rule_test": [
            _alert("BridgeIndexerLostPartitions", "2m"),
            _alert("BridgeIndexerLostPartitions", "4m", _bridge()),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            _series("bridge_stream_seq_gaps_total", "0 0 1x10"),
            _series("bridge_stream_seq_gaps_total", "0x12", instance="bridge-1:8080"),
        ],
        "alert_rule_test": [
            _alert("BridgeStreamSeqGap", "2m"),
            _alert("BridgeStreamSeqGap", "4m", _bridge()),
        ],
    },
    {  # every live delivery of job "slow" takes 1-2.5 s; job "fast" stays under 0.5 s
        "interval": "1m",
        "input_series": [
            *[
                _series("bridge_stream_delivery_latency_seconds_bucket", v, job="slow", le=le)
                for le, v in (
                    ("0.5", "0x20"),
                    ("1", "0x20"),
                    ("2.5", "0+10x20"),
                    ("+Inf", "0+10x20"),
                )
            ],
            *[
                _series(
                    "bridge_stream_delivery_latency_seconds_bucket", "0+10x20", job="fast", le=le
                )
                for le in ("0.5", "1", "2.5", "+Inf")
            ],
        ],
        "alert_rule_test": [
            _alert("BridgeDeliveryLatencyHigh", "5m"),
            _alert("BridgeDeliveryLatencyHigh", "12m", {"job": "slow"}),
        ],
    },
    {  # p0: records deleted at 2m, oldest retained 1000 s old (two replicas report it);
        # p1: a young topic, nothing deleted yet; p2: an empty partition (headroom 0)
        "interval": "1m",
        "input_series": [
            *[
                s
                for instance in ("bridge-0:8080", "bridge-1:8080")
                for s in (
                    _series(
                        "bridge_retention_headroom_seconds",
                        "1000+60x20",
                        partition="0",
                        instance=instance,
                    ),
                    _series(
                        "bridge_log_start_offset", "0 0 50x20", partition="0", instance=instance
                    ),
                    _series("bridge_log_end_offset", "100+10x20", partition="0", instance=instance),
                )
            ],
            _series("bridge_retention_headroom_seconds", "100+60x20", partition="1"),
            _series("bridge_log_start_offset", "0x22", partition="1"),
            _series("bridge_log_end_offset", "100+10x20", partition="1"),
            _series("bridge_retention_headroom_seconds", "0x22", partition="2"),
            _series("bridge_log_start_offset", "100x22", partition="2"),
            _series("bridge_log_end_offset", "100x22", partition="2"),
        ],
        "alert_rule_test": [
            _alert("BridgeRetentionHeadroomLow", "10m"),
            _alert("BridgeRetentionHeadroomLow", "18m", {"job": JOB, "partition": "0"}),
        ],
    },
]


def _replicas(job: str, events: str, owned: dict[str, str]) -> list[dict[str, str]]:
    """The ownership gauges of a job's replicas: ``owned`` by instance; every replica reports
    the events topic's partition count ``events`` while it is scraped."""
    return [
        s
        for instance, values in owned.items()
        for s in (
            _series("bridge_owned_partitions", values, job=job, instance=instance),
            _series("bridge_events_partitions", events, job=job, instance=instance),
        )
    ]


def _rebalances(job: str, values: str, *instances: str) -> list[dict[str, str]]:
    return [
        _series("bridge_rebalances_total", values, job=job, instance=instance)
        for instance in instances
    ]


# The ownership alerts, by deployment (job): the condition fires, a healthy look-alike does not.
OWNERSHIP_RULE_TESTS: list[dict[str, Any]] = [
    {  # "lost": 6 partitions, from 2m the two replicas own 5 together (one partition orphaned);
        # "failover": bridge-1 is killed at 2m (its series go stale), bridge-0 owns all 6 from
        # 3m; "all": two processes with ownership "all", each owning every partition
        "interval": "1m",
        "input_series": [
            *_replicas("lost", "6x12", {"bridge-0:8080": "3x12", "bridge-1:8080": "3 3 2x10"}),
            *_replicas("failover", "6 6 6 6x9", {"bridge-0:8080": "3 3 3 6x9"}),
            *_replicas("failover", "6 6 stale", {"bridge-1:8080": "3 3 stale"}),
            *_replicas("all", "6x12", {"bridge-0:8080": "6x12", "bridge-1:8080": "6x12"}),
        ],
        "alert_rule_test": [
            _alert("BridgePartitionWithoutOwner", "3m"),
            _alert("BridgePartitionWithoutOwner", "5m", {"job": "lost"}),
            _alert("BridgePartitionWithoutOwner", "10m", {"job": "lost"}),
        ],
    },
    {  # every replica counts each rebalance of its group. "storm": one a minute; "steady": one
        # every 5 minutes, for ever (2 per 10 minutes); "burst": a scale-out and a crashed pod's
        # return (3 rebalances in 5 minutes), then quiet
        "interval": "1m",
        "input_series": [
            *_rebalances("storm", "0+1x40", "bridge-0:8080", "bridge-1:8080"),
            *_rebalances("steady", "0+0.2x40", "bridge-0:8080", "bridge-1:8080"),
            *_rebalances("burst", "0 0 1 1 2 3 3x35", "bridge-0:8080", "bridge-1:8080"),
        ],
        "alert_rule_test": [
            _alert("BridgeRebalanceStorm", "8m"),
            _alert("BridgeRebalanceStorm", "25m", {"job": "storm"}),
            _alert("BridgeRebalanceStorm", "40m", {"job": "storm"}),
        ],
    },
]


# The canary's alerts: losses and slow probes fire, a clean look-alike does not.
CANARY_RULE_TESTS: list[dict[str, Any]] = [
    {  # p0 loses one probe at 3m (and its owner is later bridge-1: the sum spans instances);
        # p1 and p2 lose none
        "interval": "1m",
        "input_series": [
            _series("bridge_canary_lost_total", "0 0 0 1 1 1 stale", partition="0"),
            _series(
                "bridge_canary_lost_total",
                "stale stale stale stale stale stale 0x20",
                partition="0",
                instance="bridge-1:8080",
            ),
            _series("bridge_canary_lost_total", "0x20", partition="1"),
            _series("bridge_canary_lost_total", "0x20", partition="2", instance="bridge-1:8080"),
        ],
        "alert_rule_test": [
            _alert("BridgeCanaryLost", "5m"),
            _alert("BridgeCanaryLost", "9m", {"job": JOB, "partition": "0"}),
            _alert("BridgeCanaryLost", "20m"),
        ],
    },
    {  # every probe of job "slow" takes 1-2.5 s; job "fast" stays under 0.5 s
        "interval": "1m",
        "input_series": [
            *[
                _series("bridge_canary_latency_seconds_bucket", v, job="slow", le=le)
                for le, v in (
                    ("0.5", "0x20"),
                    ("1", "0x20"),
                    ("2.5", "0+6x20"),
                    ("+Inf", "0+6x20"),
                )
            ],
            *[
                _series("bridge_canary_latency_seconds_bucket", "0+6x20", job="fast", le=le)
                for le in ("0.5", "1", "2.5", "+Inf")
            ],
        ],
        "alert_rule_test": [
            _alert("BridgeCanaryLatencyHigh", "5m"),
            _alert("BridgeCanaryLatencyHigh", "13m", {"job": "slow"}),
        ],
    },
]


# The rollout alerts: a partition unserved again and again, and a stream close to retention's
# cut, fire; a single fail-over and a stream far from the cut (or a young topic) do not.
ROLLOUT_RULE_TESTS: list[dict[str, Any]] = [
    {  # p0: unserved 20 s of every minute (flapping); p1: one 40 s fail-over at 2m, then
        # served; p2: never unserved. bridge-1 saw p0 served (it owned it).
        "interval": "1m",
        "input_series": [
            _series("bridge_partition_unavailable_seconds_total", "0+20x20", partition="0"),
            _series(
                "bridge_partition_unavailable_seconds_total",
                "0x20",
                partition="0",
                instance="bridge-1:8080",
            ),
            _series("bridge_partition_unavailable_seconds_total", "0 0 40x18", partition="1"),
            _series("bridge_partition_unavailable_seconds_total", "0x20", partition="2"),
        ],
        "alert_rule_test": [
            _alert("BridgePartitionUnavailable", "3m"),
            _alert("BridgePartitionUnavailable", "6m", {"job": JOB, "partition": "0"}),
            _alert("BridgePartitionUnavailable", "15m", {"job": JOB, "partition": "0"}),
        ],
    },
    {  # p0: a stream 300 s behind the log start's record time, retention deleting; p1: no
        # stream behind (the distance is the whole retained span, 200 s: a short retention);
        # p2: a stream just as close, but nothing ever deleted (a young topic)
        "interval": "1m",
        "input_series": [
            _series("bridge_data_loss_distance_seconds", "300x20", partition="0"),
            _series("bridge_data_loss_distance_records", "50x20", partition="0"),
            _series("bridge_log_start_offset", "100x20", partition="0"),
            _series("bridge_log_end_offset", "1000x20", partition="0"),
            _series("bridge_data_loss_distance_seconds", "200x20", partition="1"),
            _series("bridge_data_loss_distance_records", "900x20", partition="1"),
            _series("bridge_log_start_offset", "100x20", partition="1"),
            _series("bridge_log_end_offset", "1000x20", partition="1"),
            _series("bridge_data_loss_distance_seconds", "300x20", partition="2"),
            _series("bridge_data_loss_distance_records", "50x20", partition="2"),
            _series("bridge_log_start_offset", "0x20", partition="2"),
            _series("bridge_log_end_offset", "1000x20", partition="2"),
        ],
        "alert_rule_test": [
            _alert("BridgeDataLossNear", "3m"),
            _alert("BridgeDataLossNear", "7m", {"job": JOB, "partition": "0"}),
        ],
    },
]


def test_every_alert_fires_on_its_condition_and_not_on_a_healthy_look_alike(tmp_path):
    promtool = require_tool("promtool")
    (tmp_path / "rules.yaml").write_text(without_annotations(rules_spec()))
    rule_tests = RULE_TESTS + OWNERSHIP_RULE_TESTS + CANARY_RULE_TESTS + ROLLOUT_RULE_TESTS
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": rule_tests}
    (tmp_path / "tests.yaml").write_text(json.dumps(tests, indent=1))  # JSON is YAML
    tested = [x["alertname"] for t in rule_tests for x in t["alert_rule_test"]]
    assert set(tested) == set(ALERTS)
    ran = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


# --- a live bridge and Prometheus ----------------------------------------------------------


@dataclass
class Observed:
    """A running bridge, and a Prometheus that scrapes it every second."""

    settings: Settings
    base: str  # the bridge, http://127.0.0.1:<port>
    url: str  # its MCP endpoint
    prometheus: str  # http://127.0.0.1:<port>


@contextlib.contextmanager
def running_prometheus(workdir: Path, target_port: int) -> Iterator[str]:
    """A real Prometheus with the PrometheusRule's rules, scraping one bridge every second."""
    binary = require_tool("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "rules.yaml").write_text(rules_spec())
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(workdir / "rules.yaml")],
        "scrape_configs": [
            {"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, f"prometheus exited:\n{log_path.read_text()[-3000:]}"
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{base}/-/ready", timeout=2).status_code == 200
        return False

    try:
        wait_until_sync(ready, 30, what="prometheus is ready")
        yield base
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("prometheus did not stop on SIGTERM within 30 s") from None
        assert code == 0, f"prometheus exited with {code}:\n{log_path.read_text()[-3000:]}"


@pytest.fixture(scope="module")
def observed(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    require_tool("prometheus")
    # Large events let a client that stops reading fill the socket buffers (MBs) quickly.
    settings = make_settings(
        kafka_bootstrap, fresh_prefix("o"), tasks={"max_event_bytes": 256 * 1024}
    )
    env = {
        "BRIDGE_SERVER__ADMIN_ENDPOINTS": "true",
        "BRIDGE_SERVER__METRICS_REFRESH_S": "1",
        "BRIDGE_STREAMS__QUEUE_SIZE": "8",  # a small queue: a client that stops reading overflows it
        "BRIDGE_STREAMS__KEEPALIVE_S": "1",
        "BRIDGE_CANARY__INTERVAL_S": "1",  # the canary's panels need its probes
    }
    work = tmp_path_factory.mktemp("observability")
    with (
        running_bridge(settings, work, **env) as bridge,
        running_prometheus(work / "prometheus", bridge.port) as prometheus,
    ):
        base = f"http://127.0.0.1:{bridge.port}"
        running = Observed(settings, base, bridge.url, prometheus)
        up = f'up{{job="{JOB}"}} == 1'
        wait_until_sync(
            lambda: query_sync(prometheus, up), what="Prometheus scrapes the bridge", poll_s=POLL_S
        )
        yield running


def query_sync(prometheus: str, expr: str) -> list[dict[str, Any]]:
    reply = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = reply.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


async def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(f"{prometheus}/api/v1/query", params={"query": expr})
    body = reply.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def has_finite(series: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in series)


#: Histograms that time an event this test's single bridge never has (a hand-over between
#: replicas; a gain in a rebalance): their quantiles are NaN until one happens, as Grafana's
#: "No data". For these the panel must still answer with the series (the query is valid and
#: the histogram is exported from the start); tests/test_handover.py observes them.
EVENT_TIMED = ("bridge_partition_handover_seconds_bucket", "bridge_partition_gain_seconds_bucket")


def answers(expr: str, series: list[dict[str, Any]]) -> bool:
    """A panel target has data: a finite value, or for an event-timed histogram its series."""
    if any(name in expr for name in EVENT_TIMED):
        return bool(series)
    return has_finite(series)


async def scrape(obs: Observed) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The bridge's /metrics as ``{(sample name, sorted labels): value}``."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{obs.base}/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def gauge(obs: Observed, name: str, **labels: str) -> float:
    return (await scrape(obs))[(name, tuple(sorted(labels.items())))]


# --- driving the bridge --------------------------------------------------------------------


async def new_task(obs: Observed, seconds: float = 120, label: str = "obs") -> str:
    async with httpx.AsyncClient(timeout=BOUND) as http:
        return await create_task(
            http, obs.url, "slow_compute", {"seconds": seconds, "label": label}
        )


async def publish(obs: Observed, task_id: str, n: int, blob: str = "") -> list[Published]:
    async with TaskEventPublisher(obs.settings) as pub:
        return [
            await pub.publish(task_id, "com.example.obs", {"i": i, "blob": blob}) for i in range(n)
        ]


async def wait_indexed(obs: Observed, where: Published) -> None:
    """Until a refresh of the gauges shows the partition indexed past ``where``."""
    p = str(where.partition)

    async def indexed() -> bool:
        m = await scrape(obs)
        end = m[("bridge_log_end_offset", (("partition", p),))]
        return end > where.offset and m[("bridge_indexer_lag_records", (("partition", p),))] == 0

    await wait_until(
        indexed, what=f"partition {p} is indexed past offset {where.offset}", poll_s=POLL_S
    )


async def delete_records(obs: Observed, where: Published) -> None:
    """deleteRecords: the log start of ``where``'s partition moves to ``where.offset``."""
    tp = TopicPartition(obs.settings.topics.events, where.partition)
    await delete_records_before(obs.settings, tp, where.offset)


async def live_stream_and_resume(obs: Observed) -> None:
    """A fresh stream that receives live events, then a resume of the same task."""
    task = await new_task(obs)
    live = StreamRead()
    reader = asyncio.create_task(read_stream(obs.url, task, into=live))
    async with asyncio.timeout(BOUND):
        await wait_until(lambda: live.events, what="the live stream's first event")
        await publish(obs, task, 30)
        await cancel(obs.url, task)
        await reader
    assert live.seqs == list(range(len(live.seqs))) and len(live.seqs) >= 32
    assert live.result is not None
    resumed = await read_stream(obs.url, task, after=3)
    assert resumed.seqs == live.seqs[4:]


async def slow_consumer(obs: Observed) -> None:
    """A stream whose client never reads: its queue overflows and it falls back to catch-up."""
    task = await new_task(obs)
    headers, body = request("tasks/stream", {"taskId": task})
    payload = json.dumps(body).encode()
    port = int(obs.base.rsplit(":", 1)[1])
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n{head}\r\n"
    ).encode() + payload
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few events
    sock.setblocking(False)
    key = ("bridge_stream_slow_consumer_fallbacks_total", ())
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, raw)
        before = (await scrape(obs))[key]
        blob = "x" * 64_000
        async with asyncio.timeout(BOUND):
            for _ in range(40):  # up to 400 events of 64 kB
                await publish(obs, task, 10, blob)
                if (await scrape(obs))[key] > before:
                    break
        assert (await scrape(obs))[key] > before, "no slow-consumer fallback"
    finally:
        sock.close()
    await cancel(obs.url, task)


async def gone_open(obs: Observed) -> None:
    """A resume with a cursor older than the log start: events_gone, counted as mode=gone."""
    task = await new_task(obs)
    published = await publish(obs, task, 6)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        # a client that looked at its task, went away, and comes back with a cursor that
        # retention (here: deleteRecords) has since passed
        await result(http, obs.url, "tasks/get", {"taskId": task})
        await wait_indexed(obs, published[-1])
        await delete_records(obs, published[-1])
        gone = await call(http, obs.url, "tasks/stream", {"taskId": task, "after": 0})
    assert gone["error"]["code"] == EVENTS_GONE, gone
    await cancel(obs.url, task)


async def put_load(obs: Observed) -> None:
    await new_task(obs, seconds=0, label="quick")  # completes on its own
    await live_stream_and_resume(obs)
    await slow_consumer(obs)
    await gone_open(obs)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        await call(http, obs.url, "tasks/get", {"taskId": "no-such-task"})  # an error code


# --- live tests ----------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
async def test_every_dashboard_panel_returns_data_from_a_bridge_under_load(observed):
    await put_load(observed)
    pending = {concrete(e): t for t, e in panel_targets()}
    last: dict[str, list[dict[str, Any]]] = {}

    async def all_have_data() -> bool:
        for expr in list(pending):
            last[expr] = await query(observed.prometheus, expr)
            if answers(expr, last[expr]):
                del pending[expr]
        return not pending

    with contextlib.suppress(AssertionError):
        await wait_until(all_have_data, 30, what="every panel has data", poll_s=POLL_S)
    assert not pending, "\n".join(f"{t}: {e} -> {last.get(e)}" for e, t in pending.items())
    opens = await query(observed.prometheus, "sum by (mode) (bridge_stream_opens_total)")
    assert {s["metric"]["mode"] for s in opens} == {"fresh", "resume", "gone"}
    async with httpx.AsyncClient(timeout=10) as http:  # the $job variable's values
        reply = await http.get(
            f"{observed.prometheus}/api/v1/label/job/values",
            params={"match[]": "bridge_streams_active"},
        )
    assert reply.json()["data"] == [JOB]


@pytest.mark.kafka
@pytest.mark.slow
async def test_indexer_lag_rises_while_paused_and_returns_to_zero_on_resume(observed):
    task = await new_task(observed)
    first = (await publish(observed, task, 1))[0]
    await wait_indexed(observed, first)
    p = str(first.partition)
    async with httpx.AsyncClient(timeout=10) as http:
        paused = await http.post(f"{observed.base}/admin/indexer/pause")
        assert paused.json() == {"indexer": "pause"}
        try:
            await publish(observed, task, 20)
            seen: list[float] = []

            async def lag_rises() -> bool:
                records = await gauge(observed, "bridge_indexer_lag_records", partition=p)
                seconds = await gauge(observed, "bridge_indexer_lag_seconds", partition=p)
                seen.append(seconds)
                return records >= 20 and seconds > 0 and seconds > seen[0] + 1

            await wait_until(lag_rises, what=f"the lag of partition {p} rises", poll_s=POLL_S)
            in_prometheus = f'bridge_indexer_lag_records{{partition="{p}"}} >= 20'
            await wait_until(
                lambda: _nonempty(observed, in_prometheus),
                what="Prometheus sees the lag",
                poll_s=POLL_S,
            )
        finally:
            resumed = await http.post(f"{observed.base}/admin/indexer/resume")
        assert resumed.json() == {"indexer": "resume"}

    async def caught_up() -> bool:
        m = await scrape(observed)
        lags = [v for (n, _), v in m.items() if n.startswith("bridge_indexer_lag_")]
        return bool(lags) and all(v == 0 for v in lags)

    await wait_until(caught_up, what="every lag gauge is back to 0", poll_s=POLL_S)
    await cancel(observed.url, task)


async def _nonempty(obs: Observed, expr: str) -> bool:
    return bool(await query(obs.prometheus, expr))


@pytest.mark.kafka
@pytest.mark.slow
async def test_retention_headroom_drops_when_records_are_deleted(observed):
    settings = observed.settings
    task = f"headroom-probe-{secrets.token_hex(4)}"  # any key: only the partition matters here
    # A record written "two hours ago" (Kafka CreateTime) becomes the oldest retained one.
    value, headers = TaskEventPublisher(settings).encode("com.example.old", {"old": True})
    producer = idempotent_producer(settings, role="test-old-record")
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            settings.topics.events,
            key=task.encode(),
            value=value,
            headers=headers,
            timestamp_ms=int((time.time() - 7200) * 1000),
        )
    finally:
        await producer.stop()
    old = Published(sent.partition, sent.offset)
    p = str(old.partition)
    await wait_indexed(observed, old)
    await delete_records(observed, old)

    async def headroom_is(low: float, high: float, start: int) -> bool:
        m = await scrape(observed)
        headroom = m[("bridge_retention_headroom_seconds", (("partition", p),))]
        return m[("bridge_log_start_offset", (("partition", p),))] == start and (
            low <= headroom <= high
        )

    await wait_until(
        lambda: headroom_is(7000, 7400, old.offset), what="headroom is two hours", poll_s=POLL_S
    )
    fresh = (await publish(observed, task, 1))[0]
    await wait_indexed(observed, fresh)
    await delete_records(observed, fresh)
    await wait_until(
        lambda: headroom_is(0, 60, fresh.offset), what="headroom drops to seconds", poll_s=POLL_S
    )
    # the alert sees it too: records were deleted and the oldest retained event is seconds old
    pending = (
        f'ALERTS{{alertname="BridgeRetentionHeadroomLow", partition="{p}", alertstate="pending"}}'
    )
    await wait_until(
        lambda: _nonempty(observed, pending),
        what="BridgeRetentionHeadroomLow is pending",
        poll_s=POLL_S,
    )


@pytest.mark.kafka
@pytest.mark.slow
async def test_alert_rules_load_into_prometheus_evaluate_cleanly_and_canaries_stay_silent(
    observed,
):
    rules: list[dict[str, Any]] = []

    async def evaluated() -> bool:
        async with httpx.AsyncClient(timeout=10) as http:
            groups = (await http.get(f"{observed.prometheus}/api/v1/rules")).json()["data"]
        rules[:] = [r for g in groups["groups"] for r in g["rules"]]
        return bool(rules) and all(r["health"] == "ok" for r in rules)

    await wait_until(evaluated, 30, what="every rule was evaluated without error", poll_s=POLL_S)
    assert {r["name"]: r["labels"]["severity"] for r in rules} == ALERTS
    doc_anchors = anchors(OPERATIONS.read_text())
    for rule in rules:
        assert rule["duration"] > 0, rule["name"]
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], rule["name"]
        assert notes["runbook_url"].rsplit("#", 1)[1] in doc_anchors, rule["name"]
    firing = await query(observed.prometheus, "ALERTS")
    names = {s["metric"]["alertname"] for s in firing}
    assert not names & {"BridgeStreamSeqGap", "BridgeIndexerLostPartitions"}, firing
    assert await gauge(observed, "bridge_stream_seq_gaps_total") == 0
    assert await gauge(observed, "bridge_indexer_lost_partitions") == 0

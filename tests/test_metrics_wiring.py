"""Metrics are wired once, at composition: the dashboard's metrics are registered exactly once,
in the registry ``/metrics`` serves, and they keep counting with the end-to-end canary on.

A bridge built as production builds it (:func:`~bridge.server.app.create_app` under uvicorn,
the canary on) on the shared broker. The canary's streams run in a hub of their own: before
metrics were wired at composition, that hub's constructor rewired the shared reader's reports
to a throwaway ``Metrics()``, so the shared scans, the reads leaving them and the log-start
lookups stopped counting, and so did the canary's own seq-gap counter.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from support.imports import bridge_modules
from support.layout import fresh_prefix, make_settings, merged
from support.served import Served, serving
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.kafka.clients import partition_for_key
from bridge.log.reader import Reader, ReadEvent

pytestmark = pytest.mark.kafka

DASHBOARD = Path(__file__).resolve().parents[1] / "grafana/dashboards/mcp-kafka-bridge.json"
#: The three series the canary used to silence.
SCANS = "bridge_stream_catchup_scan_reads"
DETACHED = "bridge_stream_catchup_detached_total"
LOOKUPS = "bridge_reader_log_start_lookups_total"
GAPS = "bridge_stream_seq_gaps_total"
#: The clients' own stream series, which the canary's streams must leave alone.
CLIENT_SERIES = (
    "bridge_stream_opens_total",
    "bridge_stream_catchup_reads_total",
    "bridge_stream_events_delivered_total",
)
ROUNDS = 12  # events per task of the load
TASKS = 6


def canary_on(kafka_bootstrap: str, **overrides: Any) -> Settings:
    values = merged({"canary": {"interval_s": 0.2, "timeout_s": 2.0}}, overrides)
    return make_settings(kafka_bootstrap, fresh_prefix("mw"), **values)


def dashboard_metrics() -> set[str]:
    """Every ``bridge_`` sample name the dashboard's panels query (a committed, trusted file)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = " ".join(
        t["expr"] for p in board["panels"] if p["type"] != "row" for t in p.get("targets", ())
    )
    return set(re.findall(r"\bbridge_[a-z_]+", exprs))


def sample_names(collector: Collector) -> set[str]:
    """The sample names a registered collector exposes (its series need not exist yet)."""
    names: set[str] = set()
    for family in collector.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


async def scrape(served: Served) -> list[Any]:
    """The samples ``/metrics`` serves now."""
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(f"{served.base}/metrics")
    reply.raise_for_status()
    return [s for f in text_string_to_metric_families(reply.text) for s in f.samples]


def total(samples: list[Any], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def shared_scans(samples: list[Any]) -> float:
    """Scans that served two reads or more (the histogram's count above its ``le=1`` bucket)."""
    return total(samples, f"{SCANS}_count") - total(samples, f"{SCANS}_bucket", le="1.0")


async def probes_delivered(served: Served) -> float:
    samples = await scrape(served)
    return total(samples, "bridge_canary_latency_seconds_count")


def same_partition(partitions: int) -> list[str]:
    """TASKS task ids whose records share one events partition."""
    ids = [f"mw-load-{i}" for i in range(64 * TASKS)]
    first = partition_for_key(ids[0].encode(), partitions)
    return [t for t in ids if partition_for_key(t.encode(), partitions) == first][:TASKS]


async def publish_interleaved(served: Served, tasks: list[str]) -> None:
    """ROUNDS events of every task, round-robin, indexed before this returns."""
    publisher = served.components.service.publisher
    for i in range(ROUNDS):
        sent = await asyncio.gather(
            *(publisher.publish(t, "com.example.e", {"i": i}) for t in tasks)
        )
    async with asyncio.timeout(BOUND):
        await served.components.indexer.wait_indexed(sent[0].partition, max(s.offset for s in sent))


async def read_all(reader: Reader, task: str) -> int:
    return sum([len(batch) async for batch in reader.read_batches(task)])


@pytest.fixture
async def served(kafka_bootstrap: str) -> AsyncIterator[Served]:
    # Canary tasks replaced every second: new canary streams keep reading while the test runs.
    async with serving(canary_on(kafka_bootstrap, canary={"task_ttl_s": 2})) as running:
        assert running.components.canary is not None
        await wait_until(lambda: probes_delivered(running), what="a canary probe delivered")
        yield running


# --- registered once -------------------------------------------------------------------------


@pytest.fixture
def registrations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, Collector]]]:
    """Every ``(registry, collector)`` registration made while the test runs."""
    made: list[tuple[Any, Collector]] = []
    register = CollectorRegistry.register

    def recording(registry: CollectorRegistry, collector: Collector) -> None:
        made.append((registry, collector))
        register(registry, collector)

    monkeypatch.setattr(CollectorRegistry, "register", recording)
    yield made


async def test_every_dashboard_metric_is_registered_once_in_the_registry_metrics_serves(
    kafka_bootstrap: str, registrations: list[tuple[Any, Collector]]
) -> None:
    wanted = dashboard_metrics()
    assert {SCANS + "_count", DETACHED, LOOKUPS, GAPS} <= wanted  # the parse found them
    async with serving(canary_on(kafka_bootstrap)) as served:
        assert served.components.canary is not None  # built, as production builds it
        registry = served.components.metrics.registry
        where = {name: [r for r, c in registrations if name in sample_names(c)] for name in wanted}
        twice = {name: len(found) for name, found in where.items() if len(found) != 1}
        assert not twice, f"registered other than once: {twice}"
        elsewhere = sorted(name for name, found in where.items() if found[0] is not registry)
        assert not elsewhere, f"registered outside the registry /metrics serves: {elsewhere}"
        async with httpx.AsyncClient(timeout=10) as http:
            text = (await http.get(f"{served.base}/metrics")).text
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    suffixes = ("", "_bucket", "_count", "_sum")
    unserved = sorted(n for n in wanted if not any(n.removesuffix(s) in typed for s in suffixes))
    assert not unserved, f"not served by /metrics: {unserved}"


def test_only_the_composition_makes_metrics_and_wires_the_reader_and_the_stream_hubs() -> None:
    # A Metrics() built anywhere else is a registry nobody scrapes (the canary's was); the
    # reader's reports and each hub's are given to their constructors, by the composition.
    made: dict[str, int] = {}
    for name, path in bridge_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                callee = node.func
                called = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", "")
                wires = called == "Reader" and any(
                    k.arg and k.arg.startswith("on_") for k in node.keywords
                )
                if called in ("Metrics", "StreamHub") or wires:
                    key = f"{name}: {called}"
                    made[key] = made.get(key, 0) + 1
    app = "bridge.server.app"
    assert made == {f"{app}: Metrics": 1, f"{app}: Reader": 1, f"{app}: StreamHub": 2}, made


# --- counting with the canary on --------------------------------------------------------------


async def test_shared_scans_detached_reads_and_log_start_lookups_count_with_the_canary_on(
    served: Served,
) -> None:
    tasks = same_partition(served.settings.topics.partitions)
    await publish_interleaved(served, tasks)
    before = await scrape(served)
    reader = served.components.reader
    # Small fetches and a small buffer: a scan takes several fetches, so a read that stops
    # reading falls behind it and leaves it.
    reader.chunk = 10
    reader.catchup.member_limit = 2
    slow = reader.read_batches(tasks[0])
    try:
        async with asyncio.timeout(BOUND):
            await anext(slow)  # one batch, then it stops reading
            # Started in one loop tick: one scan serves them all.
            counts = await asyncio.gather(*(read_all(reader, t) for t in tasks[1:]))
        assert counts == [ROUNDS] * (TASKS - 1)

        seen: dict[str, float] = {}

        async def moved() -> list[Any] | None:
            now = await scrape(served)
            seen["shared scans"] = shared_scans(now) - shared_scans(before)
            seen[DETACHED] = total(now, DETACHED) - total(before, DETACHED)
            seen[LOOKUPS] = total(now, LOOKUPS) - total(before, LOOKUPS)
            return now if all(v > 0 for v in seen.values()) else None

        after = await wait_until(moved, what=lambda: f"each of these moved: {seen}")
    finally:
        await slow.aclose()
    # The canary's streams are not clients: the clients' stream series hold none of them.
    for name in CLIENT_SERIES:
        assert total(after, name) == 0, name


async def test_a_seq_gap_in_the_canary_s_stream_counts_in_the_served_registry(
    served: Served,
) -> None:
    canary = served.components.canary
    assert canary is not None
    closed = asyncio.Event()
    served_gaps = total(await scrape(served), GAPS)
    assert served_gaps == 0

    class GappyReader:
        """The canary hub's reader, whose next catch-up read skips seq 1 (once)."""

        def __init__(self, real: Reader) -> None:
            self.real = real

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        async def read_batches(self, task_id: str, *args: Any, **kwargs: Any) -> Any:
            canary.hub.reader = self.real  # once
            try:
                async for batch in self.real.read_batches(task_id, *args, **kwargs):
                    event = batch[0]
                    gap = [ReadEvent(0, event.offset, event.event)]
                    gap.append(ReadEvent(2, event.offset, event.event))
                    yield gap
                    return
            finally:
                closed.set()  # the stream has taken the batch and stopped reading

    canary.hub.reader = GappyReader(canary.hub.reader)  # type: ignore[assignment]
    # The next canary task (one is replaced every second, canary_task_ttl_s) opens a stream,
    # whose first catch-up read meets the gap.
    async with asyncio.timeout(BOUND):
        await closed.wait()
    assert total(await scrape(served), GAPS) == 1

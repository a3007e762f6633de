"""Benchmarks of serving replicas that divide the events partitions (``replicas.ownership = group``).

Run::

    .venv/bin/python bench/bench_replicas.py            # full size, ~4-5 minutes here
    .venv/bin/python bench/bench_replicas.py --small    # smoke run, ~2 minutes
    .venv/bin/python bench/bench_replicas.py --only divide --only hop --json out.json

The broker comes from ``bridgedev.kafka.provide_broker`` (the configured cluster, else Docker,
else a throwaway local KRaft broker). Every cluster runs on fresh topics
(``bench-replicas-<N>-<8 hex>.*``) whose events topic has **six partitions**; each replica is
a ``bridge serve`` subprocess with ``BRIDGE_REPLICAS__OWNERSHIP=group``, its own instance id and
advertised URL, one shared peer secret, and auth mode none (every task is the principal
``anonymous``'s). Tasks are created by publishing their ``task.created`` directly; no worker
runs. All traffic is loopback.

What is measured (see docs/benchmarks-replicas.md):

1. ``divide``   - with N = 1, 2, 3 replicas and the same load (the same tasks, as many in each
   partition, each ``task.created``, ticks and ``completed``, produced at once after the
   partitions are divided): per replica, the records indexed, the bytes received from Kafka
   (``ss`` ``bytes_received`` of its sockets to the broker; ``bytes_acked`` of what it wrote
   beside it) and the index memory: the VmRSS growth while indexing, and the tasks it holds
   times the per-task cost fitted over all runs (growth = fixed + cost x tasks), each against
   1/N of the single replica's. Target: within 15%.
2. ``capacity`` - from the same runs: CPU seconds (``/proc/<pid>/stat`` utime + stime, less the
   replica's idle rate) per million records indexed, per replica, against N; and the wall
   time to index the load on this machine (informational).
3. ``hop``      - on the three-replica cluster: ``tasks/get`` and the time to the first event
   of a ``tasks/stream``, asked of the task's owner (direct) and of a replica that does not own
   it (forwarded in one signed hop), alternately. Target: forwarded adds <= 2 ms at p50.
4. ``failover`` - SIGKILL of the replica owning some live tasks while clients stream them (one
   client on the victim, one through another replica); each client resumes with its cursor on
   a survivor. The time from the kill to the first event a resumed stream delivers.
   Target: <= the group session timeout + 2 s (the timeout is reported).
5. ``tail``     - the single-process indexer catch-up (``bench/bench_log.py --only resume``)
   before the cheap tail (commit ``TAIL_BEFORE``, from ``git archive``) and in this tree,
   alternately. Target: >= 2x.

A MISS is reported, never raised; every wait is bounded and names what it waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from bench_streams import (
    TICK_TYPE,
    BridgeProcess,
    broker_ports,
    bytes_delta,
    created_record,
    free_port,
    kafka_socket_bytes,
    mcp_body,
    mcp_headers,
    open_stream,
    pct,
    rss_kib,
    tasks_get,
)
from common import (
    REPO,
    Record,
    Results,
    environment,
    produce_partitioned,
    report,
    say,
    verdict,
)

from bridge.config import Settings, load_settings
from bridge.kafka.clients import partition_for_key
from bridge.kafka.topics import create_layout
from bridge.log.publisher import TaskEventPublisher
from bridge.tasks.messages import new_task_id
from bridgedev.kafka import provide_broker

# --- targets ------------------------------------------------------------------------------------

TARGET_SHARE_TOLERANCE = 0.15  # per-replica value / (single replica's / N), either way
TARGET_HOP_ADDED_MS = 1.0  # forwarded p50 - direct p50 (issue 30: a lean hop)
TARGET_HOP_CPU_RATIO = 2.0  # CPU of all replicas per forwarded tasks/get / per direct one
TARGET_FAILOVER_SLACK_S = 2.0  # failover <= session timeout + this
TARGET_TAIL_SPEEDUP = 2.0

PARTITIONS = 6
REPLICA_COUNTS = (1, 2, 3)
SESSION_TIMEOUT_MS = 6000
#: The commit before the cheap tail (docs/benchmarks.md, "A cheaper tail").
TAIL_BEFORE = "bd2d047"
#: A resuming client's pause before it reconnects (its retry policy).
RECONNECT_BACKOFF_S = 0.2
#: Poll interval of bounded waits on a replica's /metrics (nothing signals them).
POLL_S = 0.25


@dataclass(frozen=True)
class Sizes:
    tasks: int  # tasks of the divide load (a multiple of PARTITIONS)
    events_per_task: int  # task.created, ticks, completed
    hop_rounds: int  # tasks/get rounds over the six partitions (each: direct + forwarded)
    stream_rounds: int  # tasks/stream rounds over the six partitions
    failover_tasks: int  # live tasks on the victim's partitions (two clients each)
    tail_scale: float  # bench_log --scale of each tail run
    tail_pairs: int  # before/after pairs of tail runs


FULL = Sizes(48_000, 4, 40, 15, 4, 0.15, 2)
SMALL = Sizes(6_000, 5, 10, 3, 2, 0.05, 1)

_ORDER = {"divide": 0, "capacity": 1, "hop": 2, "failover": 3, "tail": 4}


def within(share: float) -> bool:
    return abs(share - 1.0) <= TARGET_SHARE_TOLERANCE


def sized_verdict(ok: bool, args: argparse.Namespace) -> str:
    """Verdict of a target stated for the full size."""
    return verdict(ok) if not args.small else f"({verdict(ok)} - target is for full size)"


# --- a process, as /proc sees it ------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (its threads included)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        after_name = fh.read().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / _CLOCK_TICKS  # fields 14 and 15


@dataclass(frozen=True)
class Usage:
    """What a replica had used at one moment."""

    at: float
    cpu_s: float
    rss_kib: int
    sockets: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, pid: int, ports: set[int]) -> Usage:
        return cls(
            time.monotonic(),
            cpu_seconds(pid),
            rss_kib(pid),
            kafka_socket_bytes(pid, ports),
        )


# --- replicas -------------------------------------------------------------------------------------


@dataclass
class Replica(BridgeProcess):
    """A serving replica of a group: its hops go to its peer listener (``replica_env``)."""

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return str(reply.read().decode())

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of the samples of ``name`` whose labels contain ``labels`` (0 if none)."""
        return metric_sum(self.scrape(), name, labels)


def metric_sum(text: str, name: str, labels: str = "") -> float:
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    for found in pattern.finditer(text):
        if labels in (found.group(1) or ""):
            total += float(found.group(2))
    return total


#: Each replica's peer listener binds a loopback address of its own, all on one port (as pods
#: do): an owner URL must name the peer port and one of these hosts.
PEER_HOSTS = [f"127.0.0.{k}" for k in range(2, 10)]


def replica_env(
    secret: str, index: int, peer_port: int, tls: dict[str, str] | None = None
) -> dict[str, str]:
    """``tls``: the peer listener's TLS settings (``BRIDGE_PEERS__TLS_*``), None for http."""
    scheme = "https" if tls else "http"
    return {
        **(tls or {}),
        "BRIDGE_PEERS__ADVERTISED_URL": f"{scheme}://{PEER_HOSTS[index]}:{peer_port}",
        "BRIDGE_PEERS__HOST": PEER_HOSTS[index],
        "BRIDGE_PEERS__PORT": str(peer_port),
        "BRIDGE_PEERS__HOSTS": json.dumps(PEER_HOSTS),
        "BRIDGE_REPLICAS__OWNERSHIP": "group",
        "BRIDGE_REPLICAS__INSTANCE_ID": f"replica-{index}",
        "BRIDGE_PEERS__SECRET": secret,
        "BRIDGE_REPLICAS__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        "BRIDGE_REPLICAS__OWNER_WAIT_S": "5",
        # The Kafka gauges' refresher reads records for the lag and retention gauges; off here
        # (one refresh at start) so that it does not land at random in the byte counts.
        "BRIDGE_SERVER__METRICS_REFRESH_S": "3600",
        "BRIDGE_STREAMS__OPENS_PER_MINUTE": "1000000",  # every stream is one principal's
        "BRIDGE_STREAMS__MAX_PER_PRINCIPAL": "1000",
    }


@dataclass
class Cluster:
    """N replicas on one set of topics."""

    settings: Settings
    replicas: list[Replica]

    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive()]

    async def start(self) -> None:
        # Concurrently: each one's readiness waits for the group's first assignment.
        await asyncio.gather(*(asyncio.to_thread(r.start, 120.0) for r in self.replicas))

    async def stop(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.replicas))

    async def owned(self) -> list[int]:
        return [
            int(await asyncio.to_thread(r.metric, "bridge_owned_partitions")) for r in self.live
        ]

    async def divided(self) -> list[int]:
        """Wait until the live replicas own the six partitions evenly; returns the counts."""
        share = [PARTITIONS // len(self.live)] * len(self.live)
        seen: list[list[int]] = [[]]
        counts: list[int] = await bounded(
            lambda: self._owns(share, seen),
            60,
            lambda: f"{len(self.live)} replicas own {share} partitions (they own {seen[0]})",
        )
        return counts

    async def _owns(self, share: list[int], seen: list[list[int]]) -> list[int] | None:
        seen[0] = await self.owned()
        return seen[0] if seen[0] == share else None

    def tail(self) -> str:
        return "\n".join(f"--- {r.log_path.name}\n{r.tail(15)}" for r in self.replicas)


async def bounded(
    condition: Callable[[], Awaitable[Any]], bound_s: float, what: str | Callable[[], str]
) -> Any:
    """The first truthy value of ``condition``, polled every POLL_S; fails naming ``what``
    (or what it returns by then)."""
    last: Any = None
    try:
        async with asyncio.timeout(bound_s):
            while not (last := await condition()):  # noqa: ASYNC110 - nothing signals /metrics
                await asyncio.sleep(POLL_S)  # poll interval of a bounded wait on /metrics
    except TimeoutError:
        text = what() if callable(what) else what
        raise TimeoutError(
            f"not reached within {bound_s:g} s: {text} (last seen: {last!r})"
        ) from None
    return last


def peer_tls(logs: Path) -> dict[str, str]:
    """A throwaway CA and one certificate for every peer address: the peer listeners' TLS."""
    import trustme  # a development dependency, needed by --peer-tls only

    ca = trustme.CA()
    cert = ca.issue_cert(*PEER_HOSTS)
    files = {
        "ca": logs / "peer-ca.pem",
        "cert": logs / "peer-cert.pem",
        "key": logs / "peer-key.pem",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    return {
        "BRIDGE_PEERS__TLS_CA_FILE": str(files["ca"]),
        "BRIDGE_PEERS__TLS_CERT_FILE": str(files["cert"]),
        "BRIDGE_PEERS__TLS_KEY_FILE": str(files["key"]),
    }


def start_cluster(
    bootstrap: str, n: int, logs: Path, secret: str, tls: dict[str, str] | None = None
) -> Cluster:
    settings = load_settings(
        kafka={"bootstrap_servers": bootstrap},
        topics={
            "prefix": f"bench-replicas-{n}-{secrets.token_hex(4)}",
            "partitions": PARTITIONS,
            "replication_factor": 1,
            "min_insync_replicas": 1,
        },
    )
    peer_port = free_port()  # on 127.0.0.1: free on the other loopback addresses as a rule
    replicas = [
        Replica(settings, replica_env(secret, i, peer_port, tls), logs / f"n{n}-replica{i}.log")
        for i in range(n)
    ]
    return Cluster(settings, replicas)


# --- the load -------------------------------------------------------------------------------------


def balanced_ids(tasks: int) -> list[list[str]]:
    """Task ids, ``tasks // PARTITIONS`` in each events partition (murmur2 of the id)."""
    per = tasks // PARTITIONS
    buckets: list[list[str]] = [[] for _ in range(PARTITIONS)]
    while any(len(b) < per for b in buckets):
        task_id = new_task_id()
        bucket = buckets[partition_for_key(task_id.encode(), PARTITIONS)]
        if len(bucket) < per:
            bucket.append(task_id)
    return buckets


def load_records(
    settings: Settings, ids: list[list[str]], events: int
) -> Iterator[tuple[int, Record]]:
    """Every task's task.created, ticks and completed status, in rounds over the tasks."""
    pub = TaskEventPublisher(settings)
    ticks = [pub.encode(TICK_TYPE, {"i": i, "pad": "x" * 32}) for i in range(16)]
    status = pub.encode(f"{settings.tasks.event_type_prefix}.task.status", {"status": "completed"})
    for round_ in range(events):
        for partition, bucket in enumerate(ids):
            for task_id in bucket:
                if round_ == 0:
                    yield partition, created_record(settings, pub, task_id)
                else:
                    value, headers = status if round_ == events - 1 else ticks[round_ % 16]
                    yield partition, (task_id.encode(), value, headers)


# --- 1 and 2. dividing the load -------------------------------------------------------------------


@dataclass
class Share:
    """One replica's part of one run."""

    tasks: int
    records: int
    received: int
    sent: int
    rss_growth_kib: int
    cpu_s: float  # over the indexing window
    idle_cpu_per_s: float
    window_s: float
    sockets_changed: tuple[int, int]

    @property
    def net_cpu_s(self) -> float:
        return max(0.0, self.cpu_s - self.idle_cpu_per_s * self.window_s)


@dataclass
class Run:
    n: int
    shares: list[Share]
    index_s: float
    produce_s: float


async def settled_rss(pid: int) -> int:
    samples = []
    for _ in range(3):
        samples.append(rss_kib(pid))
        await asyncio.sleep(0.3)  # samples apart in time (not a synchronisation)
    return min(samples)


async def tasks_completed(cluster: Cluster) -> float:
    counts = [
        await asyncio.to_thread(r.metric, "bridge_tasks", 'status="completed"')
        for r in cluster.live
    ]
    return sum(counts)


async def divide_run(cluster: Cluster, ids: list[list[str]], sizes: Sizes) -> Run:
    """Start the cluster's replicas, wait for the partitions to be divided, produce the load,
    and measure each replica from the load's first record to the last task completed."""
    settings = cluster.settings
    n = len(cluster.replicas)
    await create_layout(settings)
    say(f"divide: N={n}: starting {n} replica(s) on {settings.topics.prefix}")
    await cluster.start()
    await cluster.divided()
    ports = broker_ports(settings.kafka.bootstrap_servers or "")
    pids = [r.pid for r in cluster.replicas]
    idle0 = [Usage.of(p, ports) for p in pids]
    await asyncio.sleep(2.0)  # the idle window: what a replica burns doing nothing
    idle1 = [Usage.of(p, ports) for p in pids]
    idle_rate = [(b.cpu_s - a.cpu_s) / (b.at - a.at) for a, b in zip(idle0, idle1, strict=True)]
    rss0 = [await settled_rss(p) for p in pids]
    before = [Usage.of(p, ports) for p in pids]
    total = sizes.tasks * sizes.events_per_task
    say(f"divide: N={n}: producing {total:,} records ({sizes.tasks:,} tasks)")
    started = time.monotonic()
    produce_s = await produce_partitioned(
        settings, load_records(settings, ids, sizes.events_per_task), total
    )
    await bounded(
        lambda: _all_completed(cluster, sizes.tasks),
        600,
        f"the {n} replica(s) index all {sizes.tasks:,} tasks to completed",
    )
    index_s = time.monotonic() - started
    after = [Usage.of(p, ports) for p in pids]
    rss1 = [await settled_rss(p) for p in pids]
    shares = []
    for i, replica in enumerate(cluster.replicas):
        tasks = int(await asyncio.to_thread(replica.metric, "bridge_tasks"))
        received, sent, opened, closed = bytes_delta(before[i].sockets, after[i].sockets)
        shares.append(
            Share(
                tasks=tasks,
                records=tasks * sizes.events_per_task,
                received=received,
                sent=sent,
                rss_growth_kib=rss1[i] - rss0[i],
                cpu_s=after[i].cpu_s - before[i].cpu_s,
                idle_cpu_per_s=idle_rate[i],
                window_s=after[i].at - before[i].at,
                sockets_changed=(opened, closed),
            )
        )
    return Run(n, shares, index_s, produce_s)


async def _all_completed(cluster: Cluster, tasks: int) -> bool:
    return await tasks_completed(cluster) >= tasks


Measure = Callable[[Share], float]


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def report_divide(runs: list[Run], sizes: Sizes, args: argparse.Namespace, res: Results) -> None:
    total = sizes.tasks * sizes.events_per_task
    res.add(
        "divide",
        f"load: {sizes.tasks:,} tasks x {sizes.events_per_task} events = {total:,} records, "
        f"{sizes.tasks // PARTITIONS:,} tasks per partition",
        "",
    )
    shares = [s for run in runs for s in run.shares]
    fit = statistics.linear_regression(
        [s.tasks for s in shares], [s.rss_growth_kib * 1024 for s in shares]
    )
    # (name, unit, value, its format, whether the 1/N target applies)
    measures: list[tuple[str, str, Measure, Callable[[float], str], bool]] = [
        ("records indexed", "records", lambda s: s.records, lambda v: f"{v:,.0f}", True),
        ("bytes received from Kafka (ss)", "MiB", lambda s: s.received, mib, True),
        # Informational: a task's index entry is rewritten at every flush (0.5 s) in which it
        # changed, so what is written depends on how the indexing falls across flushes.
        ("  bytes sent to Kafka (ss: index, task updates)", "MiB", lambda s: s.sent, mib, False),
        ("VmRSS growth while indexing", "MiB", lambda s: s.rss_growth_kib * 1024, mib, True),
        (
            "index memory: tasks x fitted cost per task",
            "MiB",
            lambda s: s.tasks * fit.slope,
            mib,
            True,
        ),
    ]
    for name, unit, value, fmt, targeted in measures:
        share_rows(res, runs, name, unit, value, fmt, args if targeted else None)
    res.add(
        "divide",
        f"  VmRSS growth fitted over the {len(shares)} replicas: fixed + per task",
        f"{fit.intercept / 2**20:.1f} MiB + {fit.slope:.0f} B",
        "",
    )
    for run in runs:
        changed = [s.sockets_changed for s in run.shares if s.sockets_changed != (0, 0)]
        if changed:
            res.note(f"divide: N={run.n}: broker sockets (opened, closed) in the window: {changed}")


def share_rows(
    res: Results,
    runs: list[Run],
    name: str,
    unit: str,
    value: Measure,
    fmt: Callable[[float], str],
    args: argparse.Namespace | None,
) -> None:
    """The single replica's ``value``, then each N's per replica against 1/N of it (with a
    verdict unless ``args`` is None: informational)."""
    base = value(runs[0].shares[0])
    res.add("divide", f"N=1: {name}", fmt(base), unit)
    for run in runs[1:]:
        shares = [value(s) / (base / run.n) for s in run.shares]
        res.add(
            "divide",
            f"N={run.n}: {name.strip()} per replica (vs N=1 / {run.n})",
            f"{' / '.join(fmt(value(s)) for s in run.shares)} "
            f"({' / '.join(f'{x:.2f}' for x in shares)}x)",
            unit,
            target=""
            if args is None
            else f"each {1 - TARGET_SHARE_TOLERANCE:.2f}-{1 + TARGET_SHARE_TOLERANCE:.2f}x",
            status="" if args is None else sized_verdict(all(within(x) for x in shares), args),
        )


def report_capacity(runs: list[Run], res: Results) -> None:
    for run in runs:
        per_million = [s.net_cpu_s / (s.records / 1e6) for s in run.shares]
        idle = [s.idle_cpu_per_s * 100 for s in run.shares]
        res.add(
            "capacity",
            f"N={run.n}: CPU s per million records indexed, per replica (idle rate subtracted)",
            " / ".join(f"{x:.1f}" for x in per_million),
            "s",
        )
        res.add(
            "capacity",
            f"  N={run.n}: idle CPU per replica / CPU s in the window, sum over replicas",
            f"{' / '.join(f'{x:.1f}' for x in idle)} % / {sum(s.cpu_s for s in run.shares):.1f} s",
            "",
        )
        mean = statistics.mean(per_million)
        res.add(
            "capacity",
            f"  N={run.n}: cluster capacity if each replica had a core (1e6 / CPU s per M x N)",
            run.n * 1e6 / mean if mean else 0.0,
            "records/s",
        )
        total = sum(s.records for s in run.shares)
        res.add(
            "capacity",
            f"  N={run.n}: produce + index the load on this machine "
            f"(produce {run.produce_s:.1f} s)",
            f"{run.index_s:.1f} s, {total / run.index_s:,.0f}",
            "records/s",
        )


# --- 3. one hop: forwarded against direct ---------------------------------------------------------


async def owners(cluster: Cluster, probes: list[str]) -> list[int]:
    """The index of the replica that owns each probe task's partition.

    Each replica is asked for each task; the one whose count of forwarded requests did not
    grow served it itself.
    """
    found = []
    async with httpx.AsyncClient(timeout=30) as http:
        for task_id in probes:
            serving = []
            for i, replica in enumerate(cluster.replicas):
                label = 'method="tasks/get",outcome="ok"'
                count = await asyncio.to_thread(
                    replica.metric, "bridge_forwarded_requests_total", label
                )
                answer = await tasks_get(http, replica.url, task_id)
                if "result" not in answer:
                    raise RuntimeError(f"tasks/get of {task_id} at {replica.url}: {answer}")
                now = await asyncio.to_thread(
                    replica.metric, "bridge_forwarded_requests_total", label
                )
                if now == count:
                    serving.append(i)
            if len(serving) != 1:
                raise RuntimeError(f"task {task_id}: served without a hop by replicas {serving}")
            found.append(serving[0])
    return found


async def timed_get(http: httpx.AsyncClient, url: str, task_id: str) -> float:
    started = time.perf_counter()
    answer = await tasks_get(http, url, task_id)
    elapsed = time.perf_counter() - started
    if "result" not in answer:
        raise RuntimeError(f"tasks/get of {task_id} at {url}: {answer}")
    return elapsed * 1000


async def timed_first_event(port: int, task_id: str) -> float:
    """ms from connecting to the first event (seq 0) of a fresh tasks/stream; then it closes."""
    started = time.perf_counter()
    async with asyncio.timeout(30):
        stream = await open_stream(port, task_id)
    elapsed = time.perf_counter() - started
    stream.close()
    return elapsed * 1000


Pair = tuple[str, Replica, Replica]  # a task, its owner, a replica that does not own it


async def cpu_per_get(
    cluster: Cluster,
    clients: dict[int, httpx.AsyncClient],
    pairs: list[Pair],
    forwarded: bool,
    rounds: int,
) -> tuple[float, float]:
    """CPU ms all replicas spend per tasks/get (idle included), asked only of the owners or
    only of the others; and the wall ms per request."""
    pids = [r.pid for r in cluster.replicas]
    before, started = sum(cpu_seconds(p) for p in pids), time.monotonic()
    for _ in range(rounds):
        for task_id, owner, other in pairs:
            replica = other if forwarded else owner
            await timed_get(clients[replica.port], replica.url, task_id)
    spent = sum(cpu_seconds(p) for p in pids) - before
    count = rounds * len(pairs)
    return spent / count * 1000, (time.monotonic() - started) / count * 1000


async def idle_cpu_rate(cluster: Cluster, window_s: float = 3.0) -> float:
    """CPU seconds per second all replicas burn while nobody asks them anything."""
    pids = [r.pid for r in cluster.replicas]
    before, started = sum(cpu_seconds(p) for p in pids), time.monotonic()
    await asyncio.sleep(window_s)  # the idle window measured (not a synchronisation)
    return (sum(cpu_seconds(p) for p in pids) - before) / (time.monotonic() - started)


async def bench_hop(
    cluster: Cluster,
    probes: list[str],
    found: list[int],
    sizes: Sizes,
    args: argparse.Namespace,
    res: Results,
) -> None:
    """``probes``: a task of each partition; ``found``: the index of each one's owner."""
    n = len(cluster.replicas)
    pairs: list[Pair] = [
        (t, cluster.replicas[o], cluster.replicas[(o + 1) % n])
        for t, o in zip(probes, found, strict=True)
    ]
    gets: dict[str, list[float]] = {"direct": [], "forwarded": []}
    streams: dict[str, list[float]] = {"direct": [], "forwarded": []}
    clients = {r.port: httpx.AsyncClient(timeout=30) for r in cluster.replicas}
    try:
        for task_id, owner, other in pairs:  # warm: connections, the hop's pool
            await timed_get(clients[owner.port], owner.url, task_id)
            await timed_get(clients[other.port], other.url, task_id)
        say(f"hop: tasks/get, {sizes.hop_rounds} rounds over the {len(pairs)} partitions")
        for _ in range(sizes.hop_rounds):
            for task_id, owner, other in pairs:
                gets["direct"].append(await timed_get(clients[owner.port], owner.url, task_id))
                gets["forwarded"].append(await timed_get(clients[other.port], other.url, task_id))
        say("hop: tasks/get CPU, idle, then direct only, then forwarded only")
        idle = await idle_cpu_rate(cluster)
        measured = {
            path: await cpu_per_get(cluster, clients, pairs, path == "forwarded", sizes.hop_rounds)
            for path in ("direct", "forwarded")
        }
        cpu = {path: cpu_ms for path, (cpu_ms, _) in measured.items()}
        net = {path: cpu_ms - idle * wall_ms for path, (cpu_ms, wall_ms) in measured.items()}
        say(f"hop: tasks/stream, {sizes.stream_rounds} rounds")
        for _ in range(sizes.stream_rounds):
            for task_id, owner, other in pairs:
                streams["direct"].append(await timed_first_event(owner.port, task_id))
                streams["forwarded"].append(await timed_first_event(other.port, task_id))
    finally:
        for client in clients.values():
            await client.aclose()
    res.add(
        "hop",
        f"peer listener: {'https (TLS)' if args.peer_tls else 'http'}",
        "",
        "",
    )
    res.add(
        "hop",
        "  tasks/get: CPU of all replicas per request, direct / forwarded (runs of each alone)",
        f"{cpu['direct']:.2f} / {cpu['forwarded']:.2f}",
        "ms",
    )
    res.add(
        "hop",
        f"  tasks/get: the same, idle CPU subtracted ({idle * 100:.1f}% of a core, all replicas)",
        f"{net['direct']:.2f} / {net['forwarded']:.2f}",
        "ms",
    )
    ratio = cpu["forwarded"] / cpu["direct"] if cpu["direct"] else float("inf")
    res.add(
        "hop",
        "tasks/get: CPU of all replicas, forwarded / direct",
        f"{ratio:.2f}",
        "x",
        target=f"<= {TARGET_HOP_CPU_RATIO:g}x",
        status=sized_verdict(ratio <= TARGET_HOP_CPU_RATIO, args),
    )
    for what, samples in (("tasks/get", gets), ("tasks/stream first event", streams)):
        direct, hop = samples["direct"], samples["forwarded"]
        for path, values in (("direct (owner)", direct), ("forwarded (one hop)", hop)):
            res.add(
                "hop",
                f"{what}, {path}: p50 / p90 / p99 ({len(values)} requests)",
                f"{pct(values, 50):.2f} / {pct(values, 90):.2f} / {pct(values, 99):.2f}",
                "ms",
            )
        added = pct(hop, 50) - pct(direct, 50)
        res.add(
            "hop",
            f"{what}: forwarded p50 - direct p50",
            f"{added:.2f}",
            "ms",
            target=f"<= {TARGET_HOP_ADDED_MS:g} ms",
            status=sized_verdict(added <= TARGET_HOP_ADDED_MS, args),
        )
    for method in ("tasks/get", "tasks/stream"):
        label = f'method="{method}"'
        count = sum(r.metric("bridge_forward_seconds_count", label) for r in cluster.replicas)
        total = sum(r.metric("bridge_forward_seconds_sum", label) for r in cluster.replicas)
        if count:
            res.add(
                "hop",
                f"  {method}: the forwarder's bridge_forward_seconds mean ({count:.0f} hops)",
                total / count * 1000,
                "ms",
            )


# --- 4. failover after a SIGKILL ------------------------------------------------------------------


@dataclass
class Follower:
    """One client of one live task: what it got, and when, on which connection."""

    task_id: str
    first_choice: Replica
    last: int | None = None
    got: int = 0
    disorder: list[tuple[int | None, int]] = field(default_factory=list)
    connects: int = 0
    resumed_first_event: float | None = None  # on a connection opened after the kill


async def follow(
    client: Follower, cluster: Cluster, kill: dict[str, float], stop: asyncio.Event
) -> None:
    """Stream the task, resuming with the cursor on a live replica whenever a stream ends."""
    rng = random.Random(client.task_id)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as http:
        while not stop.is_set():
            live = cluster.live
            replica = client.first_choice if client.first_choice.alive() else rng.choice(live)
            opened_after_kill = "at" in kill
            params: dict[str, Any] = {"taskId": client.task_id}
            if client.last is not None:
                params["after"] = client.last
            body = mcp_body("tasks/stream", params, client.connects)
            client.connects += 1
            headers = mcp_headers("tasks/stream", client.task_id)
            with contextlib.suppress(httpx.HTTPError, OSError):
                async with http.stream("POST", replica.url, content=body, headers=headers) as reply:
                    async for line in reply.aiter_lines():
                        if stop.is_set():
                            return
                        if line.startswith("data: ") and "notifications/tasks/event" in line[:80]:
                            seq = json.loads(line[6:])["params"]["seq"]
                            take(client, seq, opened_after_kill)
            if not stop.is_set():
                await asyncio.sleep(RECONNECT_BACKOFF_S)  # the client's retry policy


def take(client: Follower, seq: int, opened_after_kill: bool) -> None:
    expected = 0 if client.last is None else client.last + 1
    if seq != expected:
        client.disorder.append((client.last, seq))
    client.last = seq
    client.got += 1
    if opened_after_kill and client.resumed_first_event is None:
        client.resumed_first_event = time.monotonic()


async def tick(
    settings: Settings, task_ids: list[str], stop: asyncio.Event, acked: list[float]
) -> int:
    """Publish a tick to every task every 100 ms (the SDK's producer) until ``stop``; the time
    each round was acknowledged goes to ``acked`` (a stalled producer shows as a gap)."""
    sent = 0
    async with TaskEventPublisher(settings) as pub:
        while not stop.is_set():
            await asyncio.gather(*(pub.publish(t, TICK_TYPE, {"i": sent}) for t in task_ids))
            acked.append(time.monotonic())
            sent += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await stop.wait()
    return sent


async def bench_failover(cluster: Cluster, owner_of: list[int], sizes: Sizes, res: Results) -> None:
    """``owner_of``: the index of the replica owning each partition (the last one dies)."""
    victim, survivors = cluster.replicas[-1], cluster.replicas[:-1]
    mine = [p for p, o in enumerate(owner_of) if o == len(cluster.replicas) - 1]
    if not mine:
        raise RuntimeError(f"the victim owns no partition (owners: {owner_of})")
    # Live tasks (created, then a tick every 100 ms) in the victim's partitions.
    ids = balanced_ids(PARTITIONS * sizes.failover_tasks)
    live_tasks = [t for p in mine for t in ids[p]][: sizes.failover_tasks]
    settings = cluster.settings
    pub = TaskEventPublisher(settings)
    created = (
        (partition_for_key(t.encode(), PARTITIONS), created_record(settings, pub, t))
        for t in live_tasks
    )
    await produce_partitioned(settings, created, len(live_tasks))
    say(f"failover: {victim.log_path.stem} owns partitions {mine}; {len(live_tasks)} live tasks")
    clients = [Follower(t, victim) for t in live_tasks]
    clients += [Follower(t, survivors[i % len(survivors)]) for i, t in enumerate(live_tasks)]
    stop = asyncio.Event()
    kill: dict[str, float] = {}
    acked: list[float] = []
    ticking = asyncio.create_task(tick(settings, live_tasks, stop, acked))
    following = [asyncio.create_task(follow(c, cluster, kill, stop)) for c in clients]
    try:
        await bounded(
            lambda: _all_got(clients, 5), 60, "every client streams its task (5 events each)"
        )
        assert victim.popen is not None
        victim.popen.kill()
        kill["at"] = time.monotonic()
        await asyncio.to_thread(victim.popen.wait, 30)
        say(f"failover: SIGKILLed {victim.log_path.stem} (pid {victim.pid})")
        bound = SESSION_TIMEOUT_MS / 1000 + 60
        # Watched beside the clients: when the survivors have restored the victim's partitions.
        owning = asyncio.create_task(
            stamped(
                bounded(
                    lambda: _survivors_own_all(cluster),
                    bound,
                    "the survivors own the six partitions",
                )
            )
        )
        await bounded(
            lambda: _all_resumed(clients),
            bound,
            "every client gets an event on a stream opened after the kill",
        )
        moved, owned_at = await owning
        rebalanced = owned_at - kill["at"]
    finally:
        stop.set()
        await asyncio.gather(*following, return_exceptions=True)
        with contextlib.suppress(Exception):
            await ticking
    times = [c.resumed_first_event - kill["at"] for c in clients if c.resumed_first_event]
    target = SESSION_TIMEOUT_MS / 1000 + TARGET_FAILOVER_SLACK_S
    res.add(
        "failover",
        "group session timeout (BRIDGE_REPLICAS__SESSION_TIMEOUT_MS)",
        SESSION_TIMEOUT_MS / 1000,
        "s",
    )
    res.add(
        "failover",
        f"kill -> first event on a resumed stream, median / max ({len(times)} clients, "
        f"backoff {RECONNECT_BACKOFF_S:g} s)",
        f"{statistics.median(times):.2f} / {max(times):.2f}",
        "s",
        target=f"<= {target:g} s",
        status=verdict(max(times) <= target),
    )
    res.add(
        "failover",
        f"  kill -> survivors own {moved} partitions, restored (polled every {POLL_S:g} s)",
        rebalanced,
        "s",
    )
    after_kill = [kill["at"], *(t for t in acked if t > kill["at"])]
    res.add(
        "failover",
        "  longest pause of the producer's acknowledged ticks after the kill",
        max(b - a for a, b in itertools.pairwise(after_kill)) if len(after_kill) > 1 else 0.0,
        "s",
    )
    gaps = [(c.task_id[:8], c.disorder) for c in clients if c.disorder]
    connects = [c.connects for c in clients]
    res.add(
        "failover",
        "  events in seq order, none lost or repeated, across resumes",
        "yes" if not gaps else f"no: {gaps[:3]}",
        "",
        status=verdict(not gaps),
    )
    res.add(
        "failover",
        "  connections per client, median / max",
        f"{statistics.median(connects):.0f} / {max(connects)}",
        "",
    )


async def stamped(awaitable: Awaitable[Any]) -> tuple[Any, float]:
    """What ``awaitable`` gives, and when (``time.monotonic``)."""
    value = await awaitable
    return value, time.monotonic()


async def _all_got(clients: list[Follower], events: int) -> bool:
    return all(c.got >= events for c in clients)


async def _all_resumed(clients: list[Follower]) -> bool:
    return all(c.resumed_first_event is not None for c in clients)


async def _survivors_own_all(cluster: Cluster) -> list[int] | None:
    counts = await cluster.owned()
    return counts if sum(counts) == PARTITIONS else None


# --- 5. the single-process tail before and after the cheap tail -----------------------------------


def tree_of(commit: str, into: Path) -> Path:
    """The files of ``commit`` (``git archive``) under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def tail_rate(tree: Path, bootstrap: str, scale: float, out: Path) -> float:
    """records/s of the indexer catch-up in ``bench_log.py --only resume`` of ``tree``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env.update(BRIDGE_KAFKA__BOOTSTRAP_SERVERS=bootstrap, PYTHONPATH=str(tree))
    where = subprocess.run(
        [sys.executable, "-c", "import bridge; print(bridge.__file__)"],
        env=env,
        cwd=tree,  # ``-c`` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    if not where.startswith(str(tree)):
        raise RuntimeError(f"bridge of {tree} not imported (got {where})")
    command = [sys.executable, str(tree / "bench" / "bench_log.py"), "--only", "resume"]
    command += ["--repeat", "1", "--scale", str(scale), "--json", str(out)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench_log.py of {tree} failed:\n{done.stderr[-2000:]}")
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        if row["metric"].startswith("indexer catch-up over"):
            return float(row["value"])
    raise RuntimeError(f"no catch-up row in {out}")


async def bench_tail(bootstrap: str, sizes: Sizes, logs: Path, res: Results) -> None:
    before_tree = tree_of(TAIL_BEFORE, logs / "before")
    ratios = []
    for pair in range(sizes.tail_pairs):
        rates = {}
        for name, tree in (("before", before_tree), ("after", REPO)):
            out = logs / f"tail-{name}-{pair}.json"
            say(f"tail: pair {pair + 1}: bench_log.py --only resume of {name} ({tree})")
            rates[name] = await asyncio.to_thread(tail_rate, tree, bootstrap, sizes.tail_scale, out)
        ratio = rates["after"] / rates["before"]
        ratios.append(ratio)
        res.add(
            "tail",
            f"pair {pair + 1}: catch-up before ({TAIL_BEFORE}) / this tree, "
            f"{int(1_100_000 * sizes.tail_scale):,} records, one partition",
            f"{rates['before']:,.0f} / {rates['after']:,.0f}",
            "records/s",
        )
    res.add(
        "tail",
        "speed-up this tree / before, worst pair",
        min(ratios),
        "x",
        target=f">= {TARGET_TAIL_SPEEDUP:g}x",
        status=verdict(min(ratios) >= TARGET_TAIL_SPEEDUP),
    )


# --- main ---------------------------------------------------------------------------------------

STAGES = ("divide", "hop", "failover", "tail")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="smoke run (6k tasks, few samples)")
    parser.add_argument(
        "--only",
        choices=STAGES,
        action="append",
        help="run only these (repeatable; hop and failover run on the three-replica cluster)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the replicas' logs")
    parser.add_argument(
        "--peer-tls", action="store_true", help="the peer listeners serve https (a throwaway CA)"
    )
    parser.add_argument(
        "--hop-rounds",
        type=int,
        metavar="N",
        help="tasks/get rounds of the hop stage (CPU is counted in 10 ms ticks: more is finer)",
    )
    return parser.parse_args(argv)


async def run(
    bootstrap: str, sizes: Sizes, args: argparse.Namespace, logs: Path, res: Results
) -> None:
    only = set(args.only or STAGES)
    secret = secrets.token_urlsafe(32)  # never printed: it signs the hops
    tls = peer_tls(logs) if args.peer_tls else None
    ids = balanced_ids(sizes.tasks)
    counts = REPLICA_COUNTS if "divide" in only else ()
    runs: list[Run] = []
    cluster: Cluster | None = None
    try:
        for n in counts:
            if cluster is not None:
                await cluster.stop()
            cluster = start_cluster(bootstrap, n, logs, secret, tls)
            runs.append(await divide_run(cluster, ids, sizes))
        if runs:
            report_divide(runs, sizes, args, res)
            report_capacity(runs, res)
        if only & {"hop", "failover"}:
            if cluster is None:  # the three replicas, with a smaller load of the same tasks
                cluster = start_cluster(bootstrap, REPLICA_COUNTS[-1], logs, secret, tls)
                await divide_run(cluster, ids, Sizes(**{**asdict(sizes), "events_per_task": 3}))
            probes = [bucket[0] for bucket in ids]
            found = await owners(cluster, probes)
            say(f"owners of partitions 0-{PARTITIONS - 1}: replicas {found}")
            if "hop" in only:
                await bench_hop(cluster, probes, found, sizes, args, res)
            if "failover" in only:
                await bench_failover(cluster, found, sizes, res)
    except BaseException:
        if cluster is not None:
            say(f"replica logs:\n{cluster.tail()}")
        raise
    finally:
        if cluster is not None:
            await cluster.stop()
    if "tail" in only:
        await bench_tail(bootstrap, sizes, logs, res)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMALL if args.small else FULL
    if args.hop_rounds:
        sizes = Sizes(**{**asdict(sizes), "hop_rounds": args.hop_rounds})
    res = Results(order=_ORDER)
    wall = time.perf_counter()
    settings = load_settings()
    logs = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    with provide_broker(settings, progress=say) as broker:
        res.environment = environment(broker, settings)
        res.environment.update(
            size="small" if args.small else "full",
            partitions=PARTITIONS,
            session_timeout_ms=SESSION_TIMEOUT_MS,
        )
        say(f"broker: {broker.info.provider} at {broker.info.bootstrap_servers}; logs in {logs}")
        asyncio.run(run(broker.info.bootstrap_servers, sizes, args, logs, res))
    env = res.environment
    env["wall_seconds"] = round(time.perf_counter() - wall, 1)
    res.note(
        f"the machine has {env['nproc']} cores shared with other engineers' runs; the broker, "
        "every replica and this client share them"
    )
    if not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    report(
        res,
        f"bench_replicas.py  size={env['size']}",
        f"replicas: {PARTITIONS} events partitions, ownership=group, session timeout "
        f"{SESSION_TIMEOUT_MS} ms, metrics refresh off  wall time {env['wall_seconds']} s",
        json_path=args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

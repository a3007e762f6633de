"""Shared pieces of the benchmarks: progress output, where a run happened, settings on fresh
topics, the results table and report, fast producing (to one partition or to several).

Not a package module: the benchmark scripts import it from their own folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from bridge.config import Settings, load_settings
from bridge.kafka.clients import committed_consumer
from bridgedev.kafka import Broker

REPO = Path(__file__).resolve().parent.parent
#: Libraries whose versions a result depends on.
VERSIONED = ("aiokafka", "uvicorn", "starlette", "h11", "httptools", "uvloop", "orjson", "msgspec")

#: (key, value, headers) of one record.
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]
PRODUCE_BATCH_BYTES = 200_000


class NotReached(Exception):
    """A bench stage waited for a condition that did not come within its bound."""


@contextlib.asynccontextmanager
async def within(seconds: float, what: str) -> AsyncIterator[None]:
    """``asyncio.timeout`` that fails with what was not reached, never a bare TimeoutError."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise NotReached(f"not reached within {seconds:g} s: {what}") from None


def say(message: str) -> None:
    """Progress to stderr (the results table goes to stdout)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Row:
    bench: str
    metric: str
    value: float | int | str
    unit: str = ""
    target: str = ""
    status: str = ""  # PASS / MISS / "" (informational)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Order of the benches in the table (others last, in insertion order).
    order: dict[str, int] = field(default_factory=dict)

    def add(self, *args: Any, **kwargs: Any) -> None:
        row = Row(*args, **kwargs)
        self.rows.append(row)
        say(f"{row.bench}: {row.metric} = {_fmt(row.value)} {row.unit} {row.status}".rstrip())

    def add_ratio(self, bench: str, metric: str, ratio: float, at_most: float) -> None:
        """A row of a ratio whose target is ``at_most``."""
        ok = verdict(ratio <= at_most)
        self.add(bench, metric, ratio, "x", target=f"<= {at_most:g}x", status=ok)

    def note(self, text: str) -> None:
        say(f"note: {text}")
        self.notes.append(text)

    def ordered(self) -> list[Row]:
        return sorted(self.rows, key=lambda r: self.order.get(r.bench, 9))  # stable within a bench

    def table(self) -> str:
        header = ("bench", "metric", "value", "target", "result")
        body = [
            (r.bench, r.metric, f"{_fmt(r.value)} {r.unit}".strip(), r.target, r.status)
            for r in self.ordered()
        ]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
        line = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [line.format(*header), line.format(*("-" * w for w in widths))]
        out += [line.format(*row) for row in body]
        return "\n".join(s.rstrip() for s in out)


def _fmt(value: float | int | str) -> str:
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# --- where a run happened -------------------------------------------------------------------------


def environment(broker: Broker, settings: Settings) -> dict[str, Any]:
    """Date, commit, machine, Python and library versions, and the Kafka of a run."""
    return {
        **machine(),
        "kafka_provider": broker.info.provider,
        "kafka": _kafka(broker, settings),
        "bootstrap": broker.info.bootstrap_servers,
    }


def machine() -> dict[str, Any]:
    """Date, commit, machine, Python and library versions of a run (no Kafka)."""
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "commit": _commit(),
        "loadavg_start": _loadavg(),
        "calibration_ms_start": calibration_ms(),
        "cpu_times_start": _cpu_times(),
        "nproc": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu": _cpu(),
        "memory": _memory(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "versions": _versions(),
    }


def _cpu() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _memory() -> str:
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open("/proc/meminfo", encoding="utf-8") as fh,
    ):
        return f"{int(fh.readline().split()[1]) / 2**20:.1f} GiB"
    return "?"


def _kafka(broker: Broker, settings: Settings) -> str:
    if broker.info.provider != "local":
        return broker.info.detail
    local = settings.kafka.local
    return f"Apache Kafka {local.version} (local KRaft broker from Maven jars, heap {local.heap})"


def _git(*args: str) -> str:
    command = ["git", "-C", str(REPO), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()


def _commit() -> str:
    """The checked-out commit, marked when bridge/ has changes not committed."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        dirty = _git("status", "--porcelain", "--", "bridge")
        return _git("rev-parse", "--short", "HEAD") + (" (bridge/ modified)" if dirty else "")
    return "?"


def _versions() -> dict[str, str]:
    versions = {}
    for dist in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return versions


def _loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


#: The calibration workload's size: about 40 ms on the 2-core machine of docs/benchmarks*.md.
_CALIBRATION_ROUNDS = 7_000


def calibration_ms() -> float:
    """Milliseconds of a fixed pure-Python workload (JSON and string work like the bridge's
    per-event path), best of five: how fast this host runs Python right now.

    The same machine has measured twice as slow on one day as on another (a shared host);
    a result is comparable with another run only next to this number.
    """
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for i in range(_CALIBRATION_ROUNDS):
            text = json.dumps({"i": i, "pad": "x" * 32}, separators=(",", ":"))
            f"id: c{i}\nevent: message\ndata: {json.loads(text)['pad']}\n\n".encode()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def _cpu_times() -> list[int]:
    """The host's (total, steal) CPU jiffies from /proc/stat; [] where there is none."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/stat", encoding="utf-8") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        return [sum(fields[:8]), fields[7]]  # user..steal (guest time is inside user)
    return []


def _steal(start: list[int], end: list[int]) -> str:
    """Share of the host's CPU time the hypervisor gave to others between two readings."""
    if len(start) != 2 or len(end) != 2 or end[0] <= start[0]:
        return "?"
    return f"{100 * (end[1] - start[1]) / (end[0] - start[0]):.1f}%"


def bench_settings(bootstrap: str, name: str) -> Settings:
    """Default settings on fresh topics (``bench-<name>-<8 hex>``) with one events partition."""
    return load_settings(
        kafka={"bootstrap_servers": bootstrap},
        topics={
            "prefix": f"bench-{name}-{secrets.token_hex(4)}",
            "partitions": 1,
            "replication_factor": 1,
            "min_insync_replicas": 1,
        },
    )


def report(res: Results, headline: str, *details: str, json_path: str | None = None) -> None:
    """Print where the run happened, the results table and the notes; ``json_path`` also gets
    all of it as JSON."""
    env = res.environment
    env["loadavg_end"] = _loadavg()
    env["calibration_ms_end"] = calibration_ms()
    env["cpu_steal"] = _steal(env.get("cpu_times_start", []), _cpu_times())
    print()
    print(f"{headline}  {env['date']}  commit {env['commit']}")
    print(
        f"machine: nproc={env['nproc']}  cpu={env['cpu']}  memory={env['memory']}  "
        f"loadavg {env['loadavg_start']} at start, {env['loadavg_end']} at end"
    )
    print(
        f"speed:   calibration {env['calibration_ms_start']} ms at start, "
        f"{env['calibration_ms_end']} ms at end (a fixed Python workload; lower is faster: "
        f"compare runs next to it); CPU steal {env['cpu_steal']} during the run"
    )
    print(f"python:  {env['python']}  {env['versions']}  ({env['platform']})")
    print(f"kafka:   {env['kafka']}  provider={env['kafka_provider']}")
    for line in details:
        print(line)
    print()
    print(res.table())
    if res.notes:
        print()
        for note in res.notes:
            print(f"note: {note}")
    if json_path:
        rows = [asdict(r) for r in res.ordered()]
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump({"environment": env, "rows": rows, "notes": res.notes}, fh, indent=2)


async def produce(settings: Settings, records: Iterable[Record], total: int) -> float:
    """Write ``records`` to events partition 0 as fast as one raw producer goes; returns seconds.

    See :func:`produce_partitioned`.
    """
    return await produce_partitioned(settings, ((0, record) for record in records), total)


async def produce_partitioned(
    settings: Settings, records: Iterable[tuple[int, Record]], total: int
) -> float:
    """Write ``(partition, record)`` pairs to the events topic as fast as one raw producer goes;
    returns seconds.

    Hand-built record batches (``create_batch``/``send_batch``, one open batch per partition),
    acks=1, no idempotence: the fastest way to get large partitions; the acks are gathered in
    chunks, never one by one.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        client_id="bench-producer",
        acks=1,
        enable_idempotence=False,
        linger_ms=20,
        max_batch_size=PRODUCE_BATCH_BYTES,
        max_request_size=4 * PRODUCE_BATCH_BYTES,
    )
    await producer.start()
    topic = settings.topics.events
    started = time.perf_counter()
    try:
        pending: list[asyncio.Future[Any]] = []
        batches: dict[int, Any] = {}
        sent = 0
        next_report = total // 10 or 1
        for partition, (key, value, headers) in records:
            batch = batches.setdefault(partition, producer.create_batch())
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    raise RuntimeError("a single record does not fit in an empty batch")
                if len(pending) >= 32:
                    await asyncio.gather(*pending)
                    pending.clear()
            sent += 1
            if sent >= next_report:
                say(f"  produced {sent:,}/{total:,}")
                next_report += total // 10 or 1
        for partition, batch in batches.items():
            if batch.record_count():
                pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    elapsed = time.perf_counter() - started
    if sent != total:
        raise RuntimeError(f"produced {sent} records, expected {total}")
    return elapsed


async def end_offset(settings: Settings) -> int:
    consumer = committed_consumer(settings, role="bench-end")
    await consumer.start()
    try:
        tp = TopicPartition(settings.topics.events, 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()

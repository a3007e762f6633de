"""Shared pieces of the benchmarks: progress output, the results table, fast producing.

Not a package module: the benchmark scripts import it from their own folder.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from bridge.config import Settings
from bridge.kafka.clients import committed_consumer

#: (key, value, headers) of one record.
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]
PRODUCE_BATCH_BYTES = 200_000


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


async def produce(settings: Settings, records: Iterable[Record], total: int) -> float:
    """Write ``records`` to events partition 0 as fast as one raw producer goes; returns seconds.

    Hand-built record batches (``create_batch``/``send_batch``), acks=1, no idempotence: the
    fastest way to get a large partition; the acks are gathered in chunks, never one by one.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
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
        batch = producer.create_batch()
        sent = 0
        next_report = total // 10 or 1
        for key, value, headers in records:
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                pending.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    raise RuntimeError("a single record does not fit in an empty batch")
                if len(pending) >= 32:
                    await asyncio.gather(*pending)
                    pending.clear()
            sent += 1
            if sent >= next_report:
                say(f"  produced {sent:,}/{total:,}")
                next_report += total // 10 or 1
        if batch.record_count():
            pending.append(await producer.send_batch(batch, topic, partition=0))
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

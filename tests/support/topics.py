"""Whole topics as data: read every record of a topic, write it out as JSON, replay it.

For tests that look at what the bridge stored (the subscriptions topic holds no clear secret)
and for upgrade fixtures: records a released version wrote, dumped with their partition, key,
value and headers (base64), then replayed into a fresh topic in their partitions and order.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bridge.config import Settings
from bridge.kafka.clients import TopicPartition, committed_consumer, idempotent_producer
from bridge.kafka.port import Log, LogRecord, TopicPart
from bridge.kafka.topics import topic_partition_ids
from bridge.log.restore import read_to_end

__all__ = ["TopicRecord", "replay_records", "topic_records"]


@dataclass(frozen=True)
class TopicRecord:
    """One record as the log holds it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, bytes as base64 (``null`` for a missing key or a tombstone)."""
        return {
            "partition": self.partition,
            "offset": self.offset,
            "key": _b64(self.key),
            "value": _b64(self.value),
            "headers": [[name, _b64(value)] for name, value in self.headers],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicRecord:
        return cls(
            int(data["partition"]),
            int(data["offset"]),
            _unb64(data["key"]),
            _unb64(data["value"]),
            tuple((str(name), _unb64(value) or b"") for name, value in data["headers"]),
        )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


async def topic_records(
    settings: Settings, topic: str | None = None, *, log: Log | None = None
) -> list[TopicRecord]:
    """Every record of ``topic`` (the subscriptions topic by default) up to its current end,
    in partition then offset order; from ``log`` when given (else the broker of ``settings``)."""
    name = topic or settings.topics.subscriptions
    if log is not None:
        return await _port_records(log, name)
    partitions = [TopicPartition(name, p) for p in await topic_partition_ids(settings, name)]
    consumer = committed_consumer(settings, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[TopicRecord] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batches = await consumer.getmany(timeout_ms=1000)
            for tp, batch in batches.items():
                records.extend(
                    TopicRecord(tp.partition, r.offset, r.key, r.value, tuple(r.headers))
                    for r in batch
                )
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


async def _port_records(log: Log, topic: str) -> list[TopicRecord]:
    records: list[TopicRecord] = []

    def keep(r: LogRecord) -> None:
        records.append(TopicRecord(r.partition, r.offset, r.key, r.value, tuple(r.headers)))

    parts = [TopicPart(topic, p) for p in await log.partitions(topic)]
    await read_to_end(log, parts, keep, role="test")
    return sorted(records, key=lambda r: (r.partition, r.offset))


async def replay_records(
    settings: Settings, topic: str, records: Iterable[TopicRecord], *, log: Log | None = None
) -> None:
    """Write ``records`` to ``topic`` in their own partitions, in the given order; to ``log``
    when given (else the broker of ``settings``)."""
    if log is not None:
        writer = log.producer()
        await writer.start()
        try:
            for record in records:
                await writer.send(
                    topic,
                    record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=record.headers,
                )
        finally:
            await writer.close()
        return
    producer = idempotent_producer(settings)
    await producer.start()
    try:
        for record in records:
            await producer.send_and_wait(
                topic,
                record.value,
                key=record.key,
                partition=record.partition,
                headers=list(record.headers),
            )
    finally:
        await producer.stop()

"""Whole topics as data: read every record of a topic, write it out as JSON, replay it.

For tests that look at what the bridge stored (the subscriptions topic holds no clear secret)
and for upgrade fixtures: records a released version wrote, dumped with their partition, key,
value and headers (base64), then replayed into a fresh topic in their partitions and order.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log, LogRecord, TopicPart
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
    async with _on(settings, log) as port:
        return await _port_records(port, name)


@contextlib.asynccontextmanager
async def _on(settings: Settings, log: Log | None) -> AsyncIterator[Log]:
    """``log``, or a Kafka log on the broker of ``settings`` for the block's length."""
    if log is not None:
        yield log
        return
    kafka = KafkaLog(settings, pool_size=1, role="test")
    try:
        yield kafka
    finally:
        await kafka.close()


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
    async with _on(settings, log) as port, port.producer() as writer:
        for record in records:
            await writer.send(
                topic,
                record.value,
                key=record.key,
                partition=record.partition,
                headers=record.headers,
            )

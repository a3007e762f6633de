"""The producer SDK for job pipelines: publish task events into the events topic.

``TaskEventPublisher`` writes one record per event with key = task id (so every event of a
task lands in one partition, in order), through an idempotent acks=all producer, in the Avro
envelope by default. It never assigns seq: the indexer derives it from the log, which is what
lets any other producer (kcat, an existing pipeline) write to the same task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bridge.component import Component
from bridge.config import Settings
from bridge.envelope import TaskEvent, encode_event
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log, Producer
from bridge.log.identity import Keyring, load_keyring
from bridge.tracing import record_headers

__all__ = ["EventTooLarge", "Published", "TaskEventPublisher", "UnprefixedEventType"]


class UnprefixedEventType(ValueError):
    """SEP-2694 reserves unprefixed event types for MCP itself."""

    def __init__(self, event_type: str) -> None:
        super().__init__(
            f"event type {event_type!r} has no vendor prefix: use a reverse-DNS prefix under a "
            f"real top-level domain such as 'com.example.{event_type or 'thing'}', or a prefix "
            "listed in tasks.accepted_event_prefixes (unprefixed types are reserved for MCP)"
        )


class EventTooLarge(ValueError):
    """The encoded event exceeds ``tasks.max_event_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"encoded event is {size} bytes, over the {limit}-byte limit (BRIDGE_TASKS__MAX_EVENT_BYTES); "
            "put large data in an artifact and reference it from the event"
        )
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Published:
    """Where Kafka stored the event."""

    partition: int
    offset: int


class TaskEventPublisher(Component):
    """Publishes task events; use as ``async with TaskEventPublisher(settings) as pub``."""

    def __init__(
        self,
        settings: Settings,
        *,
        fmt: Literal["avro", "json"] = "avro",
        keyring: Keyring | None = None,
        log: Log | None = None,
    ) -> None:
        """``log``: where the events are written (default: the Kafka cluster of ``settings``;
        tests and the simulation give the in-memory log)."""
        self.settings = settings
        self.fmt: Literal["avro", "json"] = fmt
        self._log = log
        self._producer: Producer | None = None
        self._keyring = keyring

    @property
    def keyring(self) -> Keyring:
        """The keys that sign the task identities this publisher writes (loaded on first use:
        a pipeline's publisher never needs them)."""
        if self._keyring is None:
            self._keyring = load_keyring(self.settings)
        return self._keyring

    async def start(self) -> None:
        log = self._log if self._log is not None else KafkaLog(self.settings, pool_size=1)
        producer = log.producer("publisher")
        await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None

    def encode(
        self,
        event_type: str,
        payload: dict[str, Any],
        meta: dict[str, Any] | None = None,
        timestamp_ms: int | None = None,
    ) -> tuple[bytes, list[tuple[str, bytes]]]:
        """Validate and encode one event (raises before anything is sent)."""
        if not self.settings.type_rule.is_prefixed(event_type):
            raise UnprefixedEventType(event_type)
        event = (
            TaskEvent(event_type, payload, meta)
            if timestamp_ms is None
            else TaskEvent(event_type, payload, meta, timestamp_ms)
        )
        value, headers = encode_event(event, fmt=self.fmt)
        if len(value) > self.settings.tasks.max_event_bytes:
            raise EventTooLarge(len(value), self.settings.tasks.max_event_bytes)
        return value, headers

    async def publish(
        self,
        task_id: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        meta: dict[str, Any] | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Published:
        """Publish one event and wait until Kafka acknowledged it on all in-sync replicas;
        ``headers`` are added to the record's (the bridge's own identity signature)."""
        if self._producer is None:
            raise RuntimeError("publisher not started: use `async with TaskEventPublisher(...)`")
        if not task_id:
            raise ValueError("task_id must be a non-empty string")
        value, own = self.encode(event_type, payload, meta, timestamp_ms)
        sent = await self._producer.send(
            self.settings.topics.events,
            value,
            key=task_id.encode("utf-8"),
            headers=[*own, *(headers or ()), *record_headers()],  # trace context, if tracing
        )
        return Published(sent.partition, sent.offset)

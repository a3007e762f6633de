"""From a consumed Kafka record to what the log side works with: task id and event.

A record that does not decode still occupies its seq: it becomes a placeholder event of the
bridge's own prefixed type (``<prefix>.event.undecodable`` or ``<prefix>.event.oversized``)
describing why, so no event is ever dropped and no bad record can crash a reader.

:func:`task_facts_of` reads the facts a record may state about its task (created, a status). Anyone who can write
to the events topic writes records, so it is strict: a status counts only under its exact wire
name, and an identity only from a well-formed ``task.created`` payload (the index then takes
it only from the task's seq 0).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from bridge.envelope import EnvelopeError, EnvelopeTooLarge, TaskEvent, decode_event
from bridge.events import REVERSE_DNS_ONLY, EventTypeRule, TaskEventTypes, TaskStatus
from bridge.kafka.clients import ConsumerRecord
from bridge.log.seqindex import TaskIdentity, owner_key

__all__ = ["event_from_record", "task_facts_of", "task_id_of"]


def task_id_of(record: ConsumerRecord[bytes, bytes]) -> str | None:
    """The record's task id (its key), or None for keyless or non-UTF-8 keys."""
    key: bytes | None = record.key
    if not key:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def event_from_record(
    record: ConsumerRecord[bytes, bytes],
    *,
    prefix: str,
    max_bytes: int,
    types: EventTypeRule = REVERSE_DNS_ONLY,
) -> TaskEvent:
    """Decode the record's event, or describe why it cannot be decoded (never raises).

    ``types`` decides which types are vendor-prefixed: pass ``settings.type_rule`` so the
    configured ``accepted_event_prefixes`` count; the default knows reverse-DNS types only.
    """
    try:
        event = decode_event(
            record.value,
            record.headers,
            max_bytes=max_bytes,
            record_timestamp_ms=record.timestamp,
        )
        if not types.is_prefixed(event.type):
            # A foreign producer's unprefixed type: SEP-2694 forbids emitting it, so it is
            # delivered under our prefix with the original type inside; it keeps its seq.
            payload: dict[str, Any] = {"type": event.type, "payload": event.payload}
            unprefixed = TaskEventTypes.of(prefix).unprefixed
            return TaskEvent(unprefixed, payload, event.meta, event.timestamp_ms)
        return event
    except EnvelopeTooLarge:
        size = len(record.value or b"")
        payload = {"offset": record.offset, "bytes": size, "limitBytes": max_bytes}
        oversized = TaskEventTypes.of(prefix).oversized
        return TaskEvent(oversized, payload, None, record.timestamp)
    except EnvelopeError as exc:
        payload = {"offset": record.offset, "reason": exc.reason, "error": exc.message}
        undecodable = TaskEventTypes.of(prefix).undecodable
        return TaskEvent(undecodable, payload, None, record.timestamp)


def task_facts_of(
    event: TaskEvent, prefix: str
) -> tuple[bool, TaskStatus | None, TaskIdentity | None]:
    """``(is task.created, announced status, the created task's identity)`` of an event.

    The status is None unless the payload names one by its exact wire name.
    """
    types = TaskEventTypes.of(prefix)
    if event.type == types.created:
        return True, None, _identity(event.payload)
    if event.type == types.status:
        return False, TaskStatus.from_wire(event.payload.get("status")), None
    return False, None, None


def _identity(payload: dict[str, Any]) -> TaskIdentity | None:
    owner, created, ttl, poll = (
        payload.get(k) for k in ("owner", "createdMs", "ttlMs", "pollIntervalMs")
    )
    if not (isinstance(owner, str) and len(owner) >= 16 and _count(created) and _count(poll)):
        return None
    if ttl is not None and not _count(ttl):
        return None
    try:
        key = owner_key(owner)
    except ValueError:
        return None
    return TaskIdentity(key, created, -1 if ttl is None else ttl, poll)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

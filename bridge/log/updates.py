"""Task updates: one record per status change, written by the owner of the task's partition.

Where it sits: the indexer folds each task's status events into its state (bridge.log.seqindex);
every change it folds is also written, in the same Kafka transaction as that partition's index
flush, to the ``<prefix>.task-updates`` topic, keyed by the task owner's key. So each change
appears there exactly once whichever replica owned the partition, and a reader of one owner's
updates (the Events extension's ``task.updated`` source) reads one partition of one topic
instead of scanning the events topic.

The format (``v`` 1), a UTF-8 JSON object::

    key   = the owner digest's first 64 bits as 16 lowercase hex digits (see :func:`owner_hex`)
    value = {"v": 1, "taskId": str, "seq": int, "status": "working" | "input_required" |
             "completed" | "failed" | "cancelled", "statusMessage": str (optional),
             "partition": int, "offset": int, "ts": int (the status record's timestamp, ms),
             "owner": the whole owner digest, 32 lowercase hex digits}

The key only routes (all of one principal's updates share a partition); readers match the
whole digest in ``owner``. Records written by 8fd441c have no ``owner``: they are matched on
the key's 64 bits, as they were then.

A task's ``task.created`` event (seq 0) yields its first record, status ``working``.

What it does not do: decide what changed (the index does) or read the topic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bridge.log.seqindex import owner_key, owner_prefix

__all__ = ["TaskUpdate", "UpdateRecordError", "decode_update", "owner_hex"]

_VERSION = 1


class UpdateRecordError(ValueError):
    """A task-updates record this version cannot read."""


def owner_hex(owner: int) -> str:
    """The record key of an owner key (the index's 128-bit form of the principal digest): its
    first 64 bits."""
    return format(owner_prefix(owner), "016x")


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """One status change of one task."""

    owner: int
    task_id: str
    seq: int
    status: str
    partition: int
    offset: int
    ts: int
    status_message: str | None = None
    #: False: ``owner`` holds only the first 64 bits (a record or entry of 8fd441c).
    full_owner: bool = True

    def matches(self, owner: int) -> bool:
        """Whether the owner key ``owner`` owns this update (all 128 bits when known)."""
        if self.full_owner:
            return self.owner == owner
        return owner_prefix(self.owner) == owner_prefix(owner)

    def key(self) -> bytes:
        return owner_hex(self.owner).encode("ascii")

    def value(self) -> bytes:
        body: dict[str, Any] = {
            "v": _VERSION,
            "taskId": self.task_id,
            "seq": self.seq,
            "status": self.status,
            "partition": self.partition,
            "offset": self.offset,
            "ts": self.ts,
        }
        if self.status_message is not None:
            body["statusMessage"] = self.status_message
        if self.full_owner:
            body["owner"] = format(self.owner, "032x")
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_update(key: bytes | None, value: bytes | None) -> TaskUpdate:
    """Decode one record; :class:`UpdateRecordError` on anything this version cannot read."""
    try:
        if key is None or value is None:
            raise ValueError("a record without key or value")
        prefix = int(key.decode("ascii"), 16)
        body = json.loads(value)
        if not isinstance(body, dict) or body.get("v") != _VERSION:
            raise ValueError("not a version 1 object")
        message = body.get("statusMessage")
        full = body.get("owner")
        owner = owner_key(full) if isinstance(full, str) else prefix << 64
        if isinstance(full, str) and owner_prefix(owner) != prefix:
            raise ValueError("the owner does not match the record key")
        update = TaskUpdate(
            owner=owner,
            full_owner=isinstance(full, str),
            task_id=_typed(body, "taskId", str),
            seq=_typed(body, "seq", int),
            status=_typed(body, "status", str),
            partition=_typed(body, "partition", int),
            offset=_typed(body, "offset", int),
            ts=_typed(body, "ts", int),
            status_message=message if isinstance(message, str) else None,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise UpdateRecordError(f"unreadable task-updates record: {exc}") from None
    return update


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{name!r} is not a {kind.__name__}")
    return value

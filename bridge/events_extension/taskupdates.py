"""The ``<prefix>.task.updated`` event type: status changes of the caller's tasks.

Upstream: the ``<prefix>.task-updates`` topic (format in :mod:`bridge.log.updates`), where the
owner of each events partition writes one record per status change it folds, keyed by the task
owner's key. So the updates of one principal are all in one partition (murmur2 of the key, as
Kafka's default partitioner places them), and a subscription reads that one partition and keeps
the records whose key is the caller's: never another principal's tasks.

* **Arguments**: ``{}`` (every task of the caller) or ``{"taskId": id}`` (that task only, with
  tasks/get's authorization: an unknown, expired or foreign task is ``TaskNotFound``; a push
  stream of it ends after its terminal status).
* **Occurrence**: ``eventId`` ``<taskId>.<seq>.updated`` (the status event's seq: the same id
  from every replica, never the id the task's own event type gives that event, see
  :mod:`bridge.events_extension.occurrences`); ``timestamp`` the status
  event's; ``data`` ``{taskId, seq, status, statusMessage?, resultRequest?}``, where
  ``resultRequest`` is the request that returns the outcome (``tasks/get``, which carries
  ``result`` on completed and ``error`` on failed: the 2026-07-28 tasks extension has no
  ``tasks/result``).
* **Cursor**: ``u1.<partition>.<offset>`` (:func:`~bridge.events_extension.cursor.encode_partition`).

Records this version cannot read are skipped and counted, never fatal.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from bridge.events_extension.cursor import BadCursor, decode_partition, encode_partition
from bridge.events_extension.kafkalog import Record
from bridge.events_extension.occurrences import task_update_id
from bridge.events_extension.offsets import Found, OffsetSource, Selection
from bridge.events_extension.skips import Skips
from bridge.events_extension.sources import TaskLookup, validated
from bridge.kafka.clients import partition_for_key
from bridge.log.seqindex import owner_key
from bridge.log.updates import UpdateRecordError, decode_update, owner_hex
from bridge.tasks.messages import owner_digest
from bridge.vocabulary import TERMINAL_WIRE, TaskStatus

__all__ = ["TASK_UPDATE_PAYLOAD_SCHEMA", "TaskUpdates", "owner_record_key"]

#: The statuses after which tasks/get carries more than the status: the result or the error.
_WITH_OUTCOME = frozenset({TaskStatus.COMPLETED.wire, TaskStatus.FAILED.wire})
_STATUSES = sorted(status.wire for status in TaskStatus if status is not TaskStatus.UNKNOWN)

TASK_UPDATE_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "taskId": {
            "type": "string",
            "minLength": 1,
            "description": "Only this task's updates; without it, every task of yours",
        }
    },
    "additionalProperties": False,
}

TASK_UPDATE_PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "taskId": {"type": "string"},
        "seq": {"type": "integer", "minimum": 0, "description": "The status event's seq"},
        "status": {"type": "string", "enum": _STATUSES},
        "statusMessage": {"type": "string"},
        "resultRequest": {
            "type": "object",
            "description": "On completed and failed: the request whose answer carries the "
            "result (or the error)",
            "properties": {
                "method": {"const": "tasks/get"},
                "params": {
                    "type": "object",
                    "properties": {"taskId": {"type": "string"}},
                    "required": ["taskId"],
                },
            },
            "required": ["method", "params"],
        },
    },
    "required": ["taskId", "seq", "status"],
}


def owner_record_key(principal: str) -> bytes:
    """The key of ``principal``'s records in the updates topic."""
    return owner_hex(owner_key(owner_digest(principal))).encode("ascii")


def _owner_of(principal: str) -> int:
    return owner_key(owner_digest(principal))


class TaskUpdates(OffsetSource):
    """Status changes of the caller's tasks (see the module docstring)."""

    def __init__(self, *args: Any, tasks: TaskLookup, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = tasks
        self.skips = Skips(self.name)
        self._validator = jsonschema.Draft202012Validator(TASK_UPDATE_INPUT_SCHEMA)

    def descriptor(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "A status change of one of your tasks (of every task, or of the "
            "one named); resumable from the cursor while the log retains it",
            "delivery": ["poll", "push"],
            "inputSchema": TASK_UPDATE_INPUT_SCHEMA,
            "payloadSchema": TASK_UPDATE_PAYLOAD_SCHEMA,
        }

    async def select(self, principal: str, arguments: dict[str, Any]) -> Selection:
        validated(self._validator, arguments)
        task_id = arguments.get("taskId")
        over = False
        if task_id is not None:
            over = (await self.tasks.get(task_id, principal)).status in TERMINAL_WIRE
        key = owner_record_key(principal)
        partitions = await self.reader.partitions(self.topic)
        partition = partitions[partition_for_key(key, len(partitions))]
        return Selection(
            (partition,),
            functools.partial(self._match, key, _owner_of(principal), task_id),
            ends=functools.partial(_ends_the_task, task_id),
            over=over,
        )

    def _match(self, key: bytes, owner: int, task_id: str | None, record: Record) -> Found | None:
        if record.key != key:
            return None  # another principal's: not even decoded
        try:
            update = decode_update(record.key, record.value)
        except UpdateRecordError:
            self.skips.add("unreadable")
            return None
        if not update.matches(owner):
            return None  # the same first 64 bits, another principal
        if TaskStatus.from_wire(update.status) is None:
            self.skips.add("unknown_status")
            return None
        if task_id is not None and update.task_id != task_id:
            return None
        data: dict[str, Any] = {
            "taskId": update.task_id,
            "seq": update.seq,
            "status": update.status,
        }
        if update.status_message is not None:
            data["statusMessage"] = update.status_message
        if update.status in _WITH_OUTCOME:
            data["resultRequest"] = {"method": "tasks/get", "params": {"taskId": update.task_id}}
        return Found(task_update_id(update.task_id, update.seq), update.ts, data)

    def encode(self, positions: Mapping[int, int]) -> str:
        ((partition, offset),) = positions.items()
        return encode_partition(partition, offset)

    def decode(self, cursor: str, partitions: Sequence[int]) -> dict[int, int]:
        partition, offset = decode_partition(cursor)
        if partition not in partitions:
            raise BadCursor("task update")  # another principal's partition, or another layout
        return {partition: offset}


def _ends_the_task(task_id: str | None, data: dict[str, Any]) -> bool:
    """A subscription to one task ends with its terminal status; one to all tasks never."""
    return task_id is not None and data["status"] in TERMINAL_WIRE

"""What an event source hands to the serving side: occurrences, poll batches, stream items.

Plain data in the SEP-3415 terms (``EventOccurrence`` and the poll result), with the wire
field names applied by :meth:`Occurrence.wire` only; no JSON-RPC framing here (that is
:mod:`bridge.server.events`).

**Event ids** (``eventId``, and so a webhook delivery's ``webhook-id``) are made here only, one
function per kind, so that no two occurrences of one server share an id (receivers deduplicate
on it; docs/events.md, "Event ids"):

* a task's own event (:func:`task_event_id`): ``<taskId>.<seq>``, it ends in digits after a dot;
* a task's status change on ``task.updated`` (:func:`task_update_id`):
  ``<taskId>.<seq>.updated``, it ends in a letter;
* a record of a configured source (:func:`record_event_id`): ``<name>/<partition>-<offset>``, it
  ends in digits after a hyphen, and source names are unique and hold no ``/``.

The three shapes never meet whatever a task id holds; within one kind, the task id and seq, or
the source name and the record's position, are unique. Every part is taken from the log, so an
id is the same on every replica, after restarts and through every delivery mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge.tasks.messages import iso_ms

__all__ = [
    "Active",
    "Heartbeat",
    "Occurrence",
    "PollBatch",
    "StreamItem",
    "record_event_id",
    "task_event_id",
    "task_update_id",
]


def task_event_id(task_id: str, seq: int) -> str:
    """The ``eventId`` of event ``seq`` of task ``task_id`` (``task.event``)."""
    return f"{task_id}.{seq}"


def task_update_id(task_id: str, seq: int) -> str:
    """The ``eventId`` of the status change that event ``seq`` of ``task_id`` made
    (``task.updated``): not the id of that event itself, since the two occurrences differ (name
    and data) and a receiver subscribed to both must get both."""
    return f"{task_id}.{seq}.updated"


def record_event_id(name: str, partition: int, offset: int) -> str:
    """The ``eventId`` of the record at ``offset`` of ``partition`` read by the configured
    source ``name``: its position names the record in its topic, the name the topic (and the
    filters: two sources over one topic deliver two occurrences of a record)."""
    return f"{name}/{partition}-{offset}"


#: The longest decimal partition or offset :func:`record_position` reads (an int64's width).
_MAX_DIGITS = 19


def record_position(name: str, event_id: str) -> tuple[int, int] | None:
    """The (partition, offset) a :func:`record_event_id` of source ``name`` names, or None
    when ``event_id`` is not one (a client's string: checked by plain comparisons)."""
    prefix = f"{name}/"
    if not event_id.startswith(prefix):
        return None
    partition, dash, offset = event_id[len(prefix) :].partition("-")
    if not dash or not _decimal(partition) or not _decimal(offset):
        return None
    return int(partition), int(offset)


def _decimal(text: str) -> bool:
    return 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One event occurrence; ``cursor`` is the subscription's position after it."""

    event_id: str
    name: str
    timestamp_ms: int
    data: dict[str, Any]
    cursor: str | None

    def wire(self, *, with_cursor: bool) -> dict[str, Any]:
        """The ``EventOccurrence`` object (poll carries the cursor at the response level)."""
        out: dict[str, Any] = {
            "eventId": self.event_id,
            "name": self.name,
            "timestamp": iso_ms(self.timestamp_ms),
            "data": self.data,
        }
        if with_cursor:
            out["cursor"] = self.cursor
        return out


@dataclass(frozen=True, slots=True)
class PollBatch:
    """The answer to one ``events/poll``."""

    events: list[Occurrence]
    cursor: str | None
    truncated: bool
    has_more: bool
    next_poll_ms: int
    #: With ``truncated``: the position the read went on from after its last skip, before any
    #: event of the batch (where a new webhook subscription starts, the fresh cursor).
    resumed: str | None = None


@dataclass(frozen=True, slots=True)
class Active:
    """Delivery (re)starts at ``cursor``; ``truncated``: events before it were skipped."""

    cursor: str | None
    truncated: bool


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing to send; everything up to ``cursor`` has been checked."""

    cursor: str | None


StreamItem = Active | Occurrence | Heartbeat

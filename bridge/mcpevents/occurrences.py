"""What an event source hands to the serving side: occurrences, poll batches, stream items.

Plain data in the draft's terms (SEP-3415 ``EventOccurrence`` and the poll result), with the
wire field names applied by :meth:`Occurrence.wire` only; no JSON-RPC framing here (that is
:mod:`bridge.server.events`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge.tasks.messages import iso_ms

__all__ = ["Active", "Heartbeat", "Occurrence", "PollBatch", "StreamItem"]


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

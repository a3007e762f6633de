"""Names shared across the package: event type suffixes, task statuses, index record keys.

The bridge's own event types are ``<event_type_prefix>.<suffix>`` with the configurable vendor
prefix of :class:`bridge.config.Settings`; the suffixes live here so that producer, indexer and
server agree on them.
"""

from __future__ import annotations

import re
from enum import IntEnum

__all__ = [
    "PREFIXED_TYPE",
    "TERMINAL_STATUSES",
    "EventSuffix",
    "TaskStatus",
    "is_prefixed_type",
]


class EventSuffix:
    """Suffixes of the bridge's own event types (prefix them with the vendor prefix)."""

    CREATED = "task.created"
    STATUS = "task.status"
    PROGRESS = "progress"
    UNDECODABLE = "event.undecodable"
    OVERSIZED = "event.oversized"
    UNPREFIXED = "event.unprefixed"


class TaskStatus(IntEnum):
    """Task statuses of the tasks extension; the int is what the index stores."""

    UNKNOWN = 0
    WORKING = 1
    INPUT_REQUIRED = 2
    COMPLETED = 3
    FAILED = 4
    CANCELLED = 5

    @property
    def wire(self) -> str:
        return self.name.lower()

    @classmethod
    def from_wire(cls, value: object) -> TaskStatus | None:
        if isinstance(value, str) and value.upper() in cls.__members__ and value != "unknown":
            return cls[value.upper()]
        return None


TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})

#: A vendor-prefixed event type: a reverse-DNS prefix of at least two labels, then a name.
#: ``content.partial`` or ``task.status`` are unprefixed (reserved for MCP) and do not match.
PREFIXED_TYPE = re.compile(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def is_prefixed_type(event_type: str) -> bool:
    """True for types with a vendor prefix, e.g. ``com.example.review.comment``."""
    return len(event_type) <= 256 and PREFIXED_TYPE.match(event_type) is not None

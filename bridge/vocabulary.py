"""The task-event vocabulary: one home for what producers, the log side and the server share.

* the bridge's own event types, ``<tasks.event_type_prefix>.<suffix>`` (:class:`TaskEventTypes`);
* task statuses (:class:`TaskStatus`: the wire name, and the int the index stores);
* the payloads of ``task.created`` and status events (:class:`CreatedPayload`,
  :class:`StatusPayload`), which workers write and the index and tasks/get read;
* the JSON-RPC error codes those payloads and the wire carry;
* the rule (:class:`EventTypeRule`) that tells a vendor-prefixed event type from one SEP-2694
  reserves for MCP.

``bridge.log`` and ``bridge.tasks`` both import it; nothing else spells these names. It knows
nothing of Kafka, HTTP or JSON-RPC messages (:mod:`bridge.server.wire` has those). The Events
extension (SEP-3415), whose events are not only a task's, is :mod:`bridge.events_extension`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from functools import cache, lru_cache
from typing import Any, Literal

from publicsuffixlist import PublicSuffixList
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EVENTS_GONE",
    "FORBIDDEN",
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "MISSING_CAPABILITY",
    "NOT_FOUND",
    "PARSE_ERROR",
    "REVERSE_DNS_ONLY",
    "TERMINAL_STATUSES",
    "TERMINAL_WIRE",
    "UNSUPPORTED",
    "UNSUPPORTED_VERSION",
    "CreatedPayload",
    "EventSuffix",
    "EventTypeRule",
    "StatusPayload",
    "StatusWire",
    "TaskEventTypes",
    "TaskStatus",
    "error_object",
    "is_prefixed_type",
    "is_top_level_domain",
]

# --- JSON-RPC error codes ----------------------------------------------------------------------

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: SEP-2694's events_gone; it sits in the legacy -32000..-32019 band (see docs/).
EVENTS_GONE = -32010
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022
#: The Events extension's (SEP-3415, as numbered in the text docs/events.md follows).
NOT_FOUND = -32023
FORBIDDEN = -32024
UNSUPPORTED = -32026


def error_object(code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error object ``{code, message, data?}`` (the wire, and failed statuses)."""
    out: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        out["data"] = data
    return out


# --- event types -------------------------------------------------------------------------------


class EventSuffix:
    """Suffixes of the bridge's own event types (:class:`TaskEventTypes` prefixes them)."""

    CREATED = "task.created"
    STATUS = "task.status"
    PROGRESS = "progress"
    UNDECODABLE = "event.undecodable"
    OVERSIZED = "event.oversized"
    UNPREFIXED = "event.unprefixed"


@dataclass(frozen=True, slots=True)
class TaskEventTypes:
    """The bridge's own event types under one vendor prefix: ``types.status`` is
    ``io.mcpbridge.task.status`` for the default prefix. Get one with :meth:`of`."""

    prefix: str
    created: str
    status: str
    progress: str
    undecodable: str
    oversized: str
    unprefixed: str

    @staticmethod
    @cache
    def of(prefix: str) -> TaskEventTypes:
        s = EventSuffix
        return TaskEventTypes(
            prefix,
            *(
                f"{prefix}.{suffix}"
                for suffix in (
                    s.CREATED,
                    s.STATUS,
                    s.PROGRESS,
                    s.UNDECODABLE,
                    s.OVERSIZED,
                    s.UNPREFIXED,
                )
            ),
        )


# --- task status -------------------------------------------------------------------------------


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
        """The status whose wire name is exactly ``value``; None for anything else.

        Strict on purpose: any producer can write status events, and a lenient parse (other
        case, ``"unknown"``) would let one fold a task back to a state it never had.
        """
        return _BY_WIRE.get(value) if isinstance(value, str) else None


_BY_WIRE = {status.wire: status for status in TaskStatus if status is not TaskStatus.UNKNOWN}

TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})

#: The wire names of the terminal statuses.
TERMINAL_WIRE = frozenset(status.wire for status in TERMINAL_STATUSES)

#: A status as the wire and the status event payload spell it.
StatusWire = Literal["working", "input_required", "completed", "failed", "cancelled"]


# --- the task.created and status payloads -----------------------------------------------------


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        dumped: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True)
        return dumped


class CreatedPayload(_Payload):
    """``<prefix>.task.created``: every task's seq 0, written by the bridge's create path."""

    tool: str
    owner: str
    created_ms: int = Field(alias="createdMs")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int = Field(alias="pollIntervalMs")


class StatusPayload(_Payload):
    """``<prefix>.task.status``: a status change with what tasks/get shows."""

    status: StatusWire
    status_message: str | None = Field(default=None, alias="statusMessage")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")

    def payload(self) -> dict[str, Any]:
        return self.to_dict()

    @property
    def terminal(self) -> bool:
        return TaskStatus.from_wire(self.status) in TERMINAL_STATUSES

    @classmethod
    def failed(
        cls, message: str, status_message: str | None = None, *, code: int = INTERNAL_ERROR
    ) -> StatusPayload:
        """A ``failed`` status whose error is ``{code, message}`` (an internal error by default)."""
        return cls(
            status="failed", status_message=status_message, error=error_object(code, message)
        )


# --- the vendor-prefix rule --------------------------------------------------------------------

#: Dot-separated DNS labels (RFC 1035 / 1123): letters, digits and inner hyphens, at most 63
#: characters each. One pattern for the whole name: it runs for every record indexed.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_MAX_TYPE_CHARS = 256


@cache
def _icann_suffixes() -> PublicSuffixList:
    # Private-section entries (github.io, blogspot.com, ...) are registrable names, not TLDs;
    # unknown labels must not count either (the list's default rule would accept any label).
    return PublicSuffixList(only_icann=True, accept_unknown=False)


@lru_cache(maxsize=4096)
def is_top_level_domain(label: str) -> bool:
    """True when ``label`` is an ICANN top-level domain (``com``, ``io``, ``dev``, ``uk``, ...).

    Cached per label: the indexer asks for every record's type, and first labels repeat.
    """
    return "." not in label and _icann_suffixes().is_public(label.lower())


def _is_dns_name(name: str) -> bool:
    return len(name) <= _MAX_TYPE_CHARS and _DNS_NAME.fullmatch(name) is not None


def _under_a_tld(name: str, min_labels: int) -> bool:
    return name.count(".") >= min_labels - 1 and is_top_level_domain(name.partition(".")[0])


class EventTypeRule:
    """Which event types carry a vendor prefix (SEP-2694 reserves all others for MCP).

    A type is prefixed when every label is a DNS label and either it starts with one of the
    ``accepted`` prefixes followed by at least one more label, or it is reverse-DNS: at least
    three labels whose first is a real top-level domain (``com.example.review.comment``).
    ``tool.call.started`` has three labels but no vendor behind it, so it is not prefixed.
    """

    def __init__(self, accepted: Iterable[str] = ()) -> None:
        self.accepted = tuple(accepted)
        bad = [prefix for prefix in self.accepted if not _is_dns_name(prefix)]
        if bad:
            raise ValueError(
                f"accepted event type prefixes must be dot-separated DNS labels "
                f"(e.g. 'acme.internal'), not {bad}"
            )
        self._starts = tuple(f"{prefix}." for prefix in self.accepted)

    def is_prefixed(self, event_type: str) -> bool:
        """True for ``com.example.thing`` or ``<accepted prefix>.thing``."""
        if not _is_dns_name(event_type):
            return False
        return event_type.startswith(self._starts) or _under_a_tld(event_type, 3)

    def is_namespace(self, prefix: str) -> bool:
        """True when ``prefix`` may head event types: accepted, or reverse-DNS of 2+ labels."""
        if not _is_dns_name(prefix):
            return False
        accepted = prefix in self.accepted or prefix.startswith(self._starts)
        return accepted or _under_a_tld(prefix, 2)


#: The rule without configured prefixes: reverse-DNS types under a real top-level domain only.
REVERSE_DNS_ONLY = EventTypeRule()


def is_prefixed_type(event_type: str, accepted: Iterable[str] = ()) -> bool:
    """True for types with a vendor prefix, e.g. ``com.example.review.comment``.

    See :class:`EventTypeRule`; ``accepted`` are extra configured vendor prefixes.
    """
    rule = EventTypeRule(accepted) if accepted else REVERSE_DNS_ONLY
    return rule.is_prefixed(event_type)

"""Names shared across the package: event type suffixes, task statuses, index record keys.

The bridge's own event types are ``<event_type_prefix>.<suffix>`` with the configurable vendor
prefix of :class:`bridge.config.Settings`; the suffixes live here so that producer, indexer and
server agree on them, and so does the rule (:class:`EventTypeRule`) that tells a vendor-prefixed
event type from one SEP-2694 reserves for MCP.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum
from functools import cache, lru_cache

from publicsuffixlist import PublicSuffixList

__all__ = [
    "REVERSE_DNS_ONLY",
    "TERMINAL_STATUSES",
    "EventSuffix",
    "EventTypeRule",
    "TaskStatus",
    "is_prefixed_type",
    "is_top_level_domain",
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
        """The status whose wire name is exactly ``value``; None for anything else.

        Strict on purpose: any producer can write status events, and a lenient parse (other
        case, ``"unknown"``) would let one fold a task back to a state it never had.
        """
        return _BY_WIRE.get(value) if isinstance(value, str) else None


_BY_WIRE = {status.wire: status for status in TaskStatus if status is not TaskStatus.UNKNOWN}

TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})

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

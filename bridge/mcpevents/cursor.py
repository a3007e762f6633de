"""Opaque cursors of the Events extension (SEP-3415): positions a client stores and hands back.

A cursor is base64url (no padding) of a short versioned text, so a client cannot mistake it for
a number to do arithmetic on, and a later version can change the text without breaking old
cursors (an unknown version is refused, never guessed at). Cursors carry only log positions,
never replica state: any replica, before or after a restart, reads the same position.

* a task's own events: ``t1.<last>``, the seq of the last event the client has (``-1``: none);
* an ``events/list`` page: ``p1.<index>``, the first entry of the page.

This module is pure: no Kafka, no JSON-RPC. A malformed cursor raises :class:`BadCursor`.
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["BadCursor", "decode_page", "decode_task", "encode_page", "encode_task"]

_TASK = "t1"
_PAGE = "p1"
#: The largest seq (seq counts records at Kafka's int64 offsets).
_MAX_SEQ = 2**63 - 1


class BadCursor(ValueError):
    """A cursor this server did not mint (or a version it no longer reads)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"not a {what} cursor of this server")


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("ascii")).rstrip(b"=").decode("ascii")


def _decode(cursor: str, version: str, what: str) -> int:
    """The integer after ``<version>.`` in ``cursor``; BadCursor for anything else."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii")
    except (UnicodeError, binascii.Error, ValueError):
        raise BadCursor(what) from None
    head, _, number = text.partition(".")
    if head != version or not number.lstrip("-").isdigit() or number.startswith("+"):
        raise BadCursor(what)
    value = int(number)
    if not -1 <= value <= _MAX_SEQ or text != f"{version}.{value}":
        raise BadCursor(what)  # one spelling per position: no "-0", no leading zeros
    return value


def encode_task(last: int) -> str:
    """The cursor after seq ``last`` of a task's events (``-1``: before its first event)."""
    return _encode(f"{_TASK}.{last}")


def decode_task(cursor: str) -> int:
    """The seq :func:`encode_task` was given."""
    return _decode(cursor, _TASK, "task event")


def encode_page(index: int) -> str:
    """The ``events/list`` cursor of the page starting at entry ``index``."""
    return _encode(f"{_PAGE}.{index}")


def decode_page(cursor: str) -> int:
    index = _decode(cursor, _PAGE, "events/list")
    if index < 0:
        raise BadCursor("events/list")
    return index

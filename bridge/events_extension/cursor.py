"""Opaque cursors of the Events extension (SEP-3415): positions a client stores and hands back.

A cursor is base64url (no padding) of a short versioned text, so a client cannot mistake it for
a number to do arithmetic on, and a later version can change the text without breaking old
cursors (an unknown version is refused, never guessed at). Cursors carry only log positions,
never replica state: any replica, before or after a restart, reads the same position.

* a task's own events: ``t2.<tag>.<last>``, the seq of the last event the client has (``-1``:
  none), ``tag`` 8 hex digits of the task id's SHA-256 so that a cursor of one task is not
  taken for another's; ``t1.<last>`` (minted before the tag, no task named) is still read;
* an ``events/list`` page: ``p1.<index>``, the first entry of the page;
* a topic partition read by offset (``task.updated``, the owner's partition of the updates
  topic): ``u1.<partition>.<offset>``, the next offset to read;
* every partition of a topic (a configured source): ``k1.<tag>.<offset 0>.<offset 1>...``, the
  next offset to read in each partition by number, ``tag`` 8 hex digits of the topic name's
  SHA-256 so that one source's cursor is never taken for another's.

This module is pure: no Kafka, no JSON-RPC. A malformed cursor raises :class:`BadCursor`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping

__all__ = [
    "BadCursor",
    "decode_offsets",
    "decode_page",
    "decode_partition",
    "decode_task",
    "encode_offsets",
    "encode_page",
    "encode_partition",
    "encode_task",
    "topic_tag",
]

_TASK = "t2"
#: The task cursor before it named its task: still read (clients hold them), never minted.
_TASK_V1 = "t1"
_PAGE = "p1"
_PARTITION = "u1"
_OFFSETS = "k1"
#: The longest offsets cursor read: 8 KiB of text holds ~400 partitions at 20 digits each, more
#: than a pipeline's topic has; a longer one is not of this server.
_MAX_TEXT = 8192
#: The largest seq (seq counts records at Kafka's int64 offsets).
_MAX_SEQ = 2**63 - 1
_MAX_DIGITS = len(str(_MAX_SEQ))


class BadCursor(ValueError):
    """A cursor this server did not mint (or a version it no longer reads)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"not a {what} cursor of this server")


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("ascii")).rstrip(b"=").decode("ascii")


def _text(cursor: str, what: str) -> str:
    """The text inside ``cursor``; BadCursor when it is not base64url of ASCII."""
    if len(cursor) > _MAX_TEXT * 4 // 3 + 4:
        raise BadCursor(what)
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii")
    except (UnicodeError, binascii.Error, ValueError):
        raise BadCursor(what) from None


def _number(text: str, what: str, *, low: int = 0) -> int:
    """``text`` as an integer in ``low..2**63-1`` spelled the one way this module writes it."""
    digits = text.removeprefix("-")
    # At most 19 digits (int() of a long run is slow, and past 4300 digits raises ValueError).
    if not (0 < len(digits) <= _MAX_DIGITS and digits.isascii() and digits.isdigit()):
        raise BadCursor(what)
    value = int(text)
    if not low <= value <= _MAX_SEQ or text != str(value):
        raise BadCursor(what)  # one spelling per position: no "-0", no leading zeros
    return value


def _fields(cursor: str, version: str, what: str) -> list[str]:
    """The dot-separated fields after ``<version>.`` in ``cursor``."""
    head, *fields = _text(cursor, what).split(".")
    if head != version or not fields:
        raise BadCursor(what)
    return fields


def _decode(cursor: str, version: str, what: str) -> int:
    """The integer after ``<version>.`` in ``cursor``; BadCursor for anything else."""
    fields = _fields(cursor, version, what)
    if len(fields) != 1:
        raise BadCursor(what)
    return _number(fields[0], what, low=-1)


def encode_task(last: int, task_id: str | None = None) -> str:
    """The cursor after seq ``last`` of the events of ``task_id`` (``-1``: before its first
    event); without ``task_id``, the version 1 cursor that names no task (tests, old clients)."""
    if task_id is None:
        return _encode(f"{_TASK_V1}.{last}")
    return _encode(f"{_TASK}.{topic_tag(task_id)}.{last}")


def decode_task(cursor: str, task_id: str | None = None) -> int:
    """The seq :func:`encode_task` was given; BadCursor for a cursor minted for another task
    than ``task_id`` (a version 1 cursor names none: it is taken for any)."""
    what = "task event"
    if _text(cursor, what).split(".", 1)[0] == _TASK_V1:
        return _decode(cursor, _TASK_V1, what)
    fields = _fields(cursor, _TASK, what)
    if len(fields) != 2 or (task_id is not None and fields[0] != topic_tag(task_id)):
        raise BadCursor(what)
    return _number(fields[1], what, low=-1)


def encode_page(index: int) -> str:
    """The ``events/list`` cursor of the page starting at entry ``index``."""
    return _encode(f"{_PAGE}.{index}")


def decode_page(cursor: str) -> int:
    index = _decode(cursor, _PAGE, "events/list")
    if index < 0:
        raise BadCursor("events/list")
    return index


def encode_partition(partition: int, offset: int) -> str:
    """The cursor before ``offset`` of ``partition`` (the next record to read)."""
    return _encode(f"{_PARTITION}.{partition}.{offset}")


def decode_partition(cursor: str) -> tuple[int, int]:
    """The partition and offset :func:`encode_partition` was given."""
    fields = _fields(cursor, _PARTITION, "task update")
    if len(fields) != 2:
        raise BadCursor("task update")
    partition, offset = (_number(field, "task update") for field in fields)
    return partition, offset


def topic_tag(topic: str) -> str:
    """What a cursor carries of its topic (or task): 8 hex digits of the name's SHA-256."""
    return hashlib.sha256(topic.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def encode_offsets(tag: str, offsets: Mapping[int, int]) -> str:
    """The cursor before ``offsets[p]`` of each partition ``p`` (numbered from 0, none left
    out) of the topic whose :func:`topic_tag` is ``tag``."""
    vector = [offsets[partition] for partition in range(len(offsets))]
    return _encode(".".join([_OFFSETS, tag, *map(str, vector)]))


def decode_offsets(cursor: str, tag: str) -> dict[int, int]:
    """The offsets :func:`encode_offsets` was given; BadCursor for another topic's cursor."""
    fields = _fields(cursor, _OFFSETS, "event source")
    if fields[0] != tag or len(fields) < 2:
        raise BadCursor("event source")
    return {p: _number(field, "event source") for p, field in enumerate(fields[1:])}

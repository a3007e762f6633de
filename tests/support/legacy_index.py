"""Index records as 8fd441c and earlier wrote them (versions 1 and 2), for upgrade tests.

Their layout is written out here on purpose, not taken from bridge.log.seqindex: the tests
must hold the current reader to the bytes old versions really wrote.
"""

from __future__ import annotations

import struct

from bridge.log.seqindex import TaskEntry

_TASK = struct.Struct("<BiqqBBqqqqq")
_MARKER = struct.Struct("<Bqq")


def legacy_task_value(entry: TaskEntry, partition: int, version: int = 2) -> bytes:
    """``entry`` as a version 1 or 2 task record: a signed 64-bit owner (the digest's first
    16 hex digits)."""
    prefix = entry.owner >> 64
    owner = prefix - (1 << 64) if prefix >= 1 << 63 else prefix
    head = _TASK.pack(
        version,
        partition,
        entry.next_seq,
        entry.last_offset,
        int(entry.status),
        entry.flags,
        entry.status_offset,
        owner,
        entry.created_ms,
        entry.ttl_ms,
        entry.poll_ms,
    )
    return head + entry.checkpoints.tobytes()


def legacy_marker_value(through: int, lost_before: int, version: int = 2) -> bytes:
    """A version 1 or 2 marker record."""
    return _MARKER.pack(version, through, lost_before)

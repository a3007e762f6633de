"""The seq index: per-task counts and checkpoints derived from one events partition.

This module is pure data: no Kafka, no I/O. :meth:`PartitionIndex.apply` is the one rule of
the design (docs/architecture.md): a record's seq is the number of earlier committed records
with its key in the partition, made idempotent: a record at or below a task's ``last_offset`` was already
counted and is ignored, so replaying from any older position derives the same seq again.

Per task it keeps ``next_seq``, ``last_offset``, a sparse list of ``(seq, offset)`` checkpoints
(one every ``K`` events, seq 0 included) and the folded status. Per partition it keeps the
``through`` offset (every record below it has been applied) and, if retention ever deleted
records before they were counted, the offset where counting resumed (``lost_before``).

Index records (the compacted ``<prefix>.task-index`` topic) are small fixed-layout structs:

* key ``t:<taskId>`` → ``<B i q q B B q Q Q q q q`` (version 3: version, partition, next_seq,
  last_offset, status, flags, status_offset, owner (128 bits, high then low half), created_ms,
  ttl_ms, poll_ms) followed by ``<q q`` per checkpoint;
* key ``p:<partition>`` → ``<B q q q`` (version 3: version, through, lost_before,
  unsigned_below).

Versions 1 and 2 (8fd441c and before) are still read: their owner is the digest's first 64
bits (the entry is marked :data:`FLAG_OWNER_PREFIX` and compared on those bits only), and a
version 2 marker means the partition was indexed before identities were signed
(:attr:`PartitionIndex.unsigned_below` is then chosen by the indexer, once).

During a rolling upgrade from 8fd441c (:attr:`PartitionIndex.legacy`) a partition is written
in version 2, byte for byte as 8fd441c writes it, so that its replicas can still take it: the
owner is then the digest's first 64 bits and the marker says nothing of ``unsigned_below``.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

from bridge.vocabulary import TERMINAL_STATUSES, TaskStatus

__all__ = [
    "FLAG_OWNER_PREFIX",
    "FLAG_UNTRUSTED",
    "UNSIGNED_UNDECIDED",
    "IndexRecordError",
    "MarkerRecord",
    "PartitionIndex",
    "TaskEntry",
    "TaskIdentity",
    "TaskRecord",
    "decode_index_record",
    "legacy_owner_key",
    "marker_key",
    "owner_key",
    "owner_prefix",
    "task_key",
]

#: The status of each stored code (the index's bytearray holds TaskStatus values).
_STATUS_OF = {int(status): status for status in TaskStatus}

#: 2: the co-partitioned layout (a record lives in the index partition numbered like its events
#: partition); the bytes are those of 1, which was written wherever the key hashed. Version 1
#: records are still decoded, for ``bridge index migrate``, and refused when restoring.
#: 3: 128-bit owners, and the marker's ``unsigned_below``.
_VERSION = 3
_READABLE = (1, 2, 3)
_TASK = struct.Struct("<BiqqBBqQQqqq")
_TASK_V2 = struct.Struct("<BiqqBBqqqqq")
_CHECKPOINT = struct.Struct("<qq")
_MARKER = struct.Struct("<Bqqq")
_MARKER_V2 = struct.Struct("<Bqq")
_LOW64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdef")

#: The task's count may have missed records that retention deleted before they were indexed.
FLAG_UNTRUSTED = 1
#: Only the owner's first 64 bits are known (an entry persisted by 8fd441c or before).
FLAG_OWNER_PREFIX = 2
#: A restored marker predates signed identities: the indexer decides ``unsigned_below``.
UNSIGNED_UNDECIDED = -1


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    """What a ``task.created`` event says of its task, as the index keeps it."""

    owner: int  # the 128-bit owner key
    created_ms: int
    ttl_ms: int  # -1: unlimited
    poll_ms: int


def owner_key(digest: str) -> int:
    """The index's form of a principal digest: its 128 bits (exactly 32 lowercase hex digits,
    as :func:`bridge.tasks.messages.owner_digest` writes them) as an unsigned int."""
    if len(digest) != 32 or not _HEX.issuperset(digest):
        raise ValueError("an owner digest is 32 lowercase hex digits")
    return int(digest, 16)


def owner_prefix(owner: int) -> int:
    """The first 64 bits of an owner key: all an entry of 8fd441c holds, and the task-updates
    topic's record key."""
    return owner >> 64


def legacy_owner_key(owner: int) -> int:
    """The owner an entry persisted in version 1 or 2 holds for the 128-bit ``owner``: its first
    64 bits, then zeros (:data:`FLAG_OWNER_PREFIX`). The active-task count files such entries
    under a key of their own (:mod:`bridge.tasks.service`), so they count for their principal."""
    return owner_prefix(owner) << 64


class IndexRecordError(ValueError):
    """An index topic record this version cannot read."""


class TaskEntry:
    """What the index knows of one task. ``checkpoints`` is a flat ``[seq, offset, ...]``."""

    __slots__ = (
        "checkpoints",
        "created_ms",
        "flags",
        "last_offset",
        "next_seq",
        "owner",
        "poll_ms",
        "status",
        "status_offset",
        "ttl_ms",
    )

    def __init__(self) -> None:
        self.next_seq = 0
        self.last_offset = -1
        self.status = TaskStatus.UNKNOWN
        self.status_offset = -1
        self.flags = 0
        self.checkpoints = array("q")
        #: From the task's ``task.created`` event (0 / -1 when it had none): the owner key,
        #: creation time, ttl (-1: unlimited) and poll interval. Kept here, not only in the
        #: log, so a task stays known (and bound to its owner) after retention deletes seq 0.
        self.owner = 0
        self.created_ms = 0
        self.ttl_ms = -1
        self.poll_ms = 0

    @property
    def trusted(self) -> bool:
        return not self.flags & FLAG_UNTRUSTED

    def owned_by(self, owner: int) -> bool:
        """Whether the owner key ``owner`` owns this task: on all 128 bits, or on the first 64
        for an entry that holds no more (:data:`FLAG_OWNER_PREFIX`). Never for no owner."""
        if self.owner == 0:
            return False
        if self.flags & FLAG_OWNER_PREFIX:
            return owner_prefix(self.owner) == owner_prefix(owner)
        return self.owner == owner

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def first_offset(self) -> int:
        return self.checkpoints[1] if self.checkpoints else -1

    def checkpoint_pairs(self) -> list[tuple[int, int]]:
        cps = self.checkpoints
        return [(cps[i], cps[i + 1]) for i in range(0, len(cps), 2)]

    def checkpoint_at_or_before(self, seq: int) -> tuple[int, int] | None:
        """The checkpoint with the largest seq ≤ ``seq``, or None."""
        seqs = self.checkpoints[0::2]
        i = bisect_right(seqs, seq) - 1
        if i < 0:
            return None
        return seqs[i], self.checkpoints[2 * i + 1]

    def checkpoint_after_offset(self, offset: int) -> tuple[int, int] | None:
        """The first checkpoint whose offset is ≥ ``offset``, or None."""
        offsets = self.checkpoints[1::2]
        i = bisect_right(offsets, offset - 1)
        if i >= len(offsets):
            return None
        return self.checkpoints[2 * i], offsets[i]

    def encode(self, partition: int, *, legacy: bool = False) -> bytes:
        """The index record value: version 3, or (``legacy``) version 2 as 8fd441c wrote it."""
        if legacy:
            return self._encode_v2(partition)
        head = _TASK.pack(
            _VERSION,
            partition,
            self.next_seq,
            self.last_offset,
            int(self.status),
            self.flags,
            self.status_offset,
            self.owner >> 64,
            self.owner & _LOW64,
            self.created_ms,
            self.ttl_ms,
            self.poll_ms,
        )
        return head + self.checkpoints.tobytes()

    def _encode_v2(self, partition: int) -> bytes:
        prefix = owner_prefix(self.owner)
        head = _TASK_V2.pack(
            2,
            partition,
            self.next_seq,
            self.last_offset,
            int(self.status),
            self.flags & ~FLAG_OWNER_PREFIX,  # 8fd441c knows no other flag than FLAG_UNTRUSTED
            self.status_offset,
            prefix - (1 << 64) if prefix >> 63 else prefix,  # 8fd441c's owner was signed
            self.created_ms,
            self.ttl_ms,
            self.poll_ms,
        )
        return head + self.checkpoints.tobytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskEntry):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self) -> str:
        return (
            f"TaskEntry(next_seq={self.next_seq}, last_offset={self.last_offset}, "
            f"status={self.status.name}, checkpoints={self.checkpoint_pairs()})"
        )


class PartitionIndex:
    """The derived state of one events partition, stored by columns.

    A task is a row: ``rows`` maps its id to a row number, and each field lives in a compact
    column (``array("q")``, ``array("Q")`` for the owner's halves, or ``bytearray``), so a task
    costs its id, a dict slot and about 74 bytes. Checkpoint seq 0 is the task's first offset;
    later checkpoints live in a side table only for tasks that have them. :class:`TaskEntry` is
    built on lookup, as a snapshot.
    """

    def __init__(
        self,
        partition: int,
        checkpoint_interval: int,
        through: int = 0,
        lost_before: int = -1,
        *,
        track_dirty: bool = True,
        unsigned_below: int = 0,
    ) -> None:
        self.partition = partition
        self.checkpoint_interval = checkpoint_interval
        self.through = through
        self.lost_before = lost_before
        #: Unsigned ``task.created`` records below this offset were written before identities
        #: were signed (the upgrade rule) and still define their task; 0: none is honoured.
        self.unsigned_below = unsigned_below
        #: ``task.created`` records refused since this index was made (unsigned, forged).
        self.refused = 0
        #: A rolling upgrade from 8fd441c is under way and this partition was never written in
        #: version 3: write version 2 (8fd441c's replicas may own it next) and honour unsigned
        #: ``task.created`` records as they do. ``unsigned_below`` stays undecided.
        self.legacy = False
        #: The version of the marker restored from the index topic; 0 when there was none.
        self.marker_version = 0
        #: ``unsigned_below`` is the end of a partition that had records but no marker: the
        #: first signed ``task.created`` below it lowers it (records from there on were
        #: written by a version that signs), and the marker waits until ``through`` reaches it.
        self.provisional = False
        #: Only a persisting indexer needs to know which rows changed since its last flush.
        self.track_dirty = track_dirty
        self.dirty: set[str] = set()
        self.rows: dict[str, int] = {}
        self._next_seq = array("q")
        self._last_offset = array("q")
        self._first_offset = array("q")
        self._status_offset = array("q")
        self._status = bytearray()
        self._flags = bytearray()
        self._owner_hi = array("Q")
        self._owner_lo = array("Q")
        self._created = array("q")
        self._ttl = array("q")
        self._poll = array("q")
        self._more_checkpoints: dict[int, array[int]] = {}

    # --- rows ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.rows

    def _new_row(self, task_id: str) -> int:
        row = len(self.rows)
        self.rows[task_id] = row
        for column in (self._next_seq, self._first_offset, self._status_offset):
            column.append(0 if column is self._next_seq else -1)
        self._last_offset.append(-1)
        self._status.append(TaskStatus.UNKNOWN)
        self._flags.append(0)
        self._owner_hi.append(0)
        self._owner_lo.append(0)
        self._created.append(0)
        self._ttl.append(-1)
        self._poll.append(0)
        return row

    def trusts(self, task_id: str) -> bool:
        """False once retention made the task untrusted (its flag only: no snapshot); True
        for a task not indexed here."""
        row = self.rows.get(task_id)
        return row is None or not self._flags[row] & FLAG_UNTRUSTED

    def get(self, task_id: str) -> TaskEntry | None:
        """A snapshot of the task's entry, or None."""
        row = self.rows.get(task_id)
        return None if row is None else self._entry(row)

    def _entry(self, row: int) -> TaskEntry:
        entry = TaskEntry()
        entry.next_seq = self._next_seq[row]
        entry.last_offset = self._last_offset[row]
        entry.status = _STATUS_OF[self._status[row]]  # TaskStatus(code) costs ~1 µs a call
        entry.status_offset = self._status_offset[row]
        entry.flags = self._flags[row]
        entry.owner = self._owner_of(row)
        entry.created_ms = self._created[row]
        entry.ttl_ms = self._ttl[row]
        entry.poll_ms = self._poll[row]
        if self._next_seq[row]:
            entry.checkpoints.append(0)
            entry.checkpoints.append(self._first_offset[row])
            more = self._more_checkpoints.get(row)
            if more is not None:
                entry.checkpoints.extend(more)
        return entry

    def _owner_of(self, row: int) -> int:
        return (self._owner_hi[row] << 64) | self._owner_lo[row]

    def items(self) -> Iterator[tuple[str, TaskEntry]]:
        for task_id, row in self.rows.items():
            yield task_id, self._entry(row)

    def entries(self) -> dict[str, TaskEntry]:
        """Every task's entry (a snapshot; for tests and verification)."""
        return dict(self.items())

    def next_seq_of(self, task_id: str) -> int | None:
        """The task's next seq (cheap: no entry is built), or None."""
        row = self.rows.get(task_id)
        return None if row is None else self._next_seq[row]

    def folded_status(self, task_id: str) -> tuple[int, int, int] | None:
        """The task's status code, the offset of the event it came from and its owner key
        (cheap: no entry is built), or None."""
        row = self.rows.get(task_id)
        if row is None:
            return None
        return self._status[row], self._status_offset[row], self._owner_of(row)

    def owner_is_prefix(self, task_id: str) -> bool:
        """Whether the task's owner key holds only the digest's first 64 bits."""
        row = self.rows.get(task_id)
        return row is not None and bool(self._flags[row] & FLAG_OWNER_PREFIX)

    def status_counts(self) -> dict[TaskStatus, int]:
        return {status: self._status.count(int(status)) for status in TaskStatus}

    def encode_task(self, task_id: str) -> bytes:
        return self._entry(self.rows[task_id]).encode(self.partition, legacy=self.legacy)

    # --- the rule ------------------------------------------------------------------------

    def apply(
        self,
        task_id: str,
        offset: int,
        *,
        created: bool = False,
        status: TaskStatus | None = None,
        identity: TaskIdentity | None = None,
        signed: bool = False,
    ) -> int | None:
        """Count the committed record at ``offset``; return its seq, or None if already counted.

        ``created`` marks the bridge's own ``task.created`` event; ``status`` the status a status
        event announces; ``signed`` that the record carries a valid signature of ``identity``
        (:mod:`bridge.log.identity`). Records must be applied in offset order.

        Only an authentic ``task.created`` at seq 0 defines the task (status working, and
        ``identity``): the bridge always writes it first under a fresh random id, so any later
        one is some producer's ordinary event that keeps its seq and changes nothing.
        Authentic means signed, or (the upgrade rule) unsigned below :attr:`unsigned_below` in
        a partition whose records were all counted (after a loss, the first record left of a
        task may be any later one). Any other ``task.created`` is an ordinary event, counted
        in :attr:`refused`. A status changes the task only until it is terminal.
        """
        if signed and self.provisional and offset < self.unsigned_below:
            self.unsigned_below = offset
        if created and not self._authentic(offset, identity, signed):
            created = False
            if offset >= self.through:  # counted once, not again on a re-read
                self.refused += 1
        row = self.rows.get(task_id)
        if row is None:
            row = self._new_row(task_id)
            if self.lost_before >= 0 and not created:
                self._flags[row] |= FLAG_UNTRUSTED
        elif offset <= self._last_offset[row]:
            self.through = max(self.through, offset + 1)
            return None
        seq = self._next_seq[row]
        if seq == 0:
            self._first_offset[row] = offset
        elif seq % self.checkpoint_interval == 0:
            more = self._more_checkpoints.get(row)
            if more is None:
                more = self._more_checkpoints[row] = array("q")
            more.append(seq)
            more.append(offset)
        self._next_seq[row] = seq + 1
        self._last_offset[row] = offset
        if created and seq == 0:
            self._define(row, offset, identity)
        elif status not in _NO_STATUS and self._status[row] not in _TERMINAL_CODES:
            self._status[row] = status
            self._status_offset[row] = offset
        self.through = max(self.through, offset + 1)
        if self.track_dirty:
            self.dirty.add(task_id)
        return seq

    def _authentic(self, offset: int, identity: TaskIdentity | None, signed: bool) -> bool:
        if identity is None:
            return False
        if signed:
            return True
        if self.lost_before >= 0:  # the first record left of a task may be any later one
            return False
        # UNSIGNED_UNDECIDED (-1) honours nothing until the indexer decides; during an upgrade
        # (legacy) 8fd441c's replicas still write unsigned records, and every owner honours them.
        return self.legacy or offset < self.unsigned_below

    def _define(self, row: int, offset: int, identity: TaskIdentity | None) -> None:
        self._status[row] = TaskStatus.WORKING
        self._status_offset[row] = offset
        if identity is not None:
            self._owner_hi[row] = identity.owner >> 64
            self._owner_lo[row] = identity.owner & _LOW64
            self._created[row] = identity.created_ms
            self._ttl[row] = identity.ttl_ms
            self._poll[row] = identity.poll_ms

    def advance(self, offset: int) -> None:
        """Every record below ``offset`` has been seen (e.g. after transaction markers)."""
        self.through = max(self.through, offset)

    def mark_lost(self, log_start: int) -> None:
        """Retention deleted records in ``[through, log_start)`` before they were counted.

        Every task known so far may have had records there, so none of them can be trusted;
        tasks first seen later are trusted only if their first record is ``task.created``.
        """
        for task_id, row in self.rows.items():
            if not self._flags[row] & FLAG_UNTRUSTED:
                self._flags[row] |= FLAG_UNTRUSTED
                if self.track_dirty:
                    self.dirty.add(task_id)
        self.lost_before = log_start
        self.through = log_start

    def marker(self) -> bytes:
        """The marker record value (version 2 while :attr:`legacy`, as 8fd441c writes it)."""
        if self.legacy:
            return _MARKER_V2.pack(2, self.through, self.lost_before)
        return _MARKER.pack(_VERSION, self.through, self.lost_before, self.unsigned_below)

    def restore_task(self, task_id: str, entry: TaskEntry) -> None:
        row = self.rows.get(task_id)
        if row is None:
            row = self._new_row(task_id)
        self._next_seq[row] = entry.next_seq
        self._last_offset[row] = entry.last_offset
        self._status[row] = entry.status
        self._status_offset[row] = entry.status_offset
        self._flags[row] = entry.flags
        self._owner_hi[row] = entry.owner >> 64
        self._owner_lo[row] = entry.owner & _LOW64
        self._created[row] = entry.created_ms
        self._ttl[row] = entry.ttl_ms
        self._poll[row] = entry.poll_ms
        cps = entry.checkpoints
        self._first_offset[row] = cps[1] if cps else -1
        if len(cps) > 2:
            self._more_checkpoints[row] = array("q", cps[2:])  # exact size, no over-allocation
        else:
            self._more_checkpoints.pop(row, None)

    def restore_marker(
        self, through: int, lost_before: int, unsigned_below: int = 0, version: int = _VERSION
    ) -> None:
        self.through = through
        self.lost_before = lost_before
        self.unsigned_below = unsigned_below
        self.marker_version = version

    def active_tasks(self, now_ms: int) -> Iterator[tuple[str, int, int, bool]]:
        """Every task with an owner that is neither terminal nor expired at ``now_ms``, as
        ``(task_id, owner key, expiry ms or -1 for none, owner is a 64-bit prefix)``: what the
        active-task limit counts of this partition (read-only, no entry is built)."""
        for task_id, row in self.rows.items():
            owner = self._owner_of(row)
            if owner == 0 or self._status[row] in _TERMINAL_CODES:
                continue
            ttl = self._ttl[row]
            expires = self._created[row] + ttl if ttl >= 0 else -1
            if 0 <= expires <= now_ms:
                continue
            yield task_id, owner, expires, bool(self._flags[row] & FLAG_OWNER_PREFIX)


_TERMINAL_CODES = frozenset(int(s) for s in TERMINAL_STATUSES)
#: Statuses that change nothing: none announced, or UNKNOWN (no record may un-know a task).
_NO_STATUS = (None, TaskStatus.UNKNOWN)


def task_key(task_id: str) -> bytes:
    return b"t:" + task_id.encode("utf-8")


def marker_key(partition: int) -> bytes:
    return b"p:" + str(partition).encode("ascii")


@dataclass(frozen=True)
class TaskRecord:
    task_id: str
    partition: int
    entry: TaskEntry
    version: int = _VERSION


@dataclass(frozen=True)
class MarkerRecord:
    partition: int
    through: int
    lost_before: int
    version: int = _VERSION
    unsigned_below: int = 0


def decode_index_record(key: bytes, value: bytes) -> TaskRecord | MarkerRecord:
    """Decode one index topic record; raises :class:`IndexRecordError` on anything unknown."""
    try:
        if key.startswith(b"t:"):
            return _task_record(key[2:].decode("utf-8"), value)
        if key.startswith(b"p:"):
            return _marker_record(int(key[2:]), value)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, IndexRecordError):
            raise
        raise IndexRecordError(f"undecodable index record {key[:40]!r}: {exc}") from None
    raise IndexRecordError(f"unknown index record key {key[:40]!r}")


def _task_record(task_id: str, value: bytes) -> TaskRecord:
    version = value[0] if value else 0
    layout = _TASK if version == _VERSION else _TASK_V2
    if version not in _READABLE or (len(value) - layout.size) % _CHECKPOINT.size:
        raise IndexRecordError(f"task record of version {version}, {len(value)} bytes")
    fields = layout.unpack_from(value)
    entry = TaskEntry()
    (_, partition, entry.next_seq, entry.last_offset, status, entry.flags) = fields[:6]
    entry.status = TaskStatus(status)
    entry.status_offset = fields[6]
    if version == _VERSION:
        entry.owner = (fields[7] << 64) | fields[8]
    elif fields[7]:
        # 8fd441c kept the digest's first 64 bits (signed): that much, and say so.
        entry.owner = legacy_owner_key((fields[7] & _LOW64) << 64)
        entry.flags |= FLAG_OWNER_PREFIX
    entry.created_ms, entry.ttl_ms, entry.poll_ms = fields[-3:]
    entry.checkpoints.frombytes(value[layout.size :])
    return TaskRecord(task_id, partition, entry, version)


def _marker_record(partition: int, value: bytes) -> MarkerRecord:
    version = value[0] if value else 0
    if version == _VERSION:
        _, through, lost_before, unsigned_below = _MARKER.unpack(value)
        return MarkerRecord(partition, through, lost_before, version, unsigned_below)
    if version not in _READABLE:
        raise IndexRecordError(f"marker record of version {version}")
    _, through, lost_before = _MARKER_V2.unpack(value)
    return MarkerRecord(partition, through, lost_before, version)

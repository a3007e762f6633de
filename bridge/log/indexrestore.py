"""The seq index of a set of events partitions, restored from their slices of the index topic.

Where it sits: between the generic restore of a compacted topic
(:func:`bridge.log.restore.latest_by_key`) and everything that needs the persisted counts: the
indexer's ownership (:mod:`bridge.log.ownership`, a partition gained), ``bridge verify``, the
checker and the index migration. Each events partition's index lives in the index partition of
the same number; reading committed records up to the last stable offset is a consistent cut,
since the index is only ever written in transactions. It decides nothing about which records
define a task (:mod:`bridge.log.reconcile`) and writes nothing (:mod:`bridge.log.indexwriter`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log
from bridge.kafka.topics import TopicLayoutError, topic_partition_ids
from bridge.log.restore import latest_by_key
from bridge.log.seqindex import (
    UNSIGNED_UNDECIDED,
    IndexRecordError,
    MarkerRecord,
    PartitionIndex,
    TaskRecord,
    decode_index_record,
)

__all__ = [
    "IndexerError",
    "apply_index_record",
    "index_layout_error",
    "load_index",
    "topic_partitions",
]


class IndexerError(Exception):
    """The indexer cannot start or go on (missing topic, unreadable index, fenced writer)."""


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """Partition ids of ``topic``, or :class:`IndexerError` naming the fix."""
    try:
        return await topic_partition_ids(settings, topic)
    except TopicLayoutError as exc:
        raise IndexerError(str(exc)) from None


def index_layout_error(settings: Settings, what: str) -> IndexerError:
    """The refusal for an index this version must not restore from, with the way out."""
    return IndexerError(
        f"the index topic {settings.topics.index!r} {what}. This version keeps each events "
        "partition's index in the index partition of the same number (so a replica restores only "
        "the partitions it owns). Stop every bridge process, then run `bridge index migrate` "
        "once: it rewrites the index in place, without losing a count (docs/deployment.md)"
    )


async def load_index(
    settings: Settings,
    partitions: Iterable[int],
    *,
    strict_layout: bool = True,
    log: Log | None = None,
) -> dict[int, PartitionIndex]:
    """Restore the persisted seq index (a consistent committed cut) of ``partitions``.

    Reads only the index partitions of those numbers, from ``log`` (the cluster of
    ``settings`` when None). With ``strict_layout`` a record written by a version before the
    co-partitioned layout, or found in another partition's slice, is refused
    (:func:`index_layout_error`): restoring around it could miss counts it holds.
    """
    index = {p: PartitionIndex(p, settings.tasks.checkpoint_interval) for p in partitions}
    if not index:
        return index
    # By partition and key: a migrated index holds a key's record in its partition and a
    # tombstone in the one it was moved out of; compaction keeps the latest per partition.
    async with _log_of(settings, log) as source:
        latest = await latest_by_key(source, settings.topics.index, index, role="index-restore")
    for (slice_, key), value in latest.items():
        if value is not None:  # a tombstone: the entry was deleted on purpose
            apply_index_record(settings, index, slice_, key, value, strict_layout=strict_layout)
    return index


def apply_index_record(
    settings: Settings,
    index: dict[int, PartitionIndex],
    slice_: int,
    key: bytes,
    value: bytes,
    *,
    strict_layout: bool = True,
) -> None:
    """Apply one index record of index partition ``slice_`` to ``index`` (a restore, in any
    order of keys; a standby copy, in offset order: the later record of a key wins either way).
    :class:`IndexerError` for a record this version must not restore from."""
    record = _decoded(settings, key, value)
    if strict_layout and (record.version < 2 or record.partition != slice_):
        raise index_layout_error(settings, "was written by an older version of the bridge")
    target = index.get(record.partition)
    if target is None:
        return  # only with strict_layout off: another slice's record
    if isinstance(record, TaskRecord):
        target.restore_task(record.task_id, record.entry)
    elif record.version < 3:  # indexed before identities were signed: the upgrade rule
        target.restore_marker(
            record.through, record.lost_before, UNSIGNED_UNDECIDED, record.version
        )
    else:
        target.restore_marker(record.through, record.lost_before, record.unsigned_below)


@contextlib.asynccontextmanager
async def _log_of(settings: Settings, log: Log | None) -> AsyncIterator[Log]:
    """``log``, or the cluster of ``settings`` for this one use (closed after it)."""
    if log is not None:
        yield log
        return
    kafka = KafkaLog(settings, pool_size=1)
    try:
        yield kafka
    finally:
        await kafka.close()


def _decoded(settings: Settings, key: bytes, value: bytes) -> TaskRecord | MarkerRecord:
    try:
        return decode_index_record(key, value)
    except IndexRecordError as exc:
        raise IndexerError(
            f"the index topic {settings.topics.index!r} holds a record this version cannot "
            f"read ({exc}); refusing to guess seq counts"
        ) from None

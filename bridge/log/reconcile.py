"""A partition's index reconciled with its log as the log is now: the start retention moved,
and (when the partition is taken) the end that decides the upgrade rule.

Where it sits: called by the indexer's ownership (:mod:`bridge.log.ownership`) when a partition
is gained, and by its tail (:mod:`bridge.log.seqtail`) when a fetch finds the log start past
the tail's position (``OffsetOutOfRange``). It changes only the
:class:`~bridge.log.seqindex.PartitionIndex` it is handed and the tail's position; it does not
persist the result (:mod:`bridge.log.indexwriter` does, with the next flush).

If retention deletes records before they were counted (``through`` below the log start
offset), the partition is marked lost: tasks known then become untrusted, and later tasks are
trusted only if their first record is the bridge's own ``task.created``.

A ``task.created`` defines its task only when it is authentic (:mod:`bridge.log.identity`), or
written before identities were signed. That upgrade rule is per partition: when a partition's
restored marker is of a version before signing (8fd441c), the indexer records the partition's
current end as ``unsigned_below``, once, and persists it with the marker; unsigned records below
it keep their meaning, none written after it does. While a rolling upgrade from 0.1 is under
way (``upgrade.from``), nothing is decided: a partition not yet written in version 3 is written
in 8fd441c's version 2 and honours unsigned records, because 8fd441c's replicas may still write
them there, or own the partition next.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bridge.kafka.port import Log, Tail, TopicPart
from bridge.log.seqindex import UNSIGNED_UNDECIDED, PartitionIndex

__all__ = ["decide", "mark_lost", "reconcile_with_retention"]

log = logging.getLogger(__name__)


def mark_lost(idx: PartitionIndex, log_start: int) -> None:
    """Retention deleted ``[idx.through, log_start)`` before it was counted: say so, and
    mark the partition lost from ``log_start``."""
    log.error(
        "events partition %d: retention deleted offsets [%d, %d) before they were indexed; "
        "tasks with records there can no longer be served with a trusted seq",
        idx.partition,
        idx.through,
        log_start,
    )
    idx.mark_lost(log_start)


async def reconcile_with_retention(
    log_: Log, tail: Tail, topic: str, partitions: Mapping[int, PartitionIndex]
) -> None:
    """Mark owned partitions whose uncounted records retention deleted as lost, and seek
    where counting goes on."""
    tps = [TopicPart(topic, p) for p in partitions]
    begins = await log_.log_starts(tps)
    for tp in tps:
        idx = partitions.get(tp.partition)  # read again: ownership may have moved meanwhile
        if idx is not None and idx.through < begins[tp]:
            mark_lost(idx, begins[tp])
            tail.reposition(tp, idx.through)


def decide(idx: PartitionIndex, begin: int, end: int, *, persist: bool, legacy: bool) -> bool:
    """Which unsigned ``task.created`` records of a partition just taken define a task; True
    when its upgrade offset was set now (its marker must then be written again).

    * A version 3 marker decided it already.
    * No marker, yet records: 8fd441c (or this version) wrote them and stopped before its
      first flush of the partition; they may predate signing, so it is undecided, and
      provisional: the first signed ``task.created`` lowers the offset to its own.
    * During an upgrade from 0.1 (``legacy``) a partition not yet written in version 3 stays
      in 8fd441c's format and honours unsigned records (:attr:`PartitionIndex.legacy`).
    * Otherwise an undecided partition gets its upgrade offset now (:func:`_upgrade`), and a
      partition without a marker gets one at the next flush, so that records written after it
      are never taken for 8fd441c's.
    """
    if persist and idx.marker_version == 0 and end > begin:
        # (A process that never persists never finds a marker: nothing is undecided there.)
        idx.unsigned_below = UNSIGNED_UNDECIDED
        idx.provisional = not legacy
    idx.legacy = legacy and idx.marker_version < 3
    if idx.unsigned_below == UNSIGNED_UNDECIDED and not idx.legacy:
        _upgrade(idx, end)
        return True
    return False


def _upgrade(idx: PartitionIndex, end: int) -> None:
    """The upgrade rule: every record the partition held when this version first took it
    was written before identities were signed; a ``task.created`` among them still counts."""
    idx.unsigned_below = end
    log.warning(
        "events partition %d was indexed by a version that did not sign task identities: "
        "unsigned task.created records below offset %d are honoured, none after it",
        idx.partition,
        end,
    )

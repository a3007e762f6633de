"""What the indexer's parts share: the events partitions this process owns now, and the
progress of their tail.

Where it sits: under the indexer's parts (:mod:`bridge.log.ownership` puts partitions in and
takes them out, :mod:`bridge.log.seqtail` advances them, :mod:`bridge.log.indexwriter`
persists them) and behind :class:`~bridge.log.indexer.Indexer`'s queries. It holds state and
wakes waiters; it reads and writes no log.
"""

from __future__ import annotations

import asyncio

from bridge.log.seqindex import PartitionIndex

__all__ = ["NotOwner", "OwnedPartitions"]


class NotOwner(Exception):
    """The task's events partition is owned by another replica (or is moving)."""

    def __init__(self, partition: int) -> None:
        super().__init__(f"events partition {partition} is not owned by this replica")
        self.partition = partition


class OwnedPartitions:
    """The derived state of the owned partitions, and one wake-up for every waiter on them."""

    def __init__(self) -> None:
        #: The events topic's partition count (murmur2 of the key modulo this is a partition).
        self.count = 0
        #: The partitions owned now. One dict for the process's life: every part holds it.
        self.partitions: dict[int, PartitionIndex] = {}
        self._progress = asyncio.Event()

    def owned(self, partition: int) -> PartitionIndex:
        """The partition's index, or :class:`NotOwner`."""
        idx = self.partitions.get(partition)
        if idx is None:
            raise NotOwner(partition)
        return idx

    def notify_progress(self) -> None:
        """Wake every waiter once. The event is replaced, never left set: a waiter whose
        condition still fails must wait for the next progress, not spin on a set event."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def progressed(self) -> None:
        """Return at the next :meth:`notify_progress` (callers re-check their condition)."""
        await self._progress.wait()

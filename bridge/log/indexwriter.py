"""The fenced index writer: each owned partition's counts persisted in transactions of that
partition's own writer.

Where it sits: behind the indexer's tail (:mod:`bridge.log.seqtail` marks task entries dirty
and queues a task-update for each status change) and its ownership (:mod:`bridge.log.ownership`
opens a partition's writer when it gains the partition, flushes and closes it when it loses
it); it writes the index topic and the task-updates topic through the port's
:class:`~bridge.kafka.port.TransactionalWriter`. It derives no seq and reads no log.

Every ``flush_interval_s`` each partition's dirty task entries, its marker and the
task-updates its status changes produced are encoded at one instant and written in one
transaction of that partition's own writer (transactional id ``<prefix>.index.<partition>``). A
crash at any point leaves either the whole cut or none of it; the partition's next owner starts
a writer with the same id and so fences the previous one, which can never again overwrite newer
counts. Replaying records at or below a task's ``last_offset`` is a no-op, so any owner derives
exactly the same seq for every record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from bridge.config import Settings
from bridge.kafka.acls import index_writer_id
from bridge.kafka.port import Log, LogError, TransactionalWriter, WriterFenced
from bridge.log.indexrestore import IndexerError
from bridge.log.owned import OwnedPartitions
from bridge.log.seqindex import PartitionIndex, marker_key, task_key
from bridge.log.updates import TaskUpdate

__all__ = ["IndexWriter"]

log = logging.getLogger(__name__)

#: One partition's cut: its index records (key, value) and its task-updates.
Cut = tuple[list[tuple[bytes, bytes]], list[TaskUpdate]]


class IndexWriter:
    """The index writers of the owned partitions, what each must write next, and the flush."""

    def __init__(
        self, settings: Settings, log_: Log, owned: OwnedPartitions, *, group: bool
    ) -> None:
        self.settings = settings
        self._log = log_
        self._partitions = owned.partitions  # one dict for the process's life
        self._group = group
        #: The open writer of each partition this process persists.
        self.writers: dict[int, TransactionalWriter] = {}
        #: Partitions whose writer a newer writer fenced (in ``all`` mode they go on unpersisted).
        self.fenced: set[int] = set()
        self._updates: dict[int, list[TaskUpdate]] = {}
        self._markers: dict[int, bytes] = {}  # the marker each partition last persisted
        self._lock = asyncio.Lock()

    # --- a partition gained or lost -----------------------------------------------------

    async def open(self, parts: set[int]) -> None:
        """Start the writers of ``parts``: each fences its previous writer (whose open
        transaction is aborted) or this raises :class:`IndexerError`."""
        # Every fence runs to its end (each is bounded) before a failure is raised, so no
        # writer opens after the caller has closed the ones it knows.
        opened = await asyncio.gather(*(self._open(p) for p in parts), return_exceptions=True)
        failed = [exc for exc in opened if isinstance(exc, BaseException)]
        if failed:
            exc = failed[0]
            if not isinstance(exc, LogError):
                raise exc
            # Without fencing, a zombie could still extend the cut the restore reads.
            raise IndexerError(
                f"could not fence the previous index writer of events partitions "
                f"{sorted(parts)} ({exc}): its open transaction must complete first, which "
                f"needs every partition it wrote (of the index topic "
                f"{self.settings.topics.index!r} and the updates topic) to have a leader; "
                "nothing is served until then"
            ) from exc

    async def _open(self, partition: int) -> None:
        writer = self._log.transactional_writer(index_writer_id(self.settings.topics, partition))
        await writer.start()
        self.writers[partition] = writer
        self.fenced.discard(partition)

    def took(self, idx: PartitionIndex, upgraded: bool) -> None:
        """``idx`` was restored and is owned now: its marker is written with the next flush
        even if nothing else changed. That first write is how the partition's previous owner
        sees that this one serves it (:mod:`bridge.log.handover`); ``upgraded`` (its upgrade
        offset was set now) needs the write too."""
        del upgraded  # written either way
        self._markers.pop(idx.partition, None)
        self._updates[idx.partition] = []

    async def close(self, parts: set[int]) -> None:
        """Close the writers of ``parts`` (errors of a writer already gone are ignored)."""
        for p in parts:
            writer = self.writers.pop(p, None)
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer.close()

    def drop(self, partition: int) -> None:
        """Forget what ``partition`` had to write (it is no longer owned)."""
        self._markers.pop(partition, None)
        self._updates.pop(partition, None)

    # --- what to write ----------------------------------------------------------------------

    def queue(self, partition: int, update: TaskUpdate) -> None:
        """Write ``update`` with the partition's next cut."""
        self._updates[partition].append(update)

    def _cut(self, partition: int) -> Cut:
        """Encode the partition's dirty entries, changed marker and queued updates at one
        instant (no await inside)."""
        idx = self._partitions[partition]
        batch = [(task_key(t), idx.encode_task(t)) for t in idx.dirty]
        idx.dirty.clear()
        marker = idx.marker()
        if idx.provisional and idx.through >= idx.unsigned_below:
            idx.provisional = False  # decided: every record below the offset was seen
        if not idx.provisional and marker != self._markers.get(partition):
            batch.append((marker_key(partition), marker))
        updates, self._updates[partition] = self._updates[partition], []
        return batch, updates

    # --- writing ----------------------------------------------------------------------------

    async def flush(self) -> int:
        """Persist every owned partition's cut, one transaction per partition; returns the
        number of index records written."""
        total = 0
        for partition in list(self.writers):
            total += await self.flush_partition(partition)
        return total

    async def flush_partition(self, partition: int) -> int:
        """Persist one partition's cut (see :meth:`flush`)."""
        async with self._lock:
            writer = self.writers.get(partition)
            if writer is None or partition not in self._partitions:
                return 0
            batch, updates = self._cut(partition)
            if not batch and not updates:
                return 0
            s = self.settings
            try:
                async with writer.transaction():
                    for key, value in batch:
                        await writer.send(s.topics.index, value, key=key, partition=partition)
                    for update in updates:
                        await writer.send(s.topics.updates, update.value(), key=update.key())
            except WriterFenced:
                await self._fenced(partition)
                return 0
            except BaseException:
                self._redirty(partition, (batch, updates))
                raise
            for key, value in batch:
                if key.startswith(b"p:"):
                    self._markers[partition] = value
            return len(batch)

    async def _fenced(self, partition: int) -> None:
        self.fenced.add(partition)
        writer = self.writers.pop(partition, None)
        log.error(
            "the index writer of events partition %d was fenced by a newer one; %s",
            partition,
            "giving the partition up" if self._group else "no longer persisting it",
        )
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.close()

    def _redirty(self, partition: int, cut: Cut) -> None:
        """A cut that was not written is written with the next one."""
        idx = self._partitions.get(partition)
        if idx is None:
            return
        batch, updates = cut
        for key, _ in batch:
            if key.startswith(b"t:"):
                idx.dirty.add(key[2:].decode("utf-8"))
            else:
                self._markers.pop(partition, None)
        self._updates[partition][:0] = updates

    async def run(self, interval_s: float) -> None:
        """Flush every ``interval_s`` until cancelled; a failed flush is retried next time."""
        while True:
            await asyncio.sleep(interval_s)  # the flush cadence, not synchronisation
            try:
                # No offsets are committed to the group: positions come from the index, and a
                # commit racing a rebalance (IllegalGeneration) makes aiokafka rejoin, which
                # turned one rebalance into a storm of them.
                await self.flush()
            except Exception:
                log.exception("index flush failed; will retry")

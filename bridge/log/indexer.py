"""The indexer: tails the events partitions this process owns and derives each record's seq.

Where it sits: after the events topic, before the fan-out, the task service and the reader,
which ask it what is indexed (:meth:`Indexer.lookup`, :meth:`Indexer.wait_indexed`) and where
a partition's owner is. Every bridge replica runs one :class:`Indexer`: the composition of its
parts, which each say where they sit.

* :mod:`bridge.log.ownership`: which partitions it owns (every one with ``replicas.ownership = "all"``,
  or the share the replicas' consumer group gives it with ``"group"``, see
  :mod:`bridge.kafka.ownership`); a partition gained is fenced, restored and sought to, a
  partition lost is flushed and dropped.
* :mod:`bridge.log.indexrestore`: a partition's index restored from its slice of the compacted
  index topic (the index partition of the same number).
* :mod:`bridge.log.seqtail`: the tail (``read_committed``) that applies every record to the
  seq rule (:class:`~bridge.log.seqindex.PartitionIndex`) and hands
  :class:`IndexedEvent`\\ s to listeners.
* :mod:`bridge.log.indexwriter`: with ``persist`` (every serving replica), each partition's
  index written in transactions of its own fenced writer.
* :mod:`bridge.log.reconcile`: retention loss (records deleted before they were counted) and
  the upgrade rule for unsigned ``task.created`` records.
* :mod:`bridge.log.owned`: the owned partitions' state the parts share, and the progress
  waiters wait on.
* :mod:`bridge.log.handover`: a lost partition's streams end once its new owner serves it;
  :meth:`Indexer.hand_over` gives every partition away before a replica stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bridge.component import Component, NotStarted, cancel_and_wait
from bridge.config import Settings
from bridge.kafka.acls import bridge_group
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.ownership import OwnershipAssignor
from bridge.kafka.port import GroupTail, Log, Tail, TopicPart, UnknownTopic
from bridge.log.handover import Handovers
from bridge.log.identity import Keyring, load_keyring
from bridge.log.indexrestore import IndexerError, index_layout_error, load_index, topic_partitions
from bridge.log.indexwriter import IndexWriter
from bridge.log.misrouted import MisroutedEvents
from bridge.log.owned import NotOwner, OwnedPartitions
from bridge.log.ownership import GroupCallbacks, Ownership, OwnershipListener
from bridge.log.seqindex import PartitionIndex, TaskEntry
from bridge.log.seqtail import (
    CREATED_SKEW_MS,
    IndexedEvent,
    Listener,
    SeqTail,
    out_of_place,
    task_partition,
)
from bridge.log.standby import Standbys

__all__ = [
    "CREATED_SKEW_MS",
    "IndexedEvent",
    "Indexer",
    "IndexerError",
    "NotOwner",
    "OwnershipListener",
    "index_layout_error",
    "load_index",
    "out_of_place",
    "topic_partitions",
]

log = logging.getLogger(__name__)


class Indexer(Component):
    """Derives seq for the committed records of the events partitions this process owns, and
    (``persist``) writes their index, one fenced transactional writer per partition.

    Ownership is every partition (``settings.replicas.ownership == "all"``), or what the consumer group
    assigns (``"group"``: see :mod:`bridge.kafka.ownership`). A partition gained is restored
    from its index slice and tailed from there; a partition lost is flushed and dropped, and
    the ownership listeners are told (streams on it end so that clients resume on its owner).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        persist: bool = False,
        flush_interval_s: float = 0.5,
        keyring: Keyring | None = None,
        on_misrouted: Callable[[], None] | None = None,
        log: Log | None = None,
    ) -> None:
        """``log``: the log to index (the cluster of ``settings`` when None)."""
        self.settings = settings
        self.persist = persist
        self.flush_interval_s = flush_interval_s
        self.group = settings.replicas.ownership == "group"
        self.assignor: OwnershipAssignor | None = None
        self._owned = OwnedPartitions()
        #: Events in a partition their task id does not map to (``on_misrouted`` counts each).
        self.misrouted = MisroutedEvents(self.partition_of, on_misrouted)
        #: Verifies the signature of every ``task.created`` record.
        self.keyring = keyring if keyring is not None else load_keyring(settings)
        #: The log: the events partitions, their index slices and the fenced index writers.
        self._log: Log = log if log is not None else KafkaLog(settings, pool_size=2)
        self._own_log = log is None
        #: The tail of the owned partitions (the group's member in ``group`` mode).
        self._reader: Tail | GroupTail | None = None
        #: The same tail, as the group's member (``group`` mode, while started).
        self._member: GroupTail | None = None
        self._callbacks: GroupCallbacks | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._writer = IndexWriter(settings, self._log, self._owned, group=self.group)
        self._seq = SeqTail(
            settings,
            self._owned,
            self._writer,
            keyring=self.keyring,
            misrouted=self.misrouted,
            log_=self._log,
            persist=persist,
        )
        self._ownership = Ownership(
            settings, self._owned, self._writer, self._started_tail, log_=self._log, persist=persist
        )
        #: How long the last :meth:`hand_over` took.
        self.hand_over_seconds = 0.0

    # --- the parts' state, as attributes ------------------------------------------------------

    @property
    def partitions(self) -> dict[int, PartitionIndex]:
        """The derived state of the partitions this process owns now."""
        return self._owned.partitions

    @partitions.setter
    def partitions(self, partitions: dict[int, PartitionIndex]) -> None:
        # In place: every part holds this one dict (tests set an offline indexer's state).
        self._owned.partitions.clear()
        self._owned.partitions.update(partitions)

    @property
    def partition_count(self) -> int:
        """The events topic's partition count (murmur2 of the key modulo this is a partition)."""
        return self._owned.count

    @partition_count.setter
    def partition_count(self, count: int) -> None:
        self._owned.count = count

    @property
    def fenced(self) -> set[int]:
        """Partitions whose writer a newer writer fenced (in ``all`` mode they go on
        unpersisted)."""
        return self._writer.fenced

    @property
    def rebalances(self) -> int:
        """Assignments applied (``group`` mode)."""
        return self._ownership.rebalances

    @property
    def moved(self) -> dict[str, int]:
        """Partitions ``"gained"`` and ``"lost"`` over all assignments."""
        return self._ownership.moved

    @property
    def failed(self) -> BaseException | None:
        """Why the group's latest assignment could not be taken (retried with back-off);
        None while every assigned partition is owned."""
        return self._ownership.failed

    @property
    def restore_seconds(self) -> float:
        """How long the last restore of gained partitions took."""
        return self._ownership.restore_seconds

    @property
    def refused_identities(self) -> int:
        """``task.created`` records this process refused (unsigned or forged), in all."""
        refused = sum(idx.refused for idx in self.partitions.values())
        return self._ownership.refused_before + refused

    # --- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """Take ownership (every partition, or the group's share), restore, and start tailing."""
        s = self.settings
        if s.upgrade.legacy:
            log.warning(
                "rolling upgrade from %s (BRIDGE_UPGRADE__FROM): writing the index as 0.1.0 does "
                "and honouring unsigned task.created records; remove the setting once no 0.1.0 "
                "process runs (CHANGELOG.md, Upgrade)",
                s.upgrade.from_,
            )
        try:
            parts = await self._partitions(s.topics.events)
            self.partition_count = len(parts)
            index_parts = await self._partitions(s.topics.index)
            if len(index_parts) < len(parts):
                raise index_layout_error(
                    s, f"has {len(index_parts)} partitions and the events topic {len(parts)}"
                )
            if self.group:
                await self._join_group()
            else:
                tail = self._log.tail("indexer")
                self._reader = tail
                await tail.start()
                tail.assign({TopicPart(s.topics.events, p): 0 for p in parts})  # sought in gain()
                await self._ownership.gain(set(parts))
                self._ownership.assigned.set()
                self._tasks.append(self._tailing(tail))
        except BaseException:
            await self.stop()
            raise
        if self.persist:
            persisting = self._writer.run(self.flush_interval_s)
            self._tasks.append(asyncio.create_task(persisting, name="indexer-persist"))

    def _tailing(self, tail: Tail) -> asyncio.Task[None]:
        """The seq tail's task; if it ends with an error, the indexer reports it as failed
        (not ready: nothing more is indexed)."""
        task = asyncio.create_task(self._seq.run(tail), name="indexer-tail")

        def ended(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None:
                self._ownership.failed = done.exception()
                log.error("the seq tail stopped: %r", done.exception())

        task.add_done_callback(ended)
        return task

    async def _join_group(self) -> None:
        s = self.settings
        if s.peers.advertised_url is None:  # the settings refuse this; a guard for direct use
            raise IndexerError("ownership 'group' needs peers.advertised_url")
        self.assignor = OwnershipAssignor(
            s.peers.advertised_url,
            s.topics.events,
            s.replicas.instance_id,
            standbys=s.handover.standbys if self.persist else 0,
        )
        self.assignor.warm = self._ownership.standbys.warm
        self._callbacks = GroupCallbacks(
            self._ownership, self._writer, self.assignor, self._group_member
        )
        # Positions come from the index (seek on assignment); a committed offset, when there
        # is one, is only ever at or below it, and records below ``through`` are skipped.
        # Retention passing a position must surface (the seq tail marks what it lost and
        # repositions): "earliest" would silently resume at the log start, seqs then wrong.
        tail = self._log.group_tail(
            bridge_group(s.topics),
            [s.topics.events],
            self._callbacks,
            assignor=self.assignor,
            instance_id=s.replicas.instance_id,
            session_timeout_ms=s.replicas.session_timeout_ms,
            reset="none",
            role="indexer",
        )
        self._reader = self._member = tail
        await tail.start()
        self._tasks.append(self._tailing(tail))
        async with asyncio.timeout(max(60.0, 3 * s.replicas.session_timeout_ms / 1000)):
            await self._ownership.assigned.wait()
        failed = self._ownership.failed
        if failed is not None:  # the first share could not be taken: say why, do not serve
            if isinstance(failed, IndexerError):
                raise failed
            raise IndexerError(f"could not take the assigned partitions: {failed!r}") from failed

    def _group_member(self) -> GroupTail | None:
        return self._member

    async def hand_over(self) -> bool:
        """Before a stop (SIGTERM, ``group`` mode): rejoin *draining*, so the others take every
        partition, and return once each new owner serves what it took (each stream of a
        partition given away ends then, "moved"), within ``handover.timeout_s``.

        True when nothing is owned any more (every partition was handed over); False when
        there is no hand-over (``all`` mode, the setting at 0, no other replica, or a group
        leader of an older version that does not know draining) or the bound passed.
        """
        member = self._group_member()
        bound = self.settings.handover.timeout_s
        if member is None or self.assignor is None or bound <= 0:
            return False
        started = time.monotonic()
        self.assignor.draining = True
        self._ownership.standbys.want(set())  # about to stop: no copy is worth keeping
        rebalanced = asyncio.create_task(self.next_rebalance(), name="indexer-handover")
        try:
            async with asyncio.timeout(bound):
                member.rejoin()
                await rebalanced
                await self._ownership.handovers.settled()
        except TimeoutError:
            log.warning("the hand-over did not complete within %g s", bound)
        finally:
            await cancel_and_wait(rebalanced)
        self.hand_over_seconds = time.monotonic() - started
        handed = not self.partitions
        log.info(
            "hand-over %s in %.2fs",
            "complete" if handed else f"incomplete: still owning {sorted(self.partitions)}",
            self.hand_over_seconds,
        )
        return handed

    def report_hand_overs(
        self, on_handed_over: Callable[[float, bool], None], on_gained: Callable[[float], None]
    ) -> None:
        """Where the hand-overs are reported (metrics, wired at composition): each lost
        partition's seconds until its streams ended and whether its new owner was seen serving
        it; each gain's seconds from the assignment to serving."""
        self._ownership.handovers.on_done = on_handed_over
        self._ownership.on_gained = on_gained

    @property
    def standbys(self) -> Standbys:
        """The warm copies of the partitions this replica stands by for."""
        return self._ownership.standbys

    @property
    def handovers(self) -> Handovers:
        """Lost partitions whose streams stay open until their new owner serves them."""
        return self._ownership.handovers

    async def stop(self) -> None:
        """Stop tailing; a persisting indexer flushes what it has first."""
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self._callbacks is not None:
            await self._callbacks.stop()
        await self._ownership.stop()
        if self._writer.writers:
            with contextlib.suppress(Exception):
                await self._writer.flush()
        await self._writer.close(set(self._writer.writers))
        if self._reader is not None:
            await self._reader.close()  # a dynamic member leaves the group here
            self._reader = self._member = None
        if self._own_log and isinstance(self._log, KafkaLog):
            await self._log.close()

    async def _partitions(self, topic: str) -> list[int]:
        """Partition ids of ``topic``, or :class:`IndexerError` naming the fix."""
        try:
            return await self._log.partitions(topic)
        except UnknownTopic as exc:
            raise IndexerError(str(exc)) from None

    # --- ownership -------------------------------------------------------------------------

    async def next_rebalance(self) -> None:
        """Return after the next assignment has been applied (bound the wait)."""
        await self._ownership.next_rebalance()

    def owner_url(self, partition: int) -> str | None:
        """Where the owner of ``partition`` answers (group mode), as the last assignment said."""
        if self.assignor is None:
            return None
        return self.assignor.map.owner(partition)

    def owns(self, partition: int) -> bool:
        return partition in self.partitions

    async def remove_from_group(self, instance_id: str) -> None:
        """Have the group drop the static member ``instance_id`` now (its process is gone):
        the group rebalances without it instead of after its session timeout."""
        await self._log.remove_members(bridge_group(self.settings.topics), [instance_id])

    def add_ownership_listener(self, listener: OwnershipListener) -> None:
        self._ownership.listeners.append(listener)

    # --- queries -------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self._seq.listeners.append(listener)

    def partition_of(self, task_id: str) -> int:
        return task_partition(task_id, self._owned.count)

    def lookup(self, task_id: str) -> tuple[int, TaskEntry] | None:
        """The task's partition and index entry, or None if no record of it was indexed;
        :class:`NotOwner` when another replica owns the task's partition."""
        partition = self.partition_of(task_id)
        entry = self._owned.owned(partition).get(task_id)
        return None if entry is None else (partition, entry)

    def pause(self) -> None:
        """Stop fetching (operations drills); the lag metrics then grow."""
        tail = self._started_tail()
        tail.pause(*tail.assignment())

    def resume(self) -> None:
        tail = self._started_tail()
        tail.resume(*tail.assignment())

    def _started_tail(self) -> Tail:
        if self._reader is None:
            raise NotStarted("the indexer")
        return self._reader

    def head(self, task_id: str) -> int | None:
        """The task's next seq (the number of its events indexed so far), or None."""
        return self._owned.owned(self.partition_of(task_id)).next_seq_of(task_id)

    async def wait_indexed(self, partition: int, offset: int) -> None:
        """Return once the record at ``offset`` (and all before it) has been applied;
        :class:`NotOwner` if the partition is (or becomes) another replica's.

        Callers bound the wait with ``asyncio.timeout``.
        """
        while self._owned.owned(partition).through <= offset:
            await self._owned.progressed()

    async def end_offsets(self) -> dict[int, int]:
        """The current end (last stable offset) of every owned events partition."""
        self._started_tail()
        tps = [TopicPart(self.settings.topics.events, p) for p in self.partitions]
        if not tps:
            return {}
        ends = await self._log.log_ends(tps)
        return {tp.partition: off for tp, off in ends.items()}

    async def catch_up(self) -> None:
        """Return once everything committed before this call has been applied in the owned
        partitions (bound it)."""
        await self._ownership.assigned.wait()
        ends = await self.end_offsets()
        while any(
            p in self.partitions and self.partitions[p].through < end for p, end in ends.items()
        ):
            await self._owned.progressed()

    # --- persisting ----------------------------------------------------------------------

    async def flush(self) -> int:
        """Persist every owned partition's cut, one transaction per partition; returns the
        number of index records written."""
        return await self._writer.flush()

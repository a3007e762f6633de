"""Which events partitions the indexer owns, and what gaining or losing one does.

Where it sits: between the port's tail (the group's member in ``group`` mode, whose assignment
callbacks arrive here; see :mod:`bridge.kafka.ownership` for the assignor that deals the
partitions) and the indexer's other parts. A partition gained has its previous index writer
fenced (:mod:`bridge.log.indexwriter`), its slice of the index restored
(:mod:`bridge.log.indexrestore`) and reconciled with the log (:mod:`bridge.log.reconcile`),
and the tail sought to it; a partition lost is flushed and dropped, and the ownership listeners
are told (streams on it end so that clients resume on its owner) once its new owner serves it
(:mod:`bridge.log.handover`). A partition kept through the eager revoke that starts every
rebalance is neither dropped nor restored: its streams never notice. It applies no record
(:mod:`bridge.log.seqtail`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.kafka.ownership import OwnershipAssignor
from bridge.kafka.port import GroupTail, Log, LogError, Tail, TopicPart
from bridge.log.handover import Handovers
from bridge.log.indexrestore import IndexerError, load_index
from bridge.log.indexwriter import IndexWriter
from bridge.log.owned import OwnedPartitions
from bridge.log.reconcile import decide, mark_lost
from bridge.log.seqindex import PartitionIndex
from bridge.log.standby import Standbys, catch_up_copy

__all__ = ["GroupCallbacks", "Ownership", "OwnershipListener"]

log = logging.getLogger(__name__)

#: Called with the partitions gained and lost at each assignment (both may be empty).
OwnershipListener = Callable[[set[int], set[int]], None]


#: Back-off of a failed gain's retries: the first wait and the longest.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
#: The bound of a returning replica's wait for warm copies before it rejoins for its share,
#: when ``handover.timeout_s`` is 0 (the hand-over turned off while it was stopped draining):
#: the wait must end even when the copies never warm (the index topic's leader is away).
REJOIN_WAIT_S = 20.0


class Ownership:
    """Gains and loses partitions for the indexer, one assignment at a time."""

    def __init__(
        self,
        settings: Settings,
        owned: OwnedPartitions,
        writer: IndexWriter,
        started_tail: Callable[[], Tail],
        *,
        log_: Log,
        persist: bool,
    ) -> None:
        """``started_tail``: the indexer's tail, or :class:`~bridge.component.NotStarted`."""
        self.settings = settings
        self.persist = persist
        #: Set once the first assignment (or, ``all``, every partition) is owned.
        self.assigned = asyncio.Event()
        self.listeners: list[OwnershipListener] = []
        self.rebalances = 0
        self.moved = {"gained": 0, "lost": 0}
        #: How long the last restore of gained partitions took.
        self.restore_seconds = 0.0
        #: ``task.created`` records refused by partitions no longer owned.
        self.refused_before = 0
        self._owned = owned
        self._writer = writer
        self._started_tail = started_tail
        self._log = log_
        self._rebalanced = asyncio.Event()
        self._moving = asyncio.Lock()
        #: Why the last assignment could not be taken (None once one was): a start fails on
        #: it; later, the gain is retried (:meth:`retry_failed`) and readiness reports it.
        self.failed: BaseException | None = None
        #: The group's latest assignment (what a retry takes).
        self._assignment: set[int] = set()
        self._retrying: asyncio.Task[None] | None = None
        #: Called with the seconds from an assignment to serving what it gained (a metric).
        self.on_gained: Callable[[float], None] = lambda seconds: None
        #: Lost partitions whose loss is told once their new owner serves them (persisting
        #: replicas only: the signal is the new owner's index write).
        #: Warm copies of the partitions this replica stands by for (taken on a gain).
        self.standbys = Standbys(settings, log_)
        self.handovers = Handovers(
            settings.topics.index,
            log_,
            self._tell_lost,
            timeout_s=settings.handover.timeout_s if persist else 0.0,
        )

    def _tell_lost(self, lost: set[int]) -> None:
        """A held partition's new owner serves it (or the bound passed): tell the listeners."""
        lost -= set(self._owned.partitions)  # taken back meanwhile: nothing to end
        if lost:
            self.moved["lost"] += len(lost)
            self._notify(set(), lost)

    def _notify(self, taken: set[int], lost: set[int]) -> None:
        for listener in self.listeners:
            try:
                listener(taken, lost)
            except Exception:
                log.exception("ownership listener failed")

    def owned_now(self) -> set[int]:
        """The partitions owned now."""
        return set(self._owned.partitions)

    def stand_by(self, assignor: OwnershipAssignor) -> None:
        """Keep warm copies of what the last assignment names this replica standby for (none
        while draining: it is about to stop)."""
        named = set() if assignor.draining else assignor.map.standing_by(assignor.url)
        self.standbys.want(named - set(self._owned.partitions))

    async def revoked(self) -> None:
        """The revoke before a rebalance (after the flush): note where the owned partitions'
        index slices end, so that their next owner's first write can be seen."""
        await self.handovers.note_ends(set(self._owned.partitions))

    async def next_rebalance(self) -> None:
        """Return after the next assignment has been applied."""
        await self._rebalanced.wait()

    async def gain(self, parts: set[int]) -> None:
        """Own ``parts``: fence their previous writers, restore their slices, seek to them."""
        if not parts:
            return
        tail = self._started_tail()
        topic = self.settings.topics.events
        if self.persist:
            # Fence first: the old owner's open transaction is aborted, so the restore below
            # reads a cut that no zombie can still extend.
            await self._writer.open(parts)
        started = time.perf_counter()
        try:
            restored = await self._restored(parts)
        except LogError as exc:
            # Without its index a partition's seq cannot be known: nothing is served from it.
            raise IndexerError(
                f"could not read the seq index of events partitions {sorted(parts)} from the "
                f"index topic {self.settings.topics.index!r} ({exc!r}): every partition of it "
                "needs a leader that answers; nothing is served until it can be read"
            ) from exc
        self.restore_seconds = time.perf_counter() - started
        tps = [TopicPart(topic, p) for p in sorted(parts)]
        begins = await self._log.log_starts(tps)
        ends = await self._log.log_ends(tps)
        legacy = self.settings.upgrade.legacy
        for tp in tps:
            idx = restored[tp.partition]
            idx.track_dirty = self.persist
            if idx.through < begins[tp]:
                mark_lost(idx, begins[tp])
            self._owned.partitions[tp.partition] = idx
            upgraded = decide(idx, begins[tp], ends[tp], persist=self.persist, legacy=legacy)
            self._writer.took(idx, upgraded)
            tail.reposition(tp, idx.through)
        log.info(
            "owning events partitions %s: restored %d tasks in %.2fs",
            sorted(parts),
            sum(len(restored[p]) for p in parts),
            self.restore_seconds,
        )

    async def _restored(self, parts: set[int]) -> dict[int, PartitionIndex]:
        """The index of ``parts`` as their previous owner committed it (after the fence): a
        standby copy caught up from where it stands, else the slice restored in full."""
        warm = {p: taken for p in sorted(parts) if (taken := self.standbys.take(p)) is not None}
        restored = await load_index(self.settings, parts - set(warm), log=self._log)
        if warm:
            topic = self.settings.topics.index
            ends = await self._log.log_ends([TopicPart(topic, p) for p in warm])
            for p, (standby, position) in warm.items():
                end = ends[TopicPart(topic, p)]
                await catch_up_copy(self.settings, self._log, standby, position, end)
                restored[p] = standby
            log.info("events partitions %s taken from warm standby copies", sorted(warm))
        return restored

    async def lose(self, parts: set[int]) -> None:
        """Give up ``parts``: persist what they have (if still allowed) and drop their state."""
        if not parts:
            return
        wrote: set[int] = set()
        for p in parts & set(self._writer.writers):
            with contextlib.suppress(Exception):
                if await self._writer.flush_partition(p):
                    wrote.add(p)
        await self._writer.close(parts)
        # What the seq tail applied since the revoke was written now, after the ends were
        # noted: this replica's own write must not pass for the new owner's first one.
        await self.handovers.moved_ends(wrote)
        for p in parts:
            gone = self._owned.partitions.pop(p, None)
            self.refused_before += gone.refused if gone is not None else 0
            self._writer.drop(p)
        log.info("no longer owning events partitions %s", sorted(parts))

    async def assigned_now(self, assigned: set[int]) -> None:
        """The group's new assignment: lose, gain, and re-seek what is kept.

        A gain that fails (the previous writer cannot be fenced, the index slice cannot be
        read) leaves those partitions unowned, their writers closed, and :attr:`failed` set;
        the listeners still hear of what was lost and gained, and the gain is retried with
        back-off until it succeeds or the group assigns otherwise. The error is raised.
        """
        self._assignment = set(assigned)
        async with self._moving:
            owned = set(self._owned.partitions)
            lost, gained, kept = owned - assigned, assigned - owned, owned & assigned
            started = time.perf_counter()
            try:
                await self.lose(lost)
                await self.gain(gained)
                if gained:
                    self.on_gained(time.perf_counter() - started)
            except Exception as exc:
                await self._writer.close(gained - set(self._owned.partitions))
                self.failed = exc
                self._retry_later()
                raise
            else:
                self.failed = None
            finally:
                taken = gained & set(self._owned.partitions)
                tail = self._started_tail()
                for p in kept:
                    tail.reposition(
                        TopicPart(self.settings.topics.events, p),
                        self._owned.partitions[p].through,
                    )
                self.handovers.regained(taken)
                told = self.handovers.hold(lost)
                self.rebalances += 1
                self.moved["gained"] += len(taken)
                self.moved["lost"] += len(told)
                self.assigned.set()
                self._owned.notify_progress()  # waiters re-check: their partition may have moved
                self._rebalanced.set()
                self._rebalanced = asyncio.Event()
                self._notify(taken, told)

    def _retry_later(self) -> None:
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.create_task(self._retry(), name="indexer-retry-gain")

    async def _retry(self) -> None:
        delay = RETRY_FIRST_S
        while self.failed is not None:
            await asyncio.sleep(delay)  # back-off: the index topic's leader may come back
            delay = min(delay * 2, RETRY_MAX_S)
            try:
                await self.assigned_now(set(self._assignment))
            except Exception as exc:
                log.warning(
                    "still cannot take events partitions %s: %s", sorted(self._assignment), exc
                )

    async def stop(self) -> None:
        """Stop retrying a failed gain; what is held is told lost now."""
        if self._retrying is not None:
            await cancel_and_wait(self._retrying)
        await self.handovers.stop()
        await self.standbys.stop()


class GroupCallbacks:
    """The group's callbacks (a port GroupListener): flush before giving partitions back, then
    apply the new share.

    ``member``: the group's member these callbacks serve (asked to rejoin when the assignment
    still counts this replica as draining: it came back on the static replace path)."""

    def __init__(
        self,
        ownership: Ownership,
        writer: IndexWriter,
        assignor: OwnershipAssignor | None,
        member: Callable[[], GroupTail | None] = lambda: None,
    ) -> None:
        self.ownership = ownership
        self.writer = writer
        self.assignor = assignor
        self._member = member
        self._waiting: asyncio.Task[None] | None = None
        #: Set by :meth:`stop`: aiokafka's coordinator, which calls these, runs until the
        #: consumer closes, after the indexer stopped; what it calls then starts nothing.
        self._stopped = False

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        if self._stopped:
            return
        # Eager rebalancing revokes everything before the new round: persist now, so whoever
        # gets a partition restores its latest counts (partitions kept lose nothing).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.writer.flush()
        await self.ownership.revoked()

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        if self._stopped:
            return
        if self.assignor is not None:
            self.assignor.on_assignment(parts, user_data)
        try:
            await self.ownership.assigned_now({p.partition for p in parts})
        except Exception:
            log.exception("could not take the assigned partitions")
        if self.assignor is None:
            return
        self.ownership.stand_by(self.assignor)
        member = self._member()
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        if self.assignor.thought_draining and member is not None:
            # Back from a restart with the old (draining) metadata the broker kept: one rejoin,
            # once the copies of what it gave away are warm (bounded), to get a share again.
            log.info("the group counts this replica as draining: rejoining once warm")
            self._waiting = asyncio.create_task(
                self._rejoin_when_warm(member, self.assignor), name="indexer-rejoin-when-warm"
            )

    async def _rejoin_when_warm(self, member: GroupTail, assignor: OwnershipAssignor) -> None:
        standbys = self.ownership.standbys
        named = assignor.map.standing_by(assignor.url) - set(self.ownership.owned_now())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.ownership.settings.handover.timeout_s or REJOIN_WAIT_S):
                while not named <= standbys.warm():
                    await standbys.warmed()
        assignor.bump()  # the same metadata as the broker holds would not rebalance
        _rejoin(member)

    async def stop(self) -> None:
        """Stop waiting to rejoin, and take no assignment from now on."""
        self._stopped = True
        await cancel_and_wait(self._waiting)


def _rejoin(member: GroupTail) -> None:
    try:
        member.rejoin()
    except LogError as exc:  # closed meanwhile: it is stopping anyway
        log.info("no rejoin: %s", exc)

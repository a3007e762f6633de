"""Warm standbys: copies of the index of the partitions this replica is the next owner of.

Where it sits: beside the indexer's ownership (:mod:`bridge.log.ownership`). The group's
assignment names, for each events partition, the replica(s) that stand by for it
(:func:`bridge.kafka.ownership.name_standbys`; with two replicas, the other one). A standby
restores the partition's slice of the index topic once and then tails it (``read_committed``),
applying each record as the restore does, so its copy follows the owner's persisted cut within
a flush interval. When the partition is gained (a hand-over, a crash), the new owner fences the
old writer and catches its copy up from where it stands to the post-fence end, instead of
reading the whole slice again: a partition is served after the fence and a few records, not a
full restore (:meth:`Standbys.take`, :func:`catch_up_copy`).

Cost: a copy is a :class:`~bridge.log.seqindex.PartitionIndex` as large as the owner's (about
223 B a task), and the tail reads every index write of the partition once more. With one
standby a partition (``handover.standbys``, default 1) every replica holds, besides its own
share, the copies of about as many partitions again: twice the index memory, and the index
topic read twice.

What it does not do: index events (the seq tail), write the index, or decide who stands by.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.kafka.port import Log, LogError, Tail, TopicPart
from bridge.log.indexrestore import apply_index_record, load_index
from bridge.log.seqindex import PartitionIndex

__all__ = ["Standbys", "catch_up_copy"]

log = logging.getLogger(__name__)

#: How long one poll of the standby tail waits for index writes.
POLL_S = 0.5
#: The bound of a gain's catch-up of its copy (a leaderless index partition fails it).
CATCH_UP_S = 30.0
#: Back-off after a failed restore or tail (the index topic's leader may be away).
RETRY_S = 2.0
#: How far behind its slice's end a copy may be and count as warm (index records). Its gain
#: applies the rest after the fence; under a steady load a copy is never exactly at the end.
#: (Kafka Streams' acceptable.recovery.lag plays this part, 10,000 offsets by default.)
WARM_LAG = 1_000
#: Under a steady load, how often the slices' ends are looked at (seconds).
ENDS_EVERY_S = 1.0


class Standbys:
    """The standby copies this replica keeps, and the tail that keeps them current."""

    def __init__(self, settings: Settings, log_: Log) -> None:
        self.settings = settings
        self._log = log_
        self._topic = settings.topics.index
        #: Each standby partition's copy, once restored.
        self.copies: dict[int, PartitionIndex] = {}
        #: Where each copy's slice is applied up to (the next index offset to apply).
        self.positions: dict[int, int] = {}
        #: Each standby slice's end as last seen (what ``lag`` measures against).
        self.ends: dict[int, int] = {}
        #: The partitions to stand by for (the assignment's, less what is owned).
        self.wanted: frozenset[int] = frozenset()
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._warmed = asyncio.Event()
        self._ends_at = float("-inf")  # when the ends were last looked at (loop time)

    def want(self, parts: set[int]) -> None:
        """Stand by for exactly ``parts`` from now on (copies of others are dropped)."""
        wanted = frozenset(parts)
        if wanted == self.wanted:
            return
        self.wanted = wanted
        for p in set(self.copies) - wanted:
            self._drop(p)
        self._changed.set()
        if wanted and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="standbys")

    def take(self, partition: int) -> tuple[PartitionIndex, int] | None:
        """The copy of ``partition`` and its position, handed over to its new owner (the copy
        is no longer kept here); None when there is none."""
        copy = self.copies.get(partition)
        if copy is None:
            return None
        position = self.positions[partition]
        self._drop(partition)
        self.wanted -= {partition}
        self._changed.set()
        return copy, position

    async def warmed(self) -> None:
        """Return when the warm set next grows (callers re-check; bound the wait)."""
        self._warmed.clear()
        await self._warmed.wait()

    def warm(self) -> frozenset[int]:
        """The copies within :data:`WARM_LAG` records of their slice's end (as of the last
        look at it): what is left is applied by the gain's catch-up after the fence."""
        return frozenset(
            p
            for p, at in self.positions.items()
            if p in self.ends and at + WARM_LAG >= self.ends[p]
        )

    def lag(self) -> int:
        """Index records the copies are behind their slices, in all (as of the last look at
        the slices' ends)."""
        return sum(max(0, end - self.positions.get(p, 0)) for p, end in self.ends.items())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def _drop(self, partition: int) -> None:
        self.copies.pop(partition, None)
        self.positions.pop(partition, None)
        self.ends.pop(partition, None)

    async def _run(self) -> None:
        while self.wanted:
            try:
                await self._follow()
            except Exception as exc:  # a copy is an optimisation: a gain restores without it
                log.warning("standby copies %s: %r; retrying", sorted(self.wanted), exc)
                for p in list(self.copies):
                    self._drop(p)
                await asyncio.sleep(RETRY_S)  # back-off: the index topic may come back

    async def _follow(self) -> None:
        """Restore the missing copies, then tail every wanted slice until the wanted set
        changes (then the caller's loop starts again with the new set)."""
        self._changed.clear()
        wanted = set(self.wanted)
        await self._restore(wanted - set(self.copies))
        if self._changed.is_set():
            return
        async with self._log.tail("standby") as tail:
            tail.assign({TopicPart(self._topic, p): self.positions[p] for p in sorted(wanted)})
            while not self._changed.is_set():
                await self._step(tail)

    async def _restore(self, parts: set[int]) -> None:
        if not parts:
            return
        tps = [TopicPart(self._topic, p) for p in sorted(parts)]
        ends = await self._log.log_ends(tps)  # before the restore: re-applying is harmless
        restored = await load_index(self.settings, parts, log=self._log)
        for tp in tps:
            if tp.partition in self.wanted:
                self.copies[tp.partition] = restored[tp.partition]
                self.positions[tp.partition] = ends[tp]
        log.info("standing by for events partitions %s", sorted(parts))

    async def _step(self, tail: Tail) -> None:
        was_warm = self.warm()
        polled = await tail.poll(POLL_S)
        for tp, records in polled.records.items():
            copy = self.copies.get(tp.partition)
            for record in records:
                if copy is not None and record.key is not None and record.value is not None:
                    apply_index_record(
                        self.settings, {tp.partition: copy}, tp.partition, record.key, record.value
                    )
        for tp, at in polled.positions.items():
            if tp.partition in self.copies:
                self.positions[tp.partition] = at
        # A look at the ends says how far behind the copies are: when idle, and at least every
        # ENDS_EVERY_S under a steady load (looking only when idle, a busy index topic left
        # the copies never warm, and a restarted replica never rejoined for its share).
        now = asyncio.get_running_loop().time()
        if not polled.records or now - self._ends_at >= ENDS_EVERY_S:
            self._ends_at = now
            tps = [TopicPart(self._topic, p) for p in self.copies]
            with contextlib.suppress(LogError):
                ends = await self._log.log_ends(tps)
                self.ends.update({tp.partition: at for tp, at in ends.items()})
        if self.warm() - was_warm:
            self._warmed.set()


async def catch_up_copy(
    settings: Settings, log_: Log, copy: PartitionIndex, position: int, end: int
) -> None:
    """Apply the index records of ``copy``'s slice from ``position`` to ``end`` (the slice's
    end after the new owner's fence: everything the previous owner committed)."""
    if position >= end:
        return
    tp = TopicPart(settings.topics.index, copy.partition)
    try:
        async with asyncio.timeout(CATCH_UP_S):
            await _apply_range(settings, log_, copy, tp, position, end)
    except TimeoutError:  # as a restore that cannot read: the gain fails and is retried
        raise LogError(
            f"the standby copy of events partition {copy.partition} was not caught up within "
            f"{CATCH_UP_S:g} s",
            retriable=True,
        ) from None


async def _apply_range(
    settings: Settings, log_: Log, copy: PartitionIndex, tp: TopicPart, position: int, end: int
) -> None:
    async with log_.tail("standby-catch-up") as tail:
        tail.assign({tp: position})
        while position < end:
            polled = await tail.poll(POLL_S)
            for record in polled.records.get(tp, ()):
                if record.offset < end and record.key is not None and record.value is not None:
                    apply_index_record(
                        settings, {copy.partition: copy}, copy.partition, record.key, record.value
                    )
            position = polled.positions.get(tp, position)

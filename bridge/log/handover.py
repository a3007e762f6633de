"""The hand-over of a lost partition: its streams end only once its new owner serves it.

Where it sits: inside the indexer's ownership (:mod:`bridge.log.ownership`). A partition lost
in a rebalance used to be told to the ownership listeners at once, so every stream on it ended
("moved") while the new owner was still fencing and restoring it, and the clients' resumes
then waited or failed for that long. Here a lost partition is *held* instead: its streams stay
open (quiet: nothing of it is indexed here any more) until its new owner serves it, then the
listeners hear of the loss and the streams end with the "moved" reason, so their clients
resume on an owner that answers at once.

How the new owner is seen to serve: from the partition's slice of the index topic. At the
revoke that starts every rebalance this replica persists its cut and notes where each index
partition ends (:meth:`Handovers.note_ends`); from then on only the partition's next owner
writes there (the index writer's transactional id is the partition's, and this replica's
writer is flushed and closed). A new owner writes its marker with its first flush once it has
fenced, restored and taken the partition (:meth:`~bridge.log.indexwriter.IndexWriter.took`),
so the index partition's end moving past the noted end says "served". (The other signal, this
replica's writer being fenced, comes before the new owner's restore: too early.) An owner of
an older version writes only when its partition changes: then the bound
(``handover.timeout_s``) ends the wait, as it does when nobody takes the partition.

What it does not do: choose owners (the assignor), or end streams (the listeners do).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bridge.component import cancel_and_wait
from bridge.kafka.port import Log, LogError, TopicPart

__all__ = ["Handovers"]

log = logging.getLogger(__name__)

#: How long one poll of the index partitions waits for a new owner's write.
POLL_S = 0.5


class Handovers:
    """Lost partitions held until their new owner serves them (or ``timeout_s`` passed).

    ``release``: called with the partitions whose loss may now be told (each once).
    ``on_done``: called with each held partition's hand-over seconds and whether its new owner
    was seen to serve it (a metric, wired at composition).
    """

    def __init__(
        self,
        index_topic: str,
        log_: Log,
        release: Callable[[set[int]], None],
        *,
        timeout_s: float,
    ) -> None:
        self.index_topic = index_topic
        self.timeout_s = timeout_s
        self.on_done: Callable[[float, bool], None] = lambda seconds, served: None
        self._log = log_
        self._release = release
        #: Each index partition's end at the last revoke (what a new owner's write passes).
        self._ends: dict[int, int] = {}
        #: Held partitions, each with when it was lost.
        self.held: dict[int, float] = {}
        self._watching: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    async def note_ends(self, parts: set[int]) -> None:
        """At the revoke (after the flush): where each of ``parts``' index slices ends now.
        Unknown (the log did not answer) means the partition cannot be held."""
        self._ends = {}
        if not parts or self.timeout_s <= 0:
            return
        tps = [TopicPart(self.index_topic, p) for p in sorted(parts)]
        with contextlib.suppress(LogError, TimeoutError):
            async with asyncio.timeout(5):
                ends = await self._log.log_ends(tps)
                self._ends = {tp.partition: off for tp, off in ends.items()}

    async def moved_ends(self, parts: set[int]) -> None:
        """This replica wrote to ``parts``' index slices after the revoke (its last cut, as it
        lost them): note their ends again, past its own write. Unknown means they cannot be
        held (told lost at once: better than ending their streams on a write of its own)."""
        parts &= set(self._ends)
        if not parts:
            return
        for p in parts:
            del self._ends[p]
        tps = [TopicPart(self.index_topic, p) for p in sorted(parts)]
        with contextlib.suppress(LogError, TimeoutError):
            async with asyncio.timeout(5):
                ends = await self._log.log_ends(tps)
                self._ends.update({tp.partition: off for tp, off in ends.items()})

    def hold(self, lost: set[int]) -> set[int]:
        """Hold what of ``lost`` can be watched; returns the rest (to be told now)."""
        watched = {p for p in lost if p in self._ends}
        if not watched:
            return set(lost)
        now = time.monotonic()
        for p in watched:
            self.held[p] = now
        task = asyncio.create_task(self._watch(watched), name=f"handover {sorted(watched)}")
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)
        self._changed.set()
        return lost - watched

    def regained(self, parts: set[int]) -> None:
        """``parts`` are this replica's again: they are no longer held (their streams never
        ended, and now go on)."""
        for p in parts:
            self.held.pop(p, None)
        self._changed.set()

    async def settled(self) -> None:
        """Return once nothing is held (callers bound the wait)."""
        while self.held:
            self._changed.clear()
            await self._changed.wait()

    async def stop(self) -> None:
        """Stop watching; whatever is still held is told now."""
        await cancel_and_wait(*self._watching)
        self._done(set(self.held), served=False)

    async def _watch(self, parts: set[int]) -> None:
        ends = {p: self._ends[p] for p in parts}
        pending = set(parts)
        try:
            async with asyncio.timeout(self.timeout_s), self._log.tail("handover") as tail:
                tail.assign({TopicPart(self.index_topic, p): ends[p] for p in pending})
                while pending := {p for p in pending if p in self.held}:
                    polled = await tail.poll(POLL_S)
                    served = {
                        tp.partition
                        for tp, pos in polled.positions.items()
                        if tp.partition in pending and pos > ends[tp.partition]
                    }
                    self._done(served, served=True)
        except TimeoutError:
            log.warning(
                "events partitions %s: no new owner was seen serving within %g s; their "
                "streams end now (clients resume wherever the partition is served)",
                sorted(p for p in pending if p in self.held),
                self.timeout_s,
            )
        except LogError as exc:
            log.warning("could not watch the hand-over of %s: %s", sorted(pending), exc)
        finally:
            self._done({p for p in pending if p in self.held}, served=False)

    def _done(self, parts: set[int], *, served: bool) -> None:
        told = {p for p in parts if p in self.held}
        if not told:
            return
        now = time.monotonic()
        for p in told:
            self.on_done(now - self.held.pop(p), served)
        self._changed.set()
        self._release(told)

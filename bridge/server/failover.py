"""Crash fail-over: have the group drop an owner whose process is gone, now.

Where it sits: between :class:`~bridge.server.suspects.Suspects` (which reports an owner whose
peer port kept refusing connections: its host answers, nothing listens, so its process is gone)
and the indexer's group membership. Without this, a static member that died keeps its
partitions, unserved, until the group's session timeout (30 s in k8s/); with it, the group
rebalances at once without it (a LeaveGroup v3 by instance id:
:mod:`bridge.kafka.membership`).

Guards, because removing a member costs every replica a rebalance:

* whom to remove comes only from the group's ownership map (the instance id the owner's own
  metadata claimed, distributed by the group's leader), never from a request;
* only an owner of at least one partition in the current map, never this replica itself;
* at most one removal in flight, and at most one per ``interval_s`` from this replica;
* a member this replica removed that a later map names again (it rejoined: its process talks
  to Kafka, so the refusals come from the network between the replicas, e.g. a policy that
  rejects) is not removed again until it has answered this replica once, or has refused nothing
  for ``PARDON_INTERVALS`` intervals (then a refusal run is a new crash). Without this, two
  replicas cut off from each other's peer ports removed each other every ``interval_s``,
  forever, each removal a rebalance of the whole group;
* each removal (and each one skipped) is logged and counted.

What it does not do: detect anything (Suspects does), or serve the partitions (the group's
next assignment gives them to the survivors).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from bridge.kafka.ownership import OwnershipMap

__all__ = ["RemovalOutcome", "Removals"]

log = logging.getLogger(__name__)

#: How a report of a dead owner ended (the bounded label of its metric).
RemovalOutcome = Literal["removed", "failed", "not_owner", "rate_limited", "rejoined", "off"]

#: Members this replica removed, remembered until they answer (more is noise: one per replica).
MAX_REMOVED = 64

#: A rejoined member's pardon lapses after this many ``interval_s`` without a refusal run.
PARDON_INTERVALS = 10


class Removals:
    """Turns "this owner's port keeps refusing" into one guarded group removal.

    ``ownership()`` is the group's current map (None while this replica has none);
    ``remove(instance_id)`` removes a static member from the group; ``on_outcome`` counts
    each report's :data:`RemovalOutcome` (a metric, wired at composition); ``origin(url)`` is
    the peer origin an advertised URL names (the form hops and refusals use: the map keeps
    each replica's spelling). :meth:`answered`
    is told of every answer from an owner URL (wired at composition to the peer client).
    """

    def __init__(
        self,
        ownership: Callable[[], OwnershipMap | None],
        remove: Callable[[str], Awaitable[None]],
        *,
        own_url: str | None,
        interval_s: float,
        clock: Callable[[], float],
        enabled: bool = True,
        on_outcome: Callable[[RemovalOutcome], object] = lambda outcome: None,
        on_removed: Callable[[str], object] = lambda url: None,
        origin: Callable[[str], str | None] = lambda url: url,
    ) -> None:
        self._ownership = ownership
        self._remove = remove
        self._interval_s = interval_s
        self._clock = clock
        self._enabled = enabled
        self._on_outcome = on_outcome
        self._on_removed = on_removed
        self._origin = origin
        #: This replica's URL in both spellings (as advertised, and as a hop names it).
        self._own = {own_url, origin(own_url)} - {None} if own_url is not None else set()
        self._last: float | None = None
        self._running: asyncio.Task[None] | None = None
        self._closing = False
        #: Owner URL -> (instance id, map generation) of each removal made from here, until
        #: that URL answers this replica, or refuses nothing for PARDON_INTERVALS intervals;
        #: the last value is when it was last reported refusing (bounded: MAX_REMOVED).
        self._removed: dict[str, tuple[str, int, float]] = {}

    def answered(self, url: str) -> None:
        """``url`` answered this replica: a member removed from here is alive and reachable
        again, so a later run of refusals is a crash again."""
        if self._removed:
            self._removed.pop(url, None)

    def refusing(self, url: str) -> None:
        """``url``'s peer port kept refusing connections: remove its member when the guards
        allow (in the background; the caller never waits)."""
        if self._closing:
            return  # this replica is stopping: its own departure is the next change
        outcome = self._check(url)
        if outcome is not None:
            self._on_outcome(outcome)
            log.info("not removing the owner at %s from the group: %s", url, outcome)
            return
        ownership = self._ownership()
        instance = self._instance(ownership, url) if ownership is not None else None
        assert ownership is not None and instance is not None  # checked
        self._last = self._clock()
        self._remember(url, instance, ownership.generation)
        self._running = asyncio.create_task(self._removing(url, instance), name=f"remove {url}")

    def _check(self, url: str) -> RemovalOutcome | None:
        """Why ``url`` is not removed now, or None to remove it."""
        if not self._enabled:
            return "off"
        ownership = self._ownership()
        if url in self._own or ownership is None or self._instance(ownership, url) is None:
            return "not_owner"
        if self._rejoined(url, ownership):
            return "rejoined"  # alive to Kafka, unreachable from here: not a crash
        busy = self._running is not None and not self._running.done()
        recent = self._last is not None and self._clock() - self._last < self._interval_s
        return "rate_limited" if busy or recent else None

    def _rejoined(self, url: str, ownership: OwnershipMap) -> bool:
        """Whether this replica removed ``url``'s member, a later map names it again, and it
        has kept refusing since (a pardon that lapses after a long quiet: a member back and
        serving that this replica never happened to ask, crashing weeks later, is a crash)."""
        removed = self._removed.get(url)
        if removed is None or removed[0] != self._instance(ownership, url):
            return False
        instance, generation, last = removed
        if ownership.generation <= generation:
            return False
        now = self._clock()
        if now - last > PARDON_INTERVALS * self._interval_s:
            del self._removed[url]
            return False
        self._removed[url] = (instance, generation, now)
        return True

    def _instance(self, ownership: OwnershipMap, url: str) -> str | None:
        """The instance id of the owner whose advertised URL has the origin ``url`` (what hops
        and refusals name) when it owns a partition now, else None."""
        owning = set(ownership.owners.values())
        for advertised, instance in ownership.instances.items():
            if advertised in owning and self._origin(advertised) == url:
                return instance
        return None

    def _remember(self, url: str, instance: str, generation: int) -> None:
        self._removed.pop(url, None)
        if len(self._removed) >= MAX_REMOVED:
            del self._removed[next(iter(self._removed))]  # the oldest
        self._removed[url] = (instance, generation, self._clock())

    async def _removing(self, url: str, instance: str) -> None:
        log.warning(
            "the owner at %s (instance %s) refuses connections: its process is gone; "
            "having the group drop it now instead of after the session timeout",
            url,
            instance,
        )
        try:
            await self._remove(instance)
        except Exception as exc:  # the session timeout still removes it: nothing is lost
            log.warning("could not remove instance %s from the group: %r", instance, exc)
            self._removed.pop(url, None)  # not removed: a later map naming it proves nothing
            self._on_outcome("failed")
            return
        self._on_outcome("removed")
        self._on_removed(url)

    async def close(self) -> None:
        """Stop: no removal from here on, and one in flight is cancelled."""
        self._closing = True
        running = self._running
        if running is not None and not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

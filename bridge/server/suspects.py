"""Owners this replica could not reach: answered for at once, probed in the background.

Where it sits: inside :class:`~bridge.server.peers.Peers`. When a hop to an owner's peer
listener fails to connect (refused, reset, a TLS handshake that fails, no answer in time), the
owner is *suspected*: every request about its partitions is answered at once with the
retriable ``owner_unavailable`` (no connection attempt, no wait), until

* the group's ownership map changes (a new generation: the owner may be gone from it, or back),
* or the background probe of that owner (one per owner, never one per request; its delay
  doubles from ``probe_first_s`` up to ``probe_max_s``, jittered) reaches it again.

A probe that is *refused* (the owner's host answers, nothing listens on the port: its process
is gone) counts towards a crash: ``refusals`` refusals in a row within ``refusal_window_s``
call ``on_refusing`` (composition wires the guarded group removal,
:mod:`bridge.server.failover`). A timeout never counts: a busy owner causes those.

How long a client should wait (:meth:`Suspects.retry_after_s`): the time left until the group's
session timeout expires, counted from when the owner was first suspected (the group drops a
silent member then, and another owner takes its partitions), at least one second. An owner
whose last failure was a refusal, with the crash fail-over on (``refusal_wait_s``), is dropped
far sooner (within the refusal window; its partitions are served by a warm standby about a
second later): the wait is then the floor, one second. A client told the whole session timeout
(30 s in k8s/), or even the whole refusal window, comes back long after its partitions moved:
the rollout bench measured kill -> every stream resumed at 7.5 s with the window's 5 s, while
the group had moved the partitions 0.8 s after the kill. Retrying each second costs the dead
owner nothing: while it is suspected, every retry is answered here at once.

What it does not do: send hops (Peers does), decide ownership or remove members.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["ProbeFailed", "Suspect", "Suspects", "refused"]

log = logging.getLogger(__name__)

#: Owners remembered as suspects at once (the group names one URL per replica: more is noise).
MAX_SUSPECTS = 64


class ProbeFailed(Exception):
    """A probe did not reach the owner; ``refused`` when its host refused the connection."""

    def __init__(self, refused: bool) -> None:
        super().__init__("refused" if refused else "unreachable")
        self.refused = refused


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a refused connection: the
    owner's host answered that nothing listens on the port."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # a chain is finite, but guard it
        if isinstance(current, ConnectionRefusedError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@dataclass
class Suspect:
    """One suspected owner: since when, under which ownership generation, its refusals."""

    since: float
    generation: int
    refusals: list[float] = field(default_factory=list)
    probe: asyncio.Task[None] | None = None
    #: The group was asked to drop it: the next assignment is expected at once.
    removed: bool = False
    #: Its last failure was a refused connection (its process is gone, or going).
    refused: bool = False


class Suspects:
    """The suspected owners of one replica (bounded by :data:`MAX_SUSPECTS`).

    ``probe(url)`` returns when the owner answered, raises :class:`ProbeFailed` otherwise (it
    must bound its own wait). ``generation()`` is the ownership map's generation. ``sleep`` and
    ``clock`` are the loop's (injectable for tests); ``jitter()`` draws in [0, 1).
    ``refusal_wait_s``: how soon the crash fail-over drops a refusing owner (None: it is off).
    """

    def __init__(
        self,
        probe: Callable[[str], Awaitable[None]],
        *,
        clock: Callable[[], float],
        session_s: float = 10.0,
        probe_first_s: float = 0.25,
        probe_max_s: float = 2.0,
        refusals: int = 3,
        refusal_window_s: float = 5.0,
        generation: Callable[[], int] = lambda: 0,
        on_suspected: Callable[[], object] = lambda: None,
        on_refusing: Callable[[str], object] = lambda url: None,
        refusal_wait_s: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._probe = probe
        self._clock = clock
        self._session_s = session_s
        self._first_s = probe_first_s
        self._max_s = max(probe_first_s, probe_max_s)
        self._refusals = refusals
        self._window_s = refusal_window_s
        self._generation = generation
        self._on_suspected = on_suspected
        self._on_refusing = on_refusing
        self._refusal_wait_s = refusal_wait_s
        self._sleep = sleep
        self._jitter = jitter
        self._suspects: dict[str, Suspect] = {}
        self._closing = False

    def __len__(self) -> int:
        return len(self._suspects)

    def __contains__(self, url: object) -> bool:
        return url in self._suspects

    def is_suspected(self, url: str) -> bool:
        """Whether requests for ``url`` are answered at once; a suspicion from an older
        ownership map is forgotten here (the next request tries the owner again)."""
        suspect = self._suspects.get(url)
        if suspect is None:
            return False
        if suspect.generation != self._generation():
            self.clear(url)
            return False
        return True

    def retry_after_s(self, url: str) -> int:
        """Whole seconds a client should wait before retrying a request for ``url``: what is
        left of the session timeout since the owner was first suspected, at least 1; 1 for a
        refusing owner when the crash fail-over is on (the module's docstring says why)."""
        suspect = self._suspects.get(url)
        if suspect is None or suspect.removed:
            return 1
        elapsed = self._clock() - suspect.since
        left = min(self._session_s - elapsed, self._session_s)
        if suspect.refused and self._refusal_wait_s is not None:
            return 1  # the fail-over drops it within the window; a standby serves at once
        return max(1, math.ceil(left))

    def probe_of(self, url: str) -> asyncio.Task[None] | None:
        """The background probe of ``url`` while it is suspected (it ends when it answers)."""
        suspect = self._suspects.get(url)
        return suspect.probe if suspect is not None else None

    def suspect(self, url: str, exc: BaseException) -> None:
        """``url`` could not be connected to (``exc`` says how): suspect it, start its probe."""
        if self._closing:
            return
        suspect = self._suspects.get(url)
        if suspect is None:
            self._make_room()
            suspect = Suspect(self._clock(), self._generation())
            self._suspects[url] = suspect
            self._on_suspected()
            log.warning("suspecting %s (%s); probing it in the background", url, exc)
            suspect.probe = asyncio.create_task(self._probing(url), name=f"peer-probe {url}")
            # Only the failure that made the suspicion counts: requests in flight then fail
            # together (one moment, not a run); the probes count from here.
            self._count(url, suspect, refused(exc))

    def removed(self, url: str) -> None:
        """The group was asked to drop ``url``'s member: its partitions move at once."""
        suspect = self._suspects.get(url)
        if suspect is not None:
            suspect.removed = True

    def clear(self, url: str) -> None:
        """``url`` answered (or the ownership map changed): requests for it go there again."""
        suspect = self._suspects.pop(url, None)
        probe = suspect.probe if suspect is not None else None
        if probe is not None and probe is not asyncio.current_task():
            probe.cancel()

    async def close(self) -> None:
        """Stop every probe and wait until they stopped."""
        self._closing = True
        probes = [s.probe for s in self._suspects.values() if s.probe is not None]
        self._suspects.clear()
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)

    def _make_room(self) -> None:
        """Forget the oldest suspicion when full (its owner is tried again by a request)."""
        if len(self._suspects) >= MAX_SUSPECTS:
            oldest = min(self._suspects, key=lambda u: self._suspects[u].since)
            self.clear(oldest)

    def _count(self, url: str, suspect: Suspect, was_refused: bool) -> None:
        """Count a refusal (anything else breaks the run); a run long enough, within the
        window, says the owner's process is gone."""
        suspect.refused = was_refused
        if not was_refused:
            suspect.refusals.clear()
            return
        now = self._clock()
        suspect.refusals = [t for t in suspect.refusals if now - t <= self._window_s]
        suspect.refusals.append(now)
        if len(suspect.refusals) >= self._refusals:
            suspect.refusals.clear()  # the next run starts afresh (the removal is rate limited)
            try:
                self._on_refusing(url)
            except Exception:  # a report's failure never stops the probing
                log.exception("reporting %s as refusing failed", url)

    async def _probing(self, url: str) -> None:
        """Probe ``url`` until it answers (then it is cleared), or it is no longer suspected,
        or the ownership map changed (the suspicion is forgotten: a new map may not name it)."""
        delay = self._first_s
        while url in self._suspects:
            # Jittered in [delay/2, delay): replicas that suspect the same owner spread out.
            await self._sleep(delay * (0.5 + self._jitter() / 2))
            suspect = self._suspects.get(url)
            if suspect is None or not self.is_suspected(url):
                return
            try:
                await self._probe(url)
            except ProbeFailed as failed:
                if not self.is_suspected(url):
                    return  # the map changed under the probe: it speaks of an owner gone from it
                self._count(url, suspect, failed.refused)
                delay = min(self._max_s, delay * 2)
                continue
            except Exception:  # the probe's own bug: counted as no answer, never a crash
                log.exception("probing %s failed", url)
                self._count(url, suspect, False)
                delay = min(self._max_s, delay * 2)
                continue
            log.info("%s answers again; no longer suspected", url)
            self.clear(url)
            return

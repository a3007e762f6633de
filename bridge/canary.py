"""The end-to-end canary: synthetic probes through the path a client's ``tasks/stream`` takes.

Where it sits: an operations component beside the serving side, started last by
:func:`bridge.server.app.start_components` when ``canary.interval_s`` > 0 (off by default). In
the data flow of docs/architecture.md a probe goes the whole way round: written to the events
topic by the task service's publisher (``acks=all``) → the indexer's tail (seq derived) → the
fan-out → a :class:`~bridge.server.streams.StreamHub` stream (subscription, catch-up read,
``take_next``) → delivered. Only the HTTP framing is left out.

Like KMinion's end-to-end probe, it writes to every partition it is responsible for and
measures the round trip; a probe not seen within ``canary.timeout_s`` is lost. Here a
replica probes only the events partitions it owns (the indexer tells it when they move), so
with replicas every partition is probed exactly once in the cluster.

Each owned partition has one canary *task*: a real task, created the way tools/call creates
one (:func:`bridge.tasks.create.publish_created`, seq 0), whose owner is a random principal
made at start and never shown or logged, so no client can read it (tasks/get compares owner
digests). Probes are events of that task; the canary follows it with one long-lived stream.
The task is replaced at half its TTL and the old one ended with a terminal status (its
stream then ends as any client's would), so the index gains a few tasks per TTL, never one
per probe.

Metrics (docs/operations.md): ``bridge_canary_probes_total{partition}``,
``bridge_canary_lost_total{partition}`` and ``bridge_canary_latency_seconds``. The canary's
streams run in a hub of their own, the same class over the same indexer, reader and fan-out,
built by the composition with reports that leave the ``bridge_stream_*`` series to the clients
(:meth:`~bridge.metrics.Metrics.canary_streams`) but count a seq gap in the served
``bridge_stream_seq_gaps_total``; the shared reader's scan and lookup metrics go on counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field

from bridge.component import Component, cancel_and_wait
from bridge.config import Settings, ToolSpec
from bridge.log.indexer import Indexer, NotOwner
from bridge.log.publisher import TaskEventPublisher
from bridge.metrics import Metrics
from bridge.server.admission import Caller, Ticket
from bridge.server.streams import StreamHub
from bridge.tasks.create import now_ms, publish_created
from bridge.tasks.messages import new_task_id
from bridge.vocabulary import StatusPayload

__all__ = ["PROBE_SUFFIX", "Canary"]

log = logging.getLogger(__name__)

#: The probe event's type under the bridge's own prefix (``io.mcpbridge.canary.probe``).
PROBE_SUFFIX = "canary.probe"
#: The tool name in the canary tasks' ``task.created`` (not a tool of the catalog: no client
#: can call it).
_TOOL = "bridge-canary"
#: The client the canary's streams are counted as in their private hub.
_CLIENT = "bridge-canary"


class _Moved(Exception):
    """The partition moved to another replica while a probe was out: no outcome."""


class _StreamEnded(Exception):
    """The canary task's stream ended before the probe was delivered: the probe is lost."""


@dataclass(eq=False)
class _Lane:
    """One owned partition's canary task, its stream, and the probes awaiting delivery."""

    partition: int
    task_id: str
    offset: int  # where its task.created is
    created: float  # time.monotonic() at creation
    ticket: Ticket
    follow: asyncio.Task[None] | None = None
    pending: dict[int, asyncio.Future[float]] = field(default_factory=dict)

    def fail_pending(self, exc: Exception) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(exc)


class Canary(Component):
    """Probes each owned events partition every ``canary.interval_s`` (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        indexer: Indexer,
        hub: StreamHub,
        publisher: TaskEventPublisher,
        metrics: Metrics,
    ) -> None:
        """``hub``: the canary's own (see the module doc), not the clients'."""
        self.settings = settings
        self.indexer = indexer
        self.publisher = publisher
        self.metrics = metrics
        self.hub = hub
        types = settings.own_types
        self._types = types
        self.probe_type = f"{types.prefix}.{PROBE_SUFFIX}"
        # 256 random bits no client is configured with or can guess: the canary tasks' owner.
        self._principal = f"{_CLIENT}:{secrets.token_urlsafe(32)}"
        self._tool = ToolSpec(name=_TOOL, ttl_ms=int(settings.canary.task_ttl_s * 1000))
        self._numbers = itertools.count()
        self._lanes: dict[int, _Lane] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        indexer.add_ownership_listener(self._partitions_moved)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="bridge-canary")

    async def stop(self) -> None:
        """Stop probing and end every canary task with a terminal status (bounded)."""
        await cancel_and_wait(self._loop)
        self._loop = None
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            self._retire(lane, "the bridge stops")
        retiring = list(self._retiring)
        if retiring:
            await asyncio.wait(retiring, timeout=self.settings.canary.timeout_s)
        await cancel_and_wait(*retiring, *(lane.follow for lane in lanes))

    @property
    def task_ids(self) -> dict[int, str]:
        """The current canary task of each probed partition (for tests and drills)."""
        return {p: lane.task_id for p, lane in self._lanes.items()}

    async def _run(self) -> None:
        interval = self.settings.canary.interval_s
        while True:
            began = time.monotonic()
            try:
                await self.probe_all()
            except Exception:  # a bug here must not end the canary for the process's life
                log.exception("canary round failed")
            # The probing cadence, not synchronisation.
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    # --- one round -----------------------------------------------------------------------

    async def probe_all(self) -> None:
        """Probe every owned partition once, concurrently; one log line if any was lost."""
        owned = sorted(self.indexer.partitions)
        outcomes = await asyncio.gather(*(self._probe(p) for p in owned))
        lost = {p: why for p, why in zip(owned, outcomes, strict=True) if why is not None}
        if lost:
            log.warning(
                "canary: %d of %d probes lost: %s",
                len(lost),
                len(owned),
                "; ".join(f"partition {p}: {why}" for p, why in sorted(lost.items())),
            )

    async def _probe(self, partition: int) -> str | None:
        """One probe of ``partition``: None when delivered (or moot), else why it was lost."""
        timeout = self.settings.canary.timeout_s
        began = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                lane = await self._lane(partition)
                number = next(self._numbers)
                delivered = asyncio.get_running_loop().create_future()
                lane.pending[number] = delivered
                try:
                    began = time.monotonic()
                    payload = {"probe": number, "sentMs": now_ms()}
                    await self.publisher.publish(lane.task_id, self.probe_type, payload)
                    at = await delivered
                finally:
                    lane.pending.pop(number, None)
        except (_Moved, NotOwner):
            return None  # the new owner probes it now
        except TimeoutError:
            why = f"not delivered within {timeout:g} s"
        except _StreamEnded as exc:
            why = str(exc)
        except Exception as exc:  # the write or the set-up failed: the path is broken too
            why = f"{type(exc).__name__}: {exc}"
        else:
            self.metrics.canary_probed(partition, at - began)
            return None
        if partition in self.indexer.partitions:  # not a probe of a partition that just moved
            self.metrics.canary_probed(partition, None)
            return why
        return None

    # --- canary tasks --------------------------------------------------------------------

    async def _lane(self, partition: int) -> _Lane:
        """The partition's canary task with its stream open, created or replaced when due."""
        lane = self._lanes.get(partition)
        if lane is not None:
            if lane.follow is not None and lane.follow.done():
                self._lanes.pop(partition)
                self._retire(lane, "its stream ended")
                lane = None
            elif time.monotonic() - lane.created >= self.settings.canary.task_ttl_s / 2:
                self._lanes.pop(partition)
                self._retire(lane, "replaced before its TTL")
                lane = None
        if lane is None:
            lane = await self._create(partition)
        if lane.follow is None:
            # Kept even when this times out: the next round waits for the same task instead
            # of writing another one (an indexer that stalls must not grow the index).
            await self.indexer.wait_indexed(partition, lane.offset)
            lane.follow = asyncio.create_task(self._follow(lane), name=f"canary-{partition}")
        return lane

    async def _create(self, partition: int) -> _Lane:
        task_id = self._task_id_in(partition)
        where = await publish_created(
            self.publisher, self._types, self._tool, self._principal, task_id, now_ms()
        )
        if where.partition != partition:  # the producer's partitioner disagrees with ours
            raise RuntimeError(f"canary task written to partition {where.partition}")
        caller = Caller(self._principal, _CLIENT)
        lane = _Lane(
            partition, task_id, where.offset, time.monotonic(), Ticket(caller, task_id, None)
        )
        self._lanes[partition] = lane
        return lane

    def _task_id_in(self, partition: int) -> str:
        """A fresh random task id whose key hashes to ``partition`` (as tools/call draws ids
        for its owned partitions): P draws on average for P partitions."""
        for _ in range(64 * max(1, self.indexer.partition_count)):
            task_id = new_task_id()
            if self.indexer.partition_of(task_id) == partition:
                return task_id
        raise RuntimeError(f"no task id for partition {partition} found")

    async def _follow(self, lane: _Lane) -> None:
        """The canary task's stream: resolve each probe when the stream delivers it."""
        why = "its stream ended"
        try:
            async for batch in self.hub.events(lane.ticket, None):
                if batch is None:
                    continue  # keep-alive tick
                at = time.monotonic()
                for _seq, event in batch.pairs():
                    if event.type != self.probe_type:
                        continue
                    number = event.payload.get("probe")
                    future = lane.pending.get(number) if isinstance(number, int) else None
                    if future is not None and not future.done():
                        future.set_result(at)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = f"its stream failed: {type(exc).__name__}: {exc}"
        lane.fail_pending(_Moved() if lane.ticket.moved else _StreamEnded(why))

    def _retire(self, lane: _Lane, why: str) -> None:
        """End ``lane``'s task with a terminal status in the background; its stream then ends
        at that status (waited for, bounded), as a client's would."""
        task = asyncio.create_task(self._end(lane, why))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _end(self, lane: _Lane, why: str) -> None:
        status = StatusPayload(status="completed", status_message=f"canary task {why}")
        try:
            async with asyncio.timeout(self.settings.canary.timeout_s):
                await self.publisher.publish(lane.task_id, self._types.status, status.payload())
                if lane.follow is not None:
                    await lane.follow  # ends at the terminal status just written
        except TimeoutError:
            log.warning(
                "canary: the stream of the old canary task of partition %d did not end at its "
                "terminal status within %g s",
                lane.partition,
                self.settings.canary.timeout_s,
            )
        except Exception as exc:
            log.warning(
                "canary: could not end the old canary task of partition %d: %s: %s",
                lane.partition,
                type(exc).__name__,
                exc,
            )
        finally:
            await cancel_and_wait(lane.follow)

    def _partitions_moved(self, gained: set[int], lost: set[int]) -> None:
        """Partitions gained are probed from the next round; a lost one's probes end without
        an outcome, its canary task is ended, and its series go (the new owner's now)."""
        for partition in lost:
            self.metrics.canary_forget(partition)
            lane = self._lanes.pop(partition, None)
            if lane is not None:
                lane.fail_pending(_Moved())
                with contextlib.suppress(RuntimeError):  # no running loop: nothing to end
                    self._retire(lane, "moved to another replica")

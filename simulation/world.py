"""One simulated run: replicas, producers and stream clients over the in-memory log, under a
seeded schedule of faults, judged by the checker.

Every replica is the bridge's own serving path: an :class:`~bridge.log.indexer.Indexer` in a
consumer group (persisting its index through fenced per-partition writers), a
:class:`~bridge.log.reader.Reader`, a :class:`~bridge.log.fanout.Fanout` and a
:class:`~bridge.server.streams.StreamHub`. Producers are the producer SDK
(:class:`~bridge.log.publisher.TaskEventPublisher`, with the signed ``task.created`` of
:func:`~bridge.tasks.create.publish_created`) and raw records: JSON envelopes, transactions
(some aborted), and hostile records (forged ``task.created``, garbage, keyless). Clients open
``tasks/stream`` on the replica that owns the task's partition and resume with their cursor
when a stream ends without its result (moved, crashed, drained).

Everything random is drawn from one :class:`random.Random` seeded by the run's seed, and
time is the virtual loop's (:mod:`simulation.loop`), so a seed replays exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import random
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from bridge.clock import LoopClock, SeededEntropy
from bridge.config import Settings, ToolSpec, load_settings
from bridge.envelope import TaskEvent, encode_event
from bridge.kafka.memory import MemoryLog, MemoryWriter
from bridge.kafka.port import Log, TopicPart, WriterFenced
from bridge.keyring import Keyring
from bridge.log.fanout import Fanout
from bridge.log.identity import load_keyring
from bridge.log.indexer import Indexer, NotOwner, load_index
from bridge.log.publisher import TaskEventPublisher
from bridge.log.reader import Reader, UnknownTask
from bridge.log.seqindex import PartitionIndex, owner_key
from bridge.metrics import StreamMetrics
from bridge.server.admission import Caller
from bridge.server.streams import StreamHub
from bridge.server.wire import RpcError
from bridge.tasks.create import publish_created
from bridge.tasks.messages import owner_digest
from bridge.tasks.service import TaskService
from bridge.vocabulary import StatusPayload, TaskStatus
from bridge.workers.sdk import JobContext, Worker
from bridgedev.checker import CheckReport, Recording, check, ground_truth
from simulation import http, logs
from simulation.loop import Spinning, Stuck, VirtualLoop, run

__all__ = ["Outcome", "Plan", "run_seed"]

FORGER = Keyring([("sim", b"not-the-bridge-key-0123456789abc")])
TOOL = ToolSpec(name="sim")
#: Virtual wall-clock time: the loop's time this far past the epoch (records, creation times).
EPOCH = 1_700_000_000.0
CLOCK = LoopClock(EPOCH)
PARTITIONS = 4
WORKERS = 2
SESSION_MS = 3_000
#: The share of stream clients that stream over HTTP (simulation/http.py).
HTTP_SHARE = 0.25
#: Virtual seconds the end of a run may take to settle (owners, caught up).
SETTLE_S = 60
#: Draws allowed for one fault slot before the run counts it as a failure.
MAX_DRAWS = 12
FAULT_KINDS = (
    "crash_restart",
    "join_leave",
    "retention",
    "zombie",
    "stall_client",
    "abort_txn",
    "graceful_restart",
    "worker_restart",
)


@dataclass
class Plan:
    """What one seed runs (every number drawn from the seed)."""

    seed: int
    replicas: int = 3
    tasks: int = 10
    events: int = 500
    faults: int = 3
    #: Virtual seconds the run may take before it is judged stuck.
    deadline_s: float = 900.0


@dataclass
class Outcome:
    """What a run found: the checker's report, the other invariants, and the trace digest."""

    seed: int
    report: CheckReport
    problems: list[str]
    digest: str
    faults: list[str]
    virtual_s: float
    deliveries: int
    #: What took effect (fenced writes, OffsetOutOfRange met, cuts past the index...).
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.problems

    def summary(self) -> str:
        state = "ok" if self.ok else "FAILED"
        lines = [
            f"seed {self.seed}: {state}; faults {', '.join(self.faults)}; "
            f"{self.deliveries} deliveries in {self.virtual_s:.1f} virtual s; "
            f"{', '.join(f'{k} {v}' for k, v in sorted(self.stats.items()) if v)}; "
            f"trace {self.digest}"
        ]
        if not self.report.ok:
            lines.append(self.report.summary())
        lines.extend(f"  {p}" for p in self.problems)
        return "\n".join(lines)


@functools.cache
def settings_of(name: str) -> Settings:
    """A replica's settings (made once per name: the validation costs milliseconds)."""
    return load_settings(
        topics={"prefix": "sim", "partitions": PARTITIONS, "min_insync_replicas": 1},
        tasks={"checkpoint_interval": 4, "max_event_bytes": 4096},
        replicas={"ownership": "group", "instance_id": name, "session_timeout_ms": SESSION_MS},
        peers={
            "advertised_url": f"http://{name}.sim:8081",
            "secret": "simulation-peer-secret-0123456789abcdef",
        },
        streams={"queue_size": 16, "keepalive_s": 2.0, "cursor_catch_up_s": 1.0},
        auth={"mode": "bearer", "tokens": http.TOKENS},
        server={"allowed_hosts": [f"r{i}.sim" for i in range(10)]},
    )


#: The bridge's keyring (derived from the peer secret, as replicas in a group do).
KEYRING = load_keyring(settings_of("r0"))


class LogClock:
    """The memory log's clock on the virtual loop, in the domain's wall-clock time."""

    def now(self) -> float:
        return CLOCK.wall()

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_at(when - EPOCH, callback)


class Replica:
    """One bridge process's serving path; :meth:`crash` kills it without a goodbye."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.settings = settings_of(name)
        self.log = logs.ReplicaLog(
            world.log, name, self.settings.topics, world.problems, world.stats
        )
        self.indexer = Indexer(
            self.settings,
            persist=True,
            flush_interval_s=0.5,
            keyring=KEYRING,
            log=cast(Log, self.log),
        )
        self.reader = Reader(self.settings, self.indexer, log=cast(Log, self.log), clock=CLOCK)
        self.fanout = Fanout(self.indexer)
        self.hub = StreamHub(
            self.settings, self.indexer, self.reader, self.fanout, StreamMetrics(), CLOCK
        )
        self.service = TaskService(
            self.settings,
            self.indexer,
            self.reader,
            {TOOL.name: TOOL},
            self.fanout,
            log=cast(Log, self.log),
            clock=CLOCK,
            entropy=SeededEntropy(world.rng.getrandbits(64)),
        )
        #: Its ``POST /mcp`` (for the clients that stream over HTTP).
        self.app = http.endpoint(self)
        self.up = False
        #: The streams open here (a dict as an ordered set: a crash cuts them in a replayable
        #: order).
        self.attempts: dict[asyncio.Task[Any], None] = {}

    async def start(self) -> None:
        await self.indexer.start()
        await self.service.start()
        self.up = True

    def owns(self, partition: int) -> bool:
        return self.up and self.indexer.owns(partition)

    async def crash(self, *, zombie: bool = False) -> None:
        """Die at once: no flush, no LeaveGroup; streams cut. ``zombie``: cut off from the
        group's coordinator only: its session expires and others take its partitions, while it
        goes on fetching, indexing and flushing its index until a newer writer fences it, as a
        half-dead process does (:meth:`simulation.logs.SimGroupTail.zombie`)."""
        self.up = False
        tail = self.log.member
        if tail is not None:
            if zombie:
                tail.zombie()
            else:
                tail.crash()
        for attempt in list(self.attempts):
            attempt.cancel()
        if not zombie:
            await self.kill_zombie()
        await asyncio.gather(*self.attempts, return_exceptions=True)

    async def kill_zombie(self) -> None:
        for task in self.indexer._tasks:
            task.cancel()
        await asyncio.gather(*self.indexer._tasks, return_exceptions=True)
        self.indexer._tasks = []

    async def stop(self, *, hand_over: bool = True) -> None:
        """A graceful stop (SIGTERM): the partitions handed over to the others first (their
        streams end "moved" once their new owner serves them), then what is left drained, the
        index flushed, the member gone (static). The run's end stops without the hand-over
        (a rebalance and restores per replica that no check looks at)."""
        if hand_over:
            handed = await self.indexer.hand_over()
            self.world.stats["hand-over complete" if handed else "hand-over incomplete"] += 1
        self.up = False
        self.hub.drain()
        await asyncio.gather(*self.attempts, return_exceptions=True)
        await self.service.stop()
        await self.indexer.stop()
        await self.reader.close()


@dataclass
class TaskPlan:
    task_id: str
    principal: str
    events: int
    fmt: str  # "worker" (tools/call, then the worker SDK), "sdk-avro", "sdk-json", "raw-json"
    hostile: str | None = None  # "forged", "garbage" or "keyless", written mid-task
    #: A forged task.created of this task written before the pipeline's own (its seq 0).
    race: bool = False
    #: A stale status ("working") written after the task's terminal one.
    after_terminal: bool = False
    created: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class World:
    plan: Plan
    rng: random.Random
    log: MemoryLog
    recording: Recording = field(default_factory=Recording)
    replicas: dict[str, Replica] = field(default_factory=dict)
    stats: logs.Stats = field(default_factory=Counter)
    #: The faults that took effect, as the outcome names them.
    effective: list[str] = field(default_factory=list)
    #: Tasks a stream was refused as untrusted (retention deleted their records unindexed).
    untrusted: set[str] = field(default_factory=set)
    clients: dict[str, TaskPlan] = field(default_factory=dict)
    #: Tasks a stream was refused as not found (over HTTP): the index must bind them to no one.
    denied: set[str] = field(default_factory=set)
    #: JSON-RPC ids of the HTTP clients' requests (per run: a seed replays alone or in a range).
    request_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: The streams handed their task's result.
    ended: set[tuple[str, str]] = field(default_factory=set)
    trace: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tasks: list[TaskPlan] = field(default_factory=list)
    stalled: set[str] = field(default_factory=set)
    workers: dict[str, tuple[Worker, asyncio.Task[None]]] = field(default_factory=dict)
    background: list[asyncio.Task[Any]] = field(default_factory=list)

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def note(self, what: str) -> None:
        self.trace.append(f"{self.now():.3f} {what}")

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.background.append(task)
        return task

    def owner_of(self, partition: int) -> Replica | None:
        owners = [r for r in self.replicas.values() if r.owns(partition)]
        return owners[0] if len(owners) == 1 else None

    async def sleep(self, low: float, high: float) -> None:
        await asyncio.sleep(self.rng.uniform(low, high))

    def refused(
        self, client_id: str, task: TaskPlan, after: int | None, exc: RpcError
    ) -> int | None:
        """A stream refused: note an events_gone (the cursor moves to the earliest retained
        seq); a cursor ahead of a lagging replica is retried; anything else is a problem."""
        data = exc.data if isinstance(exc.data, dict) else {}
        reason = data.get("reason")
        self.note(f"refused {client_id} {reason}")
        if reason == "events_gone":
            earliest = int(data["earliestSeq"])
            self.recording.gone(client_id, task.task_id, -1 if after is None else after, earliest)
            return earliest - 1
        if reason == "cursor_ahead":
            return after
        if reason == "seq_untrusted":
            self.untrusted.add(task.task_id)  # judged at the end: the index must agree
            raise _Untrusted
        if reason is None and "not found" in exc.message:
            # Over HTTP: a task owned by no one (the raced one; one whose task.created
            # retention deleted unindexed) is no one's to stream (judged at the end against
            # the persisted index); else the owner has not indexed it yet: ask again.
            if self.unowned(task):
                self.denied.add(task.task_id)
                raise _Denied
            return after
        self.problems.append(f"{client_id}: refused {reason}: {exc.message}")
        return after

    def unowned(self, task: TaskPlan) -> bool:
        """Whether the task's owner indexed it as owned by no one."""
        partition = _partition(self, task)
        owner = self.owner_of(partition)
        idx = owner.indexer.partitions.get(partition) if owner is not None else None
        entry = idx.get(task.task_id) if idx is not None else None
        return entry is not None and entry.owner == 0

    def last_seq(self, client_id: str, task_id: str) -> int | None:
        """The highest seq ``client_id`` was handed of ``task_id`` (its cursor)."""
        stream = self.recording.streams.get((client_id, task_id))
        if stream is None or not stream.seqs:
            return None
        return max(stream.seqs)


# --- producers ------------------------------------------------------------------------------


async def request_task(world: World, task: TaskPlan) -> None:
    """tools/call as a task: a replica's task service writes ``task.created`` and the job;
    a worker runs it (:func:`run_job`)."""
    while True:
        live = [r for r in world.replicas.values() if r.up and r.indexer.partitions]
        if live:
            replica = world.rng.choice(live)
            try:
                args = {"n": task.events, "hostile": task.hostile}
                view = await replica.service.create(TOOL, args, task.principal)
            except Exception as exc:
                world.note(f"create refused {type(exc).__name__}")
            else:
                task.task_id = view.task_id
                task.created.set()
                world.note(f"created {task.task_id} on {replica.name}")
                return
        await world.sleep(0.2, 1.0)


async def run_job(world: World, ctx: JobContext) -> dict[str, Any]:
    """The worker's handler: the task's events, then its result."""
    events, kind = int(ctx.arguments["n"]), ctx.arguments.get("hostile")
    hostile_at = world.rng.randrange(events) if kind else -1
    for i in range(events - 1):
        await world.sleep(0.0, 0.4)
        if i == hostile_at:
            await hostile(world, ctx.task_id, kind, ctx._worker.publisher)
        await ctx.emit("com.example.progress", {"i": i, "task": ctx.task_id[-4:]})
    return {"content": [{"type": "text", "text": f"{events} events"}]}


async def produce_task(world: World, task: TaskPlan, publisher: TaskEventPublisher) -> None:
    types = publisher.settings.own_types
    created_ms = int(CLOCK.wall() * 1000)
    if task.race:
        await forge_created(world, task.task_id, publisher)
    await publish_created(publisher, types, TOOL, task.principal, task.task_id, created_ms)
    task.created.set()
    raw = world.log.producer()
    hostile_at = world.rng.randrange(task.events) if task.hostile else -1
    for i in range(task.events - 1):
        await world.sleep(0.0, 0.4)
        if i == hostile_at:
            await hostile(world, task.task_id, task.hostile, publisher)
        payload = {"i": i, "task": task.task_id[-4:], "text": "é" * world.rng.randint(0, 3)}
        event_type = "com.example.progress"
        if task.fmt == "raw-json":
            value, headers = encode_event(TaskEvent(event_type, payload), fmt="json")
            await raw.send(
                publisher.settings.topics.events, value, key=task.task_id.encode(), headers=headers
            )
        else:
            await publisher.publish(task.task_id, event_type, payload)
    done = StatusPayload(status="completed", result={"n": task.events}).payload()
    await publisher.publish(task.task_id, types.status, done)
    if task.after_terminal:
        # A pipeline restarted from a stale checkpoint: the terminal status must stay.
        await world.sleep(0.0, 0.5)
        stale = StatusPayload(status="working").payload()
        value, headers = encode_event(TaskEvent(types.status, stale), fmt="json")
        topic = publisher.settings.topics.events
        await raw.send(topic, value, key=task.task_id.encode(), headers=headers)
        world.note(f"status after terminal {task.task_id}")
    world.note(f"produced {task.task_id}")


async def hostile(
    world: World, task_id: str, kind: str | None, publisher: TaskEventPublisher
) -> None:
    """A record no honest producer writes, amid the task's events: a forged task.created
    (another owner, a foreign key), undecodable bytes, or a keyless record."""
    topic = publisher.settings.topics.events
    raw = world.log.producer()
    world.note(f"hostile {kind} {task_id}")
    if kind == "forged":
        await forge_created(world, task_id, publisher)
    elif kind == "garbage":
        await raw.send(topic, b"\x00\xffnot an envelope", key=task_id.encode())
    else:
        value, headers = encode_event(TaskEvent("com.example.stray", {"x": 1}), fmt="json")
        await raw.send(topic, value, headers=headers)


async def transaction(world: World, task: TaskPlan, *, abort: bool) -> None:
    """Events of ``task`` written in one transaction (aborted: no reader may see them). Two of
    them on one task share a transactional id: the later one fences the earlier (a zombie
    pipeline), whose open transaction is aborted and whose next write is refused."""
    await task.created.wait()  # an honest pipeline writes to tasks that exist
    writer = world.log.transactional_writer(f"sim.pipeline.{task.task_id[-4:]}")
    await writer.start()
    topic = settings_of("r0").topics.events
    fenced = False
    with contextlib.suppress(_Abort):
        try:
            await _write_transaction(world, writer, topic, task, abort)
        except WriterFenced:
            fenced = True
    state = "fenced" if fenced else "aborted" if abort else "committed"
    world.note(f"transaction {state} {task.task_id}")


async def _write_transaction(
    world: World, writer: MemoryWriter, topic: str, task: TaskPlan, abort: bool
) -> None:
    async with writer.transaction():
        for i in range(world.rng.randint(1, 4)):
            value, headers = encode_event(
                TaskEvent("com.example.txn", {"i": i, "aborted": abort}), fmt="json"
            )
            await writer.send(topic, value, key=task.task_id.encode(), headers=headers)
            await world.sleep(0.0, 0.3)
        if abort:
            raise _Abort


class _Abort(Exception):
    pass


class _Denied(Exception):
    """The task is not the client's (the raced task, owned by no one): its streams end."""


class _Untrusted(Exception):
    """The task's seq cannot be trusted any more: its streams end here."""


async def forge_created(world: World, task_id: str, publisher: TaskEventPublisher) -> None:
    """A ``task.created`` of ``task_id`` for "mallory", signed with a key not the bridge's."""
    forger = TaskEventPublisher(publisher.settings, keyring=FORGER, log=cast(Log, world.log))
    await forger.start()
    types = publisher.settings.own_types
    await publish_created(forger, types, TOOL, "mallory", task_id, int(CLOCK.wall() * 1000))
    world.note(f"forged task.created {task_id}")


# --- clients --------------------------------------------------------------------------------


async def client(
    world: World, client_id: str, task: TaskPlan, *, slow: bool, over_http: bool = False
) -> None:
    """Stream ``task`` to its end, resuming with the cursor whenever a stream ends early."""
    await task.created.wait()  # a client learns the task id from tools/call's answer
    after: int | None = None
    partition = -1
    world.recording.begin(client_id, task.task_id, -1)
    caller = Caller(task.principal, client_id)
    while True:
        replica = None
        while replica is None:
            if partition < 0 and world.replicas:
                any_replica = next(iter(world.replicas.values()))
                partition = any_replica.indexer.partition_of(task.task_id)
            replica = world.owner_of(partition) if partition >= 0 else None
            if replica is None:
                await world.sleep(0.1, 0.5)
        attempt = asyncio.get_running_loop().create_task(
            http.stream_http(world, replica, client_id, task, after, slow)
            if over_http
            else stream_once(world, replica, client_id, task, caller, after, slow)
        )
        replica.attempts[attempt] = None
        try:
            finished, after = await asyncio.shield(attempt)
        except asyncio.CancelledError:
            if not attempt.cancelled():
                raise
            finished, after = False, world.last_seq(client_id, task.task_id)
        except _Untrusted:
            world.note(f"untrusted {client_id}")
            return
        except _Denied:
            world.note(f"denied {client_id}")
            world.ended.add((client_id, task.task_id))
            return
        finally:
            replica.attempts.pop(attempt, None)
        if finished:
            world.ended.add((client_id, task.task_id))
            if not task.after_terminal:
                # (A stream ends at the terminal status: a record written after it is never
                # handed, and the checker would count it lost; the seqs before it are judged.)
                world.recording.finished(client_id, task.task_id)
            world.note(f"finished {client_id}")
            return
        await world.sleep(0.05, 0.5)


async def stream_once(
    world: World,
    replica: Replica,
    client_id: str,
    task: TaskPlan,
    caller: Caller,
    after: int | None,
    slow: bool,
) -> tuple[bool, int | None]:
    """One tasks/stream request: (whether it ended with the result, the cursor after it)."""
    hub = replica.hub
    ticket = hub.admit(caller, task.task_id, f"{client_id}-{world.now():.3f}")
    try:
        try:
            log_start = await hub.check_cursor(task.task_id, after)
        except RpcError as exc:
            return False, world.refused(client_id, task, after, exc)
        except (NotOwner, UnknownTask):
            return False, after  # moved, or not yet indexed there: ask again
        try:
            async for batch in hub.events(ticket, after, log_start):
                if batch is None:
                    continue
                if after is None and batch.seqs[0] > 0:
                    # A stream without a cursor starts at the earliest retained seq: as if it
                    # were told the rest is gone (the checker counts retained ones skipped).
                    world.recording.gone(client_id, task.task_id, -1, batch.seqs[0])
                for seq, event in batch.pairs():
                    world.recording.record(
                        client_id,
                        task.task_id,
                        seq,
                        event.type,
                        event.payload,
                        replica=replica.name,
                    )
                    after = seq
                if slow or client_id in world.stalled:
                    await world.sleep(0.2, 3.0 if client_id in world.stalled else 0.8)
        except RpcError as exc:
            return False, world.refused(client_id, task, after, exc)
        done = not (ticket.moved or ticket.cancelled or hub.draining.is_set())
        return done, after
    finally:
        hub.release(ticket)


# --- faults ---------------------------------------------------------------------------------


async def inject(world: World, first: str, at: float) -> None:
    """One fault that takes effect: ``first``, or, while the one drawn cannot apply (one
    replica left, no partition with one owner, no stream left to stall), another drawn."""
    await asyncio.sleep(at)
    kind = first
    for _ in range(MAX_DRAWS):
        world.note(f"fault {kind}")
        took = await fault(world, kind)
        if took is not None:
            world.effective.append(took)
            return
        world.note(f"fault {kind} cannot apply")
        world.stats["fault redrawn"] += 1
        await world.sleep(0.2, 1.0)
        kind = world.rng.choice(FAULT_KINDS)
    world.problems.append(f"no fault took effect in {MAX_DRAWS} draws")


async def fault(world: World, kind: str) -> str | None:
    """Inject ``kind``; what took effect, or None when it cannot apply now."""
    rng = world.rng
    live = [r for r in world.replicas.values() if r.up]
    if kind in ("crash_restart", "zombie", "graceful_restart"):
        if len(live) < 2:
            return None
        victim = rng.choice(live)
        if kind == "graceful_restart":
            await victim.stop()
            await world.sleep(0.5, 2.5 * SESSION_MS / 1000)
        elif kind == "crash_restart":
            await victim.crash()
            await world.sleep(0.5, 2.5 * SESSION_MS / 1000)
        else:
            return await zombie(world, victim)
        await restart(world, victim.name)
        return kind
    if kind == "join_leave":
        name = f"r{len(world.replicas)}"
        await restart(world, name)
        await world.sleep(2.0, 10.0)
        await world.replicas[name].crash()
        return kind
    if kind == "retention":
        return await retention(world)
    if kind == "stall_client":
        return await stall_client(world)
    if kind == "worker_restart":
        return await restart_worker(world)
    await transaction(world, rng.choice(world.tasks), abort=True)
    return kind


async def zombie(world: World, victim: Replica) -> str:
    """The victim goes on indexing and flushing past its session's expiry, so past the new
    owners' takeover: its index writes must meet their fencing."""
    before = world.stats[f"fenced write {victim.name}"]
    await victim.crash(zombie=True)
    await world.sleep(SESSION_MS / 1000 + 1.5, SESSION_MS / 1000 + 6.0)
    await victim.kill_zombie()
    fenced = world.stats[f"fenced write {victim.name}"] - before
    world.stats["zombie fenced" if fenced else "zombie not fenced"] += 1
    await restart(world, victim.name)
    return f"zombie(fenced {fenced})"


async def stall_client(world: World) -> str | None:
    """A client stops reading for a while (its stream's queue fills, its replica must cope)."""
    running = [
        c
        for c, task in sorted(world.clients.items())
        if task.task_id
        and (c, task.task_id) not in world.ended
        and task.task_id not in world.untrusted
    ]
    if not running:
        return None
    world.stalled.add(world.rng.choice(running))
    await world.sleep(5.0, 20.0)
    world.stalled.clear()
    return "stall_client"


async def start_worker(world: World, name: str) -> None:
    """A worker SDK process running the tool's jobs (a member of the workers' group)."""

    async def handler(ctx: JobContext) -> dict[str, Any]:
        return await run_job(world, ctx)

    worker = Worker(
        settings_of("r0"),
        {TOOL.name: handler},
        session_timeout_ms=SESSION_MS,
        log=cast(Log, world.log),
        clock=CLOCK,
    )
    await worker.start()
    world.workers[name] = (worker, asyncio.get_running_loop().create_task(worker.run()))
    world.note(f"started worker {name}")


async def restart_worker(world: World) -> str | None:
    """Stop a worker (its jobs in flight go to the others, run again from the start) and
    start another."""
    if len(world.workers) < 2:
        return None  # another restart has one down already: keep one running
    name = world.rng.choice(sorted(world.workers))
    worker, running = world.workers.pop(name)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await worker.stop()
    world.note(f"stopped worker {name}")
    await world.sleep(0.5, 3.0)
    await start_worker(world, f"{name}'")
    return "worker_restart"


async def restart(world: World, name: str) -> None:
    replica = Replica(world, name)
    world.replicas[name] = replica
    await replica.start()
    world.note(f"started {name}")


async def retention(world: World) -> str | None:
    """Delete a partition's oldest records, as retention by time does: it never waits for a
    stream, and (in one cut of three) not for the owner's indexer either: the owner is held
    back (a pause, as under load) while producers write, and the cut passes what it indexed,
    so its tail meets OffsetOutOfRange and marks the records lost before they were counted."""
    partition = world.rng.randrange(PARTITIONS)
    owner = world.owner_of(partition)
    if owner is None:
        return None
    part = TopicPart(settings_of("r0").topics.events, partition)
    past = world.rng.random() < 1 / 3
    if past:
        owner.indexer.pause()
        await world.sleep(0.5, 3.0)
    try:
        if not owner.owns(partition):
            return None  # moved while held back
        through = owner.indexer.partitions[partition].through
        await owner.indexer.flush()
        start = (await world.log.log_starts([part]))[part]
        end = (await world.log.log_ends([part]))[part]
        high = end if past else max(start, through)
        cut = world.rng.randint(min(high, through + 1) if past else start, high)
        if cut <= start:
            return None
        await world.log.delete_records_before(part, cut)
    finally:
        if past:
            with contextlib.suppress(Exception):
                owner.indexer.resume()
    unindexed = max(0, cut - through)
    world.stats["retention past the index"] += unindexed > 0
    world.note(f"retention p{partition} before {cut} ({unindexed} unindexed)")
    return f"retention({unindexed} unindexed)" if unindexed else "retention"


# --- the run --------------------------------------------------------------------------------


def _task_plans(plan: Plan, rng: random.Random) -> list[TaskPlan]:
    sizes = [plan.events // plan.tasks] * plan.tasks
    for _ in range(plan.events % plan.tasks):
        sizes[rng.randrange(plan.tasks)] += 1
    return [
        TaskPlan(
            f"task-{plan.seed}-{i:02d}-{rng.getrandbits(32):08x}",
            f"user{i % 3}",
            n,
            rng.choice(("worker", "worker", "sdk-avro", "sdk-json", "raw-json")),
        )
        for i, n in enumerate(sizes)
    ]


async def _main(plan: Plan) -> Outcome:
    rng = random.Random(plan.seed)
    log = MemoryLog(LogClock())
    t = settings_of("r0").topics
    for topic in (t.events, t.index, t.updates, t.control, t.jobs(TOOL.name)):
        log.create_topic(topic, PARTITIONS)
    world = World(plan, rng, log)
    world.tasks = _task_plans(plan, rng)
    for task in rng.sample(world.tasks, 3):
        task.hostile = rng.choice(("forged", "garbage", "keyless"))
    # Hostile pipelines (on tasks whose id a pipeline chooses): a forged task.created ahead of
    # the pipeline's own, and a status after the terminal one.
    pipelines = [t for t in world.tasks if t.fmt != "worker"] or world.tasks[:1]
    for task in pipelines:
        task.fmt = "sdk-json" if task.fmt == "worker" else task.fmt
    rng.choice(pipelines).race = True
    rng.choice(pipelines).after_terminal = True
    faults = [rng.choice(FAULT_KINDS) for _ in range(plan.faults)]
    for i in range(plan.replicas):
        await restart(world, f"r{i}")
    return await _run(world, faults)


async def _run(world: World, drawn: list[str]) -> Outcome:
    plan, rng = world.plan, world.rng
    publisher = TaskEventPublisher(
        settings_of("r0"), keyring=KEYRING, fmt="avro", log=cast(Log, world.log)
    )
    await publisher.start()
    json_publisher = TaskEventPublisher(
        settings_of("r0"), keyring=KEYRING, fmt="json", log=cast(Log, world.log)
    )
    await json_publisher.start()
    work: list[asyncio.Task[Any]] = []
    for i in range(WORKERS):
        await start_worker(world, f"w{i}")
    for i, task in enumerate(world.tasks):
        pub = json_publisher if task.fmt == "sdk-json" else publisher
        produce = (
            request_task(world, task) if task.fmt == "worker" else produce_task(world, task, pub)
        )
        work.append(world.spawn(_delayed(rng.uniform(0, 5), produce), f"produce-{i}"))
        for c in (2 * i, 2 * i + 1):
            world.clients[f"c{c}"] = task
            slow, over_http = rng.random() < 0.2, rng.random() < HTTP_SHARE
            stream = client(world, f"c{c}", task, slow=slow, over_http=over_http)
            work.append(world.spawn(_delayed(rng.uniform(0, 8), stream), f"c{c}"))
    work.append(world.spawn(transaction(world, rng.choice(world.tasks), abort=False), "txn"))
    for kind in drawn:
        work.append(world.spawn(inject(world, kind, rng.uniform(1.0, 14.0)), f"fault-{kind}"))
    started = world.now()
    _, pending = await asyncio.wait(work, timeout=plan.deadline_s)
    if pending:
        unfinished = sorted(t.get_name() for t in pending)
        world.problems.append(
            f"not finished within {plan.deadline_s:.0f} virtual s: {', '.join(unfinished[:8])}"
        )
        for job in pending:
            job.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for job in work:
        if not job.cancelled() and job.exception() is not None:
            world.problems.append(f"{job.get_name()} raised {job.exception()!r}")
    if len(world.effective) < plan.faults:
        world.problems.append(f"{len(world.effective)} faults took effect of {plan.faults}")
    virtual_s = world.now() - started
    await _settle(world)
    owners = {p: r for r in world.replicas.values() for p in range(PARTITIONS) if r.owns(p)}
    for worker, running in list(world.workers.values()):
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await worker.stop()
    for replica in list(world.replicas.values()):
        if replica.up:
            await replica.stop(hand_over=False)
        else:
            await replica.kill_zombie()
    return await _judge(world, owners, virtual_s)


async def _settle(world: World) -> None:
    """Before the final checks: every partition owned again (a crashed replica's session
    expires) and its owner caught up, so that each partition's index is judged."""
    for _ in range(SETTLE_S * 2):
        if all(world.owner_of(p) is not None for p in range(PARTITIONS)):
            break
        await asyncio.sleep(0.5)
    else:
        world.problems.append(f"partitions still unowned {SETTLE_S} virtual s after the run")
        return
    for replica in world.replicas.values():
        if replica.up:
            try:
                async with asyncio.timeout(SETTLE_S):
                    await replica.indexer.catch_up()
            except TimeoutError:
                world.problems.append(f"{replica.name} did not catch up within {SETTLE_S} s")


async def _delayed(delay: float, coro: Coroutine[Any, Any, Any]) -> Any:
    await asyncio.sleep(delay)
    return await coro


async def _judge(world: World, owners: dict[int, Replica], virtual_s: float) -> Outcome:
    settings = settings_of("r0")
    index = await load_index(settings, range(PARTITIONS), log=world.log)
    truth = await ground_truth(settings, log=world.log)
    excused = _excused(world, index)
    report = check(truth, _without(world.recording, excused))
    _check_bindings(world, index)
    _check_statuses(world, index)
    _check_persisted(world, index, owners)
    loop = asyncio.get_running_loop()
    if isinstance(loop, VirtualLoop):
        world.problems.extend(f"loop: {error}" for error in loop.errors)
    for client_id, task_id in world.recording.streams:
        if (client_id, task_id) not in world.ended and task_id not in excused:
            world.problems.append(f"stream {(client_id, task_id)} never ended")
    digest = hashlib.blake2b(digest_size=8)
    for (client_id, task_id), stream in sorted(world.recording.streams.items()):
        digest.update(f"{client_id}/{task_id}:{stream.seqs}:{stream.replicas}".encode())
        digest.update(b"".join(stream.digests))
    digest.update("\n".join(world.trace).encode())
    return Outcome(
        world.plan.seed,
        report,
        world.problems,
        digest.hexdigest(),
        world.effective,
        virtual_s,
        world.recording.deliveries,
        dict(world.stats),
    )


def _excused(world: World, index: dict[int, PartitionIndex]) -> set[str]:
    """Tasks whose seq the bridge may no longer trust: retention deleted records of their
    partition before the owner indexed them (the "lost before indexed" rule), so streams are
    refused with seq_untrusted and the checker has no base to judge them by. Only after a
    cut that passed the index; a stream refused so elsewhere is a failure."""
    untrusted = {
        task_id
        for idx in index.values()
        if idx.lost_before >= 0
        for task_id, entry in idx.items()
        if not entry.trusted
    }
    if untrusted and not world.stats["retention past the index"]:
        world.problems.append(f"tasks untrusted with no cut past the index: {sorted(untrusted)}")
    for task_id in sorted(world.untrusted - untrusted):
        world.problems.append(f"streams of {task_id} refused as untrusted; the index trusts it")
    world.stats["tasks untrusted"] = len(untrusted)
    return untrusted


def _without(recording: Recording, tasks: set[str]) -> Recording:
    kept = Recording()
    kept.streams = {k: s for k, s in recording.streams.items() if k[1] not in tasks}
    kept.deliveries = sum(len(s.seqs) for s in kept.streams.values())
    return kept


def _check_bindings(world: World, index: dict[int, PartitionIndex]) -> None:
    """No principal binding ever changes: every task is owned by the principal that created
    it, in the persisted index and in every replica's view; a task whose first record was a
    forged ``task.created`` (a raced pipeline) is owned by no one."""
    for task in world.tasks:
        entry = index[_partition(world, task)].get(task.task_id)
        if task.task_id in world.denied and (entry is None or entry.owner != 0):
            world.problems.append(f"task {task.task_id} refused to its owner as not found")
        want = 0 if task.race else owner_key(owner_digest(task.principal))
        views = [idx.get(task.task_id) for idx in index.values()]
        views += [
            r.indexer.partitions[p].get(task.task_id)
            for r in world.replicas.values()
            for p in r.indexer.partitions
        ]
        for entry in views:
            if entry is None or entry.owner == want or entry.owned_by(want):
                continue
            if entry.owner == 0 and not entry.trusted:
                continue  # its task.created was deleted unindexed: bound to no one, refused
            world.problems.append(
                f"task {task.task_id} bound to another owner: {entry.owner:x} != {want:x}"
            )
            return


def _check_statuses(world: World, index: dict[int, PartitionIndex]) -> None:
    """A terminal status stays: every task ended completed, whatever was written after."""
    for task in world.tasks:
        entry = index[_partition(world, task)].get(task.task_id)
        if entry is not None and entry.trusted and entry.status != TaskStatus.COMPLETED:
            world.problems.append(
                f"task {task.task_id} ended {TaskStatus(entry.status).name}, not COMPLETED"
            )


def _partition(world: World, task: TaskPlan) -> int:
    return next(iter(world.replicas.values())).indexer.partition_of(task.task_id)


def _check_persisted(
    world: World, index: dict[int, PartitionIndex], owners: dict[int, Replica]
) -> None:
    """What the index writers wrote: each partition's persisted index is its last owner's
    (which flushed on its graceful stop), entry by entry."""
    for p, owner in sorted(owners.items()):
        mine = owner.indexer.partitions.get(p)
        if mine is None:
            continue
        persisted, held = dict(index[p].items()), dict(mine.items())
        wrong = sorted(t for t in persisted.keys() | held.keys() if persisted.get(t) != held.get(t))
        if wrong or index[p].through != mine.through:
            world.problems.append(
                f"partition {p}: the persisted index differs from its owner {owner.name}'s: "
                f"through {index[p].through} != {mine.through}; tasks {wrong[:3]}"
            )


def run_seed(seed: int, *, wall_limit_s: float = 10.0, **overrides: Any) -> Outcome:
    """Run one seed on a fresh virtual-time loop and judge it (a run that spins or can never
    move again is a failed one). ``wall_limit_s``: real seconds one callback may run."""
    plan = Plan(seed, **overrides)
    try:
        return run(lambda: _main(plan), wall_limit_s=wall_limit_s)
    except (Spinning, Stuck) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        return Outcome(seed, CheckReport(), [problem], "-", [], 0.0, 0)
    except Exception as exc:  # a replica that never starts, say: a failed seed, not a crash
        problem = f"the run raised {exc!r}"
        return Outcome(seed, CheckReport(), [problem], "-", [], 0.0, 0)

"""A load harness for fault tests and the soak: replicas, workers, writers, streams, a check.

:class:`LoadHarness` starts ``replicas`` bridge processes (in group ownership mode when there
is more than one, as tests/test_replicas.py runs them) and ``workers`` worker processes on
the settings' cluster and topics, then makes load of two kinds:

* **tool tasks**: ``tools/call`` of a long-running tool (``agent_run`` of the demo pack by
  default: a timeline of events at a steady pace), run by the workers;
* **pipeline tasks**: created as :mod:`bridgedev.replay` creates a task (its ``task.created``),
  then fed by a raw producer exactly as an existing pipeline would (an envelope of
  :mod:`bridge.envelope`, key = task id), ending with a terminal status.

Every task gets ``streams_per_task`` stream clients (:class:`bridge.client.TaskStreamClient`,
which resumes with its cursor and de-duplicates), spread over the replicas. A client keeps
resuming across drops (and on another replica when one stops answering) until its task is
terminal or the harness stops; every event it yields and every ``events_gone`` it is answered
goes into a :class:`~bridgedev.checker.Recording`. :meth:`LoadHarness.stop` ends the writers
and waits (bounded) for the streams; :meth:`LoadHarness.check` then reads the ground truth and
returns the :class:`~bridgedev.checker.CheckReport`.

Faults are the caller's: :attr:`LoadHarness.replicas` and :attr:`LoadHarness.workers` are the
processes (``kill()`` is SIGKILL, :meth:`Replica.restart` starts it again on its port), and
:meth:`LoadHarness.hold` makes a client stop reading for a while. :attr:`LoadHarness.on_delivery`
sees every event a client is handed (the soak's recovery clock). Under broker faults, plan
``idempotent_pipeline`` (idempotent acks=all writers, so that "produced" is what the log holds);
a pipeline send that fails is sent again (bounded), so a fault cannot end a writer early.
The cluster is whatever ``settings.kafka.bootstrap_servers`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bridge.client import EventsGone, MemoryCursorStore, StreamError, TaskStreamClient
from bridge.config import Settings
from bridge.envelope import TaskEvent, encode_event
from bridge.kafka.clients import (
    AIOKafkaProducer,
    KafkaError,
    idempotent_producer,
    plain_producer,
)
from bridge.log.publisher import TaskEventPublisher
from bridge.vocabulary import StatusPayload
from bridgedev.checker import CheckReport, Recording, check, ground_truth
from bridgedev.replay import create_task as create_replay_task

from .layout import create_served_topics
from .mcp import create_task
from .procs import READY_S, Proc, bridge_env, free_peer_port, free_port, peer_env
from .waits import wait_until

__all__ = ["Counters", "LoadHarness", "LoadPlan", "Replica"]

#: The group session timeout of the replicas: a killed one's partitions move after this long.
SESSION_TIMEOUT_MS = 6000
#: Latency samples kept (the most recent), so a long soak stays bounded in memory.
MAX_LATENCY_SAMPLES = 100_000
#: Events of a burst sent before waiting for their acknowledgements.
BURST_CHUNK = 200
#: Entries of the clients' timeline kept (the most recent).
TIMELINE = 5_000
#: Type of the pipeline tasks' events.
PIPELINE_EVENT = "com.example.load.step"
#: How long a pipeline writer keeps sending one event again while Kafka refuses it.
PRODUCE_RETRY_BOUND_S = 180.0


@dataclass
class LoadPlan:
    """How much load: processes, tasks of each kind, streams per task, and their pacing."""

    replicas: int = 1
    workers: int = 1
    tool_tasks: int = 3
    pipeline_tasks: int = 3
    streams_per_task: int = 3
    tool: str = "agent_run"
    tool_arguments: dict[str, Any] = field(
        default_factory=lambda: {"prompt": "load", "steps": 30, "delay_ms": 50}
    )
    #: Events each pipeline task gets before its terminal status (stop() ends them sooner).
    pipeline_events: int = 60
    pipeline_interval_s: float = 0.03
    #: Pipeline writers as idempotent acks=all producers instead of a plain acks=1 one: under
    #: broker faults, what "produced" counts is then exactly what the log keeps.
    idempotent_pipeline: bool = False
    #: A client's pause before resuming elsewhere after its replica stopped answering.
    retry_backoff_s: float = 0.2
    #: Extra environment of every replica (e.g. ``BRIDGE_STREAMS__QUEUE_SIZE``).
    replica_env: dict[str, str] = field(default_factory=dict)
    #: Headers of every request of the clients (e.g. a bearer token when the replicas
    #: authenticate).
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Counters:
    """What the load did, for reports and benches."""

    produced: int = 0  # pipeline events acknowledged by Kafka (terminal statuses included)
    delivered: int = 0  # events handed to stream clients
    finished_streams: int = 0
    gone: int = 0  # events_gone answers
    retries: int = 0  # resumes on another replica after a client gave up on one
    produce_retries: int = 0  # pipeline sends repeated after Kafka refused or timed out
    stream_errors: int = 0  # refusals other than events_gone (e.g. a partition moving)
    #: The latest of those errors, for a failure's report.
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    #: Seconds from a pipeline event's record timestamp to its receipt by a client.
    latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_LATENCY_SAMPLES))
    #: (epoch seconds, what) of each client's drops and first event after one: the client's
    #: side of a fault's timeline, beside the replicas' logs (the most recent kept).
    timeline: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=TIMELINE))


@dataclass
class Replica:
    """One `bridge serve` process on a fixed port (kept across restarts)."""

    name: str
    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def alive(self) -> bool:
        return self.proc.alive()

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye to the group."""
        self.proc.kill()

    def restart(self) -> None:
        """Start the process again (after :meth:`kill` or a stop); wait with :meth:`ready`."""
        self.proc.start()

    async def ready(self, http: httpx.AsyncClient) -> bool:
        try:
            reply = await http.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200


def _done_status() -> StatusPayload:
    """A pipeline task's terminal status."""
    return StatusPayload(
        status="completed",
        status_message="load finished",
        result={"content": [{"type": "text", "text": "pipeline done"}]},
    )


class LoadHarness:
    """Processes, load and a recording; ``async with`` starts and always tears down."""

    def __init__(
        self,
        settings: Settings,
        logs: Path,
        plan: LoadPlan | None = None,
        *,
        pipeline_settings: Settings | None = None,
    ) -> None:
        self.settings = settings
        #: The pipeline writers' settings (default ``settings``): e.g. the brokers' direct
        #: addresses, when the fault is on the way between the bridge and the brokers.
        self.pipeline_settings = pipeline_settings or settings
        self.logs = logs
        self.plan = plan or LoadPlan()
        self.recording = Recording()
        self.counters = Counters()
        self.replicas: list[Replica] = []
        self.workers: list[Proc] = []
        self.tool_task_ids: list[str] = []
        self.pipeline_task_ids: list[str] = []
        #: Called with (client id, event type, payload) for every event a client is handed.
        self.on_delivery: Callable[[str, str, dict[str, Any]], None] | None = None
        self._stopping = asyncio.Event()
        self._holds: dict[str, asyncio.Event] = {}
        self._writers: list[asyncio.Task[None]] = []
        self._clients: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
        self._producer: AIOKafkaProducer | None = None
        #: The newest pipeline send time (ms) each open pipeline stream was handed (0: none yet).
        self._newest_ms: dict[str, int] = {}
        self._publisher: TaskEventPublisher | None = None
        #: Clients dropped since their last event (their next one goes on the timeline).
        self._dropped: set[str] = set()

    @property
    def open_streams(self) -> int:
        """Stream clients still following their task."""
        return sum(1 for client in self._clients if not client.done())

    @property
    def open_client_ids(self) -> list[str]:
        """The ids of the stream clients still following their task."""
        return [client.get_name() for client in self._clients if not client.done()]

    @property
    def task_ids(self) -> list[str]:
        return [*self.tool_task_ids, *self.pipeline_task_ids]

    async def __aenter__(self) -> LoadHarness:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- processes ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Topics, processes (ready), then the plan's tasks, their writers and their streams."""
        create_served_topics(self.settings)
        # Streams hold their connection: no pool limit. The read bound is far above the
        # keep-alive interval, so only a peer that vanished without a reset trips it.
        timeout = httpx.Timeout(30.0, read=4 * self.settings.streams.keepalive_s)
        self._http = httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_connections=None),
            headers=self.plan.headers,
        )
        self._start_processes()
        await self.wait_ready()
        make = idempotent_producer if self.plan.idempotent_pipeline else plain_producer
        self._producer = make(self.pipeline_settings, role="load-pipeline")
        await self._producer.start()
        self._publisher = TaskEventPublisher(self.pipeline_settings)
        await self._publisher.start()
        await self.add_tool_tasks(self.plan.tool_tasks)
        await self.add_pipeline_tasks(self.plan.pipeline_tasks)

    def _start_processes(self) -> None:
        group = self.plan.replicas > 1
        secret, peer_port = secrets.token_urlsafe(32), free_peer_port()
        for i in range(self.plan.replicas):
            port = free_port()
            extra = (
                {
                    **peer_env(i, peer_port),
                    "BRIDGE_REPLICAS__OWNERSHIP": "group",
                    "BRIDGE_REPLICAS__INSTANCE_ID": f"replica-{i}",
                    "BRIDGE_PEERS__SECRET": secret,
                    "BRIDGE_REPLICAS__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
                    "BRIDGE_REPLICAS__OWNER_WAIT_S": "20",
                }
                if group
                else {}
            )
            env = bridge_env(self.settings, **extra, **self.plan.replica_env)
            args = ["serve", "--port", str(port)]
            proc = Proc(f"replica{i}", args, env, self.logs / f"replica{i}.log")
            self.replicas.append(Replica(f"replica{i}", port, proc.start()))
        for i in range(self.plan.workers):
            env = bridge_env(self.settings)
            proc = Proc(f"worker{i}", ["workers"], env, self.logs / f"worker{i}.log")
            self.workers.append(proc.start())

    async def wait_ready(self, *replicas: Replica, bound: float = READY_S) -> None:
        """``replicas`` (default: all) answer /readyz; one that exits meanwhile fails the wait."""
        http = self._client()
        waited = replicas or tuple(self.replicas)

        async def all_ready() -> bool:
            for replica in waited:
                assert replica.alive(), f"{replica.name} exited:\n{replica.proc.tail()}"
            return all([await r.ready(http) for r in waited])

        await wait_until(all_ready, bound, what="every replica is ready")

    def _client(self) -> httpx.AsyncClient:
        assert self._http is not None, "start() first"
        return self._http

    # --- load ----------------------------------------------------------------------------------

    async def add_tool_tasks(self, count: int) -> list[str]:
        """``count`` tasks of the plan's tool (created through the live replicas in turn),
        streamed."""
        created = []
        for i in range(count):
            url = self._replica_for(len(self.tool_task_ids) + i).url
            created.append(
                await create_task(self._client(), url, self.plan.tool, self.plan.tool_arguments)
            )
        self.tool_task_ids.extend(created)
        self._follow_all(created)
        return created

    def adopt_tool_tasks(self, task_ids: list[str], streams: int | None = None) -> None:
        """Tool tasks the caller created itself (e.g. counting its own retries), streamed by
        ``streams`` clients each (default: the plan's) and checked like the others."""
        self.tool_task_ids.extend(task_ids)
        self._follow_all(task_ids, streams)

    async def add_pipeline_tasks(self, count: int) -> list[str]:
        """``count`` tasks fed by the raw pipeline producer, streamed."""
        assert self._publisher is not None, "start() first"
        created = []
        for _ in range(count):
            task_id, _where = await create_replay_task(self._publisher, self.settings)
            created.append(task_id)
        self.pipeline_task_ids.extend(created)
        self._writers.extend(asyncio.create_task(self._feed(t)) for t in created)
        self._follow_all(created)
        return created

    async def add_unfed_task(self) -> str:
        """A pipeline task that none of the harness's writers feeds nor its clients stream
        (the caller writes it with :meth:`burst` and reads it its own way); checked too."""
        assert self._publisher is not None, "start() first"
        task_id, _where = await create_replay_task(self._publisher, self.settings)
        self.pipeline_task_ids.append(task_id)
        return task_id

    async def burst(self, task_id: str, count: int, payload_bytes: int) -> None:
        """``count`` events with ``payload_bytes`` of padding sent back to back, as a backfill
        would, then the task's terminal status."""
        assert self._producer is not None, "start() first"
        pad = "x" * payload_bytes
        for first in range(0, count, BURST_CHUNK):
            # A chunk in flight at a time: a slow cluster paces the burst instead of failing
            # a send whose batch waited too long for room in the producer's buffer.
            sent = []
            for i in range(first, min(count, first + BURST_CHUNK)):
                now_ms = time.time_ns() // 1_000_000
                payload = {"i": i, "atMs": now_ms, "pad": pad}
                value, headers = encode_event(TaskEvent(PIPELINE_EVENT, payload, None, now_ms))
                sent.append(
                    await self._producer.send(
                        self.settings.topics.events, value, key=task_id.encode(), headers=headers
                    )
                )
            await asyncio.gather(*sent)
            self.counters.produced += len(sent)
        await self._produce(task_id, self.settings.own_types.status, _done_status().payload())

    async def _feed(self, task_id: str) -> None:
        """A pipeline's events for ``task_id``, then its terminal status (also when stopping)."""
        for i in range(self.plan.pipeline_events):
            if self._stopping.is_set():
                break
            now_ms = time.time_ns() // 1_000_000
            await self._produce(task_id, PIPELINE_EVENT, {"i": i, "atMs": now_ms}, now_ms)
            with contextlib.suppress(TimeoutError):  # the pacing, cut short by stop()
                await asyncio.wait_for(self._stopping.wait(), self.plan.pipeline_interval_s)
        await self._produce(task_id, self.settings.own_types.status, _done_status().payload())

    async def _produce(
        self, task_id: str, event_type: str, payload: dict[str, Any], ts: int | None = None
    ) -> None:
        assert self._producer is not None
        event = (
            TaskEvent(event_type, payload)
            if ts is None
            else TaskEvent(event_type, payload, None, ts)
        )
        value, headers = encode_event(event)
        topic, key = self.settings.topics.events, task_id.encode()
        async with asyncio.timeout(PRODUCE_RETRY_BOUND_S):
            while True:  # a broker fault outlasting the producer's own retries: send again
                try:
                    await self._producer.send_and_wait(topic, value, key=key, headers=headers)
                    break
                except KafkaError as exc:
                    self.counters.produce_retries += 1
                    self.counters.errors.append(f"pipeline send of {task_id}: {exc!r}"[:300])
                    await asyncio.sleep(self.plan.retry_backoff_s)  # the writer's backoff
        self.counters.produced += 1

    def _follow_all(self, task_ids: list[str], streams: int | None = None) -> None:
        k = self.plan.streams_per_task if streams is None else streams
        for t, task_id in enumerate(task_ids):
            for j in range(k):
                client_id = f"{task_id[:8]}-c{j}"
                start = (t * k + j) % len(self.replicas)
                follow = self._follow(client_id, task_id, start)
                self._clients.append(asyncio.create_task(follow, name=client_id))

    async def _follow(self, client_id: str, task_id: str, start: int) -> None:
        """Stream ``task_id`` to its end (see :meth:`_follow_to_end`), its newest pipeline
        event tracked while it is open."""
        if task_id in self.pipeline_task_ids:
            self._newest_ms[client_id] = 0
        try:
            await self._follow_to_end(client_id, task_id, start)
        finally:
            self._newest_ms.pop(client_id, None)

    async def _follow_to_end(self, client_id: str, task_id: str, start: int) -> None:
        """Resume with the cursor until the task's end, moving on to the next replica whenever
        one gives up (down, or refusing while its partition moves)."""
        store = MemoryCursorStore()
        attempt = start
        while True:  # until the task's end, or stop()/close() cancels it
            replica = self._replica_for(attempt)
            client = TaskStreamClient(
                replica.url, store=store, http=self._client(), max_reconnects=2, backoff_s=0.1
            )
            try:
                async for event in client.stream(task_id):
                    self._take(client_id, event.type, event.payload)
                    self.recording.record(
                        client_id, task_id, event.seq, event.type, event.payload, replica.name
                    )
                    if (held := self._holds.get(client_id)) is not None:
                        await held.wait()  # not reading: the reply waits in the socket
                self.recording.finished(client_id, task_id)
                self.counters.finished_streams += 1
                return
            except EventsGone as gone:
                after = store.load(task_id)
                self.recording.gone(
                    client_id, task_id, -1 if after is None else after, gone.earliest_seq
                )
                self.counters.gone += 1
                store.save(task_id, gone.earliest_seq - 1)  # resume at what is left
                continue
            except (StreamError, httpx.HTTPError, ValueError) as exc:
                # Refused (a partition moving), or the replica gave out mid-reply: elsewhere.
                self.counters.stream_errors += 1
                self.counters.errors.append(f"{client_id} at {replica.name}: {exc!r}"[:300])
                self._dropped.add(client_id)
                what = f"{client_id} dropped at {replica.name}: {exc!r}"[:200]
                self.counters.timeline.append((time.time(), what))
            attempt += 1
            self.counters.retries += 1
            await asyncio.sleep(self.plan.retry_backoff_s)  # the client's retry backoff

    def _replica_for(self, attempt: int) -> Replica:
        """The replica of this attempt, skipping processes known to be down (any, if all are)."""
        n = len(self.replicas)
        turn = [self.replicas[(attempt + i) % n] for i in range(n)]
        return next((r for r in turn if r.alive()), turn[0])

    def _take(self, client_id: str, type_: str, payload: dict[str, Any]) -> None:
        self.counters.delivered += 1
        if client_id in self._dropped:
            self._dropped.discard(client_id)
            self.counters.timeline.append((time.time(), f"{client_id} handed an event again"))
        if self.on_delivery is not None:
            self.on_delivery(client_id, type_, payload)
        at = payload.get("atMs") if type_ == PIPELINE_EVENT else None
        if isinstance(at, int):
            self.counters.latencies_s.append(time.time() - at / 1000)
            if client_id in self._newest_ms:
                self._newest_ms[client_id] = max(self._newest_ms[client_id], at)

    def caught_up_since(self, since_ms: int) -> bool:
        """Every open pipeline stream has been handed an event sent after ``since_ms`` (epoch
        ms): the measure of a fault's recovery."""
        return all(newest > since_ms for newest in self._newest_ms.values())

    async def recovery_s(self, since_ms: int, bound: float = 60.0) -> float:
        """Seconds from ``since_ms`` until :meth:`caught_up_since` holds (waited, bounded)."""
        await wait_until(
            lambda: self.caught_up_since(since_ms),
            bound,
            what=lambda: f"every open pipeline stream handed an event sent after {since_ms}",
        )
        return time.time() - since_ms / 1000

    async def hold(self, client_id: str, seconds: float) -> None:
        """Client ``client_id`` stops reading its stream after its next event, for ``seconds``
        (cut short by :meth:`stop`), then reads on; returns when it reads again."""
        held = self._holds.setdefault(client_id, asyncio.Event())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), seconds)
        finally:
            held.set()
            self._holds.pop(client_id, None)

    # --- the end -------------------------------------------------------------------------------

    async def writers_done(self, bound: float = 120.0) -> None:
        """Wait (bounded) until every pipeline task has had all its events and its status."""
        async with asyncio.timeout(bound):
            await asyncio.gather(*self._writers)

    async def stop(self, drain_s: float = 60.0) -> None:
        """End the writers (each pipeline task gets its terminal status), then wait up to
        ``drain_s`` for every stream to finish; streams still open then are cancelled (the
        checker judges their delivered prefix only)."""
        self._stopping.set()
        await asyncio.gather(*self._writers)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await asyncio.gather(*self._clients, return_exceptions=True)
        for client in self._clients:
            client.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)

    async def check(self) -> CheckReport:
        """The recording against the log's ground truth (read now: call after :meth:`stop`)."""
        truth = await ground_truth(self.settings, self.task_ids)
        return check(truth, self.recording)

    async def close(self) -> None:
        """Cancel what still runs, close the clients, stop every process."""
        self._stopping.set()
        for task in [*self._writers, *self._clients]:
            task.cancel()
        await asyncio.gather(*self._writers, *self._clients, return_exceptions=True)
        for closing in (self._producer, self._publisher):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing.stop()
        if self._http is not None:
            await self._http.aclose()
        for proc in [*self.workers, *(r.proc for r in self.replicas)]:
            proc.stop()

"""A rolling update and a crash of one of three replicas under load, as users see them.

Run::

    .venv/bin/python bench/bench_rollout.py                 # full size, ~4 minutes here
    .venv/bin/python bench/bench_rollout.py --smoke         # small; completes, no targets
    .venv/bin/python bench/bench_rollout.py --json out.json --keep-logs

Issue 30 item 6. The broker comes from ``bridgedev.kafka.provide_broker`` (the configured
cluster, else Docker, else a throwaway local KRaft broker); topics are fresh
(``rollout-<12 hex>.*``), the events topic has six partitions. The processes and the load are
those of the fault tests and the soak (``tests/support/load.py``, put on ``sys.path`` as the
soak does): three ``bridge serve`` replicas in group ownership mode (static members: each keeps
its instance id across restarts; group session timeout 6 s), one ``bridge workers``, and

* pipeline tasks written all the time by a raw producer (an event every
  ``pipeline_interval_s``), each followed by ``streams_per_task`` resuming stream clients
  (:class:`bridge.client.TaskStreamClient`, spread over the replicas);
* tool tasks (``agent_run``) at the start, and a new one created with ``tools/call`` every
  ``create_every_s`` through a replica in service (one stream each);
* ``tasks/get`` of a known task every ``probe_every_s`` through a replica in service;
* webhook subscriptions (``events/subscribe``, mode webhook) to the pipeline tasks, delivered
  to an HTTPS receiver of this process.

"In service" is what a Service's endpoints would hold: a replica leaves it when it is sent
SIGTERM (or killed) and comes back once ``/readyz`` answers 200. A request that fails (a
transport error, a non-2xx answer or a JSON-RPC error) is retried once, after
``RETRY_AFTER_S``, through another replica in service: the documented client retry. A request
whose retry fails too counts as failed.

Phases (all under the load):

1. ``rollout`` - a full rolling restart: for each replica in turn, SIGTERM (the process exits
   by itself or is killed after ``GRACE_S``, as a pod's grace period does), start it again with
   the same instance id, wait until it is ready and the group has given it partitions, next.
   Targets: no request failed beyond its one retry; each pipeline stream's longest gap between
   two events inside the rollout <= 2 s at p99 and <= 5 s at worst; at most 2 group
   rebalances per restarted replica (``bridge_rebalances_total`` of the replicas that stayed up
   meanwhile: every member applies every assignment).
2. ``sigkill`` - SIGKILL of one replica, then its restart. Target: every pipeline stream
   has been handed an event sent after the kill within the session timeout + 2 s (streams of
   the survivors' partitions resume at once; the victim's wait for the group). Informational:
   requests failed beyond one retry, the longest gaps.
3. ``checker`` - the load ends (each pipeline gets its terminal status), the streams drain,
   and :mod:`bridgedev.checker` compares what every client was handed with the log.
   Target: 0 lost, 0 duplicated, 0 out of order (and nothing else).

Informational too, per restart: the partition-seconds without a serving owner that a replica
up meanwhile counted (``bridge_partition_unavailable_seconds_total``; n/a on a bridge without
that metric). Webhook deliveries are counted and their longest gap in each phase reported
(informational:
a delivery loop polls every ``BRIDGE_WEBHOOKS__POLL_INTERVAL_S``, 0.2 s here).

``--smoke`` runs a smaller load through every phase and reports the same rows with the
verdicts in parentheses: a smoke run on a shared machine is not a measurement. A MISS is
reported, never raised; every wait is bounded and names what it waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import math
import random
import secrets
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import trustme
from common import REPO, Results, environment, report, say, verdict

sys.path.insert(0, str(REPO / "tests"))  # the load harness: tests/support/load.py

from support.layout import fresh_prefix, make_settings
from support.load import PIPELINE_EVENT, SESSION_TIMEOUT_MS, LoadHarness, LoadPlan, Replica
from support.mcp import call
from support.procs import webhook_keys_env

from bridge.config import Settings, load_settings
from bridge.kafka.clients import partition_for_key
from bridge.server.auth import ANONYMOUS
from bridgedev.kafka import provide_broker

# --- targets ------------------------------------------------------------------------------------

TARGET_GAP_P99_S = 2.0
TARGET_GAP_WORST_S = 5.0
TARGET_RESUME_SLACK_S = 2.0  # every stream resumed <= session timeout + this after a SIGKILL
TARGET_REBALANCES = 2  # per restarted replica

PARTITIONS = 6
REPLICAS = 3
#: A pod's grace period: SIGKILL after this long if the process has not exited.
GRACE_S = 30.0
#: The documented client retry: once, after this pause, through another replica.
RETRY_AFTER_S = 1.0
#: Bound of a restarted replica's readiness and of the group giving it partitions.
READY_BOUND_S = 120.0
SETTLE_BOUND_S = 60.0
#: Bound of every stream resuming after the SIGKILL (the measurement is the time itself).
RESUME_BOUND_S = 90.0
#: Poll interval of the waits on replicas' /metrics (nothing signals them).
POLL_S = 0.25
#: The webhook subscriptions' event name and secret (Standard Webhooks, 32 bytes).
WEBHOOK_EVENT = "io.mcpbridge.task.event"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"rollout-bench-webhook-secret-001").decode()

#: The load's bearer token (a throwaway of this run's replicas) and its principal: the one
#: bridgedev.replay creates pipeline tasks for.
TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}

_ORDER = {"load": 0, "rollout": 1, "sigkill": 2, "checker": 3, "webhooks": 4}


@dataclass(frozen=True)
class Sizes:
    pipeline_tasks: int  # written all through the run
    tool_tasks: int  # agent_run tasks at the start
    streams_per_task: int  # stream clients per task of the start
    pipeline_interval_s: float  # between two events of one pipeline task
    create_every_s: float  # a new agent_run task (tools/call) this often
    probe_every_s: float  # a tasks/get this often
    webhooks: int  # subscriptions, over the pipeline tasks
    quiet_s: float  # load alone before each phase


#: What this 2-core machine carries beside three replicas, a worker and the broker.
FULL = Sizes(6, 3, 4, 0.1, 2.0, 0.2, 6, 10.0)
SMOKE = Sizes(2, 1, 2, 0.2, 4.0, 0.5, 2, 2.0)


# --- what the clients saw -------------------------------------------------------------------------


@dataclass
class Requests:
    """One kind of request's outcomes: first tries, retries, failures beyond the retry."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class Window:
    """A phase's start and end (monotonic seconds)."""

    start: float
    end: float = float("inf")

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end


@dataclass
class Seen:
    """Every delivery's time per pipeline stream client and per webhook subscription."""

    streams: dict[str, list[float]] = field(default_factory=dict)
    hooks: dict[str, list[float]] = field(default_factory=dict)
    hook_events: int = 0

    def longest_gaps(self, times: dict[str, list[float]], window: Window) -> list[float]:
        """Per key open during ``window``, its longest stretch without a delivery that ends
        or starts inside the window (a stretch across the window's edge counts whole)."""
        gaps = []
        for seen in times.values():
            before = [t for t in seen if t < window.start][-1:]
            inside = [t for t in seen if window.holds(t)]
            after = [t for t in seen if t > window.end][:1]
            marks = [*before, *inside, *after]
            if len(marks) > 1:
                gaps.append(max(b - a for a, b in itertools.pairwise(marks)))
        return gaps


# --- the load's extra parts ------------------------------------------------------------------------


class Load:
    """The harness plus what this bench adds: replicas in service, requests with one retry,
    task creation, webhook subscriptions and their receiver."""

    def __init__(self, harness: LoadHarness, sizes: Sizes, http: httpx.AsyncClient) -> None:
        self.harness = harness
        self.sizes = sizes
        self.http = http
        self.in_service: set[int] = set(range(len(harness.replicas)))
        self.gets = Requests()
        self.creates = Requests()
        self.subscribes = Requests()
        self.seen = Seen()
        self.pipeline_clients: set[str] = set()
        self._turn = itertools.count()
        self._loops: list[asyncio.Task[None]] = []
        self._rng = random.Random(7)

    def replica(self, avoid: Replica | None = None) -> Replica:
        """The next replica in service (another than ``avoid`` when there is one)."""
        serving = [self.harness.replicas[i] for i in sorted(self.in_service)]
        serving = [r for r in serving if r is not avoid] or serving or self.harness.replicas
        return serving[next(self._turn) % len(serving)]

    async def request(self, kind: Requests, method: str, params: dict[str, Any]) -> Any:
        """``method`` through a replica in service, retried once elsewhere; its result, or
        None when the retry failed too (counted)."""
        kind.sent += 1
        first = self.replica()
        problem = await self._try(first, method, params)
        if not isinstance(problem, str):
            return problem
        kind.retried += 1
        await asyncio.sleep(RETRY_AFTER_S)  # the documented client retry's pause
        again = await self._try(self.replica(avoid=first), method, params)
        if not isinstance(again, str):
            return again
        kind.failed += 1
        if len(kind.errors) < 10:
            kind.errors.append(f"{method}: {problem} / retry: {again}")
        return None

    async def _try(self, replica: Replica, method: str, params: dict[str, Any]) -> Any:
        try:
            message = await call(self.http, replica.url, method, params)
        except (httpx.HTTPError, ValueError) as exc:
            return f"{replica.name}: {exc!r}"[:200]
        if "result" not in message:
            return f"{replica.name}: {json.dumps(message.get('error'))}"[:200]
        return message["result"]

    # --- the loops ---

    def start(self) -> None:
        self.harness.on_delivery = self._delivered
        self.pipeline_clients = {
            f"{t[:8]}-c{j}"
            for t in self.harness.pipeline_task_ids
            for j in range(self.sizes.streams_per_task)
        }
        self._loops = [
            asyncio.create_task(self._creating(), name="creating"),
            asyncio.create_task(self._probing(), name="probing"),
        ]

    async def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    def _delivered(self, client_id: str, type_: str, payload: dict[str, Any]) -> None:
        if type_ == PIPELINE_EVENT and client_id in self.pipeline_clients:
            self.seen.streams.setdefault(client_id, []).append(time.monotonic())

    async def _creating(self) -> None:
        arguments = {"prompt": "rollout", "steps": 20, "delay_ms": 100}
        while True:
            await asyncio.sleep(self.sizes.create_every_s)  # the load's pace
            created = await self.request(
                self.creates, "tools/call", {"name": "agent_run", "arguments": arguments}
            )
            if isinstance(created, dict) and created.get("resultType") == "task":
                self.harness.adopt_tool_tasks([str(created["taskId"])], streams=1)

    async def _probing(self) -> None:
        while True:
            await asyncio.sleep(self.sizes.probe_every_s)  # the load's pace
            task_id = self._rng.choice(self.harness.task_ids)
            await self.request(self.gets, "tasks/get", {"taskId": task_id})

    # --- webhooks ---

    async def subscribe(self, receiver: Receiver) -> int:
        """``sizes.webhooks`` subscriptions over the pipeline tasks; how many took."""
        taken = 0
        tasks = self.harness.pipeline_task_ids
        for n in range(self.sizes.webhooks):
            task_id = tasks[n % len(tasks)]
            delivery = {"mode": "webhook", "url": receiver.url(f"h{n}"), "secret": WEBHOOK_SECRET}
            params = {"name": WEBHOOK_EVENT, "arguments": {"taskId": task_id}, "delivery": delivery}
            done = await self.request(self.subscribes, "events/subscribe", params)
            taken += done is not None
        return taken


@dataclass
class Receiver:
    """An HTTPS webhook receiver: answers challenges, notes when each hook got an event."""

    seen: Seen
    port: int = 0

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}/hooks/{path}"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = b""
                if message.get("type") == "verification":
                    answer = json.dumps({"challenge": message["challenge"]}).encode()
                elif "eventId" in message:
                    receiver.seen.hook_events += 1
                    receiver.seen.hooks.setdefault(self.path, []).append(time.monotonic())
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


class _TlsServer(ThreadingHTTPServer):
    """A threaded HTTPS server whose TLS handshake happens in the request's thread: one
    client that connects and says nothing (a replica stopped mid-connect) cannot hold the
    accept loop, as a listening socket wrapped whole would."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.context = context

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(10)  # a silent client's thread gives up
        return self.context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), address


@contextlib.contextmanager
def receiving(seen: Seen, ca: trustme.CA) -> Iterator[Receiver]:
    receiver = Receiver(seen)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(context)
    server = _TlsServer(receiver.handler(), context)
    receiver.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# --- the replicas, as their metrics say -----------------------------------------------------------


#: Summed per replica at each phase's edges: group rebalances, and partition-seconds without a
#: serving owner as the replica saw them (a metric the bridge has since the rollout work;
#: absent before it, then reported as n/a).
REBALANCES = "bridge_rebalances_total"
UNSERVED = "bridge_partition_unavailable_seconds_total"


async def metric(http: httpx.AsyncClient, replica: Replica, name: str) -> float | None:
    """The sum of ``name``'s samples on ``replica`` (None when it does not answer or has no
    such series)."""
    try:
        reply = await http.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    total, found = 0.0, False
    for line in reply.text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name or head.startswith(name + "{"):
            total, found = total + float(value), True
    return total if found else None


async def reading(http: httpx.AsyncClient, replicas: list[Replica]) -> dict[str, dict[str, float]]:
    """Per metric of :data:`REBALANCES` and :data:`UNSERVED`, each answering replica's sum."""
    found: dict[str, dict[str, float]] = {REBALANCES: {}, UNSERVED: {}}
    for replica in replicas:
        for name, values in found.items():
            value = await metric(http, replica, name)
            if value is not None:
                values[replica.name] = value
    return found


async def settled(http: httpx.AsyncClient, replicas: list[Replica], member: Replica) -> None:
    """Wait (bounded) until the live replicas own every partition between them, ``member``
    some of them."""

    async def owned() -> list[float | None]:
        return [await metric(http, r, "bridge_owned_partitions") for r in replicas if r.alive()]

    async with asyncio.timeout(SETTLE_BOUND_S):
        while True:
            counts = await owned()
            mine = await metric(http, member, "bridge_owned_partitions")
            if None not in counts and sum(c or 0 for c in counts) == PARTITIONS and mine:
                return
            await asyncio.sleep(POLL_S)  # a poll: nothing signals an assignment


async def owners(http: httpx.AsyncClient, replicas: list[Replica]) -> dict[int, int]:
    """Partition -> index of the replica that owns it, from the per-partition series only an
    owner exports (``bridge_log_end_offset``, refreshed every ``metrics_refresh_s``)."""
    found = {}
    for i, replica in enumerate(replicas):
        try:
            reply = await http.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=5)
        except httpx.HTTPError:
            continue
        for line in reply.text.splitlines():
            if line.startswith('bridge_log_end_offset{partition="'):
                found[int(line.split('"')[1])] = i
    return found


def most_grown(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], name: str, skip: str
) -> float:
    """The most ``name`` grew on a replica that stayed up (not ``skip``) between two readings:
    every member applies every assignment, and sees every partition's owner."""
    was, now = before[name], after[name]
    deltas = [now[n] - was[n] for n in was if n != skip and n in now]
    return max(deltas, default=float("nan"))


# --- the phases -----------------------------------------------------------------------------------


async def wait_stopped(replica: Replica) -> tuple[float, bool]:
    """SIGTERM, then SIGKILL after ``GRACE_S``: (seconds until it exited, whether killed)."""
    popen = replica.proc.popen
    assert popen is not None
    started = time.monotonic()
    popen.terminate()
    try:
        await asyncio.to_thread(popen.wait, GRACE_S)
        return time.monotonic() - started, False
    except Exception:  # subprocess.TimeoutExpired: the grace period ran out
        await asyncio.to_thread(replica.kill)
        return time.monotonic() - started, True


async def come_back(load: Load, index: int) -> float:
    """Start replica ``index`` again (same instance id), wait until it is ready and owns
    partitions, then put it back in service; the seconds from its start to ready."""
    replica = load.harness.replicas[index]
    started = time.monotonic()
    replica.restart()
    await load.harness.wait_ready(replica, bound=READY_BOUND_S)
    ready_s = time.monotonic() - started
    await settled(load.http, load.harness.replicas, replica)
    load.in_service.add(index)
    return ready_s


@dataclass
class Phase:
    """What one phase measured besides the deliveries' times."""

    window: Window
    gets_failed: int = 0
    creates_failed: int = 0
    requests: int = 0
    rebalances: list[float] = field(default_factory=list)
    unserved: list[float] = field(default_factory=list)  # partition-seconds, per restart
    stop_s: list[float] = field(default_factory=list)
    killed_after_grace: int = 0
    ready_s: list[float] = field(default_factory=list)
    resume_s: float | None = None
    affected: int = 0  # pipeline streams of the killed replica's partitions


def _counts(load: Load) -> tuple[int, int, int]:
    return load.gets.failed, load.creates.failed, load.gets.sent + load.creates.sent


def _close(phase: Phase, load: Load, before: tuple[int, int, int]) -> Phase:
    phase.window.end = time.monotonic()
    after = _counts(load)
    phase.gets_failed = after[0] - before[0]
    phase.creates_failed = after[1] - before[1]
    phase.requests = after[2] - before[2]
    return phase


async def rollout(load: Load) -> Phase:
    """Every replica in turn: SIGTERM, start again, ready and given partitions."""
    replicas = load.harness.replicas
    phase, before = Phase(Window(time.monotonic())), _counts(load)
    for i, replica in enumerate(replicas):
        read = await reading(load.http, replicas)
        load.in_service.discard(i)
        say(f"rollout: SIGTERM {replica.name}")
        stop_s, killed = await wait_stopped(replica)
        phase.stop_s.append(stop_s)
        phase.killed_after_grace += killed
        phase.ready_s.append(await come_back(load, i))
        after = await reading(load.http, replicas)
        phase.rebalances.append(most_grown(read, after, REBALANCES, replica.name))
        phase.unserved.append(most_grown(read, after, UNSERVED, replica.name))
        say(
            f"rollout: {replica.name} stopped in {stop_s:.1f} s{' (killed)' if killed else ''}, "
            f"ready {phase.ready_s[-1]:.1f} s after its start, "
            f"{phase.rebalances[-1]:g} rebalances"
        )
    return _close(phase, load, before)


async def sigkill(load: Load) -> Phase:
    """SIGKILL of the replica owning the most pipeline tasks; every stream resumed; its
    restart."""
    replicas = load.harness.replicas
    owner = await owners(load.http, replicas)
    tasks = [
        owner.get(partition_for_key(t.encode(), PARTITIONS), -1)
        for t in load.harness.pipeline_task_ids
    ]
    index = max(range(len(replicas)), key=tasks.count)
    victim = replicas[index]
    say(f"sigkill: {victim.name} owns {tasks.count(index)} of {len(tasks)} pipeline tasks")
    read = await reading(load.http, replicas)
    phase, before = Phase(Window(time.monotonic())), _counts(load)
    mark = time.time_ns() // 1_000_000
    load.in_service.discard(index)
    victim.kill()
    say(f"sigkill: {victim.name} killed")
    phase.resume_s = await load.harness.recovery_s(mark, RESUME_BOUND_S)
    say(
        f"sigkill: every pipeline stream handed an event sent after the kill {phase.resume_s:.1f} s"
    )
    phase.affected = tasks.count(index) * load.sizes.streams_per_task
    phase.ready_s.append(await come_back(load, index))
    after = await reading(load.http, replicas)
    phase.rebalances.append(most_grown(read, after, REBALANCES, victim.name))
    phase.unserved.append(most_grown(read, after, UNSERVED, victim.name))
    return _close(phase, load, before)


# --- the results ----------------------------------------------------------------------------------


def pctl(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Verdicts:
    """PASS/MISS of a full run; in parentheses for a smoke run."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke

    def __call__(self, ok: bool) -> str:
        return f"({verdict(ok)})" if self.smoke else verdict(ok)


def report_phase(name: str, phase: Phase, load: Load, res: Results, judge: Verdicts) -> None:
    failed = phase.gets_failed + phase.creates_failed
    rollout_phase = name == "rollout"
    res.add(
        name,
        "requests failed beyond one retry (tasks/get + tools/call)",
        f"{failed} of {phase.requests} ({phase.gets_failed} + {phase.creates_failed})",
        target="0" if rollout_phase else "",
        status=judge(failed == 0) if rollout_phase else "",
    )
    gaps = load.seen.longest_gaps(load.seen.streams, phase.window)
    p99, worst = pctl(gaps, 0.99), max(gaps, default=float("nan"))
    if rollout_phase:
        res.add(
            name,
            f"stream longest gap p99 ({len(gaps)} streams)",
            p99,
            "s",
            target=f"<= {TARGET_GAP_P99_S:g} s",
            status=judge(p99 <= TARGET_GAP_P99_S),
        )
        res.add(
            name,
            "stream longest gap worst",
            worst,
            "s",
            target=f"<= {TARGET_GAP_WORST_S:g} s",
            status=judge(worst <= TARGET_GAP_WORST_S),
        )
    else:
        res.add(
            name,
            f"stream longest gap p99 / worst ({len(gaps)} streams)",
            f"{p99:.2f} / {worst:.2f}",
            "s",
        )
    if phase.resume_s is not None:
        bound = SESSION_TIMEOUT_MS / 1000 + TARGET_RESUME_SLACK_S
        res.add(
            name,
            f"kill -> every stream handed an event sent after it ({phase.affected} on the "
            "victim's partitions)",
            phase.resume_s,
            "s",
            target=f"<= {bound:g} s (session timeout + {TARGET_RESUME_SLACK_S:g})",
            status=judge(phase.resume_s <= bound),
        )
    most = max(phase.rebalances, default=float("nan"))
    res.add(
        name,
        "group rebalances per restarted replica (each)",
        " / ".join(f"{r:g}" for r in phase.rebalances),
        target=f"<= {TARGET_REBALANCES}" if rollout_phase else "",
        status=judge(most <= TARGET_REBALANCES) if rollout_phase else "",
    )
    res.add(
        name,
        "partition-seconds without a serving owner (each; most a replica up meanwhile saw)",
        " / ".join("n/a" if math.isnan(u) else f"{u:.1f}" for u in phase.unserved),
        "s",
    )
    if phase.stop_s:
        res.add(
            name,
            "SIGTERM -> exited (each)",
            " / ".join(f"{s:.1f}" for s in phase.stop_s),
            "s",
            target=f"grace {GRACE_S:g} s",
        )
        res.add(name, "killed after the grace period", phase.killed_after_grace)
    res.add(name, "start -> ready (each)", " / ".join(f"{s:.1f}" for s in phase.ready_s), "s")
    hooks = load.seen.longest_gaps(load.seen.hooks, phase.window)
    res.add(
        "webhooks",
        f"{name}: longest gap p99 / worst ({len(hooks)} subscriptions)",
        f"{pctl(hooks, 0.99):.2f} / {max(hooks, default=float('nan')):.2f}",
        "s",
    )


def report_checker(checked: Any, load: Load, res: Results, judge: Verdicts) -> None:
    counts = checked.counts
    for category in ("lost", "duplicated", "out_of_order"):
        res.add(
            "checker", category, counts[category], target="0", status=judge(counts[category] == 0)
        )
    others = sum(v for k, v in counts.items() if k not in ("lost", "duplicated", "out_of_order"))
    res.add("checker", "other findings", others, target="0", status=judge(others == 0))
    res.add(
        "checker",
        "deliveries judged / streams (finished)",
        f"{checked.deliveries:,} / {checked.streams} ({checked.finished_streams})",
    )
    if not checked.ok:
        res.note(checked.summary())


def report_load(load: Load, res: Results, subscribed: int) -> None:
    c = load.harness.counters
    res.add(
        "load",
        "pipeline events produced / delivered to streams",
        f"{c.produced:,} / {c.delivered:,}",
    )
    res.add(
        "load",
        "tasks (pipeline + tool)",
        f"{len(load.harness.pipeline_task_ids)} + {len(load.harness.tool_task_ids)}",
    )
    res.add(
        "load",
        "stream resumes / stream errors / events_gone",
        f"{c.retries} / {c.stream_errors} / {c.gone}",
    )
    res.add(
        "load",
        "tasks/get sent / retried; tools/call sent / retried",
        f"{load.gets.sent} / {load.gets.retried}; {load.creates.sent} / {load.creates.retried}",
    )
    res.add(
        "load",
        "webhook subscriptions / events delivered",
        f"{subscribed} / {load.seen.hook_events:,}",
    )
    lat = sorted(c.latencies_s)
    if lat:
        res.add(
            "load",
            "pipeline event latency p50 / p99 (whole run)",
            f"{statistics.median(lat) * 1000:.0f} / {pctl(lat, 0.99) * 1000:.0f}",
            "ms",
        )
    for err in [*load.subscribes.errors, *load.gets.errors, *load.creates.errors][:6]:
        res.note(f"failed request: {err}")


# --- main ---------------------------------------------------------------------------------------


def tokens_file(logs: Path) -> Path:
    """The replicas' tokens file: the load's token, for the principal ``anonymous``."""
    path = logs / "tokens.json"
    path.write_text(json.dumps({TOKEN: ANONYMOUS}))
    return path


def plan_for(sizes: Sizes, logs: Path, ca_file: Path) -> LoadPlan:
    return LoadPlan(
        replicas=REPLICAS,
        workers=1,
        tool_tasks=sizes.tool_tasks,
        pipeline_tasks=sizes.pipeline_tasks,
        streams_per_task=sizes.streams_per_task,
        tool_arguments={"prompt": "rollout", "steps": 40, "delay_ms": 100},
        pipeline_events=1_000_000,  # until stop(): the pipelines outlast every phase
        pipeline_interval_s=sizes.pipeline_interval_s,
        headers=AUTH,
        replica_env={
            # Webhook delivery needs an authenticated principal: one token for the whole load,
            # whose principal is the one bridgedev.replay creates pipeline tasks for.
            "BRIDGE_AUTH__MODE": "bearer",
            "BRIDGE_AUTH__TOKENS_FILE": str(tokens_file(logs)),
            # One client stands for many: the per-client stream and task limits are not
            # what is measured.
            "BRIDGE_STREAMS__MAX_PER_PRINCIPAL": "10000",
            "BRIDGE_TASKS__MAX_ACTIVE_PER_PRINCIPAL": "10000",
            "BRIDGE_STREAMS__OPENS_PER_MINUTE": "100000",
            "BRIDGE_WEBHOOKS__ALLOWLIST": '["127.0.0.1/32"]',
            "BRIDGE_WEBHOOKS__CA_FILE": str(ca_file),
            "BRIDGE_WEBHOOKS__POLL_INTERVAL_S": "0.2",
            "BRIDGE_WEBHOOKS__TIMEOUT_S": "2",
            "BRIDGE_WEBHOOKS__VERIFY_BURST": "32",
            **webhook_keys_env(logs),
        },
    )


async def run(settings: Settings, sizes: Sizes, logs: Path, res: Results, judge: Verdicts) -> None:
    ca = trustme.CA()
    ca_file = logs / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    seen = Seen()
    plan = plan_for(sizes, logs, ca_file)
    timeout = httpx.Timeout(30.0)
    # The receiver outlives the replicas: their webhook deliveries end first.
    with receiving(seen, ca) as receiver:
        async with (
            LoadHarness(settings, logs, plan) as harness,
            httpx.AsyncClient(timeout=timeout, headers=AUTH) as http,
        ):
            load = Load(harness, sizes, http)
            load.seen = seen
            await settled(http, harness.replicas, harness.replicas[-1])
            subscribed = await load.subscribe(receiver)
            load.start()
            say(f"load under way ({harness.open_streams} streams); {sizes.quiet_s:g} s alone")
            await asyncio.sleep(sizes.quiet_s)  # the load before the phase, not a wait
            rolled = await rollout(load)
            report_phase("rollout", rolled, load, res, judge)
            await asyncio.sleep(sizes.quiet_s)  # the load before the phase, not a wait
            killed = await sigkill(load)
            report_phase("sigkill", killed, load, res, judge)
            await asyncio.sleep(sizes.quiet_s)  # the load after it
            await load.stop()
            say("ending the load; draining the streams")
            await harness.stop(drain_s=90)
            checked = await harness.check()
            report_checker(checked, load, res, judge)
            report_load(load, res, subscribed)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", "--small", action="store_true", help="a small run: completes, no targets"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    res = Results(order=_ORDER)
    wall = time.perf_counter()
    base = load_settings()
    logs = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    with provide_broker(base, progress=say) as broker:
        res.environment = environment(broker, base)
        prefix = fresh_prefix("rollout")
        settings = make_settings(
            broker.info.bootstrap_servers,
            prefix,
            topics={"prefix": prefix, "partitions": PARTITIONS, "min_insync_replicas": 1},
            tool_packs=["conformance", "demo"],
        )
        res.environment.update(
            size="smoke" if args.smoke else "full",
            sizes=sizes.__dict__,
            partitions=PARTITIONS,
            session_timeout_ms=SESSION_TIMEOUT_MS,
        )
        say(f"broker: {broker.info.provider} at {broker.info.bootstrap_servers}; logs in {logs}")
        asyncio.run(run(settings, sizes, logs, res, Verdicts(args.smoke)))
    env = res.environment
    env["wall_seconds"] = round(time.perf_counter() - wall, 1)
    res.note(
        f"the machine has {env['nproc']} cores shared with other engineers' runs; the broker, "
        "three replicas, a worker and this load generator share them"
    )
    if args.keep_logs:
        say(f"logs kept in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    s = sizes
    report(
        res,
        f"bench_rollout.py  size={env['size']}",
        f"load: {s.pipeline_tasks} pipeline tasks (an event every {s.pipeline_interval_s:g} s) "
        f"and {s.tool_tasks} agent_run tasks x {s.streams_per_task} streams, a new agent_run "
        f"task every {s.create_every_s:g} s (1 stream), tasks/get every {s.probe_every_s:g} s, "
        f"{s.webhooks} webhook subscriptions",
        f"replicas: {REPLICAS}, {PARTITIONS} events partitions, ownership=group, static members, "
        f"session timeout {SESSION_TIMEOUT_MS} ms, grace {GRACE_S:g} s, one retry after "
        f"{RETRY_AFTER_S:g} s  wall time {env['wall_seconds']} s",
        json_path=args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

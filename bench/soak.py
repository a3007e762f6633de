"""The soak: mixed load with random faults for minutes, then the checker and a report.

Run::

    .venv/bin/python bench/soak.py --minutes 20 --json soak.json      # the measurement
    .venv/bin/python bench/soak.py --seconds 75 --seed 7               # a short one (CI's)
    .venv/bin/python bench/soak.py --minutes 5 --bootstrap HOST:PORT   # a given cluster

Issue 16 item 5. It starts its own throwaway three-broker cluster (``start_cluster``: RF 3,
min ISR 2, clients through the fault proxy) unless ``--bootstrap`` names one (then only the
faults that need no cluster handle run: replica, worker and client faults). On fresh topics it
runs the load harness of ``tests/support/load.py`` (this script puts ``tests/`` on
``sys.path`` to import it: the harness is the one the fault tests use): two ``bridge serve``
replicas in group ownership mode, two ``bridge workers``, tool tasks (``agent_run``) and
pipeline tasks (idempotent acks=all writers) created all the time so that some are always
running and finishing, several resuming stream clients on each.

Meanwhile a seeded RNG (``--seed``, printed) injects one fault at a time, after a random quiet
gap, in rounds that visit every kind once in a random order:

=================  ==========================================  ===============  ==============
fault              what is done                                clock starts at  expected
=================  ==========================================  ===============  ==============
``broker_kill``    SIGKILL of a random broker, restart later   the kill         A
``broker_freeze``  SIGSTOP of a random broker, SIGCONT later   the SIGCONT      A
``net_cut``        the proxy cuts (or blackholes) every link   the restore      B
``net_slow``       the proxy adds latency to every link        the clear        A
``replica_kill``   SIGKILL of a bridge replica, restart later  the kill         C
``worker_kill``    SIGKILL of a worker (mid-job), restart      the kill         D
``client_pause``   a few clients stop reading, then go on      the resume       E
=================  ==========================================  ===============  ==============

Expected outcomes (what a user sees): A) streams pause at most, no request fails for long;
pipeline sends may be retried by their producer. B) streams stall; a client's read may time
out or a replica may refuse (partition moving), and the client resumes with its cursor;
creating a task may fail with an error and succeed once retried. C) the clients on the killed
replica get a dropped stream and resume on the other one (a refusal while the partitions move
to it is answered with an error, then resumed); tasks created through it fail until it is back.
D) the killed worker's job is taken over (the task goes on or ends with a status), streams do
not notice. E) the paused clients catch up from where they stopped, nothing is skipped. In
every case the checker must find 0 lost, 0 duplicated (after the client's de-dup on seq),
0 silently skipped and 0 wrong seq.

Recovery of a fault: the time from its clock start until every stream open at that moment has
been handed an event produced after it (a pipeline event whose send time is later; for a tool
task any event handed later, as its events carry no send time) or has finished. After each
fault the soak waits until the cluster is whole again (every broker up and in every ISR of
the soak's topics, every replica ready, every worker alive) before the next quiet gap.

Memory: VmRSS of every process (replicas, workers, brokers, this load generator) sampled every
``--sample-s``; per process the growth compares the mean of the last third with the first
third of the samples after a warm-up (one minute, at most a third of the run), over its
longest-lived incarnation (a killed process starts again from nothing), judged only when
that spans five minutes or more (shorter: shown, not judged; a JVM restarted late is still
committing its heap).

At the end the load stops, the checker reads the log and the report is printed (and with
``--json`` written). Exit code: 1 when the checker found anything, 2 when it is clean but
another line MISSed (a fault not recovered, memory growth), 3 when no cluster could be
started, 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, Results, environment, report, say, verdict

sys.path.insert(0, str(REPO / "tests"))  # the load harness: tests/support/load.py

from support.layout import fresh_prefix, make_settings
from support.load import PIPELINE_EVENT, LoadHarness, LoadPlan

from bridge.config import Settings, load_settings
from bridge.kafka.admin import kafka_admin
from bridge.kafka.clients import KafkaError
from bridge.kafka.topics import create_layout
from bridge.tasks.tools import job_topics
from bridgedev.kafka import LocalCluster, start_cluster
from bridgedev.kafka.broker import Broker, BrokerInfo, KafkaProviderError
from bridgedev.kafka.provider import ExternalBroker

KAFKA_FAULTS = ("broker_kill", "broker_freeze", "net_cut", "net_slow")
PROCESS_FAULTS = ("replica_kill", "worker_kill", "client_pause")
#: Checker categories that have a PASS/MISS line of their own (the others are summed).
NAMED_CATEGORIES = ("lost", "duplicated", "silently_skipped", "wrong_seq")

#: Bounds (seconds) of a fault's recovery, of the cluster becoming whole, of the final drain.
RECOVERY_BOUND_S = 150.0
HEALTH_BOUND_S = 180.0
#: A broker's restart on a busy machine (JVM start, log recovery, catching up).
BROKER_START_S = 300.0
DRAIN_S = 120.0
#: Tasks of each kind kept running, and stream clients on each.
TOOL_TASKS = 3
PIPELINE_TASKS = 3
STREAMS_PER_TASK = 4
#: Memory growth bounds: the last third's mean may exceed the first third's by this fraction
#: or this many MiB, whichever is larger. JVMs commit heap up to -Xmx gradually: a wider bound.
GROWTH_BOUND = {"python": (0.10, 16.0), "jvm": (0.15, 64.0)}
WARMUP_S = 60.0
#: A process is judged on at least this long after its warm-up (a shorter life, e.g. a
#: broker restarted late, or a short run, is shown but not judged).
MIN_JUDGED_S = 300.0
#: Exit code when no cluster could be started (a test skips on it outside CI).
NO_CLUSTER = 3


@dataclass
class Fault:
    """One injected fault, what it hit, and how long until every stream moved on."""

    n: int
    kind: str
    target: str
    at_s: float  # since the load started
    held_s: float
    recovery_s: float | None = None  # None: not every stream recovered within the bound
    stuck: list[str] = field(default_factory=list)
    note: str = ""


class RecoveryClock:
    """Which streams, open at ``start`` (wall time), have been handed a fresh event since."""

    def __init__(self, start: float, clients: list[str]) -> None:
        self.start = start
        self.waiting = set(clients)
        self.last = start
        #: The stream that recovered last, and how: what a long recovery was waiting for.
        self.last_what = ""

    def delivered(self, client: str, type_: str, payload: dict[str, Any]) -> None:
        if client not in self.waiting:
            return
        at_ms = payload.get("atMs") if type_ == PIPELINE_EVENT else None
        if isinstance(at_ms, int) and at_ms / 1000 < self.start:
            return  # catch-up of an event older than the clock: not yet recovered
        self.waiting.discard(client)
        self.last = time.time()
        self.last_what = f"{client}, {'a pipeline' if type_ == PIPELINE_EVENT else 'a tool'} event"

    def finished(self, still_open: set[str]) -> None:
        """Streams that ended (their task's result reached) count as recovered at their end."""
        ended = self.waiting - still_open
        if ended:
            self.waiting -= ended
            self.last = time.time()
            self.last_what = f"{min(ended)}, its stream finished"


class Soak:
    """The run: cluster (maybe), harness, spawner, fault loop, memory sampler, report."""

    def __init__(self, args: argparse.Namespace, settings: Settings, broker: Broker) -> None:
        self.args = args
        self.settings = settings
        self.broker = broker
        self.cluster = broker if isinstance(broker, LocalCluster) else None
        self.rng = random.Random(args.seed)
        self.duration_s = args.seconds if args.seconds else args.minutes * 60
        self.logs = Path(args.logs or tempfile.mkdtemp(prefix="soak-logs-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.load: LoadHarness | None = None
        self.faults: list[Fault] = []
        self.clocks: list[RecoveryClock] = []
        self.in_fault = False
        self.latency_fault: list[float] = []
        self.latency_quiet: list[float] = []
        #: label -> [(seconds since start, pid, VmRSS KiB)]
        self.memory: dict[str, list[tuple[float, int, int]]] = {}
        self.create_failures = 0
        #: Processes found exited that no fault had killed (each restarted): a finding.
        self.exits: list[str] = []
        #: (client, task) -> seconds since start when its stream finished (for a failure's story)
        self.finish_at: dict[tuple[str, str], float] = {}
        self.create_errors: list[str] = []
        self.started = time.monotonic()

    # --- the run -------------------------------------------------------------------------------

    async def run(self) -> tuple[Any, float]:
        plan = LoadPlan(
            replicas=2,
            workers=2,
            tool_tasks=TOOL_TASKS,
            pipeline_tasks=PIPELINE_TASKS,
            streams_per_task=STREAMS_PER_TASK,
            tool_arguments={"prompt": "soak", "steps": 150, "delay_ms": 100},
            pipeline_events=300,
            pipeline_interval_s=0.06,
            idempotent_pipeline=True,
        )
        await self._create_topics()
        async with LoadHarness(self.settings, self.logs, plan) as load:
            self.load = load
            load.on_delivery = self._delivered
            finished = load.recording.finished

            def noted(client_id: str, task_id: str) -> None:
                self.finish_at[(client_id, task_id)] = time.monotonic() - self.started
                finished(client_id, task_id)

            load.recording.finished = noted  # type: ignore[method-assign]
            self.started = time.monotonic()
            say(f"load running (logs {self.logs}); faults for {self.duration_s:.0f} s")
            background = [
                asyncio.create_task(self._spawn()),
                asyncio.create_task(self._sample_memory()),
            ]
            try:
                await self._inject_faults()
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
            say("stopping the load (writers end their tasks, streams drain)")
            await load.stop(drain_s=DRAIN_S)
            elapsed = time.monotonic() - self.started
            say("checking against the log")
            checked = await load.check()
        return checked, elapsed

    async def _create_topics(self) -> None:
        """The layout, once the cluster creates RF-3 topics (every broker registered)."""

        async def created() -> bool:
            try:
                await create_layout(self.settings, job_topics(self.settings))
            except KafkaError:
                return False
            return True

        await _bounded(created, HEALTH_BOUND_S, "the topic layout created")
        if self.cluster is not None:  # replicas starting on a settling cluster time out
            await _bounded(self._isr_full, HEALTH_BOUND_S, "every broker in every ISR")

    def _delivered(self, client: str, type_: str, payload: dict[str, Any]) -> None:
        for clock in self.clocks:
            clock.delivered(client, type_, payload)
        at_ms = payload.get("atMs") if type_ == PIPELINE_EVENT else None
        if isinstance(at_ms, int):
            latency = time.time() - at_ms / 1000
            (self.latency_fault if self.in_fault else self.latency_quiet).append(latency)

    async def _spawn(self) -> None:
        """Keep TOOL_TASKS and PIPELINE_TASKS tasks running: a new one when one has ended."""
        load = self._load()
        while True:
            open_tasks = {client.rsplit("-c", 1)[0] for client in load.open_client_ids}
            for ids, target, add in (
                (load.tool_task_ids, TOOL_TASKS, load.add_tool_tasks),
                (load.pipeline_task_ids, PIPELINE_TASKS, load.add_pipeline_tasks),
            ):
                running = sum(1 for t in ids if t[:8] in open_tasks)
                if running < target:
                    await self._create(add)
            await asyncio.sleep(1.0)  # the spawner's pace

    async def _create(self, add: Callable[[int], Awaitable[list[str]]]) -> None:
        try:
            async with asyncio.timeout(60):
                await add(1)
        except Exception as exc:  # a refused create is an expected outcome: counted, retried
            self.create_failures += 1
            self.create_errors = [*self.create_errors[-9:], repr(exc)[:200]]

    async def _sample_memory(self) -> None:
        while True:
            now = time.monotonic() - self.started
            for label, pid in self._pids():
                with contextlib.suppress(OSError, ValueError):
                    self.memory.setdefault(label, []).append((now, pid, _rss_kib(pid)))
            await asyncio.sleep(self.args.sample_s)  # the sampling period

    def _pids(self) -> list[tuple[str, int]]:
        load = self._load()
        pids = [(r.name, r.proc.popen.pid) for r in load.replicas if r.alive() and r.proc.popen]
        pids += [(w.name, w.popen.pid) for w in load.workers if w.alive() and w.popen]
        if self.cluster is not None:
            pids += [(f"broker{n.node_id}", n.pid) for n in self.cluster.nodes if n.pid]
        return [*pids, ("load", os.getpid())]

    def _load(self) -> LoadHarness:
        assert self.load is not None
        return self.load

    # --- faults --------------------------------------------------------------------------------

    async def _inject_faults(self) -> None:
        kinds = [*(KAFKA_FAULTS if self.cluster is not None else ()), *PROCESS_FAULTS]
        rounds = itertools.chain.from_iterable(self.rng.sample(kinds, len(kinds)) for _ in _ever())
        for n, kind in enumerate(rounds, 1):
            gap = self.rng.uniform(*self.args.gap_s)
            if self._left() < gap + 30:
                await asyncio.sleep(max(0.0, self._left()))  # the rest of the run, quiet
                return
            await asyncio.sleep(gap)  # the quiet gap between faults (its length is the point)
            fault = await self._one(n, kind)
            self.faults.append(fault)
            took = "not recovered" if fault.recovery_s is None else f"{fault.recovery_s:.1f} s"
            say(f"fault {n} {kind} {fault.target} held {fault.held_s:.1f} s: recovery {took}")
            await self._whole()

    def _left(self) -> float:
        return self.duration_s - (time.monotonic() - self.started)

    async def _one(self, n: int, kind: str) -> Fault:
        fault = Fault(n, kind, "", round(time.monotonic() - self.started, 1), 0.0)
        self.in_fault = True
        try:
            inject = {
                "broker_kill": self._broker_kill,
                "broker_freeze": self._broker_freeze,
                "net_cut": self._net_cut,
                "net_slow": self._net_slow,
                "replica_kill": self._replica_kill,
                "worker_kill": self._worker_kill,
                "client_pause": self._client_pause,
            }[kind]
            clock = await inject(fault)
            await self._recover(fault, clock)
        finally:
            self.in_fault = False
        return fault

    async def _hold(self, low: float, high: float) -> float:
        held = self._duration(low, high)
        await asyncio.sleep(held)  # the fault's duration
        return held

    def _duration(self, low: float, high: float) -> float:
        """A fault's random duration, scaled by ``--hold-scale`` (short runs)."""
        return self.rng.uniform(low, high) * self.args.hold_scale

    def _clock(self) -> RecoveryClock:
        clock = RecoveryClock(time.time(), self._load().open_client_ids)
        self.clocks.append(clock)
        return clock

    async def _broker_kill(self, fault: Fault) -> RecoveryClock:
        node = self.rng.choice(self._cluster().nodes)
        fault.target = f"node {node.node_id}"
        node.kill()
        clock = self._clock()  # a failover: the clock runs from the kill
        fault.held_s = await self._hold(5, 20)
        started = time.monotonic()
        try:
            await asyncio.to_thread(node.start, BROKER_START_S)
            fault.note = f"restarted in {time.monotonic() - started:.1f} s"
        except KafkaProviderError:  # still starting, or died starting: _whole() sees to it
            fault.note = f"not answering {BROKER_START_S:.0f} s after its restart"
        return clock

    async def _broker_freeze(self, fault: Fault) -> RecoveryClock:
        node = self.rng.choice(self._cluster().nodes)
        fault.target = f"node {node.node_id}"
        node.freeze()
        try:
            fault.held_s = await self._hold(5, 25)
        finally:
            node.thaw()
        return self._clock()

    async def _net_cut(self, fault: Fault) -> RecoveryClock:
        proxy = self._proxy()
        blackhole = self.rng.random() < 0.5
        fault.target = "blackhole" if blackhole else "reset"
        proxy.cut(blackhole=blackhole)
        try:
            fault.held_s = await self._hold(5, 20)
        finally:
            proxy.restore()
        return self._clock()

    async def _net_slow(self, fault: Fault) -> RecoveryClock:
        proxy = self._proxy()
        latency = self.rng.uniform(0.05, 0.4)
        fault.target = f"+{latency * 1000:.0f} ms"
        proxy.slow(latency)
        try:
            fault.held_s = await self._hold(10, 30)
        finally:
            proxy.clear()
        return self._clock()

    async def _replica_kill(self, fault: Fault) -> RecoveryClock:
        load = self._load()
        replica = self.rng.choice(load.replicas)
        fault.target = replica.name
        replica.kill()
        clock = self._clock()
        fault.held_s = await self._hold(0, 10)
        replica.restart()
        started = time.monotonic()
        try:
            await load.wait_ready(replica)
            fault.note = f"ready again in {time.monotonic() - started:.1f} s"
        except AssertionError:  # it exited starting: _whole() records that and starts it again
            fault.note = "exited while starting again"
        return clock

    async def _worker_kill(self, fault: Fault) -> RecoveryClock:
        worker = self.rng.choice(self._load().workers)
        fault.target = worker.name
        worker.kill()
        clock = self._clock()
        fault.held_s = await self._hold(0, 10)
        worker.start()
        return clock

    async def _client_pause(self, fault: Fault) -> RecoveryClock:
        load = self._load()
        clients = load.open_client_ids
        paused = self.rng.sample(clients, min(len(clients), self.rng.randint(1, 3)))
        fault.target = ",".join(paused)
        held = self._duration(10, 60)
        await asyncio.gather(*(load.hold(client, held) for client in paused))
        fault.held_s = held
        return self._clock()

    async def _recover(self, fault: Fault, clock: RecoveryClock) -> None:
        load = self._load()

        def recovered() -> bool:
            clock.finished(set(load.open_client_ids))
            return not clock.waiting

        try:
            await _bounded(recovered, RECOVERY_BOUND_S, "every open stream recovered")
            fault.recovery_s = round(clock.last - clock.start, 2)
            last = f"last: {clock.last_what}" if clock.last_what else ""
            fault.note = "; ".join(x for x in (fault.note, last) if x)
        except TimeoutError:
            fault.stuck = sorted(clock.waiting)
        finally:
            self.clocks.remove(clock)

    async def _whole(self) -> None:
        """Every broker up and in every ISR, every replica ready, every worker alive."""
        load = self._load()
        for proc in [*load.workers, *(r.proc for r in load.replicas)]:
            if not proc.alive():
                self.exits.append(f"{proc.name} exited by itself: {proc.tail(3)}"[:400])
                say(self.exits[-1])
                proc.start()
        if self.cluster is not None:
            for node in self.cluster.nodes:
                if node.pid is None:  # died (starting again, or by itself)
                    self.exits.append(f"broker{node.node_id} was not running")
                    say(self.exits[-1])
                    with contextlib.suppress(KafkaProviderError):
                        await asyncio.to_thread(node.start, BROKER_START_S)
        try:
            await load.wait_ready(bound=HEALTH_BOUND_S)
            if self.cluster is not None:
                await _bounded(self._isr_full, HEALTH_BOUND_S, "every broker in every ISR")
        except (AssertionError, TimeoutError) as exc:  # a finding; the soak goes on
            self.exits.append(f"not whole again: {exc}"[:400])
            say(self.exits[-1])

    async def _isr_full(self) -> bool:
        prefix = self.settings.topics.prefix
        try:
            async with kafka_admin(self.settings) as admin:
                topics = [t for t in await admin.list_topics() if t.startswith(prefix)]
                described = await admin.describe_topics(topics)
        except KafkaError:
            return False
        brokers = len(self._cluster().nodes)
        return all(len(p["isr"]) == brokers for t in described for p in t["partitions"])

    def _cluster(self) -> LocalCluster:
        assert self.cluster is not None
        return self.cluster

    def _proxy(self) -> Any:
        proxy = self._cluster().proxy
        assert proxy is not None, "the soak's cluster is proxied"
        return proxy

    # --- the report ----------------------------------------------------------------------------

    def results(self, checked: Any, elapsed: float) -> tuple[Results, list[str], int]:
        load = self._load()
        res = Results(environment=environment(self.broker, self.settings))
        c = load.counters
        res.add("load", "run (faults, then the drain)", elapsed, "s")
        res.add("load", "tasks (tool + pipeline)", len(load.task_ids))
        res.add("load", "streams (finished)", f"{checked.streams} ({checked.finished_streams})")
        res.add("load", "pipeline events produced (acked)", c.produced)
        res.add("load", "events in the log", checked.truth_events)
        res.add("load", "events delivered to clients", c.delivered)
        res.add(
            "load",
            "resumes / stream errors / events_gone",
            f"{c.retries} / {c.stream_errors} / {c.gone}",
        )
        res.add(
            "load",
            "pipeline sends retried / task creates refused",
            f"{c.produce_retries} / {self.create_failures}",
        )
        for category in NAMED_CATEGORIES:
            count = checked.counts[category]
            res.add("checker", category, count, target="0", status=verdict(count == 0))
        others = {k: v for k, v in checked.counts.items() if k not in NAMED_CATEGORIES and v}
        res.add(
            "checker",
            "other findings",
            sum(others.values()),
            target="0",
            status=verdict(not others),
        )
        for name, values in (("under faults", self.latency_fault), ("quiet", self.latency_quiet)):
            if values:
                res.add("latency", f"p50 {name}", _pct(values, 50) * 1000, "ms")
                res.add("latency", f"p99 {name}", _pct(values, 99) * 1000, "ms")
        kinds = Counter(f.kind for f in self.faults)
        res.add("faults", "injected", len(self.faults))
        for kind, count in sorted(kinds.items()):
            res.add("faults", f"  {kind}", count)
        recovered = [f.recovery_s for f in self.faults if f.recovery_s is not None]
        stuck = [f for f in self.faults if f.recovery_s is None]
        res.add(
            "faults",
            "every stream recovered",
            len(self.faults) - len(stuck),
            f"of {len(self.faults)}",
            target="all",
            status=verdict(not stuck),
        )
        if recovered:
            res.add("faults", "longest recovery", max(recovered), "s")
        res.add(
            "faults",
            "processes that exited by themselves",
            len(self.exits),
            target="0",
            status=verdict(not self.exits),
        )
        memory_ok = self._memory_rows(res)
        details = [f"seed: {self.args.seed}   logs: {self.logs}", "faults:"]
        details += [f"  {_fault_line(f)}" for f in self.faults]
        details += self.exits
        if self.create_errors:
            details.append(f"last refused creates: {self.create_errors[-3:]}")
        if not checked.ok:
            details.append(checked.summary())
            details += self._story(checked)
        code = 0 if checked.ok else 1
        if code == 0 and (stuck or self.exits or not memory_ok):
            code = 2
        return res, details, code

    def _story(self, checked: Any) -> list[str]:
        """For each stream in the checker's examples: its last deliveries and when it finished."""
        lines = []
        named = {e.split(" ", 1)[0] for examples in checked.examples.values() for e in examples}
        for key, stream in self._load().recording.streams.items():
            if f"{key[0]}/{key[1]}" not in named:
                continue
            tail = list(zip(stream.seqs[-4:], stream.replicas[-4:], strict=True))
            lines.append(
                f"  {key[0]}/{key[1][:12]}: last handed {tail}, finished at "
                f"{self.finish_at.get(key, float('nan')):.1f} s"
            )
        return lines

    def _memory_rows(self, res: Results) -> bool:
        ok = True
        warmup = min(WARMUP_S, self.duration_s / 3)
        for label in sorted(self.memory):
            growth = _growth(self.memory[label], warmup)
            if growth is None:
                res.add("memory", f"{label} VmRSS", _last_mib(self.memory[label]), "MiB", status="")
                continue
            first, last, span = growth
            kind = "jvm" if label.startswith("broker") else "python"
            fraction, mib = GROWTH_BOUND[kind]
            bound = max(first * fraction, mib)
            # The load generator is informational; a life too short to judge is shown only.
            judged = label != "load" and span >= MIN_JUDGED_S
            good = not judged or last - first <= bound
            ok &= good
            res.add(
                "memory",
                f"{label} VmRSS first -> last third of {span / 60:.0f} min",
                f"{first:.0f} -> {last:.0f}",
                "MiB",
                target=f"growth <= {bound:.0f} MiB" if judged else "",
                status=verdict(good) if judged else "",
            )
        return ok

    def as_json(self, res: Results, checked: Any, code: int) -> dict[str, Any]:
        return {
            "environment": res.environment,
            "seed": self.args.seed,
            "duration_s": self.duration_s,
            "rows": [asdict(r) for r in res.ordered()],
            "checker": checked.as_dict(),
            "counters": {
                k: v
                for k, v in asdict(self._load().counters).items()
                if k not in ("errors", "latencies_s", "timeline")
            },
            # The clients' drops and resumes (the most recent), beside the faults' times: what a
            # long recovery was waiting for.
            "timeline": [[round(t, 3), what] for t, what in self._load().counters.timeline],
            "faults": [asdict(f) for f in self.faults],
            "exits": self.exits,
            "memory_kib": {k: v for k, v in self.memory.items()},
            "exit_code": code,
        }


def _fault_line(f: Fault) -> str:
    took = (
        "NOT RECOVERED " + ",".join(f.stuck[:5])
        if f.recovery_s is None
        else f"{f.recovery_s:6.2f} s"
    )
    note = f"  ({f.note})" if f.note else ""
    return f"{f.n:>3}  t={f.at_s:7.1f} s  {f.kind:<14} {f.target:<22} held {f.held_s:5.1f} s  recovery {took}{note}"


def _growth(
    samples: list[tuple[float, int, int]], warmup: float
) -> tuple[float, float, float] | None:
    """Mean VmRSS (MiB) of the first and last third after warm-up of the longest-lived pid,
    and the seconds those samples span."""
    by_pid: dict[int, list[tuple[float, int]]] = {}
    for at, pid, kib in samples:
        by_pid.setdefault(pid, []).append((at, kib))
    runs = []
    for series in by_pid.values():
        born = series[0][0]
        runs.append([(at, kib) for at, kib in series if at >= max(warmup, born + warmup)])
    longest = max(runs, key=len)
    if len(longest) < 6:
        return None
    third = len(longest) // 3
    first = statistics.fmean(kib for _, kib in longest[:third]) / 1024
    last = statistics.fmean(kib for _, kib in longest[-third:]) / 1024
    return first, last, longest[-1][0] - longest[0][0]


def _last_mib(samples: list[tuple[float, int, int]]) -> float:
    return samples[-1][2] / 1024


def _pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ValueError(f"no VmRSS for {pid}")


def _ever() -> itertools.count[int]:
    return itertools.count()


async def _bounded(condition: Callable[[], Any], bound: float, what: str) -> None:
    """Poll ``condition`` (sync or async) until true; TimeoutError naming ``what`` after ``bound``."""
    try:
        async with asyncio.timeout(bound):
            while True:
                value = condition()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return
                await asyncio.sleep(0.2)  # the poll period
    except TimeoutError:
        raise TimeoutError(f"not reached within {bound:g} s: {what}") from None


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="mixed load with random faults, then the checker")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=None, help="instead of --minutes")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--bootstrap", default=None, help="a given cluster: no Kafka faults")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--logs", default=None, help="processes' logs (default: a temp dir)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="memory sampling period")
    parser.add_argument(
        "--hold-scale", type=float, default=1.0, help="scales every fault's duration"
    )
    parser.add_argument("--gap-s", type=float, nargs=2, default=(5.0, 20.0), help="quiet gaps")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    # The load's Kafka clients log every refused connection while a fault lasts: thousands of
    # lines that hide the progress; the report counts what matters.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    say(f"soak seed {args.seed}")
    prefix = fresh_prefix("soak")
    if args.bootstrap:
        broker: Broker = ExternalBroker(BrokerInfo(args.bootstrap, "external", args.bootstrap))
        rf, min_isr = 1, 1
    else:
        try:
            broker = start_cluster(load_settings(), proxied=True, progress=say)
        except KafkaProviderError as exc:
            print(f"no three-broker Kafka cluster could be started: {exc}", file=sys.stderr)
            return NO_CLUSTER
        rf, min_isr = 3, 2
    try:
        settings = make_settings(
            broker.bootstrap_servers,
            prefix,
            topics={
                "prefix": prefix,
                "partitions": 3,
                "replication_factor": rf,
                "min_insync_replicas": min_isr,
            },
            tool_packs=["conformance", "demo"],
        )
        soak = Soak(args, settings, broker)
        checked, elapsed = asyncio.run(soak.run())
        res, details, code = soak.results(checked, elapsed)
        report(res, f"soak {soak.duration_s / 60:g} min, seed {args.seed}", *details)
        if args.json:
            Path(args.json).write_text(json.dumps(soak.as_json(res, checked, code), indent=2))
        if code == 0 and not args.logs:
            shutil.rmtree(soak.logs, ignore_errors=True)
        print(f"\nexit {code}: {'checker clean' if checked.ok else 'CHECKER FAILED'}")
        return code
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())

"""Faults in Kafka under load (issue 16 item 3, the Kafka half), on the three-broker cluster.

Each test runs the load harness (two replicas in group mode, one worker, tool and pipeline
tasks, three streams per task) on the session's ``kafka_cluster``, breaks the cluster, puts it
back, and has the checker compare what every stream was handed with the log: nothing lost,
silently skipped, numbered wrong or handed twice. The recovery time printed is the time until
every open pipeline stream has been handed an event sent after the mark (the fault's start
for failovers, its end for a cut); docs/reliability.md "Faults in Kafka" lists the outcomes
expected and the times measured.

The pipeline writers talk to the brokers directly (not through the fault proxy) with
idempotent acks=all producers and aiokafka's default request timeout: they stand for a
pipeline outside the bridge, which is not what is under test. The bridge's processes use
:data:`REQUEST_TIMEOUT_MS`, so a frozen broker or a black hole outlasts their requests.
Every test puts the cluster back in a ``finally`` (:func:`healed`): thawed, restarted, the
proxy cleared, every broker in every ISR.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.admin import NewTopic
from support.layout import changed, fresh_prefix, make_settings
from support.load import LoadHarness, LoadPlan
from support.mcp import call
from support.procs import Proc, bridge_env, free_port
from support.waits import wait_until

from bridge.client import MemoryCursorStore, StreamError, TaskStreamClient
from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.admin import kafka_admin
from bridge.kafka.clients import (
    KafkaError,
    TopicPartition,
    admin_client,
    committed_consumer,
    transactional_producer,
)
from bridge.kafka.port import LogError
from bridge.kafka.topics import topic_layout
from bridgedev.checker import CheckReport, Recording, check, ground_truth
from bridgedev.kafka import LocalCluster

#: The bridge processes' Kafka request timeout in these tests (aiokafka's default is 40 s).
REQUEST_TIMEOUT_MS = 10_000
#: How long a frozen broker or a cut network lasts: longer than a request may wait.
HOLD_S = 12.0
#: How long a request may take to be refused while Kafka does not answer.
ANSWER_BOUND_S = 2.5 * REQUEST_TIMEOUT_MS / 1000
#: Delay the slowed network adds to every chunk, each way.
SLOW_LATENCY_S = 0.2
#: Bound of a recovery; the measured time is printed (and kept in docs/reliability.md).
RECOVERY_BOUND_S = 60.0
#: Bound of a broker's restart and of every broker being back in every ISR.
HEAL_BOUND_S = 120.0

#: pytest-timeout of a fault test: JVM restarts on a loaded 2-core machine, and the first
#: test of a run also pays for the session cluster's start (75-140 s seen).
FAULT_TIMEOUT_S = 600

PLAN = LoadPlan(
    replicas=2,
    workers=1,
    tool_tasks=2,
    pipeline_tasks=3,
    streams_per_task=3,
    tool_arguments={"prompt": "fault", "steps": 60, "delay_ms": 100},
    pipeline_events=3000,  # cut short by stop(): the pipelines outlast every fault
    pipeline_interval_s=0.05,
    idempotent_pipeline=True,
)


# --- settings and the cluster's state ---------------------------------------------------------


def cluster_settings(cluster: LocalCluster, prefix: str) -> Settings:
    """The bridge's settings: through the fault proxy, RF 3, min ISR 2, short requests."""
    return make_settings(
        cluster.bootstrap_servers,
        prefix,
        topics={
            "prefix": prefix,
            "partitions": 3,
            "replication_factor": 3,
            "min_insync_replicas": 2,
        },
        tool_packs=["conformance", "demo"],
        kafka={"request_timeout_ms": REQUEST_TIMEOUT_MS},
    )


def direct_settings(cluster: LocalCluster, settings: Settings) -> Settings:
    """``settings`` past the proxy, with aiokafka's default request timeout: the outside world
    (pipeline writers, the test's own admin and checks)."""
    direct = {"bootstrap_servers": cluster.direct_bootstrap_servers, "request_timeout_ms": None}
    return changed(settings, kafka=direct)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def partitions_of(settings: Settings, topics: list[str] | None = None) -> list[Any]:
    """Every partition's metadata (``leader``, ``replicas``, ``isr``) of ``topics`` (all).

    The admin client asks a random broker it knows of, which may be one just killed (listed
    until fenced): a retriable error is asked again."""

    async def attempt() -> list[Any] | None:
        try:
            return await _partitions_once(settings, topics)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            return None

    partitions = await wait_until(attempt, RECOVERY_BOUND_S, what="the partitions' metadata")
    assert partitions is not None
    return partitions


async def _partitions_once(settings: Settings, topics: list[str] | None) -> list[Any]:
    async with kafka_admin(settings) as admin:
        names = topics if topics is not None else await admin.list_topics()
        described = await admin.describe_topics(names)
    return [
        {"topic": topic["topic"], **partition}
        for topic in described
        for partition in topic["partitions"]
    ]


async def every_replica_in_sync(settings: Settings) -> bool:
    try:
        partitions = await partitions_of(settings)
    except Exception:
        return False
    return all(set(p["isr"]) == set(p["replicas"]) and p["leader"] >= 0 for p in partitions)


async def wait_fully_replicated(settings: Settings) -> float:
    """Wait until every broker is in every ISR again; returns the seconds it took."""
    started = time.monotonic()
    await wait_until(
        lambda: every_replica_in_sync(settings),
        HEAL_BOUND_S,
        what="every broker in every partition's ISR",
        poll_s=0.5,
    )
    return time.monotonic() - started


@contextlib.asynccontextmanager
async def healed(cluster: LocalCluster, settings: Settings) -> AsyncIterator[None]:
    """Whatever the test broke is put back on the way out: thawed, restarted, proxy cleared,
    every broker in every ISR."""
    try:
        yield
    finally:
        for node in cluster.nodes:
            node.thaw()
        if cluster.proxy is not None:
            cluster.proxy.clear()
        for node in cluster.nodes:
            if node.pid is None:
                await asyncio.to_thread(node.start, HEAL_BOUND_S)
        await wait_fully_replicated(settings)
        await drop_topics(settings)


async def drop_topics(settings: Settings) -> None:
    """Delete the test's topics: a node restarted by a later test loads fewer partitions."""
    prefix = f"{settings.topics.prefix}."
    with contextlib.suppress(KafkaError):
        async with kafka_admin(settings) as admin:
            names = [t for t in await admin.list_topics() if t.startswith(prefix)]
            await admin.delete_topics(names, timeout_ms=30_000)


async def busiest_events_partition(settings: Settings) -> tuple[int, int]:
    """``(partition, leader node id)`` of the events partition holding the most records."""
    topic = settings.topics.events
    partitions = await partitions_of(settings, [topic])
    consumer = committed_consumer(settings, role="fault-probe")
    await consumer.start()
    try:
        ends = await consumer.end_offsets(
            [TopicPartition(topic, p["partition"]) for p in partitions]
        )
    finally:
        await consumer.stop()
    busiest = max(partitions, key=lambda p: ends[TopicPartition(topic, p["partition"])])
    return busiest["partition"], busiest["leader"]


#: What the KRaft node elected by the quorum logs (its id, and the election's epoch).
_ELECTED = re.compile(r"\[RaftManager id=(\d+)\] Completed transition to Leader\(.*?\bepoch=(\d+)")


def active_controller(cluster: LocalCluster) -> int:
    """The node id of the KRaft quorum's leader: the winner of the latest election (highest
    epoch) the nodes' logs tell of."""
    elected = [
        (int(m.group(2)), int(m.group(1)))
        for node in cluster.nodes
        for m in _ELECTED.finditer(node.log_path.read_text(errors="replace"))
    ]
    assert elected, "every quorum has elected a leader once"
    return max(elected)[1]


# --- where a failover's time goes ---------------------------------------------------------------

#: Replica log lines that mark a step of a failover (Kafka clients' complaints, the group's
#: rounds, partitions taken): shown on the breakdown's timeline.
_STEPS = (
    "WARNING",
    "ERROR",
    "owning events partitions",
    "no longer owning",
    "assigned ",
    "rebalanc",
    "Heartbeat",
    "coordinator",
)


def first_fresh_events(load: LoadHarness, mark: int) -> dict[str, float]:
    """Per client, the epoch seconds of its first pipeline event sent after ``mark`` (filled as
    the load runs)."""
    firsts: dict[str, float] = {}

    def seen(client_id: str, type_: str, payload: dict[str, Any]) -> None:
        at = payload.get("atMs")
        if isinstance(at, int) and at > mark and client_id not in firsts:
            firsts[client_id] = time.time()

    load.on_delivery = seen
    return firsts


async def new_leader_seen(settings: Settings, partition: int, old: int) -> float | None:
    """Epoch seconds when the metadata first names a leader of ``partition`` other than
    ``old`` (polled; None if not within the recovery bound)."""
    topic = settings.topics.events

    async def moved() -> float | None:
        with contextlib.suppress(KafkaError):
            described = await _partitions_once(settings, [topic])
            (leader,) = [p["leader"] for p in described if p["partition"] == partition]
            return time.time() if leader not in (old, -1) else None
        return None

    with contextlib.suppress(AssertionError):
        return await wait_until(moved, RECOVERY_BOUND_S, what="a new leader", poll_s=0.2)
    return None


def _log_steps(logs: Path, since: float, until: float) -> list[tuple[float, str]]:
    """(epoch seconds, line) of the replicas' log lines in ``_STEPS`` between two times, each
    kind of line once per replica (a client retrying a dead broker logs it every 0.1 s)."""
    found, kinds = [], set()
    for path in sorted(logs.glob("replica*.log")):
        for line in path.read_text(errors="replace").splitlines():
            stamp = line[:23]
            try:
                at = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S"))
                at += int(stamp[20:23]) / 1000
            except ValueError:
                continue
            kind = (path.stem, "".join(c for c in line[24:84] if not c.isdigit()))
            if since <= at <= until and any(s in line for s in _STEPS) and kind not in kinds:
                kinds.add(kind)
                found.append((at, f"{path.stem}: {line[24:220]}"))
    return found


def breakdown(
    load: LoadHarness, mark: int, firsts: dict[str, float], elected: float | None, logs: Path
) -> str:
    """A failover's timeline from the kill (``mark``): the new leader in the metadata, the
    replicas' log, the clients' drops and resumes, each stream's first fresh event."""
    zero = mark / 1000
    rows = [(t, what) for t, what in load.counters.timeline if t >= zero]
    rows += _log_steps(logs, zero, zero + RECOVERY_BOUND_S)
    if elected is not None:
        rows.append((elected, "metadata names the partition's new leader"))
    rows += [(t, f"{client} first event sent after the kill") for client, t in firsts.items()]
    lines = [f"{t - zero:7.2f} s  {what}" for t, what in sorted(rows)]
    return "\n[breakdown] from the kill:\n" + "\n".join(lines)


# --- the load and its verdict -----------------------------------------------------------------


def harness(cluster: LocalCluster, settings: Settings, logs: Path) -> LoadHarness:
    return LoadHarness(settings, logs, PLAN, pipeline_settings=direct_settings(cluster, settings))


async def warm(load: LoadHarness) -> None:
    """Load under way: every stream open and handed events."""
    await wait_until(lambda: load.counters.delivered >= 200, what="200 events delivered")
    pipeline_streams = PLAN.pipeline_tasks * PLAN.streams_per_task
    assert load.open_streams >= pipeline_streams, "the pipelines' streams open for the fault"


async def finish(load: LoadHarness) -> CheckReport:
    """End the load (pipelines get their terminal status), drain, check against the log."""
    await load.stop(drain_s=90)
    return await load.check()


def assert_clean(name: str, report: CheckReport, load: LoadHarness, **measured: float) -> None:
    numbers = " ".join(f"{k}={v:.1f}s" for k, v in measured.items())
    print(
        f"\n[fault] {name}: {numbers} produced={load.counters.produced} "
        f"delivered={load.counters.delivered} retries={load.counters.retries} "
        f"stream_errors={load.counters.stream_errors} gone={load.counters.gone}\n"
        f"{report.summary()}"
    )
    assert report.ok, f"{report.summary()}\n{list(load.counters.errors)}"
    streams = PLAN.streams_per_task * len(load.task_ids)
    assert report.finished_streams == report.streams == streams, report.summary()
    # Every pipeline event acknowledged by Kafka is in the log, once.
    assert report.truth_events >= load.counters.produced


# --- the unit part: the request timeout reaches every client ----------------------------------


async def test_the_request_timeout_setting_reaches_every_kafka_client_and_unset_keeps_aiokafkas():
    from bridge.config import load_settings
    from bridge.kafka.clients import idempotent_producer, plain_producer, transactional_producer

    def clients(settings: Settings) -> list[Any]:
        return [
            idempotent_producer(settings),
            transactional_producer(settings, "t"),
            plain_producer(settings),
            committed_consumer(settings),
            admin_client(settings),
        ]

    def timeouts(made: list[Any]) -> list[int]:
        inner = [getattr(c, "client", None) or c._client for c in made]
        return [client._request_timeout_ms for client in inner]

    configured = clients(
        load_settings(kafka={"bootstrap_servers": "x:1", "request_timeout_ms": 7000})
    )
    default = clients(load_settings(kafka={"bootstrap_servers": "x:1"}))
    try:
        assert timeouts(configured) == [7000] * 5
        assert timeouts(default) == [40_000, 40_000, 40_000, 40_000, 30_000]
    finally:
        for client in [*configured, *default]:
            await (client.close() if hasattr(client, "close") else client.stop())


# --- the faults ---------------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_sigkill_of_the_busiest_partitions_leader_loses_nothing_and_it_rejoins_the_isr(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    async with healed(kafka_cluster, direct), harness(kafka_cluster, settings, tmp_path) as load:
        await warm(load)
        partition, leader = await busiest_events_partition(direct)
        node = kafka_cluster.node(leader)
        firsts = first_fresh_events(load, mark := now_ms())
        node.kill()
        elected = asyncio.create_task(new_leader_seen(direct, partition, leader))
        failover_s = await load.recovery_s(mark, RECOVERY_BOUND_S)
        print(breakdown(load, mark, firsts, await elected, tmp_path))
        described = await partitions_of(direct, [settings.topics.events])
        (new_leader,) = [p["leader"] for p in described if p["partition"] == partition]
        assert new_leader not in (leader, -1), "another broker leads the partition"
        await asyncio.to_thread(node.start, HEAL_BOUND_S)
        rejoin_s = await wait_fully_replicated(direct)
        report = await finish(load)
    assert_clean(
        f"SIGKILL of broker {leader} (leader of events-{partition})",
        report,
        load,
        recovery=failover_s,
        rejoin_isr=rejoin_s,
    )


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_a_leader_frozen_past_the_request_timeout_then_thawed_loses_nothing(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    async with healed(kafka_cluster, direct), harness(kafka_cluster, settings, tmp_path) as load:
        await warm(load)
        partition, leader = await busiest_events_partition(direct)
        node = kafka_cluster.node(leader)
        mark = now_ms()
        recovered = asyncio.create_task(load.recovery_s(mark, RECOVERY_BOUND_S))
        node.freeze()
        await asyncio.sleep(HOLD_S)  # the fault's duration, not a wait for its effect
        node.thaw()
        recovery_s = await recovered
        rejoin_s = await wait_fully_replicated(direct)
        report = await finish(load)
    assert_clean(
        f"broker {leader} (leader of events-{partition}) frozen {HOLD_S:g} s",
        report,
        load,
        recovery=recovery_s,
        rejoin_isr_after_thaw=rejoin_s,
    )


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_the_quorum_loses_its_active_controller_and_goes_on_with_two(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    async with healed(kafka_cluster, direct), harness(kafka_cluster, settings, tmp_path) as load:
        await warm(load)
        controller = active_controller(kafka_cluster)
        node = kafka_cluster.node(controller)
        mark = now_ms()
        node.kill()
        recovery_s = await load.recovery_s(mark, RECOVERY_BOUND_S)
        successor = await wait_until(
            lambda: (elected := active_controller(kafka_cluster)) != controller and elected,
            RECOVERY_BOUND_S,
            what="the two nodes left elect a new active controller",
        )
        # Metadata is written with two voters of three: a topic (on the two brokers left)
        # and a new task through the bridge, whose acks=all needs the ISR shrunk.
        async with kafka_admin(direct) as admin:
            await admin.create_topics([NewTopic(f"{fresh_prefix()}.probe", 1, 2)], 30_000)
        await load.add_tool_tasks(1)
        await asyncio.to_thread(node.start, HEAL_BOUND_S)
        rejoin_s = await wait_fully_replicated(direct)
        report = await finish(load)
    assert_clean(
        f"active controller {controller} SIGKILLed (successor {successor})",
        report,
        load,
        recovery=recovery_s,
        rejoin_isr=rejoin_s,
    )


async def timed(what: Any, bound: float) -> tuple[float, Any]:
    """``(seconds, outcome)`` of an awaitable; an exception is the outcome, not a failure."""
    started = time.monotonic()
    try:
        outcome = await asyncio.wait_for(what, bound)
    except Exception as exc:
        outcome = exc
    return time.monotonic() - started, outcome


async def first_event(url: str, task_id: str, http: httpx.AsyncClient) -> Any:
    """The first event of a new tasks/stream of ``task_id`` (no reconnects)."""
    client = TaskStreamClient(url, store=MemoryCursorStore(), http=http, max_reconnects=0)
    async for event in client.stream(task_id):
        return event
    return None


async def last_event(url: str, task_id: str, http: httpx.AsyncClient) -> Any:
    """The last event of ``task_id``'s stream (its status with the result), resuming."""
    client = TaskStreamClient(url, store=MemoryCursorStore(), http=http, backoff_s=0.2)
    last = None
    async for event in client.stream(task_id):
        last = event
    return last


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_the_network_to_the_brokers_cut_past_the_request_timeout_then_restored(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    proxy = kafka_cluster.proxy
    assert proxy is not None
    async with healed(kafka_cluster, direct), harness(kafka_cluster, settings, tmp_path) as load:
        await warm(load)
        url = load.replicas[0].url
        cut_at = time.monotonic()
        proxy.cut()
        async with httpx.AsyncClient(timeout=60) as http:
            probe = {"name": PLAN.tool, "arguments": {"prompt": "cut", "steps": 3}}
            (call_s, called), (stream_s, streamed) = await asyncio.gather(
                timed(call(http, url, "tools/call", probe), 3 * HOLD_S),
                timed(first_event(url, load.task_ids[-1], http), 3 * HOLD_S),
            )
            print(f"\n[fault] while cut: tools/call {call_s:.1f}s -> {called!r}"[:600])
            print(f"[fault] while cut: tasks/stream {stream_s:.1f}s -> {streamed!r}"[:600])
            await asyncio.sleep(max(0.0, HOLD_S - (time.monotonic() - cut_at)))  # the cut's length
            proxy.restore()
            cut_s = time.monotonic() - cut_at
            mark = now_ms()
            recovery_s = await load.recovery_s(mark, RECOVERY_BOUND_S)
            # Answered within the bound with a defined error, not a hang nor an internal error.
            assert call_s < ANSWER_BOUND_S and stream_s < ANSWER_BOUND_S
            assert called["error"]["data"]["reason"] == "kafka_unavailable", called
            assert isinstance(streamed, StreamError), streamed
            assert streamed.data["reason"] == "kafka_unavailable", streamed
            # The refused call's task is created once Kafka answers again, and it runs.
            late_task = called["error"]["data"]["taskId"]
            done = await asyncio.wait_for(last_event(url, late_task, http), RECOVERY_BOUND_S)
            assert done.type == settings.own_types.status and done.payload["status"] == "completed"
        report = await finish(load)
    assert_clean(f"network cut {cut_s:.0f} s", report, load, recovery=recovery_s, refused_in=call_s)


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_a_slow_network_to_the_brokers_delays_streams_and_loses_nothing(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    proxy = kafka_cluster.proxy
    assert proxy is not None
    async with healed(kafka_cluster, direct), harness(kafka_cluster, settings, tmp_path) as load:
        await warm(load)
        proxy.slow(SLOW_LATENCY_S)
        mark = now_ms()
        slowed_s = await load.recovery_s(mark, RECOVERY_BOUND_S)
        await asyncio.sleep(HOLD_S)  # the slowness lasts a while under load
        proxy.clear()
        cleared = now_ms()
        recovery_s = await load.recovery_s(cleared, RECOVERY_BOUND_S)
        report = await finish(load)
    assert_clean(
        f"network slowed by {SLOW_LATENCY_S:g} s each way",
        report,
        load,
        fresh_while_slow=slowed_s,
        recovery=recovery_s,
    )


async def create_index_on_one_broker(settings: Settings, node_id: int) -> None:
    """The layout's index topic, every partition's one replica on ``node_id`` (the rest of the
    layout is created as usual, replicated on all three)."""
    spec = next(s for s in topic_layout(settings) if s.role == "index")
    assignment = {p: [node_id] for p in range(spec.partitions)}
    configs = {**spec.configs, "min.insync.replicas": "1"}
    async with kafka_admin(settings) as admin:
        await admin.create_topics(
            [NewTopic(spec.name, -1, -1, replica_assignments=assignment, topic_configs=configs)],
            30_000,
        )


async def index_leaderless(settings: Settings) -> bool:
    partitions = await partitions_of(settings, [settings.topics.index])
    return all(p["leader"] == -1 for p in partitions)


async def readyz(port: int, http: httpx.AsyncClient) -> int | None:
    """The /readyz status, None when nothing answers."""
    try:
        return (await http.get(f"http://127.0.0.1:{port}/readyz", timeout=2)).status_code
    except httpx.HTTPError:
        return None


async def stream_all(url: str, task_ids: list[str], http: httpx.AsyncClient) -> Recording:
    """Every task streamed once from its start to its result."""
    recording = Recording()
    for task_id in task_ids:
        client = TaskStreamClient(url, store=MemoryCursorStore(), http=http, max_reconnects=0)
        async for event in client.stream(task_id):
            recording.record("after", task_id, event.seq, event.type, event.payload)
        recording.finished("after", task_id)
    return recording


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_a_bridge_started_while_its_index_topic_is_unavailable_is_not_ready_until_it_returns(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    index_node = kafka_cluster.node(3)
    await create_index_on_one_broker(direct, index_node.node_id)
    plan = LoadPlan(tool_tasks=1, pipeline_tasks=2, pipeline_events=40, idempotent_pipeline=True)
    async with healed(kafka_cluster, direct):
        # Tasks written and indexed (the index persisted on node 3 alone).
        (tmp_path / "before").mkdir()
        async with LoadHarness(settings, tmp_path / "before", plan) as load:
            await load.writers_done()
            await load.stop(drain_s=45)
            before = await load.check()
        assert before.ok and before.finished_streams == 9, before.summary()
        index_node.kill()
        # Once fenced, the dead broker leads nothing and the index partitions have no leader.
        await wait_until(
            lambda: index_leaderless(direct), RECOVERY_BOUND_S, what="the index has no leader"
        )
        port = free_port()
        proc = Proc(
            "late", ["serve", "--port", str(port)], bridge_env(settings), tmp_path / "late.log"
        )
        proc.start()
        seen: list[int | None] = []
        async with httpx.AsyncClient() as http:
            try:
                started = time.monotonic()

                async def exited() -> bool:
                    seen.append(await readyz(port, http))
                    return not proc.alive()

                await wait_until(exited, 90, what="the bridge gives up", poll_s=0.5)
                exit_s = time.monotonic() - started
                said = proc.tail(60)
                print(f"\n[fault] index down: readyz {set(seen)}, exited in {exit_s:.1f} s\n{said}")
                # Never ready; it exits saying why (a supervisor starts it again).
                assert 200 not in seen
                # Either the restore or, when the index writer's last transaction was still
                # completing as the broker died, the fence of that writer names the topic.
                assert f"the index topic {settings.topics.index!r}" in said, said
                await asyncio.to_thread(index_node.start, HEAL_BOUND_S)
                back = time.monotonic()
                proc.start()

                async def ready() -> bool:
                    return await readyz(port, http) == 200

                await wait_until(ready, 90, what="ready once the index is back")
                ready_s = time.monotonic() - back
                truth = await ground_truth(direct, load.task_ids)
                report = check(
                    truth, await stream_all(f"http://127.0.0.1:{port}/mcp", load.task_ids, http)
                )
            finally:
                proc.stop()
    print(
        f"[fault] index back: ready in {ready_s:.1f} s (gave up in {exit_s:.1f} s)\n{report.summary()}"
    )
    assert report.ok and report.finished_streams == 3, report.summary()


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(FAULT_TIMEOUT_S)
async def test_a_writer_cannot_fence_one_whose_transaction_cannot_complete_and_says_so_in_bounded_time(
    kafka_cluster: LocalCluster,
) -> None:
    # The older writer's open transaction wrote a partition whose one replica then dies: the
    # coordinator cannot abort it, and answers a newer writer CONCURRENT_TRANSACTIONS until it
    # can (aiokafka would retry for ever; the bridge's replica would hang in its start).
    settings = cluster_settings(kafka_cluster, fresh_prefix())
    direct = direct_settings(kafka_cluster, settings)
    node = kafka_cluster.node(3)
    topic = f"{settings.topics.prefix}.one-replica"
    async with kafka_admin(direct) as admin:
        await admin.create_topics(
            [NewTopic(topic, -1, -1, replica_assignments={0: [node.node_id]})], 30_000
        )
    writer_id = f"{settings.topics.prefix}.writer"
    older = transactional_producer(direct, writer_id)
    await older.start()
    async with healed(kafka_cluster, direct):
        try:
            await older.begin_transaction()
            await older.send_and_wait(topic, b"never committed", partition=0)
            node.kill()
            await wait_until(
                lambda: leaderless(direct, topic), RECOVERY_BOUND_S, what=f"{topic} has no leader"
            )
            short = changed(settings, kafka={"request_timeout_ms": 2_000})
            newer = KafkaLog(short).transactional_writer(writer_id)
            async with asyncio.timeout(60):  # without the bound, start() never returns
                with pytest.raises(LogError, match="could not become the writer") as refused:
                    await newer.start()
            assert refused.value.retriable
            assert writer_id in str(refused.value)
        finally:
            with contextlib.suppress(Exception):
                await older.stop()


async def leaderless(settings: Settings, topic: str) -> bool:
    return all(p["leader"] == -1 for p in await partitions_of(settings, [topic]))

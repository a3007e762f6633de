"""The reference Java worker (examples/java-worker/) runs a declared tool end to end.

The worker is written from docs/workers.md and schemas/ alone; this test builds it with Maven
(offline once its dependencies are in the local repository) and runs it as a separate process
against the bridge's task service on the real broker, in the same consumer group as a Python
SDK worker of another tool (every member of a group must share an assignment protocol): a task
that asks for input and resumes on the answer while another task runs to its end beside it, a
task cancelled while it runs, and a task whose worker is killed (SIGKILL) mid-job and then
halted inside its outcome's transaction, which runs again and still ends once; while the worker
is down, a task cancelled before it starts, a job of a tool it has no handler for and a task
past its TTL, each ending as docs/workers.md says. At the end every record the Java worker wrote is checked against
schemas/, each task has one terminal status and one ``finished`` mark, and the group's
committed offsets are the job topic's end. The tool is the one examples/pipeline-tool.toml
declares.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.contract import valid
from support.layout import create_topics, make_settings
from support.topics import topic_records

from bridge.config import Settings, ToolSpec, load_settings
from bridge.envelope import AVRO_CONTENT_TYPE, decode_event
from bridge.kafka.clients import TopicPartition, admin_client, committed_consumer
from bridge.kafka.topics import topic_partition_ids
from bridge.log.indexer import IndexedEvent, Indexer
from bridge.log.reader import Reader
from bridge.tasks.service import TaskService
from bridge.vocabulary import EventSuffix
from bridge.workers.packs import pack_handlers, pack_tools
from bridge.workers.sdk import Worker

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "java-worker"
EXAMPLE = ROOT / "examples" / "pipeline-tool.toml"
BOUND = 60  # seconds any one wait may take
BUILD_BOUND_S = 600
MAIN_CLASS = "io.mcpbridge.example.CountWorker"
TERMINAL = ("completed", "failed", "cancelled")
CRASHED = 10  # the steps of the job killed mid-run
#: The SDK worker's tool, run by an SDK worker in the Java worker's group.
GREET = next(t for t in pack_tools(["conformance"]) if t.name == "greet")


def _maven(*goals: str, offline: bool) -> subprocess.CompletedProcess[str]:
    command = ["mvn", "-B", "-q", *(["-o"] if offline else []), *goals]
    return subprocess.run(
        command,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=BUILD_BOUND_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture(scope="module")
def java_worker_classpath() -> str:
    """Build the worker: offline when the local repository has everything, else once online."""
    if shutil.which("mvn") is None or shutil.which("java") is None:
        pytest.fail("the Java worker test needs `mvn` and `java` (make system-deps checks them)")
    goals = ("compile", "dependency:copy-dependencies")
    built = _maven(*goals, offline=True)
    if built.returncode != 0:
        built = _maven(*goals, offline=False)  # the first build: resolve from Maven Central
    assert built.returncode == 0, built.stdout + built.stderr
    target = PROJECT / "target"
    return f"{target / 'classes'}{os.pathsep}{target / 'dependency' / '*'}"


class Seen:
    """Every event the indexer applies, by task, with a bounded wait for a condition."""

    def __init__(self, indexer: Indexer) -> None:
        self.events: dict[str, list[IndexedEvent]] = {}
        self._changed = asyncio.Event()
        indexer.add_listener(self._on)

    def _on(self, indexed: IndexedEvent) -> None:
        self.events.setdefault(indexed.task_id, []).append(indexed)
        self._changed.set()
        self._changed = asyncio.Event()

    def of(self, task_id: str, event_type: str) -> list[dict[str, Any]]:
        return [e.event.payload for e in self.events.get(task_id, []) if e.event.type == event_type]

    async def count(self, task_id: str, event_type: str, n: int) -> None:
        """Wait until ``task_id`` has at least ``n`` events of ``event_type``."""
        while len(self.of(task_id, event_type)) < n:
            changed = self._changed
            async with asyncio.timeout(BOUND):
                await changed.wait()


class JavaWorker:
    """The Java worker as a child process, with its stderr kept for failures."""

    def __init__(self, classpath: str, settings: Settings, log: Path) -> None:
        self.classpath = classpath
        self.settings = settings
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, halt_in_outcome: bool = False) -> None:
        """Start the worker; ``halt_in_outcome``: it dies inside its next completed outcome's
        transaction (status, mark and offset sent, not committed: the worst kill point)."""
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": self.settings.kafka.bootstrap_servers or "",
            "WORKER_TOPIC_PREFIX": self.settings.topics.prefix,
            "WORKER_EVENT_TYPE_PREFIX": self.settings.tasks.event_type_prefix,
            # Static membership: a restarted worker takes its partitions back at once.
            "WORKER_INSTANCE_ID": "java-worker-1",
            "WORKER_STEP_MS": "150",
            "WORKER_TEST_HALT_IN_OUTCOME": "1" if halt_in_outcome else "",
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["java", "-cp", self.classpath, MAIN_CLASS],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no leave-group, nothing flushed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=BOUND)

    async def exited(self) -> int:
        """Wait (bounded) until the process ends by itself; its exit code."""
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, BOUND)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def bridge_side(
    settings: Settings, tool: ToolSpec
) -> AsyncIterator[tuple[TaskService, Seen]]:
    await create_topics(settings, [tool.name, GREET.name])
    async with Indexer(settings) as indexer:
        seen = Seen(indexer)
        reader = Reader(settings, indexer)
        service = TaskService(settings, indexer, reader, {tool.name: tool, GREET.name: GREET})
        await service.start()
        try:
            yield service, seen
        finally:
            await service.stop()
            await reader.close()


@contextlib.asynccontextmanager
async def sdk_worker(settings: Settings) -> AsyncIterator[Worker]:
    """An SDK worker of ``greet`` in the default group, the Java worker's group too."""
    handlers = {GREET.name: pack_handlers(["conformance"])[GREET.name]}
    # A long session: a loaded test machine that starves this event loop must not make the
    # group drop the member, since every rebalance of this group is eager and re-runs the
    # Java worker's jobs. (It joins last, so no rebalance waits for its rarer heartbeats.)
    async with Worker(settings, handlers, session_timeout_ms=45_000) as w:
        runner = asyncio.create_task(w.run())
        try:
            yield w
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


def declared_tool() -> ToolSpec:
    """The tool as examples/pipeline-tool.toml declares it."""
    (tool,) = load_settings(EXAMPLE).tools
    return tool


async def test_the_java_worker_runs_a_declared_tool_with_input_cancel_and_a_crash(
    java_worker_classpath: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    tool = declared_tool()
    settings = make_settings(kafka_bootstrap, topic_prefix, tools=[tool], tool_packs=[])
    log = tmp_path / "java-worker.log"
    async with bridge_side(settings, tool) as (service, seen):
        worker = JavaWorker(java_worker_classpath, settings, log)
        worker.start()
        try:
            async with asyncio.timeout(4 * BOUND):
                # The Java worker alone in the group first (one task proves it is in), then the
                # SDK worker joins: the later joiner is the one a group refuses when no
                # assignment protocol is common. Joining now, it re-runs no Java job (every
                # rebalance of a group with SDK members is eager).
                first = await service.create(tool, {"count": 1}, principal="alice")
                assert (await service.wait_terminal(first.task_id, "alice")).status == "completed"
                async with sdk_worker(settings):
                    greeted = await service.create(GREET, {"name": "W"}, principal="alice")
                    async with asyncio.timeout(BOUND):
                        view = await service.wait_terminal(greeted.task_id, "alice")
                    assert view.status == "completed"
                    tasks = await _input_then_cancel_then_crash(service, seen, tool, worker)
                    greeted = await service.create(GREET, {"name": "V"}, principal="alice")
                    view = await service.wait_terminal(greeted.task_id, "alice")
                    assert view.status == "completed"
                await _check_what_the_java_worker_wrote(settings, tool, [first.task_id, *tasks])
        except BaseException:
            print(worker.output())  # what the worker said, for the failure report
            raise
        finally:
            worker.kill()


async def _input_then_cancel_then_crash(
    service: TaskService, seen: Seen, tool: ToolSpec, worker: JavaWorker
) -> list[str]:
    """The scenario; the ids of every task the Java worker ran."""
    prefix = service.settings.tasks.event_type_prefix
    status_type = f"{prefix}.{EventSuffix.STATUS}"
    progress_type = f"{prefix}.{EventSuffix.PROGRESS}"

    # Input: the job parks the task halfway and resumes on the answer. Meanwhile another task
    # runs to its end: a job waiting for input holds one slot, not the worker.
    asked = await service.create(tool, {"count": 4, "confirm": True}, principal="alice")
    view = await service.wait_until(asked.task_id, "alice", frozenset({"input_required"}))
    request = view.input_requests["confirm"]
    assert request["method"] == "elicitation/create"
    assert request["params"]["requestedSchema"]["required"] == ["confirm"]
    beside = await service.create(tool, {"count": 1}, principal="alice")
    async with asyncio.timeout(BOUND):
        assert (await service.wait_terminal(beside.task_id, "alice")).status == "completed"
    assert (await service.get(asked.task_id, "alice")).status == "input_required"
    answer = {"action": "accept", "content": {"confirm": True}}
    await service.update(asked.task_id, "alice", {"confirm": answer})
    view = await service.wait_terminal(asked.task_id, "alice")
    assert view.status == "completed", view
    assert view.result["structuredContent"] == {"count": 4, "confirmation": "confirmed"}
    progress = seen.of(asked.task_id, progress_type)
    assert [p["progress"] for p in progress] == [1, 2, 3, 4]
    assert seen.of(asked.task_id, "com.example.count.tick") == [{"n": n} for n in (1, 2, 3, 4)]
    statuses = [s["status"] for s in seen.of(asked.task_id, status_type)]
    # The worker's input_required, the bridge's "working" on the answer, the worker's outcome.
    assert statuses == ["input_required", "working", "completed"]

    # Cancel: the running job stops and the task ends cancelled.
    long = await service.create(tool, {"count": 10_000}, principal="alice")
    await seen.count(long.task_id, progress_type, 1)
    await service.cancel(long.task_id, "alice")
    view = await service.wait_terminal(long.task_id, "alice")
    assert view.status == "cancelled" and view.status_message == "cancelled at the client's request"

    # A crash: SIGKILL mid-job; the restarted worker runs the job again, the task ends once.
    # Ten steps: the kill lands mid-job unless the test lags the worker by eight steps (1.2 s).
    crashed = await service.create(tool, {"count": CRASHED}, principal="alice")
    await seen.count(crashed.task_id, progress_type, 2)
    worker.kill()
    # While no worker runs: a task cancelled before its job starts, and a job for a tool the
    # worker has no handler for (sharing its topic). Both end as the SDK ends them.
    early = await service.create(tool, {"count": 1}, principal="alice")
    await service.cancel(early.task_id, "alice")
    stranger = tool.model_copy(
        update={"name": "java_other", "job_topic": _job_topic(service.settings, tool)}
    )
    unhandled = await service.create(stranger, {}, principal="alice")
    # And a task whose TTL has passed when its job starts: nobody can read it, the job stops.
    brief = tool.model_copy(update={"ttl_ms": 1})
    expired = await service.create(brief, {"count": 1}, principal="alice")
    # The second attempt dies at the worst point: inside its outcome's transaction.
    worker.start(halt_in_outcome=True)
    assert await worker.exited() == 137
    assert "halting inside the outcome transaction" in worker.output()
    worker.start()
    view = await service.wait_terminal(crashed.task_id, "alice")
    assert view.status == "completed", view
    assert view.result["structuredContent"] == {"count": CRASHED, "confirmation": "not asked"}
    # The restarts are in the data, whenever the indexer saw the kill: the killed attempt's
    # steps (at least the two waited for, not all), then two full attempts from 1 (the halted
    # one's progress went through the plain producer; its outcome was never committed), the
    # last one the outcome. A rebalance may add a partial attempt anywhere (at least once).
    steps = [p["progress"] for p in seen.of(crashed.task_id, progress_type)]
    attempts = _attempts(steps)
    full = list(range(1, CRASHED + 1))
    assert all(a == list(range(1, len(a) + 1)) for a in attempts), steps
    assert attempts[0] != full and len(attempts[0]) >= 2, steps
    assert attempts[-1] == full and attempts.count(full) >= 2, steps
    view = await service.wait_terminal(early.task_id, "alice")
    assert (view.status, view.status_message) == ("cancelled", "cancelled before it started")
    assert not seen.of(early.task_id, progress_type)
    view = await service.wait_terminal(unhandled.task_id, "alice")
    assert view.status == "failed"
    assert view.error == {"code": -32603, "message": "no handler for tool java_other"}
    await seen.count(expired.task_id, status_type, 1)
    (end,) = seen.of(expired.task_id, status_type)
    assert end["error"] == {"code": -32603, "message": "the task expired before its job ended"}
    assert not seen.of(expired.task_id, progress_type)
    # One more task after the crash: the group goes on taking jobs.
    after = await service.create(tool, {"count": 1}, principal="alice")
    assert (await service.wait_terminal(after.task_id, "alice")).status == "completed"
    ran = [asked, beside, long, crashed, early, unhandled, expired, after]
    return [task.task_id for task in ran]


async def _check_what_the_java_worker_wrote(
    settings: Settings, tool: ToolSpec, tasks: list[str]
) -> None:
    """Every record of the Java worker's tasks keeps schemas/; one end and one mark a task; the
    group committed every job (read ``read_committed`` after the last task ended)."""
    types = settings.own_types
    ends: dict[str, int] = dict.fromkeys(tasks, 0)
    for record in await topic_records(settings, settings.topics.events):
        task_id = (record.key or b"").decode()
        if task_id not in ends:
            continue
        event = decode_event(record.value, list(record.headers))
        if dict(record.headers).get("content-type") == AVRO_CONTENT_TYPE.encode():
            # The bridge's: task.created, and the "working" status it writes on an answer.
            assert event.type == types.created or event.payload["status"] == "working", event
            continue
        valid("event-envelope", json.loads(record.value or b""))  # the Java worker's JSON
        if event.type == types.progress:
            valid("progress", event.payload)
        elif event.type == types.status:
            valid("status", event.payload)
            ends[task_id] += event.payload["status"] in TERMINAL
    assert ends == dict.fromkeys(tasks, 1)
    finished: dict[str, int] = dict.fromkeys(tasks, 0)
    for record in await topic_records(settings, settings.topics.control):
        message = json.loads(record.value or b"")
        valid("control-message", message)
        if message["type"] == "finished" and message["taskId"] in finished:
            finished[message["taskId"]] += 1
    assert finished == dict.fromkeys(tasks, 1)
    assert await _committed(settings, tool) == await _job_ends(settings, tool)


def _attempts(steps: list[int]) -> list[list[int]]:
    """The progress values of a task cut where each attempt starts again from 1."""
    attempts: list[list[int]] = []
    for step in steps:
        if step == 1 or not attempts:
            attempts.append([])
        attempts[-1].append(step)
    return attempts


def _job_topic(settings: Settings, tool: ToolSpec) -> str:
    return tool.job_topic or settings.topics.jobs(tool.name)


async def _job_ends(settings: Settings, tool: ToolSpec) -> dict[int, int]:
    topic = _job_topic(settings, tool)
    consumer = committed_consumer(settings, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in await topic_partition_ids(settings, topic)]
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items() if end > 0}


async def _committed(settings: Settings, tool: ToolSpec) -> dict[int, int]:
    topic = _job_topic(settings, tool)
    admin = admin_client(settings)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(f"{settings.topics.prefix}.workers")
    finally:
        await admin.close()
    return {
        tp.partition: meta.offset
        for tp, meta in offsets.items()
        if tp.topic == topic and meta.offset >= 0
    }

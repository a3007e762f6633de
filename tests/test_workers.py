"""Tool jobs end to end on the real broker: the task service on one side, workers on the other.

The bridge side is a real :class:`TaskService` with its :class:`Indexer` and :class:`Reader`;
workers run the built-in conformance pack, in-process or as ``python -m bridge.cli workers``.
Every wait is bounded and waits for a condition (an event indexed, a status reached).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from support.layout import changed, create_topics
from support.procs import bridge_env
from support.waits import wait_until

from bridge.config import Settings, ToolSpec
from bridge.kafka.clients import partition_for_key
from bridge.log.indexer import IndexedEvent, Indexer
from bridge.log.reader import Reader
from bridge.tasks.service import TaskNotFound, TaskService, TooManyTasks
from bridge.vocabulary import INTERNAL_ERROR, EventSuffix, StatusPayload
from bridge.workers.packs import PACKS, _agent_timeline, pack_handlers, pack_tools
from bridge.workers.sdk import Worker

BOUND = 30  # seconds any single wait may take before the test fails
_SESSION_TIMEOUT_MS = 6000  # the broker's default group.min.session.timeout.ms

TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in pack_tools(["conformance", "demo"])}
HANDLERS = pack_handlers(["conformance", "demo"])
ACCEPT_CONFIRM = {"action": "accept", "content": {"confirm": True}}


# --- helpers ---------------------------------------------------------------------------------


class Seen:
    """Every event the indexer applies, by task, with a bounded wait for a condition."""

    def __init__(self, indexer: Indexer) -> None:
        self.events: dict[str, list[IndexedEvent]] = defaultdict(list)
        self._changed = asyncio.Event()
        indexer.add_listener(self._on)

    def _on(self, indexed: IndexedEvent) -> None:
        self.events[indexed.task_id].append(indexed)
        self._changed.set()

    async def wait_for(self, task_id: str, match: Callable[[IndexedEvent], bool]) -> IndexedEvent:
        def found() -> IndexedEvent | None:
            return next((e for e in self.events[task_id] if match(e)), None)

        what = f"an event of task {task_id} that matches {match.__qualname__}"
        return await wait_until(found, BOUND, what=what, wakeup=self._changed)


def is_status(prefix: str, status: str) -> Callable[[IndexedEvent], bool]:
    def match(indexed: IndexedEvent) -> bool:
        event = indexed.event
        return (
            event.type == f"{prefix}.{EventSuffix.STATUS}" and event.payload.get("status") == status
        )

    return match


def is_start(prefix: str, indexed: IndexedEvent) -> bool:
    """The first progress event of a slow_compute run (one per attempt of its job)."""
    return is_progress(prefix)(indexed) and indexed.event.payload["progress"] == 0


def is_progress(prefix: str) -> Callable[[IndexedEvent], bool]:
    return lambda indexed: indexed.event.type == f"{prefix}.{EventSuffix.PROGRESS}"


@dataclass
class Bridge:
    settings: Settings
    service: TaskService
    indexer: Indexer
    reader: Reader
    seen: Seen

    @property
    def prefix(self) -> str:
        return self.settings.tasks.event_type_prefix

    async def terminal(self, task_id: str, principal: str = "alice") -> Any:
        async with asyncio.timeout(BOUND):
            return await self.service.wait_terminal(task_id, principal)

    async def started(self, tool: ToolSpec, arguments: dict[str, Any]) -> Any:
        """A task of alice's, once a worker has started its job (its first progress event)."""
        task = await self.service.create(tool, arguments, principal="alice")
        await self.seen.wait_for(task.task_id, is_progress(self.prefix))
        return task

    async def parked(self, task_id: str, principal: str = "alice") -> Any:
        """The task's view once the worker has put it in input_required."""
        await self.seen.wait_for(task_id, is_status(self.prefix, "input_required"))
        view = await self.service.get(task_id, principal)
        assert view.status == "input_required"
        return view


@contextlib.asynccontextmanager
async def bridge_side(settings: Settings, tools: Iterable[str]) -> AsyncIterator[Bridge]:
    await create_topics(settings, tools)
    async with Indexer(settings) as indexer:
        seen = Seen(indexer)
        reader = Reader(settings, indexer)
        service = TaskService(settings, indexer, reader, TOOLS)
        await service.start()
        try:
            yield Bridge(settings, service, indexer, reader, seen)
        finally:
            await service.stop()
            await reader.close()


class WatchedWorker(Worker):
    """A worker that counts the partition assignments it got (one per rebalance)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.assignments = 0
        self._reassigned = asyncio.Event()

    def _assigned(self, assigned: set[Any]) -> None:
        super()._assigned(assigned)
        self.assignments += 1
        self._reassigned.set()

    async def wait_assignments(self, n: int) -> None:
        what = f"{n} partition assignments of the worker"
        await wait_until(lambda: self.assignments >= n, BOUND, what=what, wakeup=self._reassigned)

    @property
    def idle(self) -> bool:
        """No job runs here (none started, or every one ended, however)."""
        return not self._job_tasks


@contextlib.asynccontextmanager
async def worker(
    settings: Settings, tools: Iterable[str], *, cls: type[Worker] = Worker, **options: Any
) -> AsyncIterator[Worker]:
    """An in-process worker running the handlers of ``tools`` (so it subscribes only to those)."""
    async with cls(settings, {t: HANDLERS[t] for t in tools}, **options) as w:
        runner = asyncio.create_task(w.run())
        try:
            yield w
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


def text_of(view: Any) -> str:
    assert view.result is not None, view
    return str(view.result["content"][0]["text"])


# --- the packs without Kafka -------------------------------------------------------------------


def test_packs_list_the_conformance_fixtures_as_the_suite_expects() -> None:
    tools = pack_tools(["conformance"])
    assert tools[0].name == "test_simple_text"
    assert tools[0].task == "forbidden" and not tools[0].requires and not tools[0].input_before
    for spec in tools:
        assert spec.description and spec.input_schema["type"] == "object", spec.name
    by_name = {s.name: s for s in tools}
    modes = {n: by_name[n].task for n in ("greet", "slow_compute", "failing_job", "multi_input")}
    assert modes == {
        "greet": "forbidden",
        "slow_compute": "optional",
        "failing_job": "required",
        "multi_input": "optional",
    }
    schema = by_name["json_schema_2020_12_tool"].input_schema
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$defs"]["address"]["$anchor"] == "addressDef"
    assert schema["additionalProperties"] is False and {"if", "then", "else"} <= set(schema)
    assert by_name["test_missing_capability"].requires == {"sampling": {}}
    assert by_name["test_tool_with_task"].input_before == {
        "user_name": {
            "method": "elicitation/create",
            "params": {
                "message": "What is your name?",
                "requestedSchema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
        }
    }
    header = by_name["test_header_param"].input_schema["properties"]["region"]
    assert header == {"type": "string", "x-mcp-header": "Region"}
    assert set(pack_handlers(["conformance", "demo"])) == {s.name for s in tools} | {"agent_run"}
    assert set(PACKS) == {"conformance", "demo"}
    with pytest.raises(KeyError, match="unknown worker pack 'nope'"):
        pack_tools(["nope"])


def test_the_demo_agent_timeline_is_deterministic_and_vendor_prefixed() -> None:
    first = _agent_timeline("fix the flaky test", 40)
    assert first == _agent_timeline("fix the flaky test", 40)
    assert first != _agent_timeline("another prompt", 40)
    assert len(first) == 40
    kinds = {t.removeprefix("com.example.agent.") for t, _ in first}
    assert {"subtask.started", "message.delta", "tool.call", "tool.result"} <= kinds
    assert all(t.startswith("com.example.agent.") for t, _ in first)


# --- through a worker --------------------------------------------------------------------------


@pytest.mark.kafka
async def test_direct_fixtures_run_on_a_worker_and_report_into_the_log(settings: Settings) -> None:
    tools = [
        "greet",
        "test_simple_text",
        "test_image_content",
        "test_tool_with_progress",
        "test_tool_with_task",
        "test_streaming_elicitation",
        "agent_run",
    ]
    async with bridge_side(settings, tools) as bridge, worker(settings, tools):
        service = bridge.service
        greet = await service.create(TOOLS["greet"], {"name": "World"}, principal="alice")
        simple = await service.create(TOOLS["test_simple_text"], {}, principal="alice")
        image = await service.create(TOOLS["test_image_content"], {}, principal="alice")
        progress = await service.create(TOOLS["test_tool_with_progress"], {}, principal="alice")
        named = await service.create(
            TOOLS["test_tool_with_task"],
            {},
            principal="alice",
            input_responses={"user_name": {"action": "accept", "content": {"name": "Alice"}}},
        )
        streaming = await service.create(
            TOOLS["test_streaming_elicitation"],
            {},
            principal="alice",
            input_responses={"confirm": ACCEPT_CONFIRM},
        )

        agent = await service.create(
            TOOLS["agent_run"], {"prompt": "fix it", "steps": 6, "delay_ms": 5}, "alice"
        )

        view = await bridge.terminal(greet.task_id)
        assert view.status == "completed" and text_of(view) == "Hello, World!"
        view = await bridge.terminal(simple.task_id)
        assert text_of(view) == "This is a simple text response for testing."
        view = await bridge.terminal(image.task_id)
        assert view.result["content"][0]["mimeType"] == "image/png"
        view = await bridge.terminal(named.task_id)
        assert view.status == "completed" and text_of(view) == "Hello, Alice!"
        view = await bridge.terminal(streaming.task_id)
        assert view.status == "completed" and "accepted" in text_of(view)

        view = await bridge.terminal(progress.task_id)
        assert view.status == "completed"
        async with asyncio.timeout(BOUND):
            log = [e async for e in bridge.reader.read(progress.task_id)]
        assert [e.seq for e in log] == list(range(len(log)))
        progress_type = f"{bridge.prefix}.{EventSuffix.PROGRESS}"
        values = [e.event.payload for e in log if e.event.type == progress_type]
        assert values == [{"progress": p, "total": 100} for p in (0, 50, 100)]
        assert log[-1].event.payload["status"] == "completed"  # progress came before the result

        view = await bridge.terminal(agent.task_id)
        assert view.status == "completed" and "6 events" in text_of(view)
        async with asyncio.timeout(BOUND):
            log = [e async for e in bridge.reader.read(agent.task_id)]
        timeline = [(e.event.type, e.event.payload) for e in log[1:-1]]
        assert timeline == _agent_timeline("fix it", 6)


@pytest.mark.kafka
async def test_slow_compute_cancelled_while_running_ends_cancelled(settings: Settings) -> None:
    async with (
        bridge_side(settings, ["slow_compute"]) as bridge,
        worker(settings, ["slow_compute"]),
    ):
        service = bridge.service
        task = await service.create(
            TOOLS["slow_compute"], {"seconds": 60, "label": "cancel-me"}, principal="alice"
        )
        await bridge.seen.wait_for(task.task_id, is_progress(bridge.prefix))  # it is running
        await service.cancel(task.task_id, "alice")
        view = await bridge.terminal(task.task_id)
        assert view.status == "cancelled"
        assert view.status_message == "cancelled at the client's request"
        await service.cancel(task.task_id, "alice")  # cancelling a terminal task is a no-op

        quick = await service.create(
            TOOLS["slow_compute"], {"seconds": 0.2, "label": "quick"}, principal="alice"
        )
        view = await bridge.terminal(quick.task_id)
        assert view.status == "completed" and text_of(view) == "Computed quick in 0.2s"


@pytest.mark.kafka
async def test_input_requests_park_the_task_and_answers_resume_it(settings: Settings) -> None:
    tools = ["confirm_delete", "multi_input"]
    async with bridge_side(settings, tools) as bridge, worker(settings, tools):
        service = bridge.service
        delete = await service.create(
            TOOLS["confirm_delete"], {"filename": "a.txt"}, principal="alice"
        )
        keep = await service.create(TOOLS["confirm_delete"], {"filename": "b.txt"}, "alice")
        multi = await service.create(TOOLS["multi_input"], {}, principal="alice")

        view = await bridge.parked(delete.task_id)
        assert list(view.input_requests) == ["confirm"]
        request = view.input_requests["confirm"]
        assert request["method"] == "elicitation/create"
        assert "a.txt" in request["params"]["message"]
        assert request["params"]["requestedSchema"] == {
            "type": "object",
            "properties": {"confirm": {"type": "boolean", "description": "Delete the file"}},
            "required": ["confirm"],
        }
        await service.update(delete.task_id, "alice", {"unknown-key": {"ignored": True}})
        assert (await service.get(delete.task_id, "alice")).status == "input_required"
        await service.update(delete.task_id, "alice", {"confirm": ACCEPT_CONFIRM})
        view = await bridge.terminal(delete.task_id)
        assert view.status == "completed" and text_of(view) == "Deleted a.txt"

        await bridge.parked(keep.task_id)
        await service.update(keep.task_id, "alice", {"confirm": {"action": "decline"}})
        assert text_of(await bridge.terminal(keep.task_id)) == "Kept b.txt"

        view = await bridge.parked(multi.task_id)
        assert list(view.input_requests) == ["name", "confirm"]
        for request in view.input_requests.values():
            assert request["method"] == "elicitation/create"
            assert request["params"]["requestedSchema"]["type"] == "object"
        first = {"action": "accept", "content": {"name": "partial-1", "confirm": True}}
        await service.update(multi.task_id, "alice", {"name": first})
        view = await service.get(multi.task_id, "alice")
        assert view.status == "input_required" and list(view.input_requests) == ["confirm"]
        second = {"action": "accept", "content": {"name": "partial-2", "confirm": True}}
        await service.update(multi.task_id, "alice", {"confirm": second})
        view = await bridge.terminal(multi.task_id)
        assert view.status == "completed" and text_of(view) == "Name: partial-1; confirmed: True"


@pytest.mark.kafka
async def test_jobs_beyond_the_concurrency_wait_for_a_free_slot(settings: Settings) -> None:
    tools = ["confirm_delete"]
    async with bridge_side(settings, tools) as bridge, worker(settings, tools, concurrency=1):
        service, parked = bridge.service, is_status(bridge.prefix, "input_required")
        first = await service.create(TOOLS["confirm_delete"], {"filename": "1"}, "alice")
        second = await service.create(TOOLS["confirm_delete"], {"filename": "2"}, "alice")
        await bridge.parked(first.task_id)  # holds the only slot while it waits for input
        await service.update(first.task_id, "alice", {"confirm": ACCEPT_CONFIRM})
        done = await bridge.seen.wait_for(first.task_id, is_status(bridge.prefix, "completed"))
        asked = await bridge.seen.wait_for(second.task_id, parked)
        # the second job started only once the first had finished
        assert asked.event.timestamp_ms >= done.event.timestamp_ms
        await service.update(second.task_id, "alice", {"confirm": ACCEPT_CONFIRM})
        assert text_of(await bridge.terminal(second.task_id)) == "Deleted 2"


@pytest.mark.kafka
async def test_a_rebalance_does_not_start_a_second_copy_of_a_running_job(
    settings: Settings,
) -> None:
    tools, fast = ["slow_compute", "greet"], {"session_timeout_ms": _SESSION_TIMEOUT_MS}
    async with (
        bridge_side(settings, tools) as bridge,
        worker(settings, ["slow_compute"], cls=WatchedWorker, **fast) as a,
    ):
        assert isinstance(a, WatchedWorker)
        task = await bridge.service.create(
            TOOLS["slow_compute"], {"seconds": 4, "label": "rebalance"}, principal="alice"
        )
        await bridge.seen.wait_for(task.task_id, is_progress(bridge.prefix))
        # B joins the group for another tool: the group rebalances and A gets its partitions
        # back, reading them again from the committed offset, below the job still running.
        async with worker(settings, ["greet"], **fast):
            await a.wait_assignments(2)
            greeting = await bridge.service.create(TOOLS["greet"], {"name": "B"}, "alice")
            assert text_of(await bridge.terminal(greeting.task_id)) == "Hello, B!"
            view = await bridge.terminal(task.task_id)
        assert text_of(view) == "Computed rebalance in 4s"
        async with asyncio.timeout(BOUND):
            log = [e async for e in bridge.reader.read(task.task_id)]
        starts = [
            e
            for e in log
            if e.event.type == f"{bridge.prefix}.{EventSuffix.PROGRESS}"
            and e.event.payload["progress"] == 0
        ]
        assert len(starts) == 1
        assert [e.event.payload["status"] for e in log if "status" in e.event.payload] == [
            "completed"
        ]


@pytest.mark.kafka
async def test_a_rebalance_that_moves_a_running_job_stops_it_so_nothing_follows_its_end(
    settings: Settings,
) -> None:
    fast = {"session_timeout_ms": _SESSION_TIMEOUT_MS}
    partitions = settings.topics.partitions
    async with (
        bridge_side(settings, ["slow_compute"]) as bridge,
        worker(settings, ["slow_compute"], cls=WatchedWorker, **fast) as a,
    ):
        assert isinstance(a, WatchedWorker)
        await a.wait_assignments(1)
        # A job in every job partition, all running on A: whichever partitions B gets move.
        # They run long enough to outlast B's join (the broker delays a group's first
        # rebalance by 3 s).
        tasks: dict[int, str] = {}
        while len(tasks) < partitions:
            assert len(tasks) < 30, "task ids kept landing in the same job partitions"
            task = await bridge.started(TOOLS["slow_compute"], {"seconds": 20, "label": "moved"})
            tasks.setdefault(partition_for_key(task.task_id.encode(), partitions), task.task_id)
        async with worker(settings, ["slow_compute"], cls=WatchedWorker, **fast) as b:
            assert isinstance(b, WatchedWorker)
            await a.wait_assignments(2)
            views = [await bridge.terminal(task_id) for task_id in tasks.values()]
            assert all(view.status == "completed" for view in views), views
            # A second copy would still be emitting after the first one's end: read the logs
            # once no job runs on either worker.
            await wait_until(lambda: a.idle and b.idle, BOUND, what="both workers idle")
            restarted = 0
            async with asyncio.timeout(BOUND):
                for task_id in tasks.values():
                    log = [e async for e in bridge.reader.read(task_id)]
                    restarted += sum(is_start(bridge.prefix, e) for e in log) > 1
                    statuses = [
                        e.event.payload["status"] for e in log if "status" in e.event.payload
                    ]
                    assert statuses == ["completed"], (task_id, statuses)
                    assert "status" in log[-1].event.payload, f"events after the end of {task_id}"
        assert restarted, "no job moved to B: the rebalance came after every job had ended"


@pytest.mark.kafka
async def test_another_workers_outcome_stops_a_copy_still_running_and_nothing_follows_it(
    settings: Settings,
) -> None:
    async with (
        bridge_side(settings, ["slow_compute"]) as bridge,
        worker(settings, ["slow_compute"], cls=WatchedWorker) as a,
    ):
        assert isinstance(a, WatchedWorker)
        task = await bridge.started(TOOLS["slow_compute"], {"seconds": 20, "label": "twice"})
        # What the worker that ran the other copy writes: the outcome, then the finished mark.
        elsewhere = StatusPayload(status="completed", result={"content": []})
        await a._finish(task.task_id, elsewhere)
        await wait_until(lambda: a.idle, BOUND, what="the copy on A stopped")
        async with asyncio.timeout(BOUND):
            log = [e async for e in bridge.reader.read(task.task_id)]
    statuses = [e.event.payload["status"] for e in log if "status" in e.event.payload]
    assert statuses == ["completed"], statuses
    assert log[-1].event.payload == elsewhere.payload(), "events after the task's end"
    assert a.completed == 0, "the stopped copy reported nothing"


@pytest.mark.kafka
async def test_protocol_errors_fail_and_tool_errors_complete_with_is_error(
    settings: Settings,
) -> None:
    tools = ["protocol_error_job", "failing_job"]
    async with bridge_side(settings, tools) as bridge, worker(settings, tools):
        service = bridge.service
        broken = await service.create(TOOLS["protocol_error_job"], {}, principal="alice")
        failing = await service.create(TOOLS["failing_job"], {}, principal="alice")

        view = await bridge.terminal(broken.task_id)
        assert view.status == "failed" and view.result is None
        assert view.error is not None and view.error["code"] == INTERNAL_ERROR
        assert isinstance(view.error["message"], str) and view.error["message"]

        view = await bridge.terminal(failing.task_id)
        assert view.status == "completed" and view.error is None
        assert view.result is not None and view.result["isError"] is True
        assert text_of(view)


@pytest.mark.kafka
async def test_another_principal_cannot_see_or_touch_a_task(settings: Settings) -> None:
    tools = ["confirm_delete"]
    async with bridge_side(settings, tools) as bridge, worker(settings, tools):
        service = bridge.service
        task = await service.create(TOOLS["confirm_delete"], {"filename": "x"}, "alice")
        await bridge.parked(task.task_id)
        with pytest.raises(TaskNotFound):
            await service.get(task.task_id, "mallory")
        with pytest.raises(TaskNotFound):
            await service.update(task.task_id, "mallory", {"confirm": ACCEPT_CONFIRM})
        with pytest.raises(TaskNotFound):
            await service.cancel(task.task_id, "mallory")
        # mallory changed nothing: still parked, and alice's own answer still resumes it
        assert (await service.get(task.task_id, "alice")).status == "input_required"
        await service.update(task.task_id, "alice", {"confirm": ACCEPT_CONFIRM})
        assert text_of(await bridge.terminal(task.task_id)) == "Deleted x"


@pytest.mark.kafka
async def test_active_tasks_per_principal_are_limited(settings: Settings) -> None:
    limited = changed(settings, tasks={"max_active_per_principal": 2})
    async with (
        bridge_side(limited, ["slow_compute"]) as bridge,
        worker(settings, ["slow_compute"]),
    ):
        service, spec, args = bridge.service, TOOLS["slow_compute"], {"seconds": 60}
        first = await service.create(spec, args, principal="alice")
        second = await service.create(spec, args, principal="alice")
        with pytest.raises(TooManyTasks):
            await service.create(spec, args, principal="alice")
        other = await service.create(spec, args, principal="bob")  # a separate budget
        await service.cancel(first.task_id, "alice")
        assert (await bridge.terminal(first.task_id)).status == "cancelled"
        third = await service.create(spec, args, principal="alice")  # a slot freed up
        for task_id, who in ((second.task_id, "alice"), (third.task_id, "alice")):
            await service.cancel(task_id, who)
            assert (await bridge.terminal(task_id, who)).status == "cancelled"
        await service.cancel(other.task_id, "bob")
        assert (await bridge.terminal(other.task_id, "bob")).status == "cancelled"


# --- a worker crash --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker_process(settings: Settings) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m bridge.cli workers --pack conformance``, yielded once it says it is running."""
    with tempfile.TemporaryFile() as errors:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge.cli", "workers", "--pack", "conformance",
            "--session-timeout-ms", str(_SESSION_TIMEOUT_MS),
            env=bridge_env(settings, BRIDGE_LOG_LEVEL="WARNING"), stdout=asyncio.subprocess.PIPE, stderr=errors,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            async with asyncio.timeout(BOUND):
                ready = await proc.stdout.readline()
            errors.seek(0)
            assert ready.startswith(b"workers running"), errors.read().decode()
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            async with asyncio.timeout(BOUND):
                await proc.wait()


async def handed_over(bridge: Bridge, task_id: str, expected_starts: int) -> Any:
    """Run the task to its end on an in-process worker B; check the task's whole log."""
    async with worker(bridge.settings, ["slow_compute"], session_timeout_ms=_SESSION_TIMEOUT_MS):
        view = await bridge.terminal(task_id)
    async with asyncio.timeout(BOUND):
        log = [e async for e in bridge.reader.read(task_id)]
    prefix = bridge.prefix
    assert log[0].event.type == f"{prefix}.{EventSuffix.CREATED}"
    assert [e.seq for e in log] == list(range(len(log)))  # no gaps, no duplicates
    statuses = [
        e.event.payload["status"] for e in log if e.event.type == f"{prefix}.{EventSuffix.STATUS}"
    ]
    assert statuses == ["completed"]  # exactly one terminal status, written by B
    assert log[-1].event.payload["status"] == "completed"
    starts = [
        e
        for e in log
        if e.event.type == f"{prefix}.{EventSuffix.PROGRESS}" and e.event.payload["progress"] == 0
    ]
    assert len(starts) == expected_starts  # A started the job, B ran it again from the start
    return view


@pytest.mark.kafka
async def test_a_job_of_a_killed_worker_is_finished_by_another(settings: Settings) -> None:
    async with bridge_side(settings, ["slow_compute"]) as bridge:
        async with worker_process(settings) as proc:
            task = await bridge.started(TOOLS["slow_compute"], {"seconds": 3, "label": "crash"})
            proc.send_signal(signal.SIGKILL)
            async with asyncio.timeout(BOUND):
                assert await proc.wait() == -signal.SIGKILL
        # B gets the partition once the group has given up on A (its session timeout).
        view = await handed_over(bridge, task.task_id, expected_starts=2)
        assert view.status == "completed" and text_of(view) == "Computed crash in 3s"


@pytest.mark.kafka
async def test_a_stopped_worker_leaves_its_job_in_flight_to_another(settings: Settings) -> None:
    async with bridge_side(settings, ["slow_compute"]) as bridge:
        async with worker_process(settings) as proc:
            task = await bridge.started(TOOLS["slow_compute"], {"seconds": 2, "label": "handover"})
            proc.send_signal(signal.SIGTERM)
            assert proc.stdout is not None
            async with asyncio.timeout(BOUND):
                said = await proc.stdout.read()
                assert await proc.wait() == 0
            assert said.strip() == b"workers stopped after 0 jobs"
        # A left the group on its way out, so B gets the job without waiting for a timeout.
        view = await handed_over(bridge, task.task_id, expected_starts=2)
        assert text_of(view) == "Computed handover in 2s"


@pytest.mark.kafka
async def test_a_task_past_its_ttl_is_answered_as_unknown(settings: Settings) -> None:
    tools = ["greet"]
    short = TOOLS["greet"].model_copy(update={"ttl_ms": 1500})
    async with bridge_side(settings, tools) as bridge, worker(settings, tools):
        service = bridge.service
        task = await service.create(short, {"name": "ttl"}, "alice")
        assert task.ttl_ms == 1500
        assert text_of(await bridge.terminal(task.task_id)) == "Hello, ttl!"

        # retrievable for its ttl, then unknown (-32602 on the wire): poll the clock, bounded
        async def expired() -> str | None:
            try:
                await service.get(task.task_id, "alice")
            except TaskNotFound as exc:
                return str(exc)
            return None

        what = "the task is unknown once its ttl ran out"
        assert await wait_until(expired, BOUND, what=what, poll_s=0.1) == "Task has expired"
        with pytest.raises(TaskNotFound):
            await service.cancel(task.task_id, "alice")

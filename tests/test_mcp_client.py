"""The real PyPI MCP client (``mcp`` 2.3) against the whole bridge and its worker, served over
real HTTP from the test process on the in-memory log (tests/support/inmemory.py).

The client connects with ``mode="auto"`` (``server/discover`` → 2026-07-28). The tasks
extension is not built into the SDK, so this module supplies it the way the SDK intends:

* :class:`TasksExtension`, a ``ClientExtension`` for ``io.modelcontextprotocol/tasks`` whose
  ``ResultClaim`` on ``resultType: "task"`` turns a flat ``CreateTaskResult`` into the tool's
  ordinary ``CallToolResult`` by polling ``tasks/get`` through ``ctx.session``;
* :class:`TasksGetRequest` / :class:`TasksUpdateRequest`, custom request types whose
  ``name_param`` makes the session stamp ``Mcp-Name: <taskId>`` (the SDK's
  ``NAME_BEARING_METHODS`` covers only tools/call, prompts/get and resources/read).

Every wait is bounded (``anyio.fail_after``); polls sleep the task's ``pollIntervalMs``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import pytest
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp_types import CallToolResult, Request, RequestParams, Result, TextContent
from support.inmemory import MemoryBridge


@pytest.fixture(scope="module")
def bridge(memory_bridge_module: MemoryBridge) -> MemoryBridge:
    """The whole bridge in process: the client's interplay with it is no Kafka matter."""
    return memory_bridge_module


TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
MODERN = "2026-07-28"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
#: Upper bound of one test's waiting (a worker's first job can take a few seconds to arrive).
BOUND_S = 60.0


# --- the tasks extension's wire shapes (mcp_types only has the 2025-11-25 ones) -------------


class CreatedTask(Result):
    """The flat ``CreateTaskResult`` of a task-augmented tools/call (``resultType: "task"``)."""

    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskState(Result):
    """A tasks/get result: the task, plus its outcome or open input requests."""

    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class AckResult(Result):
    """tasks/update's (empty, ``resultType: "complete"``) acknowledgement."""

    result_type: str | None = None


class TaskIdParams(RequestParams):
    task_id: str


class TasksUpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class TasksGetRequest(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class TasksUpdateRequest(Request[TasksUpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: TasksUpdateParams
    name_param = "taskId"


async def tasks_get(session: ClientSession, task_id: str) -> TaskState:
    return await session.send_request(
        TasksGetRequest(params=TaskIdParams(task_id=task_id)), TaskState
    )


async def tasks_update(
    session: ClientSession, task_id: str, responses: dict[str, Any]
) -> AckResult:
    request = TasksUpdateRequest(
        params=TasksUpdateParams(task_id=task_id, input_responses=responses)
    )
    return await session.send_request(request, AckResult)


async def poll_until(
    session: ClientSession,
    task_id: str,
    done: Callable[[TaskState], bool],
    seen: list[TaskState],
    interval_ms: int | None,
) -> TaskState:
    """Poll tasks/get until ``done``; each poll is appended to ``seen``. The caller bounds it."""
    while True:
        state = await tasks_get(session, task_id)
        seen.append(state)
        assert state.task_id == task_id
        if done(state):
            return state
        await anyio.sleep((state.poll_interval_ms or interval_ms or 500) / 1000)


Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class TasksExtension(ClientExtension):
    """The tasks extension, client side: resolves ``resultType: "task"`` by polling tasks/get.

    ``answer`` (optional) answers a task's ``inputRequests`` (input_required) with the
    ``inputResponses`` to send through tasks/update. Everything seen is recorded for the tests.
    """

    answer: Answer | None = None
    created: list[CreatedTask] = field(default_factory=list)
    polls: list[TaskState] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        self.created.append(created)

        def settled(state: TaskState) -> bool:
            return state.status in TERMINAL or state.status == "input_required"

        with anyio.fail_after(BOUND_S):
            while True:
                # tasks/update writes the task's next status before it answers, so a later
                # input_required is always a new question, never the one just answered.
                state = await poll_until(
                    ctx.session, created.task_id, settled, self.polls, created.poll_interval_ms
                )
                if state.status in TERMINAL:
                    break
                if self.answer is None:
                    raise AssertionError(f"task needs input nobody can give: {state}")
                responses = await self.answer(state.input_requests or {})
                self.updates.append(responses)
                ack = await tasks_update(ctx.session, created.task_id, responses)
                assert ack.result_type in (None, "complete")
        if state.status != "completed":
            raise AssertionError(f"task {created.task_id} ended {state.status}: {state.error}")
        return CallToolResult.model_validate(state.result or {"content": []}, by_name=False)


def texts(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


# --- tests ------------------------------------------------------------------------------------


async def test_call_tool_with_tasks_extension_resolves_a_task_by_polling(bridge: Any) -> None:
    tasks = TasksExtension()
    with anyio.fail_after(BOUND_S):
        async with Client(bridge.url, mode="auto", extensions=[tasks]) as client:
            assert client.protocol_version == MODERN
            assert client.server_info is not None
            assert client.server_info.name == "mcp-kafka-bridge"
            extensions = client.server_capabilities.extensions or {}
            assert TASKS_EXTENSION in extensions

            result = await client.call_tool("slow_compute", {"seconds": 1, "label": "sdk"})

    assert not result.is_error
    assert "sdk" in texts(result), result
    assert texts(result) == "Computed sdk in 1s"
    # The tools/call answer was a flat CreateTaskResult, not the tool's result...
    assert len(tasks.created) == 1
    created = tasks.created[0]
    assert created.result_type == "task"
    assert created.task_id
    assert created.status == "working"
    assert created.poll_interval_ms is not None and created.poll_interval_ms > 0
    assert created.created_at and created.last_updated_at
    # ...and the result came from tasks/get: at least one poll of that task, the last completed.
    assert tasks.polls, "tasks/get was never called"
    assert {p.task_id for p in tasks.polls} == {created.task_id}
    assert tasks.polls[-1].status == "completed"
    assert all(p.status == "working" for p in tasks.polls[:-1])
    assert tasks.updates == []


async def test_input_required_round_trip_through_tasks_get_and_update(bridge: Any) -> None:
    seen: list[TaskState] = []
    with anyio.fail_after(BOUND_S):
        async with Client(bridge.url, mode="auto", extensions=[TasksExtension()]) as client:
            assert client.protocol_version == MODERN
            session = client.session
            # Take the claimed shape ourselves instead of letting the extension resolve it.
            created = await session.call_tool(
                "confirm_delete", {"filename": "a.txt"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask), created
            assert created.task_id and created.status == "working"
            task_id = created.task_id

            asking = await poll_until(
                session,
                task_id,
                lambda s: s.status != "working",
                seen,
                created.poll_interval_ms,
            )
            assert asking.status == "input_required", asking
            requests = asking.input_requests or {}
            assert set(requests) == {"confirm"}
            ask = requests["confirm"]
            assert ask["method"] == "elicitation/create"
            assert "a.txt" in ask["params"]["message"]
            schema = ask["params"]["requestedSchema"]
            assert schema["properties"]["confirm"]["type"] == "boolean"

            ack = await tasks_update(
                session,
                task_id,
                {"confirm": {"action": "accept", "content": {"confirm": True}}},
            )
            assert ack.result_type == "complete"

            done = await poll_until(
                session,
                task_id,
                lambda s: s.status in TERMINAL,
                seen,
                created.poll_interval_ms,
            )

    assert done.status == "completed", done
    result = CallToolResult.model_validate(done.result, by_name=False)
    assert not result.is_error
    assert texts(result) == "Deleted a.txt"
    statuses = [s.status for s in seen]
    assert "input_required" in statuses
    assert statuses.index("input_required") < statuses.index("completed")


async def test_extension_resolver_answers_input_required_through_tasks_update(
    bridge: Any,
) -> None:
    async def answer_both(requests: dict[str, Any]) -> dict[str, Any]:
        assert set(requests) == {"name", "confirm"}
        return {
            "name": {"action": "accept", "content": {"name": "sdk-user"}},
            "confirm": {"action": "accept", "content": {"confirm": True}},
        }

    tasks = TasksExtension(answer=answer_both)
    with anyio.fail_after(BOUND_S):
        async with Client(bridge.url, mode="auto", extensions=[tasks]) as client:
            result = await client.call_tool("multi_input", {})

    assert texts(result) == "Name: sdk-user; confirmed: True"
    assert len(tasks.created) == 1
    assert len(tasks.updates) == 1
    assert any(p.status == "input_required" for p in tasks.polls)
    assert tasks.polls[-1].status == "completed"


async def test_without_the_extension_tools_answer_directly(bridge: Any) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(bridge.url, mode="auto") as client:
            assert client.protocol_version == MODERN
            greeting = await client.call_tool("greet", {"name": "SDK"})
            direct = await client.call_tool("slow_compute", {"seconds": 0})

    assert greeting.result_type == "complete"
    assert not greeting.is_error
    assert texts(greeting) == "Hello, SDK!"
    # slow_compute allows tasks, but a client without the extension gets the result itself.
    assert isinstance(direct, CallToolResult)
    assert direct.result_type == "complete"
    assert texts(direct) == "Computed result in 0s"


@pytest.mark.kafka
async def test_on_the_broker_the_client_resolves_a_task(kafka_bridge_module: Any) -> None:
    """End-to-end smoke: the same client against `bridge serve` and `bridge workers` on Kafka."""
    await test_call_tool_with_tasks_extension_resolves_a_task_by_polling(kafka_bridge_module)

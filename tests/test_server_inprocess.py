"""The server layer in-process, without Kafka: the classifier, the method handlers and the HTTP
transport, against fakes of the task service and the stream hub.

Streaming itself (SSE bodies as they are written) is tested over real uvicorn in
tests/test_streams.py; here an ASGI transport is fine, since these responses are whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from bridge.config import Settings, ToolSpec, load_settings
from bridge.envelope import TaskEvent
from bridge.log.fanout import TaskFeed
from bridge.log.records import Batch
from bridge.metrics import Metrics
from bridge.server.admission import Admission, Caller, Limits, Ticket
from bridge.server.auth import Authenticator
from bridge.server.classify import Methods, Rejected, classify, decode_header_value
from bridge.server.cursor import encode_cursor
from bridge.server.handlers import Call, MethodHandlers, Streamed
from bridge.server.http import McpHttp
from bridge.server.sse import EventBatch, Frame
from bridge.server.wire import (
    LATEST_VERSION,
    JsonRpcRequest,
    RpcError,
    events_gone_error,
)
from bridge.tasks.service import TaskNotFound, TaskView, TooManyTasks
from bridge.vocabulary import (
    EVENTS_GONE,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CAPABILITY,
    PARSE_ERROR,
    UNSUPPORTED_VERSION,
)

TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
META = {
    "io.modelcontextprotocol/protocolVersion": LATEST_VERSION,
    "io.modelcontextprotocol/clientCapabilities": TASKS,
}
METHODS = Methods(
    modern={"server/discover", "tools/list", "tools/call", "tasks/get", "tasks/stream"},
    legacy={"initialize", "ping", "tools/list"},
)
GREET = ToolSpec(
    name="greet",
    description="Says hello",
    task="optional",
    input_schema={
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    },
)
LONG = ToolSpec(name="long_job", description="Runs long", task="required")


# --- the classifier ------------------------------------------------------------------------


def body(method: str, params: dict[str, Any] | None = None, **extra: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method}
    if params is not None:
        message["params"] = params
    message.update(extra)
    return json.dumps(message).encode()


def headers(method: str, name: str | None = None, version: str = LATEST_VERSION) -> dict[str, str]:
    out = {"mcp-protocol-version": version, "mcp-method": method}
    if name is not None:
        out["mcp-name"] = name
    return out


def rejected(head: dict[str, str], raw: bytes) -> tuple[int, int, str | int | None]:
    with pytest.raises(Rejected) as exc:
        classify(head, raw, METHODS)
    return exc.value.error.code, exc.value.error.http_status, exc.value.request_id


def test_a_well_formed_modern_request_is_classified_with_its_params() -> None:
    params = {"taskId": "t1", "_meta": META}
    inbound = classify(headers("tasks/get", "t1"), body("tasks/get", params), METHODS)
    assert not inbound.legacy and inbound.params["taskId"] == "t1" and inbound.rpc.id == 7


def test_a_request_without_a_version_header_takes_the_legacy_path() -> None:
    inbound = classify({}, body("initialize", {"protocolVersion": "2025-11-25"}), METHODS)
    assert inbound.legacy


def test_an_unknown_method_is_404_before_any_header_check() -> None:
    assert rejected({}, body("tasks/result")) == (METHOD_NOT_FOUND, 404, 7)
    assert rejected(headers("x"), body("tasks/result")) == (METHOD_NOT_FOUND, 404, 7)


def test_a_method_of_the_other_era_is_not_found() -> None:
    assert rejected({}, body("tasks/get", {"taskId": "t"}))[0] == METHOD_NOT_FOUND


def test_missing_meta_is_invalid_params_with_400() -> None:
    assert rejected(headers("tools/list"), body("tools/list", {})) == (INVALID_PARAMS, 400, 7)


def test_a_version_header_that_differs_from_meta_is_a_header_mismatch() -> None:
    raw = body("tools/list", {"_meta": META})
    assert rejected(headers("tools/list", version="2099-01-01"), raw)[:2] == (HEADER_MISMATCH, 400)


def test_an_unsupported_version_names_the_supported_ones() -> None:
    meta = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    with pytest.raises(Rejected) as exc:
        classify(
            headers("tools/list", version="2099-01-01"),
            body("tools/list", {"_meta": meta}),
            METHODS,
        )
    assert exc.value.error.code == UNSUPPORTED_VERSION
    assert exc.value.error.data["requested"] == "2099-01-01"
    assert LATEST_VERSION in exc.value.error.data["supported"]


def test_an_mcp_method_header_that_differs_from_the_method_is_a_header_mismatch() -> None:
    raw = body("tools/list", {"_meta": META})
    assert rejected(headers("tools/call"), raw)[:2] == (HEADER_MISMATCH, 400)


def test_mcp_name_must_equal_the_task_id() -> None:
    raw = body("tasks/get", {"taskId": "t1", "_meta": META})
    assert rejected(headers("tasks/get", "t2"), raw)[0] == HEADER_MISMATCH
    assert rejected(headers("tasks/get"), raw)[0] == HEADER_MISMATCH


def test_mcp_name_may_be_sent_base64_encoded() -> None:
    raw = body("tasks/get", {"taskId": "tâche", "_meta": META})
    inbound = classify(headers("tasks/get", "=?base64?dMOiY2hl?="), raw, METHODS)
    assert inbound.params["taskId"] == "tâche"


def test_malformed_base64_in_a_header_is_a_header_mismatch() -> None:
    with pytest.raises(RpcError) as exc:
        decode_header_value("=?base64?!!!?=")
    assert exc.value.code == HEADER_MISMATCH


@pytest.mark.parametrize(
    "raw",
    [b"{", b"[1,", b'{"a": NaN}', b'{"a": 1e999}', b'{"a": "\\ud800"}', b"[" * 200 + b"]" * 200],
)
def test_what_the_wire_could_not_carry_is_a_parse_error(raw: bytes) -> None:
    assert rejected({}, raw) == (PARSE_ERROR, 400, None)


def test_a_batch_is_refused() -> None:
    assert rejected({}, b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]')[:2] == (INVALID_REQUEST, 400)


def test_a_null_id_is_refused() -> None:
    assert rejected({}, b'{"jsonrpc":"2.0","id":null,"method":"ping"}')[:2] == (
        INVALID_REQUEST,
        400,
    )


def test_a_message_that_is_not_json_rpc_2_keeps_its_id_in_the_error() -> None:
    assert rejected({}, b'{"jsonrpc":"1.0","id":"x","method":"ping"}') == (
        INVALID_REQUEST,
        400,
        "x",
    )


def test_a_notification_skips_the_routing_checks() -> None:
    inbound = classify({}, b'{"jsonrpc":"2.0","method":"notifications/cancelled"}', METHODS)
    assert inbound.is_notification


def test_a_rejection_names_a_served_method_for_the_metrics() -> None:
    with pytest.raises(Rejected) as exc:
        classify(
            headers("tasks/get", "other"),
            body("tasks/get", {"taskId": "t", "_meta": META}),
            METHODS,
        )
    assert exc.value.method == "tasks/get"


# --- the handlers, against fakes -----------------------------------------------------------


class FakeTasks:
    """The task service's interface over a dict; tasks are owned by their creator."""

    def __init__(self) -> None:
        self.views: dict[str, tuple[str, TaskView]] = {}
        self.cancelled: list[str] = []
        self.updates: list[dict[str, Any]] = []
        self.limit: int | None = None

    def add(self, task_id: str, owner: str, status: str = "working", **fields: Any) -> TaskView:
        view = TaskView(task_id, status, 1000, 1000, 60_000, 500, **fields)
        self.views[task_id] = (owner, view)
        return view

    async def create(
        self,
        tool: ToolSpec,
        arguments: dict[str, Any],
        principal: str,
        *,
        task_id: str | None = None,
        input_responses: dict[str, Any] | None = None,
    ) -> TaskView:
        if self.limit is not None:
            raise TooManyTasks(self.limit)
        return self.add(task_id or f"task-{len(self.views)}", principal)

    async def get(self, task_id: str, principal: str) -> TaskView:
        owner, view = self.views.get(task_id, (None, None))
        if view is None or owner != principal:
            raise TaskNotFound()
        return view

    async def update(self, task_id: str, principal: str, responses: dict[str, Any]) -> None:
        await self.get(task_id, principal)
        self.updates.append(responses)

    async def cancel(self, task_id: str, principal: str) -> None:
        await self.get(task_id, principal)
        self.cancelled.append(task_id)

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[TaskFeed]:
        yield TaskFeed(task_id, 16)


class FakeStreams:
    """The stream hub's interface: real admission, scripted cursor checks and events."""

    def __init__(self) -> None:
        self.admission = Admission(Limits(4, 100, 100))
        self.draining = asyncio.Event()
        self.refuse: RpcError | None = None
        self.batches: list[Batch[Any] | None] = []
        self.gone = 0
        self.wire = False

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket:
        return self.admission.admit(caller, task_id, request_id)

    def release(self, ticket: Ticket) -> None:
        self.admission.release(ticket)

    async def check_cursor(self, task_id: str, after: int | None) -> int | None:
        if self.refuse is not None:
            raise self.refuse
        return None

    async def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool
    ) -> AsyncIterator[Any]:
        self.wire = wire  # the handler sends what it reads: it takes wire texts
        for batch in self.batches:
            yield batch

    def count_gone(self) -> None:
        self.gone += 1

    def cancel(self, client: str, request_id: str | int) -> int:
        return self.admission.cancel(client, request_id)


def settings() -> Settings:
    return load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}, tool_packs=[])


@pytest.fixture
def tasks() -> FakeTasks:
    return FakeTasks()


@pytest.fixture
def streams() -> FakeStreams:
    return FakeStreams()


@pytest.fixture
def handlers(tasks: FakeTasks, streams: FakeStreams) -> MethodHandlers:
    return MethodHandlers(settings(), tasks, [GREET, LONG], streams)


ALICE = Caller("alice", "alice", ("server", "alice:1"))


def call(method: str, params: dict[str, Any] | None = None, *, caps: Any = TASKS) -> Call:
    full = {**(params or {}), "_meta": {**META, "io.modelcontextprotocol/clientCapabilities": caps}}
    rpc = JsonRpcRequest(jsonrpc="2.0", id=3, method=method, params=full)
    return Call(rpc, ALICE, legacy=False, params=full)


async def error_of(handlers: MethodHandlers, c: Call) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await handlers.dispatch(c)
    return exc.value


async def test_discover_declares_the_tasks_extension_and_cache_hints(
    handlers: MethodHandlers,
) -> None:
    result = await handlers.dispatch(call("server/discover"))
    assert isinstance(result, dict)
    assert result["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert result["resultType"] == "complete" and "ttlMs" in result and "cacheScope" in result


async def test_tools_list_shows_each_tools_task_support(handlers: MethodHandlers) -> None:
    result = await handlers.dispatch(call("tools/list"))
    assert isinstance(result, dict)
    assert [(t["name"], t["execution"]["taskSupport"]) for t in result["tools"]] == [
        ("greet", "optional"),
        ("long_job", "required"),
    ]


async def test_tools_call_with_bad_arguments_names_the_failing_rule(
    handlers: MethodHandlers,
) -> None:
    error = await error_of(handlers, call("tools/call", {"name": "greet", "arguments": {}}))
    assert error.code == INVALID_PARAMS and "required" in error.message


async def test_an_unknown_tool_is_invalid_params(handlers: MethodHandlers) -> None:
    error = await error_of(handlers, call("tools/call", {"name": "nope"}))
    assert error.code == INVALID_PARAMS and "Unknown tool" in error.message


async def test_a_task_required_tool_needs_the_tasks_extension(handlers: MethodHandlers) -> None:
    error = await error_of(handlers, call("tools/call", {"name": "long_job"}, caps={}))
    assert error.code == MISSING_CAPABILITY and error.http_status == 400
    assert error.data == {"requiredCapabilities": TASKS}


async def test_a_task_tool_call_answers_a_flat_create_task_result(handlers: MethodHandlers) -> None:
    result = await handlers.dispatch(call("tools/call", {"name": "long_job"}))
    assert isinstance(result, dict)
    assert result["resultType"] == "task" and result["status"] == "working"
    assert "task" not in result and result["ttlMs"] == 60_000


async def test_the_active_task_limit_is_a_429(handlers: MethodHandlers, tasks: FakeTasks) -> None:
    tasks.limit = 2
    error = await error_of(handlers, call("tools/call", {"name": "long_job"}))
    assert (error.code, error.http_status, error.data["reason"]) == (
        INVALID_REQUEST,
        429,
        "too_many_tasks",
    )


async def test_tasks_get_of_a_completed_task_carries_its_result(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    tasks.add("t1", "alice", "completed", result={"content": [{"type": "text", "text": "ok"}]})
    result = await handlers.dispatch(call("tasks/get", {"taskId": "t1"}))
    assert isinstance(result, dict)
    assert result["status"] == "completed" and result["result"]["content"][0]["text"] == "ok"
    assert "error" not in result


async def test_tasks_get_of_a_failed_task_carries_an_error_and_no_result(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    tasks.add("t1", "alice", "failed")
    result = await handlers.dispatch(call("tasks/get", {"taskId": "t1"}))
    assert isinstance(result, dict)
    assert result["error"]["code"] == INTERNAL_ERROR and "result" not in result


async def test_tasks_get_of_input_required_lists_the_requests(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    tasks.add("t1", "alice", "input_required", input_requests={"k": {"method": "x"}})
    result = await handlers.dispatch(call("tasks/get", {"taskId": "t1"}))
    assert isinstance(result, dict) and result["inputRequests"] == {"k": {"method": "x"}}


async def test_another_principals_task_reads_as_unknown(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    tasks.add("t1", "bob")
    error = await error_of(handlers, call("tasks/get", {"taskId": "t1"}))
    unknown = await error_of(handlers, call("tasks/get", {"taskId": "t-none"}))
    assert (
        (error.code, error.message)
        == (unknown.code, unknown.message)
        == (
            INVALID_PARAMS,
            "Failed to retrieve task: Task not found",
        )
    )


async def test_tasks_methods_need_the_extension_in_that_request(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    tasks.add("t1", "alice")
    for method in ("tasks/get", "tasks/update", "tasks/cancel", "tasks/stream"):
        error = await error_of(handlers, call(method, {"taskId": "t1"}, caps={}))
        assert error.code == MISSING_CAPABILITY, method


async def test_tasks_update_and_cancel_answer_an_empty_complete_result(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    tasks.add("t1", "alice", "input_required")
    update = call("tasks/update", {"taskId": "t1", "inputResponses": {"k": 1}})
    assert await handlers.dispatch(update) == {"resultType": "complete"}
    assert await handlers.dispatch(call("tasks/cancel", {"taskId": "t1"})) == {
        "resultType": "complete"
    }
    assert tasks.updates == [{"k": 1}] and tasks.cancelled == ["t1"]


@pytest.mark.parametrize("after", [-1, 1.5, "1", True, None, 2**63, 10**30])
async def test_tasks_stream_refuses_an_after_that_is_no_sequence_number(
    handlers: MethodHandlers, tasks: FakeTasks, after: Any
) -> None:
    tasks.add("t1", "alice")
    error = await error_of(handlers, call("tasks/stream", {"taskId": "t1", "after": after}))
    assert error.code == INVALID_PARAMS


async def test_tasks_stream_renders_each_event_with_its_cursor_then_the_result(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    tasks.add("t1", "alice")
    event = TaskEvent("com.example.step", {"i": 1}, None, 5)
    spliced = '"type":"com.example.step","payload":{"i": 2}'  # a replay's wire text
    streams.batches = [Batch(range(4, 6), [40, 50], [event, spliced], [0]), None]
    outcome = await handlers.dispatch(call("tasks/stream", {"taskId": "t1", "after": 3.0}))
    assert isinstance(outcome, Streamed)
    frames = [item async for item in outcome.messages]
    first = frames[0]
    assert streams.wire
    assert isinstance(first, EventBatch)
    blocks = first.text.split("\n\n")
    assert blocks[-1] == "" and len(blocks) == 3  # two SSE events
    ids, texts = zip(
        *(block.split("\nevent: message\ndata: ") for block in blocks[:2]), strict=True
    )
    assert ids == (f"id: {encode_cursor(3, 't1', 4)}", f"id: {encode_cursor(3, 't1', 5)}")
    assert json.loads(texts[0])["params"]["seq"] == 4
    assert json.loads(texts[1])["params"] == {
        "seq": 5,
        "taskId": "t1",
        "type": "com.example.step",
        "payload": {"i": 2},
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t1"}},
    }
    assert '"payload":{"i": 2}' in texts[1]  # the producer's text, as it wrote it
    assert isinstance(frames[1], Frame) and frames[1].message is None  # keep-alive
    assert isinstance(frames[2], Frame) and frames[2].message == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"resultType": "complete"},
    }
    assert outcome.on_close is not None
    outcome.on_close()
    assert streams.admission.active == 0


async def test_a_refused_cursor_gives_the_admission_slot_back(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    tasks.add("t1", "alice")
    streams.refuse = events_gone_error("t1", 9)
    error = await error_of(handlers, call("tasks/stream", {"taskId": "t1", "after": 1}))
    assert error.code == EVENTS_GONE and streams.gone == 1
    assert streams.admission.active == 0


async def test_a_cancelled_stream_ends_without_its_result(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    tasks.add("t1", "alice")
    outcome = await handlers.dispatch(call("tasks/stream", {"taskId": "t1"}))
    assert isinstance(outcome, Streamed)
    assert streams.cancel("alice", 3) == 1
    assert [item async for item in outcome.messages] == []


# --- the HTTP transport --------------------------------------------------------------------


def app_for(handlers: MethodHandlers, streams: FakeStreams, **overrides: Any) -> httpx.AsyncClient:
    config = load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}, **overrides)
    endpoint = McpHttp(
        config, Authenticator(config.auth), handlers, Metrics(), on_cancelled=streams.cancel
    )
    app = Starlette(
        routes=[
            Route("/mcp", endpoint.post, methods=["POST"]),
            Route("/mcp", endpoint.get, methods=["GET"]),
        ]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def post_headers(method: str, name: str | None = None) -> dict[str, str]:
    return {"content-type": "application/json", **headers(method, name)}


async def test_a_foreign_host_is_refused_with_403(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    async with app_for(handlers, streams) as http:
        reply = await http.post("/mcp", content=body("ping"), headers={"host": "evil.example"})
    assert reply.status_code == 403


async def test_bearer_mode_refuses_a_missing_token_with_401(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    auth = {"mode": "bearer", "tokens": {"secret-token": "alice"}}
    async with app_for(handlers, streams, auth=auth) as http:
        reply = await http.post("/mcp", content=body("ping"))
    assert reply.status_code == 401 and reply.headers["www-authenticate"].startswith("Bearer")


async def test_a_body_over_the_limit_is_413(handlers: MethodHandlers, streams: FakeStreams) -> None:
    async with app_for(handlers, streams, server={"max_request_bytes": 1024}) as http:
        reply = await http.post("/mcp", content=b" " * 2000 + body("ping"))
    assert reply.status_code == 413 and reply.json()["error"]["code"] == INVALID_REQUEST


async def test_a_parse_error_is_400_with_a_null_id(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    async with app_for(handlers, streams) as http:
        reply = await http.post("/mcp", content=b"{nope")
    assert reply.status_code == 400 and reply.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": PARSE_ERROR, "message": "Parse error: the body is not valid JSON"},
    }


async def test_a_legacy_ping_is_answered_as_json(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    async with app_for(handlers, streams) as http:
        reply = await http.post("/mcp", content=body("ping"))
    assert reply.status_code == 200 and reply.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}


async def test_tasks_get_over_http_echoes_the_id(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    tasks.add("t1", "anonymous")
    raw = body("tasks/get", {"taskId": "t1", "_meta": META})
    async with app_for(handlers, streams) as http:
        reply = await http.post("/mcp", content=raw, headers=post_headers("tasks/get", "t1"))
    assert reply.status_code == 200 and reply.json()["result"]["taskId"] == "t1"


async def test_a_notifications_cancelled_reaches_the_callers_stream_and_gets_202(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    caller = Caller("anonymous", "anonymous@127.0.0.1", None)
    ticket = streams.admit(caller, "t1", 41)
    cancelled = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":41}}'
    async with app_for(handlers, streams) as http:
        reply = await http.post("/mcp", content=cancelled)
    assert reply.status_code == 202 and ticket.cancelled


async def test_an_unexpected_fault_is_a_500_internal_error(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    async def broken(task_id: str, principal: str) -> TaskView:
        raise RuntimeError("boom")

    tasks.get = broken  # type: ignore[method-assign]
    raw = body("tasks/get", {"taskId": "t1", "_meta": META})
    async with app_for(handlers, streams) as http:
        reply = await http.post("/mcp", content=raw, headers=post_headers("tasks/get", "t1"))
    assert reply.status_code == 500 and reply.json()["error"] == {
        "code": INTERNAL_ERROR,
        "message": "Internal error",
    }


async def test_get_without_last_event_id_is_405(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    async with app_for(handlers, streams) as http:
        reply = await http.get("/mcp")
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"


async def test_get_with_a_foreign_cursor_is_400(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    async with app_for(handlers, streams) as http:
        reply = await http.get("/mcp", headers={"last-event-id": "nonsense"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == INVALID_PARAMS


async def test_get_of_a_gone_cursor_is_410(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    tasks.add("t1", "anonymous")
    streams.refuse = events_gone_error("t1", 9)
    async with app_for(handlers, streams) as http:
        reply = await http.get("/mcp", headers={"last-event-id": encode_cursor(5, "t1", 2)})
    assert reply.status_code == 410 and reply.json()["error"]["data"]["earliestSeq"] == 9


async def test_get_of_an_unknown_task_is_404(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    async with app_for(handlers, streams) as http:
        reply = await http.get("/mcp", headers={"last-event-id": encode_cursor(5, "t9", 2)})
    assert reply.status_code == 404


class EchoExtension:
    identifier = "com.example/echo"

    def methods(self) -> dict[str, Any]:
        async def echo(c: Call) -> dict[str, Any]:
            return {"echo": c.params.get("text")}

        return {"echo/say": echo}

    def settings(self) -> dict[str, Any]:
        return {"loud": True}


async def test_an_extension_adds_its_methods_and_declares_itself_in_discover(
    tasks: FakeTasks, streams: FakeStreams
) -> None:
    handlers = MethodHandlers(settings(), tasks, [GREET], streams, [EchoExtension()])
    assert await handlers.dispatch(call("echo/say", {"text": "hi"})) == {
        "echo": "hi",
        "resultType": "complete",
    }
    discovered = await handlers.dispatch(call("server/discover"))
    assert isinstance(discovered, dict)
    assert discovered["capabilities"]["extensions"]["com.example/echo"] == {"loud": True}

"""Every endpoint answers a domain error the same way: one table (bridge/server/errors.py).

A rebalance that races a request raises :class:`NotOwner` wherever the request happens to be;
``POST /mcp`` answered it as the retriable ``partition_moving`` (503, ``Retry-After``), while
``GET /mcp`` and the browser view answered 500. Here a task service (and a stream hub) that
raise each domain error of the table sit behind every endpoint, in process (no broker): the
JSON-RPC error (code, message, ``data.reason``), the HTTP status and ``Retry-After`` must be the
ones the table below says, on each endpoint, before a stream starts and inside a started one.
A JSON-RPC request (``POST /mcp``) answers with the JSON-RPC status (200 for an unknown task, as
MCP says); a request with no JSON-RPC channel (``GET /mcp``, the view) with a status of 400 or
more.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
)
from starlette.applications import Starlette
from starlette.routing import Route

from bridge.config import Settings, load_settings
from bridge.kafka.port import LogError
from bridge.log.fanout import CANCELLED, DRAINING, MOVED, FeedClosed
from bridge.log.indexer import NotOwner
from bridge.metrics import Metrics
from bridge.server.admission import Admission, Caller, Limits, Ticket
from bridge.server.auth import Authenticator
from bridge.server.browser import BrowserView
from bridge.server.cursor import encode_cursor
from bridge.server.errors import wire_error
from bridge.server.events import EventsMethods
from bridge.server.handlers import MethodHandlers
from bridge.server.http import McpHttp
from bridge.server.wire import LATEST_VERSION
from bridge.tasks.service import KafkaUnavailable, TaskNotFound, TaskView, TooManyTasks

TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
META = {
    "io.modelcontextprotocol/protocolVersion": LATEST_VERSION,
    "io.modelcontextprotocol/clientCapabilities": TASKS,
}


@dataclass(frozen=True)
class Expected:
    """What every endpoint must answer for one domain error."""

    code: int
    reason: str | None
    #: The status of a JSON-RPC answer (POST /mcp).
    status: int
    #: The status of a request with no JSON-RPC channel for the error (GET /mcp, the view).
    transport: int

    @property
    def retry_after(self) -> bool:
        return self.transport == 503


#: The table, written out: domain error -> how every endpoint answers it.
TABLE: dict[str, tuple[Any, Expected]] = {
    "not_owner": (lambda: NotOwner(3), Expected(-32603, "partition_moving", 503, 503)),
    "subscription_moved": (
        lambda: FeedClosed("t1", MOVED),
        Expected(-32603, "partition_moving", 503, 503),
    ),
    "task_not_found": (lambda: TaskNotFound(), Expected(-32602, None, 200, 404)),
    "kafka_unavailable": (
        lambda: KafkaUnavailable("t1", 5.0),
        Expected(-32603, "kafka_unavailable", 503, 503),
    ),
    "kafka_error": (
        lambda: KafkaConnectionError("no broker"),
        Expected(-32603, "kafka_unavailable", 503, 503),
    ),
    "kafka_timeout": (
        lambda: KafkaTimeoutError(),
        Expected(-32603, "kafka_unavailable", 503, 503),
    ),
    # aiokafka's own "no broker answered the metadata request": a bare KafkaError.
    "kafka_no_metadata": (
        lambda: KafkaError("Unable to get cluster metadata over all known brokers"),
        Expected(-32603, "kafka_unavailable", 503, 503),
    ),
    # Retrying cannot help: an internal error (the operator must act), never "retry later".
    "kafka_refused": (
        lambda: TopicAuthorizationFailedError(),
        Expected(-32603, None, 500, 500),
    ),
    # The same, met through the log port (bridge.kafka.port): as the client's own error.
    "log_error": (
        lambda: LogError("KafkaTimeoutError: ", retriable=True, kind="KafkaTimeoutError"),
        Expected(-32603, "kafka_unavailable", 503, 503),
    ),
    "log_refused": (
        lambda: LogError("TopicAuthorizationFailedError: ", kind="TopicAuthorizationFailedError"),
        Expected(-32603, None, 500, 500),
    ),
    "subscription_drained": (
        lambda: FeedClosed("t1", DRAINING),
        Expected(-32603, "draining", 503, 503),
    ),
    "subscription_cancelled": (
        lambda: FeedClosed("t1", CANCELLED),
        Expected(-32603, "wait_ended", 503, 503),
    ),
    "too_many_tasks": (lambda: TooManyTasks(3), Expected(-32600, "too_many_tasks", 429, 429)),
}
CASES = pytest.mark.parametrize("case", sorted(TABLE))


def raising(case: str) -> Exception:
    exc: Exception = TABLE[case][0]()
    return exc


class RaisingTasks:
    """The task service: every read raises ``exc`` (or, with ``exc`` None, finds the task)."""

    def __init__(self, exc: Exception | None) -> None:
        self.exc = exc

    async def get(self, task_id: str, principal: str) -> TaskView:
        if self.exc is not None:
            raise self.exc
        return TaskView(task_id, "working", 0, 0, None, None)


class RaisingSource:
    """An Events source (the task events'): every poll raises ``exc``."""

    name = "io.mcpbridge.task.event"

    def __init__(self, exc: Exception | None) -> None:
        self.exc = exc

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name}

    async def poll(self, *args: Any) -> Any:
        raise self.exc or AssertionError("no error to raise")


class RaisingHub:
    """The stream hub: real admission; a started stream raises ``exc`` before any event."""

    def __init__(self, exc: Exception | None = None) -> None:
        self.admission = Admission(Limits(4, 100, 100))
        self.draining = asyncio.Event()
        self.exc = exc

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket:
        return self.admission.admit(caller, task_id, request_id)

    def release(self, ticket: Ticket) -> None:
        self.admission.release(ticket)

    async def check_cursor(self, task_id: str, after: int | None) -> int | None:
        return None

    async def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool = False
    ) -> AsyncIterator[Any]:
        if self.exc is not None:
            raise self.exc
        yield None

    def count_gone(self) -> None:
        pass

    def cancel(self, client: str, request_id: str | int) -> int:
        return self.admission.cancel(client, request_id)


def app(tasks: RaisingTasks, hub: RaisingHub) -> tuple[httpx.AsyncClient, BrowserView]:
    config: Settings = load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}, tool_packs=[])
    events = EventsMethods([RaisingSource(tasks.exc)], streams=hub)  # type: ignore[list-item]
    handlers = MethodHandlers(config, tasks, [], hub, [events])  # type: ignore[arg-type]
    endpoint = McpHttp(config, Authenticator(config.auth), handlers, Metrics(), hub.cancel)
    served = SimpleNamespace(service=tasks, hub=hub, endpoint=endpoint)
    view = BrowserView(config, lambda request: served)  # type: ignore[arg-type,return-value]
    routes = [
        Route("/mcp", endpoint.post, methods=["POST"]),
        Route("/mcp", endpoint.get, methods=["GET"]),
        *view.routes(),
    ]
    transport = httpx.ASGITransport(app=Starlette(routes=routes))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1"), view


def rpc(method: str, params: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": META}}
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": LATEST_VERSION,
        "mcp-method": method,
    }
    if "taskId" in params:
        headers["mcp-name"] = params["taskId"]
    return json.dumps(body).encode(), headers


def last_sse_data(text: str) -> dict[str, Any]:
    datas = [line[len("data:") :].strip() for line in text.splitlines() if line.startswith("data:")]
    assert datas, text
    parsed: dict[str, Any] = json.loads(datas[-1])
    return parsed


def assert_json_rpc(reply: httpx.Response, error: dict[str, Any], status: int, want: Expected):
    assert reply.status_code == status, (reply.status_code, error)
    assert error["code"] == want.code, error
    assert (error.get("data") or {}).get("reason") == want.reason, error
    assert ("retry-after" in reply.headers) == (status == 503), reply.headers


def assert_view(reply: httpx.Response, want: Expected, message: str) -> None:
    body = reply.json()
    assert reply.status_code == want.transport, (reply.status_code, body)
    assert body["error"] == message and body["code"] == want.code, body
    assert body.get("reason") == want.reason, body
    assert ("retry-after" in reply.headers) == want.retry_after, reply.headers


@CASES
async def test_every_endpoint_answers_a_domain_error_before_a_stream_the_same_way(
    case: str,
) -> None:
    want = TABLE[case][1]
    http, view = app(RaisingTasks(raising(case)), RaisingHub())
    token, _ = view.tokens.mint("anonymous", "t1")
    async with http:
        body, headers = rpc("tasks/get", {"taskId": "t1"})
        post = await http.post("/mcp", content=body, headers=headers)
        error = post.json()["error"]
        assert_json_rpc(post, error, want.status, want)
        cursor = {"last-event-id": encode_cursor(7, "t1", 2)}
        get = await http.get("/mcp", headers=cursor)
        assert get.json()["error"] == error  # the same JSON-RPC error...
        assert_json_rpc(get, error, want.transport, want)  # ...with the transport's status
        for path in ("/view/tasks/t1", "/view/tasks/t1/events"):
            assert_view(await http.get(path, params={"token": token}), want, error["message"])
        mint = await http.post("/view/token", json={"taskId": "t1"})
        assert_view(mint, want, error["message"])
        if case != "task_not_found":  # the Events extension has its own code for that (SEP-3415)
            body, headers = rpc("events/poll", {"name": RaisingSource.name, "arguments": {}})
            poll = await http.post("/mcp", content=body, headers=headers)
            assert poll.json()["error"]["message"] == error["message"]
            assert_json_rpc(poll, poll.json()["error"], want.status, want)


@CASES
async def test_every_stream_ends_with_a_domain_error_raised_inside_it_the_same_way(
    case: str,
) -> None:
    want = TABLE[case][1]
    http, view = app(RaisingTasks(None), RaisingHub(raising(case)))
    token, _ = view.tokens.mint("anonymous", "t1")
    async with http:
        body, headers = rpc("tasks/stream", {"taskId": "t1"})
        post = await http.post("/mcp", content=body, headers=headers)
        assert post.status_code == 200  # started: the error is the last event
        error = last_sse_data(post.text)["error"]
        assert error["code"] == want.code and (error.get("data") or {}).get("reason") == want.reason
        events = await http.get("/view/tasks/t1/events", params={"token": token})
        fault = last_sse_data(events.text)
        assert events.status_code == 200 and "event: fault" in events.text, events.text
        assert fault == {"code": want.code, "message": error["message"]} | (
            {"reason": want.reason} if want.reason else {}
        )


@pytest.mark.parametrize(
    "exc",
    [
        NotOwner(3),
        FeedClosed("t1", MOVED),
        FeedClosed("t1", DRAINING),
        FeedClosed("t1", CANCELLED),
        KafkaUnavailable("t1", 5.0),
        KafkaConnectionError("no broker"),
    ],
    ids=repr,
)
def test_every_retriable_answer_has_one_shape(exc: Exception) -> None:
    """``reason`` and ``retryAfterMs`` on every 503; ``taskId`` the task's when one is known,
    left out (never ``""``) when the request named none."""
    named = wire_error(exc, "t1")
    assert named.transport_status == 503 and named.headers == {"Retry-After": "1"}
    assert named.error.data["retryAfterMs"] == 1000 and named.error.data["taskId"] == "t1"
    anonymous = wire_error(exc).error.data
    assert anonymous.get("taskId", "t1") == "t1"  # the closure's or the creation's own, or none

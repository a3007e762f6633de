"""MCP over real HTTP for the tests: requests with the 2026-07-28 routing, and tasks/stream read.

``request`` builds what a correct client sends (``_meta`` with version and capabilities, the
``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` headers); ``call`` and ``result`` post it;
``read_stream`` reads one ``tasks/stream`` to its end (or a number of events) into a
:class:`StreamRead` that another task may watch while it fills. The wire's names and the
routing headers are the conformance suite's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx
from conformance.wire import (
    CLIENT_CAPS,
    CLIENT_CAPS_META,
    EVENT_METHOD,
    PROTOCOL_VERSION_META,
    TASKS_EXTENSION,
    VERSION,
    loads,
    routing_headers,
)

from .sse import sse_events, sse_messages
from .waits import BOUND

__all__ = [
    "CLIENT_CAPS",
    "TASKS_EXTENSION",
    "VERSION",
    "StreamRead",
    "call",
    "cancel",
    "create_task",
    "long_task",
    "meta",
    "read_stream",
    "request",
    "result",
    "routing_headers",
]

_ids = itertools.count(1)


def meta(caps: dict[str, Any] | None = None, version: str = VERSION) -> dict[str, Any]:
    """``params._meta`` of a 2026-07-28 request (no capabilities unless given)."""
    return {PROTOCOL_VERSION_META: version, CLIENT_CAPS_META: caps if caps is not None else {}}


def request(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    caps: dict[str, Any] | None = None,
    request_id: int | None = None,
    **extra_meta: Any,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of one request declaring the tasks extension (or ``caps``)."""
    params = dict(params or {})
    params["_meta"] = {**meta(CLIENT_CAPS if caps is None else caps), **extra_meta}
    body = {"jsonrpc": "2.0", "id": request_id or next(_ids), "method": method, "params": params}
    return routing_headers(method, params), body


async def call(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    """One request; returns the JSON-RPC response message (the last one of an SSE body)."""
    headers, body = request(method, params, **kw)
    reply = await http.post(url, json=body, headers=headers)
    if "text/event-stream" in reply.headers.get("content-type", ""):
        return sse_messages(reply.text)[-1]
    return dict(loads(reply.content))


async def result(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    """The ``result`` of one request (the test fails on an error)."""
    message = await call(http, url, method, params, **kw)
    assert "result" in message, message
    return dict(message["result"])


async def create_task(
    http: httpx.AsyncClient, url: str, tool: str, arguments: dict[str, Any]
) -> str:
    """``tools/call`` that must answer with a task; its id."""
    created = await result(http, url, "tools/call", {"name": tool, "arguments": arguments})
    assert created["resultType"] == "task", created
    return str(created["taskId"])


async def long_task(url: str, label: str = "long") -> str:
    """A ``slow_compute`` task of two minutes: working (and reporting progress) until cancelled."""
    async with httpx.AsyncClient(timeout=BOUND) as http:
        return await create_task(http, url, "slow_compute", {"seconds": 120, "label": label})


async def cancel(url: str, task_id: str) -> None:
    """``tasks/cancel``, which must succeed."""
    async with httpx.AsyncClient(timeout=BOUND) as http:
        done = await result(http, url, "tasks/cancel", {"taskId": task_id})
    assert done == {"resultType": "complete"}, done


@dataclass
class StreamRead:
    """What one ``tasks/stream`` delivered so far; filled while the stream is read."""

    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    #: The SSE id of each event of :attr:`events`.
    ids: list[str | None] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def seqs(self) -> list[int]:
        return [event["seq"] for event in self.events]

    @property
    def keepalives(self) -> int:
        return sum(1 for comment in self.comments if comment.strip() == "keep-alive")

    def take(self, message: dict[str, Any], sse_id: str | None) -> None:
        if message.get("method") == EVENT_METHOD:
            self.events.append(message["params"])
            self.ids.append(sse_id)
        elif "result" in message:
            self.result = message["result"]
        elif "error" in message:
            self.error = message["error"]


async def read_stream(
    url: str,
    task_id: str,
    after: int | None = None,
    *,
    stop_after: int | None = None,
    into: StreamRead | None = None,
) -> StreamRead:
    """Open ``tasks/stream`` and read it to its end; ``stop_after`` closes it after that many
    events. ``into`` is filled as the stream is read (for a task watching it meanwhile)."""
    params: dict[str, Any] = {"taskId": task_id}
    if after is not None:
        params["after"] = after
    headers, body = request("tasks/stream", params)
    out = StreamRead() if into is None else into
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(BOUND)) as http,
        http.stream("POST", url, json=body, headers=headers) as reply,
    ):
        out.status = reply.status_code
        async for event in sse_events(reply, out.comments):
            out.take(loads(event.data), event.id)
            if stop_after is not None and len(out.events) >= stop_after:
                break
    return out

"""Every long-lived response takes a slot of the one admission, and gives it back.

One bridge in this process over the in-memory log (uvicorn, auth mode ``none``, so every request of this test is the
one client ``anonymous@127.0.0.1``) with a budget of two streams per client. For each kind of
long-lived response (``tasks/stream``, its ``GET`` resume, ``subscriptions/listen``,
``events/stream``, a ``tools/call`` streaming its progress, the browser view's EventSource
endpoint) two are opened, a third is refused with ``too_many_streams`` (HTTP 429, ``-32600``),
and once the client has closed them every slot is back: two open again. Kinds share the budget:
a listen and an events/stream leave no room for a tasks/stream.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conformance.wire import loads
from support.inmemory import NO_BROKER, memory_log
from support.layout import fresh_prefix, make_settings
from support.mcp import CLIENT_CAPS, meta, request, routing_headers
from support.sse import sse_events
from support.waits import BOUND, wait_until
from test_canary import Served, serving

from bridge.log.publisher import TaskEventPublisher
from bridge.server.wire import INVALID_REQUEST

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMIT = 2
TASK_EVENT = "io.mcpbridge.task.event"

#: Opens one long-lived response on ``http``; yields the status once its headers are in.
Opener = Callable[[httpx.AsyncClient, str], contextlib.AbstractAsyncContextManager[httpx.Response]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[Served]:
    settings = make_settings(
        NO_BROKER, fresh_prefix("slots"), streams={"max_per_principal": LIMIT, "keepalive_s": 1}
    )
    sock = socket.create_server(("127.0.0.1", 0))
    async with serving(settings, sock, log=memory_log(settings)) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def task_id(served: Served) -> str:
    """A task that stays working (no worker runs): its streams stay open."""
    async with httpx.AsyncClient(timeout=BOUND) as http:
        headers, body = request("tools/call", {"name": "slow_compute", "arguments": {}})
        reply = await http.post(f"{served.base}/mcp", json=body, headers=headers)
        return str(loads(reply.content)["result"]["taskId"])


@contextlib.asynccontextmanager
async def post_stream(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], **kw: Any
) -> AsyncIterator[httpx.Response]:
    headers, body = request(method, params, **kw)
    async with http.stream("POST", url, json=body, headers=headers) as reply:
        yield reply


def opener(served: Served, task_id: str, kind: str) -> Opener:
    """How to open one response of ``kind`` on the served bridge."""
    mcp = f"{served.base}/mcp"

    @contextlib.asynccontextmanager
    async def tasks_stream(http: httpx.AsyncClient, _: str) -> AsyncIterator[httpx.Response]:
        async with post_stream(http, mcp, "tasks/stream", {"taskId": task_id}) as reply:
            yield reply

    @contextlib.asynccontextmanager
    async def resume(http: httpx.AsyncClient, cursor: str) -> AsyncIterator[httpx.Response]:
        async with http.stream("GET", mcp, headers={"Last-Event-ID": cursor}) as reply:
            yield reply

    @contextlib.asynccontextmanager
    async def listen(http: httpx.AsyncClient, _: str) -> AsyncIterator[httpx.Response]:
        params = {"notifications": {"taskIds": [task_id]}}
        async with post_stream(http, mcp, "subscriptions/listen", params) as reply:
            yield reply

    @contextlib.asynccontextmanager
    async def events_stream(http: httpx.AsyncClient, _: str) -> AsyncIterator[httpx.Response]:
        params = {"name": TASK_EVENT, "arguments": {"taskId": task_id}}
        async with post_stream(http, mcp, "events/stream", params) as reply:
            yield reply

    @contextlib.asynccontextmanager
    async def progress_call(http: httpx.AsyncClient, _: str) -> AsyncIterator[httpx.Response]:
        # Without the tasks extension declared, slow_compute runs as a direct call; with a
        # progress token and SSE accepted, its answer streams (no worker: it stays open).
        params = {"name": "slow_compute", "arguments": {}}
        async with post_stream(http, mcp, "tools/call", params, caps={}, progressToken=1) as reply:
            yield reply

    @contextlib.asynccontextmanager
    async def view(http: httpx.AsyncClient, token: str) -> AsyncIterator[httpx.Response]:
        url = f"{served.base}/view/tasks/{task_id}/events"
        async with http.stream("GET", url, params={"token": token}) as reply:
            yield reply

    return {
        "tasks/stream": tasks_stream,
        "GET resume": resume,
        "subscriptions/listen": listen,
        "events/stream": events_stream,
        "tools/call with progress": progress_call,
        "view EventSource": view,
    }[kind]


async def credential(served: Served, task_id: str, kind: str) -> str:
    """What the opener needs besides the task: a stream cursor, a view token, or nothing."""
    async with httpx.AsyncClient(timeout=BOUND) as http:
        if kind == "GET resume":
            async with post_stream(
                http, f"{served.base}/mcp", "tasks/stream", {"taskId": task_id}
            ) as reply:
                async for event in sse_events(reply):
                    assert event.id, event
                    return event.id  # the task.created event's cursor (seq 0)
        if kind == "view EventSource":
            reply = await http.post(f"{served.base}/view/token", json={"taskId": task_id})
            return str(reply.json()["token"])
    return ""


async def refused_as_too_many_streams(kind: str, reply: httpx.Response) -> bool:
    assert reply.status_code == 429, (kind, reply.status_code)  # before reading: it may stream
    message = loads(await reply.aread())
    if kind == "view EventSource":  # plain JSON problems, no JSON-RPC
        return bool(message["reason"] == "too_many_streams")
    error = message["error"]
    return bool(error["code"] == INVALID_REQUEST and error["data"]["reason"] == "too_many_streams")


async def slots_back(served: Served) -> None:
    hub = served.components.hub
    await wait_until(lambda: hub.admission.active == 0, what="every slot given back")


async def open_all(
    stack: contextlib.AsyncExitStack, http: httpx.AsyncClient, open_one: Opener, arg: str
) -> None:
    for _ in range(LIMIT):
        reply = await stack.enter_async_context(open_one(http, arg))
        assert reply.status_code == 200, await reply.aread()


KINDS = [
    "tasks/stream",
    "GET resume",
    "subscriptions/listen",
    "events/stream",
    "tools/call with progress",
    "view EventSource",
]


@pytest.mark.parametrize("kind", KINDS)
async def test_each_long_lived_response_is_limited_and_its_slots_come_back(
    served: Served, task_id: str, kind: str
) -> None:
    await slots_back(served)  # from any earlier case
    arg = await credential(served, task_id, kind)
    open_one = opener(served, task_id, kind)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        async with contextlib.AsyncExitStack() as stack:
            await open_all(stack, http, open_one, arg)
            assert served.components.hub.admission.active == LIMIT
            async with open_one(http, arg) as extra:
                assert await refused_as_too_many_streams(kind, extra)
        await slots_back(served)  # closed by the client: every slot is back
        async with contextlib.AsyncExitStack() as stack:
            await open_all(stack, http, open_one, arg)  # and two open again
    await slots_back(served)


async def test_kinds_share_one_budget(served: Served, task_id: str) -> None:
    await slots_back(served)
    async with httpx.AsyncClient(timeout=BOUND) as http, contextlib.AsyncExitStack() as stack:
        for kind in ("events/stream", "tools/call with progress"):
            reply = await stack.enter_async_context(opener(served, task_id, kind)(http, ""))
            assert reply.status_code == 200
        async with opener(served, task_id, "tasks/stream")(http, "") as extra:
            assert await refused_as_too_many_streams("tasks/stream", extra)
    await slots_back(served)


async def test_a_refused_events_stream_gives_its_slot_back(served: Served) -> None:
    await slots_back(served)
    params = {"name": TASK_EVENT, "arguments": {"taskId": "no-such-task"}}
    url = f"{served.base}/mcp"
    async with (
        httpx.AsyncClient(timeout=BOUND) as http,
        post_stream(http, url, "events/stream", params) as reply,
    ):
        assert "error" in loads(await reply.aread())
    assert served.components.hub.admission.active == 0


async def test_slots_come_back_when_streams_end_by_themselves(served: Served) -> None:
    """tasks/stream, events/stream and the view of a completed task end after its last event."""
    await slots_back(served)
    ended = await _completed_task(served)
    token = await credential(served, ended, "view EventSource")
    async with httpx.AsyncClient(timeout=BOUND) as http:
        for kind in ("tasks/stream", "events/stream", "view EventSource"):
            async with opener(served, ended, kind)(http, token) as reply:
                assert reply.status_code == 200
                text = (await reply.aread()).decode()
            assert ('"result"' in text) or ("event: end" in text), (kind, text)
            await slots_back(served)


async def test_slots_come_back_when_requests_are_cancelled(served: Served, task_id: str) -> None:
    """``notifications/cancelled`` ends a tasks/stream and a listen without a response."""
    await slots_back(served)
    mcp = f"{served.base}/mcp"
    streams = {
        9001: ("tasks/stream", {"taskId": task_id}),
        9002: ("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}),
    }
    async with httpx.AsyncClient(timeout=BOUND) as http, contextlib.AsyncExitStack() as stack:
        replies = []
        for request_id, (method, params) in streams.items():
            replies.append(
                await stack.enter_async_context(
                    post_stream(http, mcp, method, params, request_id=request_id)
                )
            )
        assert served.components.hub.admission.active == len(streams)
        async with httpx.AsyncClient(timeout=BOUND) as other:  # the stream holds its connection
            for request_id in streams:
                await _cancel(other, mcp, request_id)
        for reply in replies:
            assert '"result"' not in (await reply.aread()).decode()
    await slots_back(served)


async def _completed_task(served: Served) -> str:
    async with httpx.AsyncClient(timeout=BOUND) as http:
        headers, body = request("tools/call", {"name": "slow_compute", "arguments": {}})
        reply = await http.post(f"{served.base}/mcp", json=body, headers=headers)
        ended = str(loads(reply.content)["result"]["taskId"])
    status = f"{served.settings.tasks.event_type_prefix}.task.status"
    async with TaskEventPublisher(served.settings, log=served.log) as publisher:
        await publisher.publish(ended, status, {"status": "completed"})
    return ended


async def _cancel(http: httpx.AsyncClient, url: str, request_id: int) -> None:
    params = {"requestId": request_id, "_meta": meta(CLIENT_CAPS)}
    message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
    reply = await http.post(
        url, json=message, headers=routing_headers("notifications/cancelled", params)
    )
    assert reply.status_code == 202, reply.text

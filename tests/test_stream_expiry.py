"""Every long-lived stream ends when the credential it was opened with expires (issue 26,
item 7): the caller carries its credential's expiry (a JWT's ``exp``, a view token's expiry,
``auth.bearer_ttl_s`` for static tokens when set) and ``SseResponse``, which every stream is,
ends the body at that time: no result, a ``: credential expired`` comment (an ``expired``
event on the browser view), and the client resumes with its cursor and a fresh credential.

First without Kafka (the authenticator, the response, a forwarded stream), then a real bridge
in this process on the real broker: tasks/stream, the GET resume, subscriptions/listen,
events/stream and the view's event stream opened with short-lived credentials. No sleeps:
each end is awaited with a bound, and tokens live a few seconds.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import jwt
import pytest
import uvicorn
from conformance.wire import loads
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support.layout import create_served_topics, fresh_prefix, make_settings
from support.mcp import StreamRead, request
from support.sse import sse_events
from support.waits import BOUND, wait_until

from bridge.config import Settings, load_settings
from bridge.log.publisher import TaskEventPublisher
from bridge.metrics import Metrics
from bridge.server.app import create_app
from bridge.server.auth import Authenticator, Identity
from bridge.server.browser import ViewTokens
from bridge.server.handlers import MethodHandlers, Streamed
from bridge.server.http import CREDENTIAL_EXPIRED, McpHttp, RawEndpoint, SseResponse
from bridge.server.peers import Forwarded
from bridge.server.wire import EventBatch
from bridge.server.wire import sse_events as render_events

SECRET = "s" * 64
AUDIENCE, ISSUER = "mcp-kafka-bridge-tests", "https://issuer.example"
JWT_AUTH = {
    "mode": "jwt",
    "jwt_algorithms": ["HS256"],
    "jwt_secret": SECRET,
    "jwt_audience": AUDIENCE,
    "jwt_issuer": ISSUER,
}


def token(principal: str = "alice", lifetime_s: float = 3600) -> str:
    claims = {
        "sub": principal,
        "aud": AUDIENCE,
        "iss": ISSUER,
        "exp": int(time.time() + lifetime_s),
    }
    return jwt.encode(claims, SECRET, algorithm="HS256")


def scope_request(authorization: str | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": headers})


# --- the credential's expiry -----------------------------------------------------------------


def test_a_jwt_identity_expires_at_its_exp_claim():
    auth = Authenticator(load_settings(auth=JWT_AUTH).auth)
    exp = int(time.time()) + 600
    claims = {"sub": "alice", "aud": AUDIENCE, "iss": ISSUER, "exp": exp}
    credential = jwt.encode(claims, SECRET, algorithm="HS256")
    assert auth.identify(scope_request(f"Bearer {credential}")) == Identity("alice", exp)


def test_a_static_token_expires_only_when_configured():
    tokens = {"tok-a": "alice"}
    forever = Authenticator(load_settings(auth={"mode": "bearer", "tokens": tokens}).auth)
    assert forever.identify(scope_request("Bearer tok-a")) == Identity("alice", None)
    limited = load_settings(auth={"mode": "bearer", "tokens": tokens, "bearer_ttl_s": 300}).auth
    ttl = Authenticator(limited, clock=lambda: 1000.0)
    assert ttl.identify(scope_request("Bearer tok-a")) == Identity("alice", 1300.0)


def test_anonymous_callers_never_expire():
    auth = Authenticator(load_settings().auth)
    assert auth.identify(scope_request(None)) == Identity("anonymous", None)


# --- SseResponse ends at the expiry ----------------------------------------------------------


class Outcome:
    """One stream's messages: one event at once, then nothing until it is closed."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()  # on_close ran
        self.finalised = asyncio.Event()  # the messages' generator ran its finally
        self.more: asyncio.Queue[Any] = asyncio.Queue()

    async def messages(self) -> AsyncIterator[Any]:
        try:
            yield EventBatch(render_events("c-", [0], ['{"n":0}']))
            while (item := await self.more.get()) is not None:
                yield item
        finally:
            self.finalised.set()


@asynccontextmanager
async def sse_server(expires: float | None) -> AsyncIterator[tuple[str, list[Outcome]]]:
    outcomes: list[Outcome] = []

    async def endpoint(req: Request) -> Response:
        outcome = Outcome()
        outcomes.append(outcome)
        streamed = Streamed(outcome.messages(), 7, on_close=outcome.closed.set)
        return SseResponse(streamed, 7, expires=expires)

    app = Starlette(routes=[Route("/s", RawEndpoint(endpoint), methods=["GET"])])
    async with serving_app(app) as base:
        yield f"{base}/s", outcomes


@asynccontextmanager
async def serving_app(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn in this event loop (its lifespan run), at the yielded base URL."""
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    sock = socket.create_server(("127.0.0.1", 0))
    running = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or running.done(), what="serving", poll_s=0.05)
        assert not running.done(), "the server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(BOUND):
            await running
        sock.close()


async def read_all(url: str, method: str = "GET", **kwargs: Any) -> tuple[int, bytes]:
    async with (
        httpx.AsyncClient(timeout=BOUND) as http,
        http.stream(method, url, **kwargs) as reply,
    ):
        return reply.status_code, b"".join([chunk async for chunk in reply.aiter_raw()])


async def test_an_idle_stream_ends_when_its_credential_expires():
    async with sse_server(expires=time.time() + 0.5) as (url, outcomes):
        async with asyncio.timeout(BOUND):
            status, body = await read_all(url)
            await outcomes[0].closed.wait()
    assert status == 200
    assert body.startswith(b"id: c-0") and body.endswith(CREDENTIAL_EXPIRED)
    assert b"result" not in body and b"error" not in body  # no result: the client resumes
    assert outcomes[0].finalised.is_set()  # its cleanup ran: the slot is given back


async def test_a_stream_opened_at_its_expiry_ends_at_once():
    async with sse_server(expires=time.time() - 1) as (url, outcomes):
        async with asyncio.timeout(BOUND):
            _, body = await read_all(url)
            await outcomes[0].closed.wait()
    assert body.endswith(CREDENTIAL_EXPIRED)


async def test_a_stream_that_ends_first_is_not_cut():
    async with sse_server(expires=time.time() + 3600) as (url, outcomes):
        async with asyncio.timeout(BOUND):
            reading = asyncio.create_task(read_all(url))
            await wait_until(lambda: outcomes, what="the stream opened", poll_s=0.01)
            outcomes[0].more.put_nowait(None)  # the messages end on their own
            _, body = await reading
    assert body.startswith(b"id: c-0") and CREDENTIAL_EXPIRED not in body


async def test_a_forwarded_stream_ends_when_the_callers_credential_expires():
    """The owner replica knows only the principal the hop vouches for: the replica that
    checked the credential ends the stream it passes on."""
    closed = asyncio.Event()

    async def owner_stream() -> AsyncIterator[bytes]:
        yield b"id: c-0\nevent: message\ndata: {}\n\n"
        await asyncio.Event().wait()  # the owner's stream goes on

    async def close() -> None:
        closed.set()

    class Routing:
        async def where(self, task_id: str) -> str:
            return "http://owner.invalid"

    class Peers:
        async def forward(self, *args: Any, **kwargs: Any) -> Forwarded:
            headers = {"content-type": "text/event-stream"}
            return Forwarded(200, headers, owner_stream(), close, None)

    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"}, tool_packs=[], auth=JWT_AUTH
    )
    handlers = MethodHandlers(settings, None, [], None)  # type: ignore[arg-type]  # not reached
    endpoint = McpHttp(
        settings,
        Authenticator(settings.auth),
        handlers,
        Metrics(),
        lambda *_: 0,
        routing=Routing(),  # type: ignore[arg-type]
        peers=Peers(),  # type: ignore[arg-type]
    )
    app = Starlette(routes=[Route("/mcp", RawEndpoint(endpoint.post), methods=["POST"])])
    headers, body = request("tasks/stream", {"taskId": "task-elsewhere"})
    headers["authorization"] = f"Bearer {token(lifetime_s=2)}"
    async with serving_app(app) as base:
        async with asyncio.timeout(BOUND):
            status, sent = await read_all(f"{base}/mcp", "POST", json=body, headers=headers)
            await closed.wait()  # the hop to the owner is closed too
    assert status == 200
    assert sent.startswith(b"id: c-0") and sent.endswith(CREDENTIAL_EXPIRED)


# --- a real bridge ---------------------------------------------------------------------------

VIEW_SECRET = "v" * 32


@asynccontextmanager
async def jwt_bridge(kafka_bootstrap: str) -> AsyncIterator[tuple[Settings, str]]:
    settings = make_settings(
        kafka_bootstrap,
        fresh_prefix("x"),
        auth=JWT_AUTH,
        view={"token_secret": VIEW_SECRET},
        streams={"keepalive_s": 0.5},
    )
    create_served_topics(settings)
    async with serving_app(create_app(settings)) as base:
        yield settings, base


def as_(credential: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"authorization": f"Bearer {credential}"})


async def start_task(base: str) -> str:
    headers, body = request(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 120, "label": "x"}}
    )
    async with as_(token()) as http:
        reply = await http.post(f"{base}/mcp", json=body, headers=headers)
    created = reply.json()["result"]
    assert created["resultType"] == "task", created
    return str(created["taskId"])


async def read_mcp(
    http: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> tuple[StreamRead, list[dict[str, Any]]]:
    """A whole SSE response of /mcp: tasks/stream's view of it, and every message."""
    out, messages = StreamRead(), []
    async with http.stream(method, url, **kwargs) as reply:
        out.status = reply.status_code
        async for event in sse_events(reply, out.comments):
            message = loads(event.data)
            messages.append(message)
            out.take(message, event.id)
    return out, messages


def mcp(method: str, params: dict[str, Any]) -> dict[str, Any]:
    headers, body = request(method, params)
    return {"json": body, "headers": headers}


@pytest.mark.kafka
async def test_every_stream_kind_ends_when_its_credential_expires_and_resumes_with_its_cursor(
    kafka_bootstrap: str,
) -> None:
    async with jwt_bridge(kafka_bootstrap) as (settings, base):
        task = await start_task(base)
        url = f"{base}/mcp"
        async with as_(token()) as http:  # a long-lived credential: a cursor to resume from
            first, _ = await read_mcp_first(http, url, task)
        cursor = first.ids[0]
        assert cursor is not None

        # Each kind opened with a credential that lives a few seconds.
        view = ViewTokens(VIEW_SECRET.encode(), 10, clock=lambda: time.time() - 7)
        view_token, _ = view.mint("alice", task)
        async with as_(token(lifetime_s=4)) as http, asyncio.timeout(BOUND):
            stream, listen, events, resumed, page = await asyncio.gather(
                read_mcp(http, "POST", url, **mcp("tasks/stream", {"taskId": task})),
                read_mcp(
                    http,
                    "POST",
                    url,
                    **mcp("subscriptions/listen", {"notifications": {"taskIds": [task]}}),
                ),
                read_mcp(
                    http,
                    "POST",
                    url,
                    **mcp(
                        "events/stream",
                        {"name": "io.mcpbridge.task.event", "arguments": {"taskId": task}},
                    ),
                ),
                read_mcp(http, "GET", url, headers={"last-event-id": cursor}),
                read_all(f"{base}/view/tasks/{task}/events?token={view_token}"),
            )
        for name, (read, messages) in {
            "tasks/stream": stream,
            "listen": listen,
            "events/stream": events,
            "GET resume": resumed,
        }.items():
            assert read.status == 200, name
            assert messages or read.keepalives, name  # it was open: it had sent something
            assert read.result is None and read.error is None, (name, messages[-1])
            assert not any("result" in m or "error" in m for m in messages), name
            assert read.comments[-1].strip() == "credential expired", (name, read.comments)
        status, body = page
        assert status == 200 and body.startswith(b"retry: ")
        last_event = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        assert last_event.startswith(b"event: expired\ndata: "), body  # the page stops there
        assert b"event: end" not in body

        # The client authenticates again and resumes with its cursor: nothing is lost.
        last = stream[0].seqs[-1]
        async with TaskEventPublisher(settings) as pub:
            await pub.publish(task, "com.example.step", {"i": 1})
        async with as_(token()) as http:
            again, _ = await read_mcp_first(http, url, task, after=last)
        assert again.seqs == [last + 1]


async def read_mcp_first(
    http: httpx.AsyncClient, url: str, task: str, after: int | None = None
) -> tuple[StreamRead, None]:
    """The first event of ``task``'s stream (after ``after``), then the stream is closed."""
    params: dict[str, Any] = {"taskId": task}
    if after is not None:
        params["after"] = after
    out = StreamRead()
    async with http.stream("POST", url, **mcp("tasks/stream", params)) as reply:
        out.status = reply.status_code
        async for event in sse_events(reply, out.comments):
            out.take(loads(event.data), event.id)
            if out.events:
                break
    return out, None

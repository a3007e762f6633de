"""bridge.server.http.SseResponse over real HTTP (uvicorn, both parsers): how a stream ends.

An idle stream whose client leaves is ended at once (its ``on_close`` runs and its messages are
closed), a finished one sends its last event and ends the chunked body, and an error inside the
messages becomes the last event. A fake outcome stands in for tasks/stream: what is tested is
the response, not the hub.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bridge.server.handlers import Streamed
from bridge.server.http import RawEndpoint, SseResponse, _sse_error
from bridge.server.routing import owner_unavailable_error
from bridge.server.runner import AppServer
from bridge.server.wire import EventBatch, Frame, RpcError, sse_events

BOUND = 30.0


class Outcome:
    """One stream's messages: ``first`` at once, then whatever ``more`` is given."""

    def __init__(self, fail: bool = False) -> None:
        self.more: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = asyncio.Event()  # on_close ran
        self.finalised = asyncio.Event()  # the messages' generator ran its finally
        self.fail = fail

    async def messages(self) -> AsyncIterator[Any]:
        try:
            yield EventBatch(sse_events("c-", [0], ['{"n":0}']))
            while (item := await self.more.get()) is not None:
                yield item
            if self.fail:
                raise RpcError(-32603, "broke off")
        finally:
            self.finalised.set()

    def streamed(self) -> Streamed:
        return Streamed(self.messages(), 7, on_close=self.closed.set)


@pytest.fixture(params=["h11", "httptools"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[Outcome]]]:
    outcomes: list[Outcome] = []

    async def endpoint(req: Request) -> Response:
        outcome = Outcome(fail=req.query_params.get("fail") == "1")
        outcomes.append(outcome)
        return SseResponse(outcome.streamed(), 7)

    app = Starlette(routes=[Route("/s", RawEndpoint(endpoint), methods=["POST", "GET"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = AppServer(
        app, sock=sock, log_level="warning", access_log=False, http=request.param,
        handle_signals=False,
    )  # fmt: skip
    async with asyncio.timeout(BOUND):
        await server.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/s", outcomes
    finally:
        await server.close()


async def test_a_client_leaving_an_idle_stream_ends_it_at_once(served):
    url, outcomes = served
    async with asyncio.timeout(BOUND):
        async with httpx.AsyncClient() as http, http.stream("POST", url, content=b"{}") as reply:
            assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
            assert reply.headers["cache-control"] == "no-cache"
            chunks = reply.aiter_raw()
            assert await anext(chunks) == b'id: c-0\nevent: message\ndata: {"n":0}\n\n'
            assert not outcomes[0].closed.is_set()  # idle, open
        # The client has closed the connection: nothing is written to notice it by.
        await outcomes[0].closed.wait()
        await outcomes[0].finalised.wait()


async def test_a_get_stream_waits_past_its_empty_request_body_for_the_disconnect(served):
    url, outcomes = served
    async with asyncio.timeout(BOUND):
        async with httpx.AsyncClient() as http, http.stream("GET", url) as reply:
            chunks = reply.aiter_raw()
            await anext(chunks)
            await outcomes[0].more.put(Frame(None, "c-1", '{"n":1}'))
            assert b"c-1" in await anext(chunks)  # still open after the empty request body
        await outcomes[0].closed.wait()


async def test_a_finished_stream_sends_everything_and_ends_its_body(served):
    url, outcomes = served
    async with asyncio.timeout(BOUND):
        async with httpx.AsyncClient() as http, http.stream("POST", url, content=b"{}") as reply:
            chunks = reply.aiter_raw()
            await anext(chunks)
            await outcomes[0].more.put({"jsonrpc": "2.0", "id": 7, "result": {}})
            await outcomes[0].more.put(None)  # the end
            rest = b"".join([chunk async for chunk in chunks])
    assert rest == b'event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{}}\n\n'
    assert outcomes[0].closed.is_set()


async def test_an_error_inside_the_messages_is_the_last_event(served):
    url, outcomes = served
    async with asyncio.timeout(BOUND):
        async with (
            httpx.AsyncClient() as http,
            http.stream("POST", url + "?fail=1", content=b"{}") as reply,
        ):
            chunks = reply.aiter_raw()
            await anext(chunks)
            await outcomes[0].more.put(None)
            rest = b"".join([chunk async for chunk in chunks])
    assert b'"id":7,"error":{"code":-32603,"message":"broke off"}' in rest
    assert outcomes[0].closed.is_set()


def test_a_retriable_error_event_tells_an_event_source_when_to_reconnect() -> None:
    """Issue 30: a stream's retriable error answers its request's id, and SSE's ``retry``
    field carries the wait ``Retry-After`` would (an EventSource honours it); a final error
    has no ``retry``."""
    retriable = _sse_error(7, owner_unavailable_error(12))
    assert retriable.startswith(b"retry: 12000\nevent: message\ndata: ")
    assert b'"id":7' in retriable and b'"retryAfterMs":12000' in retriable
    final = _sse_error("r-1", RpcError(-32602, "no such task"))
    assert final.startswith(b"event: message\n") and b'"id":"r-1"' in final

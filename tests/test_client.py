"""bridge.client against a real HTTP server that answers tasks/stream with plain JSON.

A server may answer tasks/stream with one ``application/json`` JSON-RPC response instead of an
SSE stream (for example ``{}`` at once for a finished task with nothing after the cursor). The
server here is a tiny Starlette app under uvicorn on a real socket: what matters is the
client's reading of the reply, not the bridge behind it.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bridge.client import (
    EventsGone,
    MemoryCursorStore,
    SseDataParser,
    StreamError,
    TaskStreamClient,
    _split_lines,
    _sse_lines,
    _sse_messages,
)
from bridge.vocabulary import EVENTS_GONE

BOUND = 20  # seconds any single wait may take before the test fails
TASK = "task-1"

#: Builds the reply to the n-th tasks/stream request (0-based) from its JSON-RPC body.
Answer = Callable[[int, dict[str, Any]], Response]


class FakeServer:
    """Answers every POST with ``answer``; keeps the JSON-RPC bodies it received."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    async def post(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        return self.answer(len(self.requests) - 1, body)


@asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[FakeServer]:
    """``answer`` served by uvicorn in this event loop on a socket listening before we return."""
    fake = FakeServer(answer)
    app = Starlette(routes=[Route("/mcp", fake.post, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    sock = socket.create_server(("127.0.0.1", 0))
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    running = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield fake
    finally:
        server.should_exit = True
        async with asyncio.timeout(BOUND):
            await running
        sock.close()


def json_reply(body: dict[str, Any], message: dict[str, Any]) -> Response:
    return JSONResponse({"jsonrpc": "2.0", "id": body["id"], **message})


def sse_events_then_drop(body: dict[str, Any], seqs: range) -> Response:
    """Events ``seqs`` as SSE, then the body ends without the request's result (a drop)."""
    lines = []
    for seq in seqs:
        params = {"taskId": TASK, "seq": seq, "type": "com.example.e", "payload": {"n": seq}}
        note = {"jsonrpc": "2.0", "method": "notifications/tasks/event", "params": params}
        lines.append(f"event: message\ndata: {json.dumps(note)}\n\n")
    return Response("".join(lines), media_type="text/event-stream")


def client_of(fake: FakeServer, **options: Any) -> TaskStreamClient:
    # No reconnect budget to speak of: a reply taken for a drop fails the test at once.
    return TaskStreamClient(
        fake.url, store=MemoryCursorStore(), max_reconnects=2, backoff_s=0, **options
    )


async def seqs_of(client: TaskStreamClient, after: int | None = None) -> list[int]:
    async with asyncio.timeout(BOUND):
        return [event.seq async for event in client.stream(TASK, after)]


async def test_a_plain_json_empty_result_ends_the_stream_without_reconnecting() -> None:
    async with serving(lambda n, body: json_reply(body, {"result": {}})) as fake:
        client = client_of(fake)
        assert await seqs_of(client, after=4) == []
    assert client.reconnects == 0
    assert len(fake.requests) == 1
    assert fake.requests[0]["params"]["after"] == 4


async def test_a_resume_answered_with_plain_json_ends_after_the_events_already_delivered() -> None:
    def answer(n: int, body: dict[str, Any]) -> Response:
        if n == 0:
            return sse_events_then_drop(body, range(3))
        return json_reply(body, {"result": {}})

    async with serving(answer) as fake:
        client = client_of(fake)
        assert await seqs_of(client) == [0, 1, 2]
    assert client.reconnects == 1
    assert [r["params"].get("after") for r in fake.requests] == [None, 2]
    assert client.store.load(TASK) == 2


async def test_a_plain_json_events_gone_error_raises_events_gone_with_the_earliest_seq() -> None:
    data = {"reason": "events_gone", "taskId": TASK, "earliestSeq": 7}
    gone = {"code": EVENTS_GONE, "message": "Task events are no longer available", "data": data}

    async with serving(lambda n, body: json_reply(body, {"error": gone})) as fake:
        client = client_of(fake)
        with pytest.raises(EventsGone) as raised:
            await seqs_of(client, after=1)
    assert raised.value.earliest_seq == 7
    assert client.reconnects == 0


async def test_a_plain_json_error_is_raised_as_a_stream_error_without_reconnecting() -> None:
    refused = {"code": -32602, "message": "unknown task", "data": {"taskId": TASK}}

    async with serving(lambda n, body: json_reply(body, {"error": refused})) as fake:
        client = client_of(fake)
        with pytest.raises(StreamError) as raised:
            await seqs_of(client)
    assert (raised.value.code, raised.value.data) == (-32602, {"taskId": TASK})
    assert client.reconnects == 0
    assert len(fake.requests) == 1


# The SSE parsing rules of the WHATWG HTML standard (9.2.6, "Interpreting an event stream").


def sse_data(text: str) -> list[str]:
    return SseDataParser().feed_lines(_split_lines(text)[:-1])


def test_exactly_one_space_after_the_colon_is_dropped_from_a_data_value() -> None:
    assert sse_data("data:  two spaces\n\ndata:none\n\ndata: one\n\n") == [
        " two spaces",
        "none",
        "one",
    ]


def test_data_lines_are_joined_with_line_feeds_and_a_bare_data_field_is_an_empty_line() -> None:
    assert sse_data("data: a\ndata\ndata: b\n\n") == ["a\n\nb"]


def test_comments_other_fields_and_names_with_spaces_do_not_change_the_data() -> None:
    text = ": comment\nevent: x\nid: 7\nretry: 10\ndata : not data\ndata: kept\n\n"
    assert sse_data(text) == ["kept"]


def test_an_event_without_data_lines_is_not_dispatched_but_a_bare_data_field_is() -> None:
    assert sse_data("event: x\n\n\n\ndata\n\n") == [""]


def test_cr_lf_and_crlf_all_end_lines_and_other_unicode_breaks_do_not() -> None:
    assert sse_data("data: a\r\rdata: b\r\n\r\ndata: c\u2028d\n\n") == ["a", "b", "c\u2028d"]


def test_an_event_the_stream_ends_in_the_middle_of_is_discarded() -> None:
    assert sse_data("data: done\n\ndata: half") == ["done"]
    assert sse_data("data: done\n\ndata: half\n") == ["done"]


async def test_the_streaming_parser_keeps_a_payload_s_leading_spaces_and_drops_a_cut_event() -> (
    None
):
    body = 'data: {"a":\ndata:  " x"}\n\ndata: {"cut": 1}\n'
    reply = httpx.Response(
        200, content=body.encode(), headers={"content-type": "text/event-stream"}
    )
    assert [message async for message in _sse_messages(reply)] == [{"a": " x"}]


# --- SSE lines: CRLF, LF or CR only ----------------------------------------------------------


def _lines_read(chunks: list[bytes]) -> list[str]:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def read() -> list[str]:
        return [line async for line in _sse_lines(httpx.Response(200, content=body()))]

    return asyncio.run(read())


def test_an_event_whose_json_holds_a_raw_line_separator_reaches_the_client_whole() -> None:
    # The wire writes U+2028 and U+0085 raw inside JSON strings; aiter_lines ended lines there.
    text = "a\u2028b\u2029c\x85d\x0be\x1cf"
    body = f"id: 1\ndata: {json.dumps({'text': text}, ensure_ascii=False)}\n\n".encode()

    async def read() -> list[dict[str, Any]]:
        async def chunks() -> AsyncIterator[bytes]:
            yield body

        reply = httpx.Response(200, content=chunks())
        return [message async for message in _sse_messages(reply)]

    assert asyncio.run(read()) == [{"text": text}]


@given(
    st.lists(st.sampled_from(["a", "\r", "\n", "\r\n", "\u2028", "data: x"]), max_size=12),
    st.lists(st.integers(1, 5), min_size=1, max_size=12),
)
def test_sse_lines_end_at_crlf_lf_or_cr_wherever_the_chunks_are_cut(
    parts: list[str], cuts: list[int]
) -> None:
    raw = "".join(parts).encode()
    chunks, at = [], 0
    for size in cuts * len(raw):
        if at >= len(raw):
            break
        chunks.append(raw[at : at + size])
        at += size
    expected = re.split("\r\n|\r|\n", raw.decode())
    if expected[-1] == "":
        expected.pop()  # a body ending with a break has no line after it
    assert _lines_read(chunks) == expected


async def test_the_body_is_utf8_whatever_the_charset_and_a_leading_bom_is_dropped() -> None:
    body = '\ufeffdata: {"s": "é"}\n\n'.encode()
    reply = httpx.Response(
        200, content=body, headers={"content-type": "text/event-stream; charset=latin-1"}
    )
    assert [message async for message in _sse_messages(reply)] == [{"s": "é"}]

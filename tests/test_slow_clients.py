"""Slow and idle clients against real uvicorn (bridge/server/protocols.py, runner.AppServer).

A connection that brings no request, a head or body sent a byte at a time and then left
unfinished (slowloris), and an oversized head each end the connection; a request that has
arrived whole keeps its (long) response. Each parser (httptools, h11) is checked, and the
in-memory bridge of the fast tier is checked to run under the same runner. Waits are bounded;
the deadline is short so that the server's close is what ends each wait.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from support.inmemory import NO_BROKER, memory_bridge
from support.layout import fresh_prefix, make_settings

from bridge.config import load_settings
from bridge.server.runner import AppServer, bridge_server

BOUND = 30.0
READ_TIMEOUT_S = 0.3
MAX_HEAD = 8192
PARSERS = ["httptools", "h11"]


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


async def ticks(request: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        # A response that outlives the read deadline several times over.
        for i in range(8):
            await asyncio.sleep(READ_TIMEOUT_S / 2)
            yield f"tick {i}\n".encode()

    return StreamingResponse(body(), media_type="text/plain")


@pytest.fixture(params=PARSERS)
async def server(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/ticks", ticks, methods=["GET", "POST"]),
        ]
    )
    served = AppServer(
        app, sock=sock, log_level="warning", access_log=False, http=request.param,
        handle_signals=False, read_timeout_s=READ_TIMEOUT_S, max_head_bytes=MAX_HEAD,
    )  # fmt: skip
    async with asyncio.timeout(BOUND):
        await served.start()
    try:
        yield sock.getsockname()[1]
    finally:
        await served.close()


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    async with asyncio.timeout(BOUND):
        return await reader.read()


def _oversized_head(start: bytes) -> bytes:
    """A request head 1 KiB past MAX_HEAD, to be written at once. Under the 16 KiB send buffer
    of a new loopback socket it leaves in one send, so the server has read all of it when it
    refuses it. (Four times the bound, written line by line, a loaded server refused and closed
    with lines still unread: its kernel reset the connection, and the client's write failed
    with ConnectionResetError instead of reading the refusal.)"""
    filler = b"".join(b"x-filler: " + b"a" * 1012 + b"\r\n" for _ in range(MAX_HEAD // 1024 + 1))
    return start + filler


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def test_a_connection_that_sends_nothing_is_closed_with_408(server: int) -> None:
    reader, writer = await _open(server)
    answer = await _until_closed(reader)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    writer.close()


async def test_a_head_left_unfinished_is_closed_with_408(server: int) -> None:
    reader, writer = await _open(server)
    writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\n")
    for _ in range(3):  # a trickle of header bytes, never the blank line
        writer.write(b"x")
        await writer.drain()
    answer = await _until_closed(reader)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    writer.close()


async def test_a_body_left_unfinished_ends_the_connection(server: int) -> None:
    reader, writer = await _open(server)
    writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"{" * 10)
    await writer.drain()
    # The app is reading the body: it owns the response, so the connection just ends.
    answer = await _until_closed(reader)
    assert not answer.startswith(b"HTTP/1.1 200"), answer
    writer.close()


async def test_a_head_past_the_bound_is_refused(server: int) -> None:
    reader, writer = await _open(server)
    writer.write(_oversized_head(b"GET /ticks HTTP/1.1\r\nhost: x\r\n"))
    await writer.drain()
    answer = await _until_closed(reader)
    # 431 from the httptools protocol, 400 from h11's own incomplete-event limit.
    assert answer.startswith((b"HTTP/1.1 431 ", b"HTTP/1.1 400 ")), answer[:80]
    writer.close()


async def test_a_whole_request_is_answered_and_its_long_response_is_not_cut(server: int) -> None:
    reader, writer = await _open(server)
    writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
    writer.write(b"GET /ticks HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    await writer.drain()
    answer = await _until_closed(reader)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert b'{"bytes":2}' in answer
    assert b"tick 7" in answer  # eight ticks over four deadlines: all of them arrived
    writer.close()


def _refused_only_after_the_answer_owed(answer: bytes) -> bool:
    """Whether a refusal (a 4xx head) on the wire comes only after the chunked answer before
    it has ended (its last chunk): never as that answer, never inside it."""
    refusal = answer.find(b"HTTP/1.1 4")
    return refusal == -1 or answer.rfind(b"0\r\n\r\n", 0, refusal) != -1


async def test_a_request_refused_behind_one_still_answered_is_never_read_as_its_answer(
    server: int,
) -> None:
    reader, writer = await _open(server)
    # Pipelined: the long answer is owed when the second request's head is refused.
    writer.write(
        b"GET /ticks HTTP/1.1\r\nhost: x\r\n\r\n"
        + _oversized_head(b"GET /ticks HTTP/1.1\r\nhost: x\r\n")
    )
    await writer.drain()
    answer = await _until_closed(reader)
    assert _refused_only_after_the_answer_owed(answer), answer[:80]
    writer.close()


async def test_a_malformed_body_under_an_answer_begun_ends_it_with_nothing_spliced_in(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await _open(server)
    writer.write(b"POST /ticks HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(BOUND):
        await reader.readuntil(b"\r\n\r\n")  # the answer has begun, its body still to come
    writer.write(b"zz\r\nnot a chunk\r\n")
    await writer.drain()
    rest = await _until_closed(reader)
    assert b"HTTP/1.1 " not in rest, rest  # no refusal inside the answer's body
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    writer.close()


def test_the_settings_reach_uvicorn() -> None:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        server={"http": "h11", "read_timeout_s": 12.5, "max_head_bytes": 20_000, "keep_alive_s": 7},
    )
    config = bridge_server(settings)._server.config
    config.load()
    assert config.timeout_keep_alive == 7
    assert config.h11_max_incomplete_event_size == 20_000
    protocol = config.http_protocol_class
    assert (protocol.read_timeout_s, protocol.max_head_bytes) == (12.5, 20_000)  # type: ignore[attr-defined]


async def test_the_in_memory_bridge_is_served_by_the_production_runner() -> None:
    settings = make_settings(
        NO_BROKER,
        fresh_prefix("runner"),
        server={"read_timeout_s": READ_TIMEOUT_S, "max_head_bytes": MAX_HEAD},
    )
    with memory_bridge(settings, workers=False) as running:
        silent_reader, silent = await _open(running.port)
        assert (await _until_closed(silent_reader)).startswith(b"HTTP/1.1 408 ")
        silent.close()
        reader, writer = await _open(running.port)
        writer.write(_oversized_head(b"GET /health HTTP/1.1\r\nhost: x\r\n"))
        await writer.drain()
        assert (await _until_closed(reader)).startswith(b"HTTP/1.1 431 ")
        writer.close()

"""The head of a request is bounded under httptools too (bridge.server.protocols, issue 26 item 1).

uvicorn's httptools parser had no bound on a request's URL and headers, and gathered them in
pieces by concatenating bytes: a head of megabytes sent in small pieces cost time quadratic in
its size, on the event loop. Real uvicorn on a real socket; the client writes raw HTTP.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from bridge.server.protocols import protocol_class
from bridge.server.runner import AppServer

BOUND = 30.0
#: The default bound of a request head (``server_max_head_bytes``), which AppServer applies.
MAX_HEAD_BYTES = 64 * 1024


async def echo(request: Request) -> PlainTextResponse:
    body = await request.body()
    return PlainTextResponse(f"{len(request.url.path)} {len(body)}")


@asynccontextmanager
async def served(http: str = "httptools") -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/{path:path}", echo, methods=["GET", "POST"])])
    server = AppServer(
        app, sock=sock, log_level="error", access_log=False, http=http,  # type: ignore[arg-type]
        handle_signals=False,
    )  # fmt: skip
    async with asyncio.timeout(BOUND):
        await server.start()
        try:
            yield sock.getsockname()[1]
        finally:
            await server.close()


async def exchange(port: int, pieces: list[bytes]) -> tuple[bytes, int]:
    """Send ``pieces`` one write each, until the server closes; returns its answer (empty when
    the close came as a reset: data it never read was still on the way) and the bytes sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            sent += len(piece)
        return await reader.read(), sent
    except ConnectionError:
        return b"", sent
    finally:
        writer.close()


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def test_a_url_past_the_bound_is_refused_with_431_and_the_connection_closed() -> None:
    async with served() as port:
        head = b"GET /" + b"a" * MAX_HEAD_BYTES  # over the bound, and all of it read
        answer, _ = await exchange(port, [head])
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert answer.endswith(b"request head too large")


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.parametrize("where", ["url", "header"])
async def test_a_head_past_the_bound_in_one_write_is_refused_before_the_app(
    http: str, where: str
) -> None:
    # Review F18: a whole head arriving in one read was parsed at any size and served (200).
    big = b"a" * (MAX_HEAD_BYTES + 4096)
    url, header = (b"/" + big, b"") if where == "url" else (b"/", b"x-big: " + big + b"\r\n")
    head = b"GET " + url + b" HTTP/1.1\r\nhost: x\r\n" + header + b"connection: close\r\n\r\n"
    async with served(http) as port:
        answer, _ = await exchange(port, [head])
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert answer.endswith(b"request head too large")


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_many_headers_under_the_bound_each_but_past_it_together_are_refused(
    http: str,
) -> None:
    headers = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 1000) for i in range(80))
    head = b"GET / HTTP/1.1\r\nhost: x\r\n" + headers + b"connection: close\r\n\r\n"
    async with served(http) as port:
        answer, _ = await exchange(port, [head])
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_head_just_under_the_bound_in_one_write_is_served(http: str) -> None:
    header = b"x-big: " + b"v" * (MAX_HEAD_BYTES - 1024) + b"\r\n"
    head = b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" + header + b"\r\n"
    async with served(http) as port:
        answer, _ = await exchange(port, [head])
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"3 0"), answer[-40:]


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_header_trickled_without_end_is_cut_off_near_the_bound(http: str) -> None:
    # Without the bound httptools gathered it for as long as it came (8 MiB here).
    async with served(http) as port:
        pieces = [b"GET / HTTP/1.1\r\nhost: x\r\nx-big: "] + [b"v" * 1024] * 8192
        answer, sent = await exchange(port, pieces)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 ")
    assert sent < len(pieces) * 1024  # cut off: the rest was never taken


async def test_heads_under_the_bound_and_large_bodies_are_served() -> None:
    async with served() as port:
        header = b"x-big: " + b"v" * (MAX_HEAD_BYTES - 1024) + b"\r\n"
        head = b"GET /" + b"p" * 500 + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        answer, _ = await exchange(port, split(head + header + b"\r\n", 16))
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"501 0"), answer[-40:]
        body = b"b" * (4 * MAX_HEAD_BYTES)  # counted as body, not head, even in one write
        post = b"POST /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
        post %= len(body)
        answer, _ = await exchange(port, [post + body])
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"2 %d" % len(body))


async def test_keep_alive_requests_each_get_the_whole_bound() -> None:
    async with served() as port:
        header = b"x-big: " + b"v" * (MAX_HEAD_BYTES // 2) + b"\r\n"
        one = b"GET /k HTTP/1.1\r\nhost: x\r\n" + header + b"\r\n"
        last = b"GET /k HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" + header + b"\r\n"
        answer, _ = await exchange(port, [one, one, one, last])
    assert answer.count(b"HTTP/1.1 200 ") == 4


@pytest.mark.parametrize("http", ["auto", "httptools"])
def test_uvicorn_is_given_the_bounded_parser_wherever_it_would_take_httptools(http: str) -> None:
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    chosen = protocol_class(http, read_timeout_s=BOUND, max_head_bytes=MAX_HEAD_BYTES)  # type: ignore[arg-type]
    assert issubclass(chosen, HttpToolsProtocol)
    assert chosen.max_head_bytes == MAX_HEAD_BYTES  # type: ignore[attr-defined]
    h11 = protocol_class("h11", read_timeout_s=BOUND, max_head_bytes=MAX_HEAD_BYTES)
    assert issubclass(h11, H11Protocol)

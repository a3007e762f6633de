"""The hops' lean HTTP/1.1 transport (bridge.server.peerconn) against a raw socket server:
kept-alive connections, answers whole or as they come, and every way an owner can fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from bridge.server.peerconn import HopTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (a Content-Length body only)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


class Owner:
    """A raw server: counts connections, answers each request with ``answer(request)``."""

    def __init__(self, answer: Callable[[bytes], bytes]) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                request = await read_request(reader)
                self.requests.append(request)
                writer.write(self.answer(request))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def serving(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def json_answer(request: bytes) -> bytes:
    body = b'{"ok":true}'
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n" + body


async def test_requests_to_one_owner_share_one_kept_alive_connection() -> None:
    owner = Owner(json_answer)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        for _ in range(3):
            reply = await client.post(f"{owner.url}/mcp", content=b'{"a":1}')
            assert reply.status_code == 200 and reply.json() == {"ok": True}
    owner.server.close()
    assert owner.connections == 1
    assert len(owner.requests) == 3 and owner.requests[0].endswith(b'\r\n\r\n{"a":1}')
    assert owner.requests[0].startswith(b"POST /mcp HTTP/1.1\r\n")


async def test_a_chunked_answer_comes_as_it_is_written_and_keeps_the_connection() -> None:
    def chunked(request: bytes) -> bytes:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        return head + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

    owner = Owner(chunked)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        for _ in range(2):
            async with client.stream("GET", f"{owner.url}/mcp") as reply:
                assert b"".join([c async for c in reply.aiter_raw()]) == b"hello world"
    owner.server.close()
    assert owner.connections == 1


async def test_an_answer_left_before_its_end_closes_its_connection() -> None:
    release = asyncio.Event()
    connections: list[int] = []

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await release.wait()
        writer.close()

    async for url in serving(stream):
        async with httpx.AsyncClient(transport=HopTransport()) as client:
            for _ in range(2):
                async with client.stream("GET", f"{url}/mcp") as reply:
                    assert await anext(reply.aiter_raw()) == b"hello"
        release.set()
    assert len(connections) == 2, "a half-read answer's connection is never reused"


async def test_an_owner_that_closes_before_answering_is_a_protocol_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async for url in serving(hang_up):
        async with httpx.AsyncClient(transport=HopTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(f"{url}/mcp", content=b"{}")


async def test_a_malformed_answer_is_a_protocol_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 2x0 what\r\n\r\n")
        await writer.drain()

    async for url in serving(garbage):
        async with httpx.AsyncClient(transport=HopTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(f"{url}/mcp", content=b"{}")


async def test_a_refused_connection_is_a_connect_error_raised_from_the_refusal() -> None:
    server = await asyncio.start_server(Owner(json_answer), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        with pytest.raises(httpx.ConnectError) as raised:
            await client.get(f"http://127.0.0.1:{port}/healthz")
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)


async def test_a_silent_owner_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.Event().wait()  # never answers; cancelled when the server closes

    async for url in serving(silent):
        async with httpx.AsyncClient(transport=HopTransport(), timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"{url}/mcp")


async def test_a_full_pool_fails_at_once_and_frees_its_slot_when_an_answer_ends() -> None:
    owner = Owner(json_answer)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    transport = HopTransport(max_connections=1)
    async with httpx.AsyncClient(transport=transport) as client:
        async with client.stream("GET", f"{owner.url}/a"):
            with pytest.raises(httpx.PoolTimeout):
                await client.get(f"{owner.url}/b")
        assert (await client.get(f"{owner.url}/c")).status_code == 200
    owner.server.close()


async def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    owner = Owner(json_answer)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        request = client.build_request("GET", f"{owner.url}/mcp")
        request.headers["x-evil"] = "a"
        request.headers._list[-1] = (b"x-evil", b"x-evil", b"a\r\nx-smuggled: 1")
        with pytest.raises(httpx.LocalProtocolError):
            await client.send(request)
    owner.server.close()
    assert owner.requests == []


async def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    owner = Owner(json_answer)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport(idle_s=0.0)) as client:
        await client.get(f"{owner.url}/a")
        await client.get(f"{owner.url}/b")
    owner.server.close()
    assert owner.connections == 2


# --- review h-rev3: what a broken or hostile owner can send -------------------------------------


async def test_bytes_after_an_answer_in_the_same_read_never_join_its_body() -> None:
    """Review h-rev3 F3: httptools parses on past the answer's end within one read, so a second
    answer written behind the first was appended to its body (and the connection reused)."""
    smuggled = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil"
    owner = Owner(lambda request: json_answer(request) + smuggled)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        for _ in range(2):
            reply = await client.post(f"{owner.url}/mcp", content=b"{}")
            assert reply.content == b'{"ok":true}'
    owner.server.close()
    assert owner.connections == 2, "a connection that brought bytes nobody asked for is dropped"


async def test_an_interim_answer_is_skipped_and_the_final_one_returned() -> None:
    """Review h-rev3 F3: a 1xx answer was returned as the answer, the final one then appended to
    its body."""
    owner = Owner(lambda request: b"HTTP/1.1 100 Continue\r\n\r\n" + json_answer(request))
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        for _ in range(2):
            reply = await client.post(f"{owner.url}/mcp", content=b"{}")
            assert reply.status_code == 200 and reply.content == b'{"ok":true}'
    owner.server.close()
    assert owner.connections == 1


async def test_an_answer_head_past_the_bound_is_refused_however_it_arrives() -> None:
    """Review h-rev3 F4: the bound counted headers as httptools reported them, but httptools
    buffers a header of any length until it ends: one endless value grew without limit."""
    sent = asyncio.Event()

    async def endless_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
        for _ in range(16):  # 1 MiB of one header value, in pieces, never ended
            writer.write(b"a" * 65536)
            await writer.drain()
        sent.set()
        await asyncio.Event().wait()  # never ends it; cancelled when the server closes

    async for url in serving(endless_header):
        async with httpx.AsyncClient(transport=HopTransport(), timeout=30) as client:
            request = asyncio.ensure_future(client.get(f"{url}/mcp"))
            await asyncio.wait({request, asyncio.ensure_future(sent.wait())}, timeout=30)
            done, _ = await asyncio.wait({request}, timeout=5)
            assert request in done, "the head past the bound was still being buffered"
            with pytest.raises(httpx.RemoteProtocolError):
                request.result()


async def test_idle_connections_of_an_owner_gone_for_good_hold_no_slot() -> None:
    """Review h-rev3 F5: idle connections were dropped only when their own origin was asked
    again; an owner gone for good (a replaced pod's URL) kept its idle slots and pool slots
    for ever, so no connection was kept alive again once they filled ``max_idle``."""

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json_answer(await read_request(reader)))
        writer.close()  # then gone (a crashed or replaced pod)

    staying = Owner(json_answer)
    staying.server = await asyncio.start_server(staying, "127.0.0.1", 0)
    gone = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    transport = HopTransport(max_connections=2, max_idle=1)
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get(f"http://127.0.0.1:{gone.sockets[0].getsockname()[1]}/a")
        gone.close()
        (idle,) = next(iter(transport._idle.values()))  # kept idle, being closed by the owner
        lost = asyncio.Event()
        seen = idle.connection_lost
        idle.connection_lost = lambda exc: (seen(exc), lost.set())  # type: ignore[method-assign]
        await asyncio.wait_for(lost.wait(), 10)
        for _ in range(3):
            assert (await client.get(f"{staying.url}/b")).status_code == 200
        # Two at once: the pool's two slots, none held by the gone owner.
        async with (
            client.stream("GET", f"{staying.url}/c"),
            client.stream("GET", f"{staying.url}/d"),
        ):
            pass
    staying.server.close()
    assert staying.connections == 2, "the staying owner's connection was kept alive"


async def test_a_full_pool_closes_an_idle_connection_rather_than_refuse() -> None:
    """Review h-rev3 F5: a pool whose slots were all idle connections to other owners refused."""
    first, second = Owner(json_answer), Owner(json_answer)
    first.server = await asyncio.start_server(first, "127.0.0.1", 0)
    second.server = await asyncio.start_server(second, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport(max_connections=1)) as client:
        await client.get(f"{first.url}/a")  # its connection stays idle, holding the slot
        assert (await client.get(f"{second.url}/b")).status_code == 200
        assert (await client.get(f"{first.url}/c")).status_code == 200
    first.server.close()
    second.server.close()
    assert first.connections == 2


async def test_a_head_is_never_sent_on_a_hop() -> None:
    """Review h-rev3 F1: the answer to a HEAD has a length and no body; the parser would wait
    for that body for ever."""
    owner = Owner(json_answer)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        with pytest.raises(httpx.LocalProtocolError):
            await client.head(f"{owner.url}/mcp")
    owner.server.close()
    assert owner.requests == []


async def test_a_whole_answer_left_unread_past_the_high_water_leaves_a_working_connection() -> None:
    """Review h-rev3 F9: an answer that had arrived whole, more of it buffered than the high
    water (reading paused), was closed unread and its connection kept: the next request on it
    waited for an answer its paused socket never read (then timed out, suspecting a healthy
    owner)."""
    big = b"x" * (300 * 1024)  # past the high water in two reads: the second one completes it

    def whole(request: bytes) -> bytes:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        return head + b"content-length: %d\r\n\r\n%s" % (len(big), big)

    owner = Owner(whole)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport(), timeout=5) as client:
        async with client.stream("GET", f"{owner.url}/a") as reply:
            connection = reply.stream._stream._answer._connection  # type: ignore[attr-defined]
            for _ in range(100_000):  # a bounded wait: the whole answer buffered, unread
                if connection.complete:
                    break
                await asyncio.sleep(0)
            assert connection.complete and connection._paused
        assert (await client.get(f"{owner.url}/b")).content == big
    owner.server.close()
    assert owner.connections == 1


async def test_an_owner_that_speaks_before_the_request_is_refused_at_once() -> None:
    """Review h-rev3 F10: bytes that came before the request was written broke the connection,
    but the request was written on it anyway and its answer awaited until the read bound
    (for a hop's first answer, 30 s, then the owner suspected as silent)."""

    async def greets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")  # before any request
        await writer.drain()
        await asyncio.Event().wait()  # then silent; cancelled when the server closes

    async def ask(connection: Any) -> Any:
        connection.send(b"GET / HTTP/1.1\r\n\r\n", b"")
        return await connection.answer_head(None)

    async for url in serving(greets):
        transport = HopTransport()
        origin = ("http", "127.0.0.1", int(url.rsplit(":", 1)[1]))
        connection = await transport._connect(origin, 5)
        for _ in range(100_000):  # a bounded wait: the greeting read
            if connection.closed:
                break
            await asyncio.sleep(0)
        asking = asyncio.ensure_future(ask(connection))
        done, _ = await asyncio.wait({asking}, timeout=5)
        assert asking in done, "the request went out on a broken connection and waited"
        with pytest.raises(httpx.RemoteProtocolError):
            asking.result()
        await transport.aclose()


async def test_a_streamed_request_body_is_refused_never_written_raw_under_chunked() -> None:
    """Review h-rev3 F12: a streamed httpx body carries ``Transfer-Encoding: chunked``; the
    transport writes bodies whole and raw, so it would have sent unframed bytes under that
    header (the owner reading them as chunks: a request smuggled inside another)."""

    async def parts() -> AsyncIterator[bytes]:
        yield b"0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"

    owner = Owner(json_answer)
    owner.server = await asyncio.start_server(owner, "127.0.0.1", 0)
    async with httpx.AsyncClient(transport=HopTransport()) as client:
        with pytest.raises(httpx.LocalProtocolError):
            await client.post(f"{owner.url}/mcp", content=parts())
    owner.server.close()
    assert owner.requests == []

"""The hops' connections: a lean HTTP/1.1 transport under the peer clients' httpx clients.

Where it sits: below :class:`~bridge.server.peers.Peers` (its two ``httpx.AsyncClient`` pools
send through a :class:`HopTransport` each), above the sockets to the owners' peer listeners.
Every forwarded request crosses it, so it is built for that one job: kept-alive connections
per owner, the request written in one ``write``, the answer parsed by httptools (the C parser
uvicorn serves with) straight from the socket's buffers, the body handed over as it comes. No
HTTP/2, proxies, cookies or redirects: a hop needs none, and httpcore's general pool with the
pure-Python h11 parser cost the forwarding replica more CPU than the owner's whole answer
(docs/benchmarks-replicas.md, "A lean hop").

What it does not do: sign (bridge.server.hops), decide what to forward or suspect an owner
(bridge.server.peers); errors are httpx's own (``ConnectError`` from the refused connection,
``ReadTimeout``, ``RemoteProtocolError``...), so the pools' callers see what httpcore raised.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    import httptools

__all__ = ["Answer", "HopTransport", "origin_of", "request_head"]


@functools.cache
def _httptools() -> ModuleType:
    """httptools, imported at the first hop: a process that never forwards (a single bridge on
    h11, a bench's bare server importing bridge modules) does not load it, so the benches can
    still tell from its mapped libraries which HTTP parser its server runs."""
    import httptools

    return httptools


#: Bytes of an answer buffered here before the socket stops being read (a slow client of a
#: forwarded stream holds the owner back, as one direct connection would).
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024
#: The largest answer head accepted from an owner (status line and headers).
_MAX_HEAD_BYTES = 64 * 1024

Origin = tuple[str, str, int]  # scheme, host, port


class _Connection(asyncio.Protocol):
    """One kept-alive connection to an owner, one request at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._loop = asyncio.get_running_loop()
        self._parser: httptools.HttpResponseParser | None = None
        #: The parser's errors (none until the first request: nothing is parsed before it).
        self._errors: tuple[type[Exception], ...] = ()
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        #: Bytes fed before the final answer's head ended: httptools buffers a header of any
        #: length before reporting it, so the head is bounded here too, as it arrives.
        self._before_head = 0
        self._began = False
        self._interim = False
        self._head: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.keep_alive = False
        self.error: Exception | None = None
        self.closed = False
        #: Counted among the pool's open connections (until discarded, once).
        self.counted = True

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes while no request is out: the connection is unusable
            self._fail(httpx.RemoteProtocolError("the owner sent bytes nobody asked for"))
            return
        try:
            self._parser.feed_data(data)
        except self._errors as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed answer from the owner: {exc}"))
            return
        if self._head is not None and not self._head.done():
            self._before_head += len(data)
            if self._before_head > _MAX_HEAD_BYTES:
                self._fail(httpx.RemoteProtocolError("the owner's answer head is too large"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            why = "the owner closed the connection before its answer ended"
            self._fail(httpx.RemoteProtocolError(why) if exc is None else httpx.ReadError(why))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        # httptools parses on past an answer's end within one read: a second answer to one
        # request is a broken or hostile owner, never more of the first one's body.
        if self._began:
            raise _httptools().HttpParserError("more than one answer to one request")
        self._began = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD_BYTES:
            raise _httptools().HttpParserError("answer head too large")  # fed back to _fail
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._status = self._parser.get_status_code()
        if self._status < 200:  # an interim answer (the hop asks for none): the final follows
            self._interim = True
            return
        self.keep_alive = self._parser.should_keep_alive()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._interim:
            raise _httptools().HttpParserError("an interim answer with a body")
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:  # its headers are not the answer's
            self._interim = self._began = False
            self._headers, self._head_bytes = [], 0
            return
        self.complete = True
        self._parser = None  # anything more before the next request breaks the connection
        self._wake()

    # -- the request -----------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        for future in (self._head, self._waiter):
            if future is not None and not future.done():
                future.set_result(None)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def send(self, head: bytes, body: bytes) -> None:
        """Write one request; its answer is awaited with :meth:`answer_head`."""
        assert self.transport is not None
        if self.error is not None:  # broken before it was asked (bytes nobody asked for)
            raise self.error
        parsing = _httptools()
        self._parser = parsing.HttpResponseParser(self)
        self._errors = (parsing.HttpParserError, parsing.HttpParserUpgrade)
        self._status, self._headers, self._head_bytes = 0, [], 0
        self._before_head, self._began, self._interim = 0, False, False
        self._chunks.clear()
        self._buffered, self.complete, self.keep_alive = 0, False, False
        if self._paused:  # the last answer was whole but left unread past the high water
            self._paused = False
            self.transport.resume_reading()
        self._head = self._loop.create_future()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)  # a large body is not copied once more

    async def answer_head(self, read_s: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The answer's status and headers."""
        assert self._head is not None
        try:
            async with asyncio.timeout(read_s):
                await self._head
        except TimeoutError:
            raise httpx.ReadTimeout("the owner did not answer in time") from None
        if self.error is not None and not self.complete:  # whole, then broken: still whole
            raise self.error
        return self._status, self._headers

    @property
    def has_chunks(self) -> bool:
        return bool(self._chunks)

    async def next_chunk(self, read_s: float | None) -> bytes:
        """The answer's next bytes; ``b""`` once it has ended."""
        while not self._chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            self._waiter = self._loop.create_future()
            try:
                async with asyncio.timeout(read_s):
                    await self._waiter
            except TimeoutError:
                raise httpx.ReadTimeout("the owner's answer stalled") from None
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < _LOW_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk


class Answer:
    """An owner's answer: status, headers (names in lower case) and the body as it comes.
    Closing it returns its connection to the pool when the answer was read to its end (and
    the owner keeps the connection), else closes the connection."""

    def __init__(
        self,
        pool: HopTransport,
        connection: _Connection,
        status: int,
        headers: list[tuple[bytes, bytes]],
        read_s: float | None,
    ) -> None:
        self.status = status
        self.raw_headers = headers
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        self._pool = pool
        self._connection = connection
        self._read_s = read_s
        self._released = False

    @property
    def ended(self) -> bool:
        """Whether the whole body has been read."""
        connection = self._connection
        return connection.complete and not connection.has_chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come (closed when they end)."""
        try:
            while chunk := await self._connection.next_chunk(self._read_s):
                yield chunk
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        """The whole body (then closed)."""
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        """Done with the answer: its connection goes back to the pool, or is closed."""
        if not self._released:
            self._released = True
            self._pool.release(self._connection)


class _Body(httpx.AsyncByteStream):
    """An :class:`Answer`'s body as httpx reads a response's stream."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._answer.chunks():
            yield chunk

    async def aclose(self) -> None:
        await self._answer.aclose()


class HopTransport(httpx.AsyncBaseTransport):
    """Kept-alive HTTP/1.1 connections to the owners' peer listeners (``http`` or ``https``
    with ``tls``): at most ``max_connections`` open (a request beyond fails at once with
    ``PoolTimeout``: the retriable answer, never a wait for a slot), at most ``max_idle`` kept
    idle, each for ``idle_s`` at most (less than the listeners' keep-alive: never reused as
    the owner closes it).

    :meth:`send` is the lean way in (a request head written by :func:`request_head`);
    as an httpx transport it serves any request an ``httpx.AsyncClient`` builds.
    """

    def __init__(
        self,
        tls: ssl.SSLContext | bool = True,
        *,
        max_connections: int = 100,
        max_idle: int = 64,
        idle_s: float = 4.0,
    ) -> None:
        self._tls = tls
        self._max_connections = max_connections
        self._max_idle = max_idle
        self._idle_s = idle_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._closed = False

    async def send(
        self,
        origin: Origin,
        head: bytes,
        body: bytes,
        *,
        connect_s: float | None = None,
        read_s: float | None = None,
        body_read_s: float | None = None,
    ) -> Answer:
        """Send one request (``head`` and ``body``) to ``origin`` on a kept-alive connection
        (else a new one); its answer once its head has come (``read_s`` bounds each wait for
        the owner's bytes, ``body_read_s`` instead once the head has come when given,
        ``connect_s`` a new connection). Never a ``HEAD``: its answer has a
        length and no body, which the parser cannot know."""
        if head.startswith(b"HEAD "):
            raise httpx.LocalProtocolError("a HEAD is not sent on a hop (send its GET)")
        connection = self._reuse(origin) or await self._connect(origin, connect_s)
        try:
            connection.send(head, body)
            status, headers = await connection.answer_head(read_s)
        except BaseException:  # cancelled or failed mid-request: the connection is unknown
            self._discard(connection)
            raise
        body_s = read_s if body_read_s is None else body_read_s
        return Answer(self, connection, status, headers, body_s)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """httpx's way in: ``request`` sent with :meth:`send`."""
        url = request.url
        origin = (url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme, 80))
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        if "transfer-encoding" in request.headers:  # a streamed body: written whole, unframed
            raise httpx.LocalProtocolError("a hop's body is sent whole, with its length")
        head = request_head(request.method, url.raw_path.decode("ascii"), pairs)
        body = await request.aread()
        answer = await self.send(
            origin, head, body, connect_s=timeouts.get("connect"), read_s=timeouts.get("read")
        )
        return httpx.Response(
            answer.status, headers=answer.raw_headers, stream=_Body(answer), request=request
        )

    def _reuse(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        horizon = time.monotonic() - self._idle_s
        while idle:
            connection = idle.pop()  # the most recent: the least likely to be closing
            self._idle_count -= 1
            if connection.usable and connection.idle_since >= horizon:
                return connection
            self._discard(connection)
        return None

    async def _connect(self, origin: Origin, connect_s: float | None) -> _Connection:
        if self._closed:
            raise httpx.ConnectError("the hop pool is closed")
        if self._open >= self._max_connections:
            self._prune(make_room=True)
        if self._open >= self._max_connections:
            raise httpx.PoolTimeout(f"all {self._max_connections} hop connections are in use")
        scheme, host, port = origin
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            tls = self._tls if isinstance(self._tls, ssl.SSLContext) else _default_tls()
        loop = asyncio.get_running_loop()
        self._open += 1
        try:
            async with asyncio.timeout(connect_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(origin), host, port, ssl=tls
                )
        except TimeoutError as exc:
            self._open -= 1
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} in time") from exc
        except (OSError, ssl.SSLError) as exc:
            self._open -= 1
            raise httpx.ConnectError(f"no connection to {host}:{port}: {exc}") from exc
        except BaseException:
            self._open -= 1
            raise
        return connection

    def release(self, connection: _Connection) -> None:
        """An answer is done with: keep its connection for the next request when it can be."""
        reusable = connection.complete and connection.keep_alive and connection.usable
        if reusable and self._idle_count >= self._max_idle:
            self._prune(make_room=False)
        if not reusable or self._closed or self._idle_count >= self._max_idle:
            self._discard(connection)
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._idle_count += 1

    def _prune(self, *, make_room: bool) -> None:
        """Drop the idle connections that closed or expired, of every owner: one asked no more
        (gone for good, or its URL changed) would hold its idle and pool slots for ever. With
        ``make_room``, the oldest idle connection goes too when none did (a slot for a new
        connection rather than a refusal while connections sit idle). Runs only when the pool
        or its idle slots are full: one pass over at most ``max_idle`` connections."""
        horizon = time.monotonic() - self._idle_s
        oldest: tuple[float, Origin] | None = None
        dropped = 0
        for origin, idle in list(self._idle.items()):
            kept = [c for c in idle if c.usable and c.idle_since >= horizon]
            for connection in idle:
                if connection not in kept:
                    self._discard(connection)
            dropped += len(idle) - len(kept)
            if kept:
                self._idle[origin] = kept
                if oldest is None or kept[0].idle_since < oldest[0]:
                    oldest = (kept[0].idle_since, origin)
            else:
                del self._idle[origin]
        self._idle_count -= dropped
        if make_room and not dropped and oldest is not None:
            self._discard(self._idle[oldest[1]].pop(0))
            self._idle_count -= 1

    def _discard(self, connection: _Connection) -> None:
        if connection.counted:
            connection.counted = False
            self._open -= 1
        connection.close()

    async def aclose(self) -> None:
        """Close the idle connections; answers still open close theirs when they end."""
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                self._discard(connection)
        self._idle.clear()
        self._idle_count = 0


_DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=256)
def origin_of(base_url: str) -> tuple[Origin, str]:
    """``scheme://host:port`` as the pool's origin and the ``Host`` header's value (an owner
    URL, checked by bridge.server.routing; a few owners, each parsed once)."""
    url = urlsplit(base_url)
    scheme, host = url.scheme, url.hostname or ""
    port = url.port or _DEFAULT_PORTS.get(scheme, 80)
    return (scheme, host, port), url.netloc


def request_head(method: str, target: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """The request line and headers, as written: a value that could end the head early or
    split it (CR, LF, NUL) is refused, never sent; so is a target that is not plain ASCII
    without spaces (the hops' paths are built quoted: bridge.server.browser)."""
    if not target.isascii() or not target.isprintable() or " " in target:
        raise httpx.LocalProtocolError(f"not a request target: {target!r}")
    lines = [f"{name}: {value}\r\n" for name, value in headers]
    text = "".join(lines)
    # Each line's own CR LF is one of each: any more are in a name or a value (a few scans of
    # the whole head, not one per header and character).
    if text.count("\r") != len(lines) or text.count("\n") != len(lines) or "\x00" in text:
        raise httpx.LocalProtocolError("a header holds a line break or NUL")
    return f"{method} {target} HTTP/1.1\r\n{text}\r\n".encode("latin-1")


_DEFAULT_TLS: list[ssl.SSLContext] = []


def _default_tls() -> ssl.SSLContext:
    """The system's CAs, for an ``https`` peer without a configured context (made once)."""
    if not _DEFAULT_TLS:
        _DEFAULT_TLS.append(ssl.create_default_context())
    return _DEFAULT_TLS[0]

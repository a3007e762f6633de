"""A small, self-contained MCP client for the 2026-07-28 Streamable HTTP wire (httpx only).

It speaks just enough of the wire to drive ``tasks/stream`` black-box against any server:
routing headers (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``), ``params._meta`` with
the protocol version and client capabilities (the tasks extension declared), an optional bearer
token, and a Server-Sent Events parser written from the HTML Living Standard (fields, comments,
multi-line ``data``, events dispatched on a blank line, an unterminated event at EOF dropped).

Nothing here imports the project, so the suite can be pointed at any implementation.
Every wait is bounded; a bound that expires raises ``AssertionError`` describing what was
being waited for and what had arrived so far.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import json
import re
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

__all__ = [
    "OMIT",
    "RELATED_TASK",
    "TASKS_EXTENSION",
    "VERSION",
    "McpClient",
    "RawHttpConnection",
    "RawJson",
    "Reply",
    "SseEvent",
    "SseParser",
    "TaskStream",
    "iter_sse",
    "routing_headers",
]

VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPS_META = "io.modelcontextprotocol/clientCapabilities"
CLIENT_CAPS: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}
EVENT_METHOD = "notifications/tasks/event"

#: Methods whose ``Mcp-Name`` header carries a param.
NAME_PARAM = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}


def routing_headers(
    method: str, params: Mapping[str, Any] | None = None, version: str = VERSION
) -> dict[str, str]:
    """The headers a correct 2026-07-28 client sends for ``method`` with ``params``."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": version,
        "Mcp-Method": method,
    }
    name = NAME_PARAM.get(method)
    value = (params or {}).get(name) if name else None
    if isinstance(value, str):
        headers["Mcp-Name"] = value
    return headers


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


#: "Leave the param out" (distinct from ``None``, which is sent as JSON null).
OMIT: Any = _Omit()

_ids = itertools.count(1)


@dataclass(frozen=True)
class RawJson:
    """A JSON value sent exactly as written: ``1e0`` or ``1.0`` where ``json.dumps`` would not."""

    text: str


def encode(message: Any) -> bytes:
    """``message`` as JSON, with every :class:`RawJson` spliced in verbatim."""
    raws: list[str] = []

    def splice(value: Any) -> str:
        if not isinstance(value, RawJson):
            raise TypeError(f"not JSON serialisable: {value!r}")
        raws.append(value.text)
        return f"\0raw{len(raws) - 1}\0"

    text = json.dumps(message, default=splice)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\0raw{i}\0"), raw)
    return text.encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str | bytes) -> Any:
    """Strict JSON: ``NaN`` and ``Infinity`` (which Python's json accepts) are refused."""
    return json.loads(text, parse_constant=_no_constant)


# --- Server-Sent Events ---------------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    data: str
    event: str = "message"
    id: str | None = None


class SseParser:
    """Line-by-line SSE parsing: :meth:`feed` returns an event when a blank line dispatches one."""

    def __init__(self, comments: list[str] | None = None) -> None:
        self.comments = comments
        self._data: list[str] = []
        self._type = ""
        self._last_id: str | None = None

    def feed(self, line: str) -> SseEvent | None:
        if line == "":
            event = (
                SseEvent("\n".join(self._data), self._type or "message", self._last_id)
                if self._data
                else None
            )
            self._data, self._type = [], ""
            return event
        if line.startswith(":"):
            if self.comments is not None:
                self.comments.append(line[1:])
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None  # "retry" and unknown fields are ignored


async def iter_sse(lines: AsyncIterator[str], comments: list[str] | None = None) -> Any:
    """SSE events from decoded lines (line terminators already removed); an event not
    terminated by a blank line before EOF is discarded, as the standard says."""
    parser = SseParser(comments)
    async for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


def _describe(message: Any) -> str:
    text = json.dumps(message, default=str)
    return text if len(text) < 600 else text[:600] + "…"


# --- replies --------------------------------------------------------------------------------


class _Answer:
    """What a request got: the JSON-RPC ``response`` (once it came) and the notifications."""

    response: dict[str, Any] | None
    notifications: list[dict[str, Any]]

    @property
    def result(self) -> dict[str, Any] | None:
        value = (self.response or {}).get("result")
        return value if isinstance(value, dict) else None

    @property
    def error(self) -> dict[str, Any] | None:
        value = (self.response or {}).get("error")
        return value if isinstance(value, dict) else None

    @property
    def events(self) -> list[dict[str, Any]]:
        """``params`` of every ``notifications/tasks/event`` received, in arrival order."""
        return [n["params"] for n in self.notifications if n.get("method") == EVENT_METHOD]


@dataclass
class Reply(_Answer):
    """The outcome of one request: the HTTP status, the JSON-RPC response and what came before."""

    http_status: int
    content_type: str
    response: dict[str, Any] | None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    body: str = ""

    def __str__(self) -> str:
        return (
            f"HTTP {self.http_status} ({self.content_type or 'no content-type'}): "
            f"response={_describe(self.response)} "
            f"notifications={len(self.notifications)} body={self.body[:300]!r}"
        )


class ResponseBody(Protocol):
    """What :class:`TaskStream` reads: an ``httpx.Response`` or a :class:`RawResponse`."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def aiter_lines(self) -> AsyncIterator[str]: ...
    async def aread(self) -> bytes: ...
    async def aclose(self) -> None: ...


class TaskStream(_Answer):
    """One open ``tasks/stream`` request: its messages are read on demand, each wait bounded."""

    def __init__(
        self, reply: ResponseBody, request_id: int | str, task_id: str, bound: float
    ) -> None:
        self.reply = reply
        self.request_id = request_id
        self.task_id = task_id
        self.bound = bound
        self.http_status = reply.status_code
        self.content_type = reply.headers.get("content-type", "")
        self.messages: list[dict[str, Any]] = []
        self.sse_ids: list[str | None] = []
        self.comments: list[str] = []
        self.response: dict[str, Any] | None = None
        self.eof = False
        self._sse: Any = None

    # what has arrived ---------------------------------------------------------------------

    @property
    def is_sse(self) -> bool:
        return "text/event-stream" in self.content_type

    @property
    def notifications(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if "method" in m and "id" not in m]

    @property
    def event_ids(self) -> list[str | None]:
        """The SSE ``id`` in effect for each event of :attr:`events` (None: the server set none)."""
        return [
            sse_id
            for message, sse_id in zip(self.messages, self.sse_ids, strict=True)
            if message.get("method") == EVENT_METHOD and "id" not in message
        ]

    @property
    def seqs(self) -> list[Any]:
        return [e.get("seq") for e in self.events]

    @property
    def done(self) -> bool:
        return self.response is not None or self.eof

    def describe(self) -> str:
        tail = self.events[-3:]
        return (
            f"tasks/stream {self.task_id!r}: HTTP {self.http_status} {self.content_type!r}, "
            f"{len(self.events)} events (seqs {self.seqs[:12]}{'…' if len(self.events) > 12 else ''}), "
            f"last events {_describe(tail)}, response={_describe(self.response)}, eof={self.eof}"
        )

    # reading ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin reading: an SSE body is then read on demand, any other body at once."""
        if self.is_sse:
            self._sse = iter_sse(self.reply.aiter_lines(), self.comments)
            return
        body = (await self.reply.aread()).decode("utf-8", errors="replace")
        self.eof = True
        try:
            message = loads(body)
        except ValueError:
            return
        if isinstance(message, dict):
            self._take(message, None)

    def _take(self, message: dict[str, Any], sse_id: str | None) -> None:
        self.messages.append(message)
        self.sse_ids.append(sse_id)
        if "id" in message and ("result" in message or "error" in message):
            self.response = message

    async def next_message(self) -> dict[str, Any] | None:
        """The next JSON-RPC message; None once the response arrived or the body ended."""
        if self.done:
            return None
        assert self._sse is not None
        try:
            event = await anext(self._sse)
        except StopAsyncIteration:
            self.eof = True
            return None
        except (httpx.HTTPError, OSError, EOFError):  # EOFError: a raw body cut short
            self.eof = True
            raise
        try:
            message = loads(event.data)
        except ValueError as exc:
            raise AssertionError(
                f"an SSE event that is not JSON ({exc}): {event.data[:300]!r}"
            ) from None
        assert isinstance(message, dict), f"an SSE event that is not a JSON object: {event.data!r}"
        self._take(message, event.id)
        return message

    async def until(
        self, condition: Callable[[TaskStream], bool], what: str, bound: float | None = None
    ) -> None:
        """Read until ``condition(self)``; AssertionError if the stream ends or the bound expires."""
        limit = self.bound if bound is None else bound
        try:
            async with asyncio.timeout(limit):
                while not condition(self):
                    if self.done:
                        raise AssertionError(f"the stream ended before {what}: {self.describe()}")
                    await self.next_message()
        except TimeoutError:
            raise AssertionError(f"no {what} within {limit:g} s: {self.describe()}") from None

    async def to_end(self, bound: float | None = None, what: str = "the end of the stream") -> None:
        """Read until the JSON-RPC response arrives (or the body ends), bounded."""
        limit = self.bound if bound is None else bound
        try:
            async with asyncio.timeout(limit):
                while not self.done:
                    await self.next_message()
        except TimeoutError:
            raise AssertionError(f"no {what} within {limit:g} s: {self.describe()}") from None


# --- the client -----------------------------------------------------------------------------


class McpClient:
    """Requests to one MCP endpoint with one (optional) bearer token.

    Each client has its own connection pool: two clients never share a TCP connection, so two
    streams opened through two clients are two transport connections. ``receive_buffer`` sets
    ``SO_RCVBUF`` on its sockets: a client that stops reading then holds up the server quickly.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        bound: float = 30.0,
        receive_buffer: int | None = None,
    ) -> None:
        self.url = url
        self.token = token
        self.bound = bound
        options = [(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)] if receive_buffer else []
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(bound, connect=10.0),
            transport=httpx.AsyncHTTPTransport(socket_options=options),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> McpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def build(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        request_id: int | str | None = None,
        meta: dict[str, Any] | None = None,
        notification: bool = False,
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """Headers and body of one request (or notification), routing headers filled in."""
        params = dict(params or {})
        params["_meta"] = {
            PROTOCOL_VERSION_META: VERSION,
            CLIENT_CAPS_META: CLIENT_CAPS,
            **(meta or {}),
        }
        headers = routing_headers(method, params)
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notification:
            body["id"] = next(_ids) if request_id is None else request_id
        return headers, body

    async def _post(self, what: str, headers: dict[str, str], body: Any, bound: float) -> Reply:
        try:
            async with asyncio.timeout(bound):
                reply = await self.http.post(self.url, content=encode(body), headers=headers)
        except TimeoutError:
            raise AssertionError(f"{what}: no complete reply within {bound:g} s") from None
        return _reply(reply)

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        bound: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Reply:
        """One request, read to its end (JSON or SSE body), bounded."""
        headers, body = self.build(method, params, meta=meta)
        limit = self.bound if bound is None else bound
        return await self._post(f"{method} {_describe(params)}", headers, body, limit)

    async def notify(
        self, method: str, params: dict[str, Any] | None = None, *, bound: float | None = None
    ) -> Reply:
        """One JSON-RPC notification (no id); the reply is the bare HTTP answer (202)."""
        headers, body = self.build(method, params, notification=True)
        limit = self.bound if bound is None else bound
        return await self._post(f"{method} {_describe(params)}", headers, body, limit)

    async def resume_get(self, last_event_id: str, *, bound: float | None = None) -> Reply:
        """Transport-level resume: ``GET`` with ``Last-Event-ID``, read to its end, bounded."""
        headers = {
            "Accept": "text/event-stream",
            "Last-Event-ID": last_event_id,
            "MCP-Protocol-Version": VERSION,
        }
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        limit = self.bound if bound is None else bound
        try:
            async with asyncio.timeout(limit):
                reply = await self.http.get(self.url, headers=headers)
        except TimeoutError:
            raise AssertionError(
                f"GET Last-Event-ID: no complete reply within {limit:g} s"
            ) from None
        return _reply(reply)

    async def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.call(method, params)
        assert reply.result is not None, f"{method} failed: {reply}"
        return reply.result

    def stream_request(
        self, task_id: str, after: Any = OMIT, *, meta: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """Headers and body of a ``tasks/stream`` request (``after`` may be a :class:`RawJson`)."""
        params: dict[str, Any] = {"taskId": task_id}
        if after is not OMIT:
            params["after"] = after
        return self.build("tasks/stream", params, meta=meta)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        task_id: str,
        after: Any = OMIT,
        *,
        meta: dict[str, Any] | None = None,
        bound: float | None = None,
    ) -> AsyncIterator[TaskStream]:
        """Open ``tasks/stream``; leaving the block closes the HTTP stream (cancels it)."""
        headers, body = self.stream_request(task_id, after, meta=meta)
        limit = self.bound if bound is None else bound
        try:
            async with asyncio.timeout(limit):
                request = self.http.build_request(
                    "POST", self.url, content=encode(body), headers=headers
                )
                reply = await self.http.send(request, stream=True)
        except TimeoutError:
            raise AssertionError(f"tasks/stream: no response headers within {limit:g} s") from None
        try:
            stream = TaskStream(reply, body["id"], task_id, limit)
            await stream.start()
            yield stream
        finally:
            await reply.aclose()


def _reply(reply: httpx.Response) -> Reply:
    content_type = reply.headers.get("content-type", "")
    out = Reply(reply.status_code, content_type, None, body=reply.text)
    messages: list[Any] = []
    if "text/event-stream" in content_type:
        for event in _sse_events(reply.text):
            with contextlib.suppress(ValueError):
                messages.append(loads(event.data))
    else:
        with contextlib.suppress(ValueError):
            messages = [loads(reply.content)]
    for message in messages:
        if not isinstance(message, dict):
            continue
        if "id" in message and ("result" in message or "error" in message):
            out.response = message
        elif "method" in message:
            out.notifications.append(message)
    return out


def _sse_events(text: str) -> list[SseEvent]:
    parser = SseParser()
    events = [parser.feed(line) for line in [*text.splitlines(), ""]]
    return [event for event in events if event is not None]


# --- HTTP/1.1 by hand (pipelining) --------------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class RawResponse:
    """One HTTP/1.1 response read off a :class:`RawHttpConnection` (chunked or sized body)."""

    def __init__(self, reader: asyncio.StreamReader, status: int, headers: dict[str, str]):
        self._reader = reader
        self.status_code = status
        self.headers = headers
        self._left = int(headers.get("content-length", "0") or 0)
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.complete = False

    async def _next_chunk(self) -> bytes:
        """The next piece of the body; b"" once it is complete."""
        if self.complete:
            return b""
        if not self._chunked:
            data = await self._reader.readexactly(self._left)
            self.complete = True
            return data
        size = int((await self._reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await self._reader.readline()).strip():  # trailers, then the blank line
                pass
            self.complete = True
            return b""
        data = await self._reader.readexactly(size)
        await self._reader.readexactly(2)  # the CRLF after the chunk
        return data

    async def aiter_lines(self) -> AsyncIterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        while chunk := await self._next_chunk():
            text = pending + decoder.decode(chunk)
            held = "\r" if text.endswith("\r") else ""  # maybe half a CRLF: wait for more
            *lines, pending = _LINE_BREAK.split(text.removesuffix(held) if held else text)
            pending += held
            for line in lines:
                yield line
        if pending:
            yield pending.removesuffix("\r")

    async def aread(self) -> bytes:
        body = bytearray()
        while chunk := await self._next_chunk():
            body += chunk
        return bytes(body)

    async def aclose(self) -> None:
        """Nothing to do: the connection outlives its responses (see RawHttpConnection.aclose)."""


class RawHttpConnection:
    """One TCP connection, HTTP/1.1 written by hand: requests can be sent back to back
    (pipelining) and the responses are then read in order from the same connection."""

    def __init__(self, url: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.url = urlsplit(url)
        self.reader = reader
        self.writer = writer
        self._current: RawResponse | None = None

    @classmethod
    async def open(cls, url: str) -> RawHttpConnection:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        ssl = parts.scheme == "https"
        reader, writer = await asyncio.open_connection(parts.hostname, port, ssl=ssl or None)
        return cls(url, reader, writer)

    def request_bytes(self, headers: Mapping[str, str], body: Any) -> bytes:
        content = encode(body)
        target = self.url.path or "/"
        if self.url.query:
            target += f"?{self.url.query}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {self.url.netloc}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(content)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + content

    async def send(self, *requests: tuple[Mapping[str, str], Any]) -> None:
        """Write the requests in one go, without waiting for any response."""
        self.writer.write(b"".join(self.request_bytes(h, b) for h, b in requests))
        await self.writer.drain()

    async def response(self, bound: float) -> RawResponse:
        """The status line and headers of the next response on the connection, bounded.

        What the previous response still had (a stream read up to its JSON-RPC response stops
        before the body's end) is read and dropped first.
        """
        try:
            async with asyncio.timeout(bound):
                if self._current is not None:
                    await self._current.aread()
                status_line = await self.reader.readline()
                if not status_line:
                    raise ConnectionError("the server closed the connection")
                version, _, rest = status_line.decode("latin-1").partition(" ")
                assert version.startswith("HTTP/1."), f"not a status line: {status_line!r}"
                status = int(rest.split()[0])
                headers: dict[str, str] = {}
                while line := (await self.reader.readline()).strip():
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
        except TimeoutError:
            raise AssertionError(f"no response headers within {bound:g} s") from None
        self._current = RawResponse(self.reader, status, headers)
        return self._current

    async def stream(self, request: tuple[Mapping[str, str], Any], bound: float) -> TaskStream:
        """The next response, read as the ``tasks/stream`` of ``request`` (headers, body)."""
        body = request[1]
        stream = TaskStream(await self.response(bound), body["id"], body["params"]["taskId"], bound)
        await stream.start()
        return stream

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

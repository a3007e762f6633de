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
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "OMIT",
    "RELATED_TASK",
    "TASKS_EXTENSION",
    "VERSION",
    "McpClient",
    "Reply",
    "SseEvent",
    "SseParser",
    "TaskStream",
    "iter_sse",
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


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


#: "Leave the param out" (distinct from ``None``, which is sent as JSON null).
OMIT: Any = _Omit()

_ids = itertools.count(1)


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


@dataclass
class Reply:
    """The outcome of one request: the HTTP status, the JSON-RPC response and what came before."""

    http_status: int
    content_type: str
    response: dict[str, Any] | None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    body: str = ""

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
        return [n["params"] for n in self.notifications if n.get("method") == EVENT_METHOD]

    def __str__(self) -> str:
        return (
            f"HTTP {self.http_status} ({self.content_type or 'no content-type'}): "
            f"response={_describe(self.response)} "
            f"notifications={len(self.notifications)} body={self.body[:300]!r}"
        )


class TaskStream:
    """One open ``tasks/stream`` request: its messages are read on demand, each wait bounded."""

    def __init__(
        self, reply: httpx.Response, request_id: int | str, task_id: str, bound: float
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
    def events(self) -> list[dict[str, Any]]:
        """``params`` of every ``notifications/tasks/event`` received, in arrival order."""
        return [m["params"] for m in self.notifications if m.get("method") == EVENT_METHOD]

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
    def result(self) -> dict[str, Any] | None:
        value = (self.response or {}).get("result")
        return value if isinstance(value, dict) else None

    @property
    def error(self) -> dict[str, Any] | None:
        value = (self.response or {}).get("error")
        return value if isinstance(value, dict) else None

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

    async def _start(self) -> None:
        if self.is_sse:
            self._sse = iter_sse(self.reply.aiter_lines(), self.comments)
            return
        body = (await self.reply.aread()).decode("utf-8", errors="replace")
        self.eof = True
        try:
            message = json.loads(body)
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
        except httpx.HTTPError:
            self.eof = True
            raise
        message = json.loads(event.data)
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
    """Requests to one MCP endpoint with one (optional) bearer token."""

    def __init__(self, url: str, token: str | None = None, *, bound: float = 30.0) -> None:
        self.url = url
        self.token = token
        self.bound = bound
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(bound, connect=10.0))

    async def aclose(self) -> None:
        await self.http.aclose()

    def build(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        request_id: int | str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """Headers and body of one request, routing headers filled from the params."""
        params = dict(params or {})
        params["_meta"] = {
            PROTOCOL_VERSION_META: VERSION,
            CLIENT_CAPS_META: CLIENT_CAPS,
            **(meta or {}),
        }
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
        }
        name = NAME_PARAM.get(method)
        if name is not None and isinstance(params.get(name), str):
            headers["Mcp-Name"] = params[name]
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        rid = next(_ids) if request_id is None else request_id
        return headers, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}

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
        try:
            async with asyncio.timeout(limit):
                reply = await self.http.post(self.url, json=body, headers=headers)
        except TimeoutError:
            raise AssertionError(
                f"{method} {_describe(params)}: no complete reply within {limit:g} s"
            ) from None
        return _reply(reply)

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
        params: dict[str, Any] = {"taskId": task_id}
        if after is not OMIT:
            params["after"] = after
        headers, body = self.build("tasks/stream", params, meta=meta)
        limit = self.bound if bound is None else bound
        try:
            async with asyncio.timeout(limit):
                request = self.http.build_request("POST", self.url, json=body, headers=headers)
                reply = await self.http.send(request, stream=True)
        except TimeoutError:
            raise AssertionError(f"tasks/stream: no response headers within {limit:g} s") from None
        try:
            stream = TaskStream(reply, body["id"], task_id, limit)
            await stream._start()
            yield stream
        finally:
            await reply.aclose()

    @contextlib.asynccontextmanager
    async def stream_when_free(
        self, task_id: str, after: Any = OMIT, *, bound: float | None = None
    ) -> AsyncIterator[TaskStream]:
        """Like :meth:`stream`, retried while the server still counts a just-closed stream.

        A client that closed a stream cannot know when the server noticed (HTTP gives no
        acknowledgement), so a new stream for the same task may briefly be refused with
        -32602. This retries such an immediate refusal (a JSON reply) with a short backoff,
        within ``bound``; any other reply is yielded as it is.
        """
        limit = self.bound if bound is None else bound
        delay = 0.02
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            async with self.stream(task_id, after, bound=limit) as stream:
                busy = (
                    not stream.is_sse
                    and stream.error is not None
                    and stream.error.get("code") == -32602
                )
                if not busy or loop.time() + delay > deadline:
                    yield stream
                    return
            await asyncio.sleep(delay)  # backoff of a bounded retry, not a synchronisation
            delay = min(delay * 2, 0.5)


def _reply(reply: httpx.Response) -> Reply:
    content_type = reply.headers.get("content-type", "")
    out = Reply(reply.status_code, content_type, None, body=reply.text)
    messages: list[Any] = []
    if "text/event-stream" in content_type:
        for event in _sse_events(reply.text):
            with contextlib.suppress(ValueError):
                messages.append(json.loads(event.data))
    else:
        with contextlib.suppress(ValueError):
            messages = [reply.json()]
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

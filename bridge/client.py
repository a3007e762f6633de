"""A resuming tasks/stream client: never loses an event, never hands one over twice.

``TaskStreamClient.stream(task_id)`` opens ``tasks/stream`` and yields events in seq order.
An event counts as fully processed once the caller asks for the next one; only then is its seq
saved (in a :class:`CursorStore`, e.g. a JSON file) and used as ``after`` when the connection
drops and the client reconnects. Events are de-duplicated on (taskId, seq). A cursor older than
the server's retention raises :class:`EventsGone` with ``earliest_seq``: the caller decides
whether to resume from there (``after=earliest_seq - 1``) or treat the gap as fatal.

The server may answer with an SSE stream or with one plain JSON-RPC response: either way the
request's result ends the stream normally and its error is raised; only a reply that ends
without either counts as a drop.

Reconnecting: after a drop, and after a retriable error (:attr:`StreamError.retriable`: the
server's errors that say when to retry, as the task's replica draining or unreachable, its
partition moving, a rate limit; or an earlier stream of the task still being reaped), the
client waits and tries again, at most
``max_reconnects`` times in a row. The waits are :class:`Backoff`'s: jittered, growing, bounded,
and never shorter than the server asked, so the clients of a replica that went away do not come
back at the same instant.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import random
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from bridge import __version__
from bridge.vocabulary import INTERNAL_ERROR

__all__ = [
    "Backoff",
    "CursorStore",
    "EventsGone",
    "FileCursorStore",
    "MemoryCursorStore",
    "StreamError",
    "StreamEvent",
    "TaskStreamClient",
]

PROTOCOL_VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

#: What a proxy or load balancer in front of the bridge answers, without a JSON-RPC body, while
#: the replica behind it is away (a rolling update): retriable, as the bridge's own 503 is.
_GATEWAY_STATUSES = frozenset({429, 502, 503, 504})
#: ``data.reason`` of such an answer (the client's own, never the server's).
GATEWAY_REASON = "gateway_unavailable"


class StreamError(Exception):
    """The server refused the stream (a JSON-RPC error other than events_gone)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data

    @property
    def retry_after_s(self) -> float | None:
        """How long the server asked to wait (``retryAfterMs``, or a rate limit's
        ``retryAfterSeconds``), in seconds; None when it said nothing."""
        data = self.data if isinstance(self.data, dict) else {}
        for key, scale in (("retryAfterMs", 1000), ("retryAfterSeconds", 1)):
            value = data.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                return min(float(value) / scale, 3600.0)
        return None

    @property
    def retriable(self) -> bool:
        """Trying again later may succeed: the server said when (every retriable answer of
        the bridge carries ``retryAfterMs``), or an earlier stream of this task on this
        connection is still being reaped (``stream_active``)."""
        reason = self.data.get("reason") if isinstance(self.data, dict) else None
        return self.retry_after_s is not None or reason in ("stream_active", GATEWAY_REASON)


@dataclass
class Backoff:
    """The waits between reconnects: "full jitter" exponential back-off.

    The ``n``-th wait in a row is drawn uniformly from ``[0, min(cap_s, base_s * 2**(n-1))]``,
    so many clients dropped at once (a replica stopped) spread their returns over the window
    instead of arriving together; when the server asked for ``retry_after_s``, the wait is
    that (at most ``max_retry_after_s``: a server, or a proxy, asking for an hour is not
    believed) plus up to half of it again (jittered, never shorter than asked, and at most
    ``cap_s`` more). ``rng`` makes it reproducible in tests.
    """

    base_s: float = 0.2
    cap_s: float = 5.0
    max_retry_after_s: float = 60.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        """The wait before reconnect number ``attempt`` (1 for the first in a row)."""
        if retry_after_s is not None and retry_after_s > 0:
            asked = min(retry_after_s, self.max_retry_after_s)
            return asked + self.rng.uniform(0, min(asked / 2, self.cap_s))
        ceiling = min(self.cap_s, self.base_s * 2 ** min(max(attempt, 1) - 1, 32))
        return self.rng.uniform(0, ceiling)


class EventsGone(StreamError):
    """The cursor is older than what the server retains."""

    def __init__(self, task_id: str, earliest_seq: int) -> None:
        super().__init__(
            -32010, "Task events are no longer available", {"earliestSeq": earliest_seq}
        )
        self.task_id = task_id
        self.earliest_seq = earliest_seq


@dataclass(frozen=True)
class StreamEvent:
    seq: int
    task_id: str
    type: str
    payload: dict[str, Any]
    meta: dict[str, Any]


class CursorStore(Protocol):
    def load(self, task_id: str) -> int | None: ...
    def save(self, task_id: str, seq: int) -> None: ...


class MemoryCursorStore:
    def __init__(self) -> None:
        self.cursors: dict[str, int] = {}

    def load(self, task_id: str) -> int | None:
        return self.cursors.get(task_id)

    def save(self, task_id: str, seq: int) -> None:
        self.cursors[task_id] = seq


class FileCursorStore:
    """Cursors in a JSON file, replaced atomically on each save (survives a crash)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return {k: v for k, v in data.items() if isinstance(v, int)}

    def load(self, task_id: str) -> int | None:
        return self._read().get(task_id)

    def save(self, task_id: str, seq: int) -> None:
        data = self._read()
        data[task_id] = seq
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".cursors-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


class _Dropped(Exception):
    """The stream ended without its result: reconnect."""


class TaskStreamClient:
    """Streams a task's events from a bridge (or any SEP-2694 server) at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        store: CursorStore | None = None,
        http: httpx.AsyncClient | None = None,
        max_reconnects: int = 100,
        backoff_s: float = 0.2,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``backoff_s`` is the first wait's ceiling (when no ``backoff`` is given);
        ``sleep`` waits between reconnects (tests pass one that records)."""
        self.url = url
        self.token = token
        self.store = store or MemoryCursorStore()
        self._http = http
        self.max_reconnects = max_reconnects
        self.backoff = backoff or Backoff(base_s=backoff_s)
        self._sleep = sleep
        self.reconnects = 0
        self._ids = 0

    def _request(
        self, method: str, params: dict[str, Any], name: str | None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        self._ids += 1
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL_VERSION,
            "Mcp-Method": method,
        }
        if name is not None:
            headers["Mcp-Name"] = name
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        meta = {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "bridge.client", "version": __version__},
        }
        body = {
            "jsonrpc": "2.0",
            "id": self._ids,
            "method": method,
            "params": {**params, "_meta": meta},
        }
        return headers, body

    async def call(
        self, method: str, params: dict[str, Any], name: str | None = None
    ) -> dict[str, Any]:
        """A plain (non-streaming) request; returns the result or raises :class:`StreamError`."""
        headers, body = self._request(method, params, name)
        async with self._client() as http:
            reply = await http.post(self.url, json=body, headers=headers)
        message = _hinted(_last_message(reply), reply)
        if "error" in message:
            error = message["error"]
            raise StreamError(error.get("code", 0), error.get("message", ""), error.get("data"))
        result: dict[str, Any] = message["result"]
        return result

    async def call_retrying(
        self, method: str, params: dict[str, Any], name: str | None = None
    ) -> dict[str, Any]:
        """:meth:`call`, tried again after a retriable answer (the server's 503, a proxy's),
        with the stream's back-off, at most ``max_reconnects`` times in a row. A connection
        that fails is raised at once: a wrong URL should say so, not wait."""
        attempts = 0
        while True:
            try:
                return await self.call(method, params, name)
            except StreamError as exc:
                attempts += 1
                if not exc.retriable or attempts > self.max_reconnects:
                    raise
                await self._sleep(self.backoff.delay(attempts, exc.retry_after_s))

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._http is not None:
            yield self._http
        else:
            async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as http:
                yield http

    async def stream(self, task_id: str, after: int | None = None) -> AsyncIterator[StreamEvent]:
        """Events of ``task_id`` after ``after`` (else the saved cursor, else from the start)."""
        last = after if after is not None else self.store.load(task_id)
        pending: int | None = None
        attempts = 0
        while True:
            try:
                async with contextlib.aclosing(self._once(task_id, last)) as events:
                    async for event in events:
                        # The generator only runs again when the caller asks for more, so the event
                        # handed over before has been fully processed: persist it now.
                        if pending is not None:
                            self.store.save(task_id, pending)
                            last, pending = pending, None
                        if last is not None and event.seq <= last:
                            continue  # a duplicate after reconnecting
                        attempts = 0
                        pending = event.seq
                        yield event
                if pending is not None:
                    self.store.save(task_id, pending)
                return
            except (_Dropped, httpx.TransportError, StreamError) as exc:
                if pending is not None:
                    self.store.save(task_id, pending)
                    last, pending = pending, None
                if isinstance(exc, StreamError) and not exc.retriable:
                    raise  # final: events_gone, not found, refused, ...
                retry_after = exc.retry_after_s if isinstance(exc, StreamError) else None
                attempts += 1
                self.reconnects += 1
                if attempts > self.max_reconnects:
                    if isinstance(exc, StreamError):
                        raise
                    raise StreamError(
                        INTERNAL_ERROR, f"gave up after {attempts - 1} reconnects: {exc}"
                    ) from exc
                await self._sleep(self.backoff.delay(attempts, retry_after))

    async def _once(self, task_id: str, after: int | None) -> AsyncGenerator[StreamEvent, None]:
        params: dict[str, Any] = {"taskId": task_id}
        if after is not None:
            params["after"] = after
        headers, body = self._request("tasks/stream", params, task_id)
        async with (
            self._client() as http,
            http.stream("POST", self.url, json=body, headers=headers) as reply,
        ):
            if "text/event-stream" not in reply.headers.get("content-type", ""):
                await reply.aread()
                message = _hinted(_last_message(reply), reply)
                self._raise_error(task_id, message)
                if message.get("id") == body["id"] and "result" in message:
                    return  # a plain JSON result: nothing (more) to send, e.g. a finished task
                raise _Dropped(f"unexpected HTTP {reply.status_code}")
            async for message in _sse_messages(reply):
                if message.get("method") == "notifications/tasks/event":
                    p = message.get("params", {})
                    yield StreamEvent(
                        p["seq"], p["taskId"], p["type"], p.get("payload", {}), p.get("_meta", {})
                    )
                elif message.get("id") == body["id"]:
                    self._raise_error(task_id, message)
                    return
        raise _Dropped("the stream closed before its result")

    @staticmethod
    def _raise_error(task_id: str, message: dict[str, Any]) -> None:
        error = message.get("error")
        if not error:
            return
        data = error.get("data")
        if isinstance(data, dict) and data.get("reason") == "events_gone":
            raise EventsGone(task_id, int(data.get("earliestSeq", 0)))
        raise StreamError(error.get("code", 0), error.get("message", ""), data)


def _last_message(reply: httpx.Response) -> dict[str, Any]:
    if "text/event-stream" in reply.headers.get("content-type", ""):
        parser = SseDataParser()
        text = reply.content.decode("utf-8-sig", errors="replace")  # as _utf8_text decodes
        complete = _split_lines(text)[:-1]  # the last piece has no line end: dropped
        messages = [json.loads(data) for data in parser.feed_lines(complete) if data]
        return messages[-1] if messages else {}
    try:
        parsed = reply.json()
    except ValueError:
        return {"error": {"code": INTERNAL_ERROR, "message": f"HTTP {reply.status_code}: not JSON"}}
    return parsed if isinstance(parsed, dict) else {}


def _retry_after_header(reply: httpx.Response) -> int | None:
    """``Retry-After`` in seconds when it is a number of them (an HTTP date is not honoured:
    the back-off applies instead); read in one pass over at most 7 characters."""
    value = reply.headers.get("retry-after", "").strip()
    if 0 < len(value) <= 7 and value.isascii() and value.isdigit():
        return int(value)
    return None


def _hinted(message: dict[str, Any], reply: httpx.Response) -> dict[str, Any]:
    """``message`` with what the HTTP answer adds to its error: the ``Retry-After`` header as
    ``retryAfterMs`` when the error names no wait of its own, and a proxy's bodiless 429, 502,
    503 or 504 marked retriable (:data:`GATEWAY_REASON`)."""
    error = message.get("error")
    if not isinstance(error, dict) or reply.status_code not in _GATEWAY_STATUSES:
        return message
    data = error.get("data")
    data = dict(data) if isinstance(data, dict) else {}
    if "retryAfterMs" not in data and "retryAfterSeconds" not in data:
        seconds = _retry_after_header(reply)
        if seconds is not None:
            data["retryAfterMs"] = seconds * 1000
        data.setdefault("reason", GATEWAY_REASON)
    return {**message, "error": {**error, "data": data}}


def _split_lines(text: str) -> list[str]:
    """``text`` split at CRLF, LF and CR (the last item: what follows the last break)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


async def _utf8_text(reply: httpx.Response) -> AsyncIterator[str]:
    """The body as the SSE standard decodes it: UTF-8 whatever charset the headers declare, a
    leading byte order mark dropped, malformed bytes replaced (``utf-8-sig`` does all three,
    across chunk boundaries)."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
    async for chunk in reply.aiter_bytes():
        if text := decoder.decode(chunk):
            yield text
    if text := decoder.decode(b"", final=True):
        yield text


async def _sse_lines(reply: httpx.Response) -> AsyncIterator[str]:
    """The lines of an SSE body, ended by CRLF, LF or CR only, as the SSE grammar says.

    Not ``aiter_lines``: it also ends a line at U+2028, U+0085 and the other breaks of
    ``str.splitlines``, which the wire's JSON carries raw inside strings. One pass: a line
    that spans chunks is kept in pieces and joined once.
    """
    pieces: list[str] = []  # the line not ended yet
    after_cr = False  # the last chunk ended with CR: an LF first in the next is its CRLF
    async for text in _utf8_text(reply):
        if after_cr and text.startswith("\n"):
            text = text[1:]
        after_cr = text.endswith("\r")
        *ended, rest = _split_lines(text)
        if ended:
            ended[0] = "".join(pieces) + ended[0]
            pieces = []
            for line in ended:
                yield line
        if rest:
            pieces.append(rest)
    if pieces:
        yield "".join(pieces)  # an unended last line: it can end no event


class SseDataParser:
    """The data of SSE events, parsed line by line as the WHATWG HTML standard says (9.2.6).

    Lines come already split on CRLF, LF or CR only (:func:`_sse_lines`). A line starting
    with ``:`` is a comment; a field name runs to the first ``:`` and exactly one space after it
    is dropped from the value; a line without ``:`` is a field with an empty value. ``data``
    values are joined with LF; an empty line dispatches the event unless it had no data line.
    Other fields (``event``, ``id``, ``retry``) do not change the data and are not needed here.
    An event the stream ends in the middle of is discarded, never dispatched. Linear: each line
    is looked at once.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def line(self, line: str) -> str | None:
        """Take one line; the data of the event it dispatches, if it ends one."""
        if not line:
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if colon and value.startswith(" ") else value)
        return None

    def feed_lines(self, lines: list[str]) -> list[str]:
        """The data of every event the lines complete, in order."""
        return [data for data in map(self.line, lines) if data is not None]


async def _sse_messages(reply: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    parser = SseDataParser()
    async for line in _sse_lines(reply):
        data = parser.line(line)
        if data:  # an event with empty data carries no JSON-RPC message
            yield json.loads(data)

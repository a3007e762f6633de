"""Adversarial inputs for every parser of untrusted text, and how to measure their growth.

Each :class:`Adversary` builds an input of about ``n`` bytes meant to hit its parser's worst case
(runs of escapes, unclosed tokens, near-misses of what the parser looks for, a body in many
pieces) and feeds it to the bridge's own entry point. Two drivers use them:
``tests/test_linear_time.py`` checks that the CPU time grows linearly (the median of 5 runs at
``8n`` against ``n``, at ``n`` = 64 KiB), and ``bench/bench_parsers.py`` holds each to an
absolute budget per MiB (PASS/MISS). docs/fuzzing.md ("Linear-time audit") lists what was
checked and why each parser is linear.

CPU time of this thread (:func:`time.thread_time`), not wall time: other processes on a shared
machine do not count, and a quadratic parser at ``n`` = 64 KiB is 8x slower again at ``8n``
where a linear one is not, which no load explains away.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from starlette.requests import Request
from uvicorn.server import ServerState

from bridge import strictjson, tracing
from bridge.client import _sse_messages
from bridge.config import load_settings
from bridge.envelope import EnvelopeError, TaskEvent, decode_event, encode_event, may_have_type
from bridge.events_extension.cursor import BadCursor, decode_offsets, decode_task
from bridge.metrics import Metrics
from bridge.server.auth import Authenticator, Unauthorized
from bridge.server.browser import _cursor as view_cursor
from bridge.server.browser import redact_tokens
from bridge.server.classify import Methods, Rejected, classify, decode_header_value
from bridge.server.cursor import decode_cursor
from bridge.server.handlers import MethodHandlers
from bridge.server.http import McpHttp
from bridge.server.protocols import protocol_class
from bridge.server.wire import RpcError
from bridge.vocabulary import EventTypeRule, TaskEventTypes

__all__ = ["ADVERSARIES", "KIB", "Adversary", "cpu_median", "growth", "input_size"]

KIB = 1024
OWN = TaskEventTypes.of("io.mcpbridge")


@dataclass(frozen=True)
class Adversary:
    """One parser and its worst input: ``make(n)`` builds the input, ``run`` parses it."""

    name: str
    make: Callable[[int], Any]
    run: Callable[[Any], object]


def cpu_median(adversary: Adversary, n: int, runs: int = 5) -> float:
    """Median CPU seconds of ``runs`` parses of the ``n``-byte input (built once, untimed)."""
    data = adversary.make(n)
    times = []
    for _ in range(runs):
        started = time.thread_time()
        adversary.run(data)
        times.append(time.thread_time() - started)
    return statistics.median(times)


def growth(adversary: Adversary, n: int, runs: int = 5) -> tuple[float, float]:
    """``(seconds at n, seconds at 8n)``, medians of ``runs`` each. Linear: about 8x."""
    return cpu_median(adversary, n, runs), cpu_median(adversary, 8 * n, runs)


def _quietly(parse: Callable[[Any], object], *errors: type[Exception]) -> Callable[[Any], object]:
    """``parse`` with its documented refusals swallowed: only the time matters here."""
    caught = errors or (ValueError,)

    def run(data: Any) -> object:
        try:
            return parse(data)
        except caught as exc:
            return exc

    return run


# --- JSON: request bodies and record values -------------------------------------------------


def _escaped_quotes(n: int) -> str:
    # The case: deep enough to need the depth scan, then a string never closed, made of
    # escaped quotes (each a place a string token might start).
    return "[" * 129 + '"' + '\\"' * (n // 2)


def _backslashes(n: int) -> str:
    return "[" * 129 + '"' + "\\" * n


def _brackets(n: int) -> str:
    return "[" * n


def _quoted_brackets(n: int) -> str:
    return "[" * 129 + '"[{\\\\' * (n // 5) + '"' + "]" * 129


def _long_number(n: int) -> str:
    return "[0." + "1" * n + "]"


def _big_integers(n: int) -> str:
    # int() of a digit run is quadratic: capped at 4300 digits by the interpreter, each number
    # costs a bounded amount, and the count grows with n.
    return "[" + ",".join(["9" * 4300] * -(-n // 4301)) + "]"


def _surrogate_escapes(n: int) -> str:
    return '["' + "\\ud83d\\ude00" * (n // 12) + '"' + ",[]" * 130 + "]"


_loads = _quietly(strictjson.loads, strictjson.NotWireJson)


def _as_bytes(make: Callable[[int], str]) -> Callable[[int], bytes]:
    return lambda n: make(n).encode()


def _record_value(make: Callable[[int], str]) -> Callable[[int], bytes]:
    """A JSON record of the bridge's own created type around the text (the tail decodes it)."""
    head = '{"type":"' + OWN.created + '","payload":{"v":'
    return lambda n: (head + make(n) + "}}").encode()


def _decode_record(value: bytes) -> object:
    if may_have_type(value, None, frozenset({OWN.created, OWN.status})):
        try:
            return decode_event(value, None)
        except EnvelopeError as exc:
            return exc
    return None


def _near_miss_types(n: int) -> bytes:
    # Nearly the created type's token, over and over: a naive search would restart each time.
    near = ('"' + OWN.created[:-1]).encode()
    return b'{"type":"x.y","payload":{"v":"' + near * (n // len(near)) + b'"}}'


def _avro_payload(n: int) -> bytes:
    payload = {"v": "\\" * (n // 2)}
    return encode_event(TaskEvent(OWN.status, payload), fmt="avro")[0]


_METHODS = Methods(modern={"tools/call"}, legacy={"tools/call"})


def _classify(body: bytes) -> object:
    try:
        return classify({}, body, _METHODS)
    except Rejected as exc:
        return exc


# --- headers, cursors, names ----------------------------------------------------------------


def _b64_header(n: int) -> str:
    return "=?base64?" + "QUFB" * (n // 4) + "=?="


def _spaced_header(n: int) -> str:
    return " " * (n // 2) + "x" + " " * (n // 2)


def _task_cursor(n: int) -> str:
    return base64.urlsafe_b64encode(("t1." + "-" * n + "5").encode()).decode().rstrip("=")


def _offsets_cursor(n: int) -> str:
    return base64.urlsafe_b64encode(("k1.abcdef01." + "1." * (n // 2)).encode()).decode()


def _stream_cursor(n: int) -> str:
    return "v1." + "A" * (n // 2) + "." + "9" * (n // 2)


def _event_type(n: int) -> str:
    return "com." + "a-" * (n // 2) + "!"


def _token_query(n: int) -> str:
    return "GET /view?" + "&token=" * (n // 7) + " HTTP/1.1"


_RULE = EventTypeRule(["io.mcpbridge"])
_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _tracestate(member: Callable[[int], str]) -> Callable[[int], dict[str, Any]]:
    """``params`` whose ``_meta`` carries a valid traceparent and a tracestate of ``n`` bytes
    (the body, not a header, so up to the request limit)."""

    def make(n: int) -> dict[str, Any]:
        members, size = [], 0
        while size < n:
            members.append(member(len(members)))
            size += len(members[-1]) + 1
        meta = {"traceparent": _TRACEPARENT, "tracestate": ",".join(members)}
        return {"_meta": meta}

    return make


def _incoming_trace(params: dict[str, Any]) -> object:
    return tracing._incoming({}, params)


def _config() -> Any:
    return load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        tool_packs=[],
        server={"max_request_bytes": 16 * 1024 * KIB},
        auth={
            "mode": "jwt",
            "jwt_algorithms": ["HS256"],
            "jwt_secret": "s" * 32,
            "jwt_audience": "bridge",
            "jwt_issuer": "issuer",
        },
    )


_CONFIG = _config()
_AUTH = Authenticator(_CONFIG.auth)
_HTTP = McpHttp(_CONFIG, _AUTH, MethodHandlers(_CONFIG, None, [], None), Metrics(), lambda *_: 0)  # type: ignore[arg-type]


def _request(headers: list[tuple[str, str]], receive: Any = None) -> Request:
    raw = [(k.encode(), v.encode("latin-1")) for k, v in headers]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": raw, "query_string": b""}
    return Request(scope, receive) if receive is not None else Request(scope)


def _host_header(n: int) -> Request:
    return _request([("host", "[" + ":" * (n // 2) + "]"), ("origin", "http://[" + ":" * (n // 2))])


def _origin_header(n: int) -> Request:
    return _request([("host", "localhost"), ("origin", "http://" + "@:" * (n // 2) + "x")])


def _jwt_header(n: int) -> Request:
    part = "e" * (n // 12 * 4)  # a length base64 can decode, so each part is read whole
    return _request([("authorization", f"Bearer {part}.{part}.{part}")])


def _principal(request: Request) -> object:
    try:
        return _AUTH.principal(request)
    except Unauthorized as exc:
        return exc


def _trickled_body(n: int) -> list[bytes]:
    """A body of ``n`` bytes in 8-byte ASGI messages (a client sending tiny segments)."""
    return [b"x" * 8] * (n // 8)


def _read_body(pieces: list[bytes]) -> object:
    messages = iter(pieces)

    async def receive() -> dict[str, Any]:
        piece = next(messages, None)
        more = piece is not None
        return {"type": "http.request", "body": piece or b"", "more_body": more}

    try:
        return asyncio.run(_HTTP._read_body(_request([], receive)))
    except RpcError as exc:
        return exc


class _Transport(asyncio.Transport):
    """What a uvicorn protocol needs of a connection: it swallows writes and records a close."""

    closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: Any) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


#: The bridge's httptools protocol with its default bounds (bridge/server/protocols.py).
BoundedHttpTools = protocol_class("httptools", read_timeout_s=30.0, max_head_bytes=64 * KIB)
_UVICORN = uvicorn.Config(app=lambda *_: None, http=BoundedHttpTools, log_level="error")
_UVICORN.load()


def _trickled_head(n: int) -> list[bytes]:
    """A request line whose URL is ``n`` bytes, in 16-byte reads, never ended."""
    return [b"GET /"] + [b"a" * 16] * (n // 16)


def _read_head(pieces: list[bytes]) -> object:
    loop = asyncio.new_event_loop()  # the protocol's, for tasks it never gets to start here
    try:
        protocol = BoundedHttpTools(_UVICORN, ServerState(), {}, _loop=loop)
        transport = _Transport()
        protocol.connection_made(transport)
        for piece in pieces:
            if transport.closed:
                break
            protocol.data_received(piece)
        return transport.closed
    finally:
        loop.close()


def _sse_line(n: int) -> list[bytes]:
    """One SSE line of ``n`` bytes in 64-byte chunks, never ended by a newline."""
    return [b"data: " + b"x" * 58] * (n // 64)


def _client_sse(chunks: list[bytes]) -> object:
    async def body() -> Any:
        for chunk in chunks:
            yield chunk

    async def read() -> list[object]:
        reply = httpx.Response(200, content=body())
        try:
            return [message async for message in _sse_messages(reply)]
        except ValueError as exc:  # the line is no JSON
            return [exc]

    return asyncio.run(read())


ADVERSARIES: list[Adversary] = [
    Adversary("loads: escaped quotes, unclosed", _escaped_quotes, _loads),
    Adversary("loads bytes: escaped quotes, unclosed", _as_bytes(_escaped_quotes), _loads),
    Adversary("loads: backslashes, unclosed", _backslashes, _loads),
    Adversary("loads: brackets", _brackets, _loads),
    Adversary("loads: brackets in strings", _quoted_brackets, _loads),
    Adversary("loads: long fraction", _long_number, _loads),
    Adversary("loads: 4300-digit integers", _big_integers, _loads),
    Adversary("loads: surrogate-pair escapes", _surrogate_escapes, _loads),
    Adversary("POST body: escaped quotes", _as_bytes(_escaped_quotes), _classify),
    Adversary("record: escaped quotes", _record_value(_escaped_quotes), _decode_record),
    Adversary("record: near-miss type tokens", _near_miss_types, _decode_record),
    Adversary("record: Avro, escaped payload", _avro_payload, _decode_record),
    Adversary("Mcp-Name: base64", _b64_header, _quietly(decode_header_value, RpcError)),
    Adversary("Mcp-Name: spaces", _spaced_header, _quietly(decode_header_value, RpcError)),
    Adversary("Last-Event-ID: stream cursor", _stream_cursor, _quietly(decode_cursor)),
    Adversary("Last-Event-ID: view seq", lambda n: "9" * n, lambda t: view_cursor(t, None)),
    Adversary("events cursor: task", _task_cursor, _quietly(decode_task, BadCursor)),
    Adversary(
        "events cursor: offsets",
        _offsets_cursor,
        _quietly(lambda c: decode_offsets(c, "abcdef01"), BadCursor),
    ),
    Adversary("event type: vendor rule", _event_type, _RULE.is_prefixed),
    Adversary("access log: token redaction", _token_query, redact_tokens),
    Adversary("tracestate: many members", _tracestate(lambda i: f"k{i}=v"), _incoming_trace),
    Adversary(
        "tracestate: near-miss keys", _tracestate(lambda i: "a" * 250 + "="), _incoming_trace
    ),
    Adversary("Host and Origin: brackets", _host_header, _HTTP._origin_allowed),
    Adversary("Origin: userinfo", _origin_header, _HTTP._origin_allowed),
    Adversary("Authorization: JWT", _jwt_header, _principal),
    Adversary("POST body: 8-byte pieces", _trickled_body, _read_body),
    Adversary("HTTP head: URL in 16-byte reads", _trickled_head, _read_head),
    Adversary("client SSE: one unended line", _sse_line, _client_sse),
]


def input_size(adversary: Adversary, n: int) -> int:
    """The size of ``adversary``'s input for ``n``: its bytes, or its headers' as JSON."""
    data = adversary.make(n)
    if isinstance(data, list):
        return sum(map(len, data))
    if isinstance(data, Request):
        return len(json.dumps(dict(data.headers)))
    if isinstance(data, dict):
        return len(json.dumps(data))
    return len(data)

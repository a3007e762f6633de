"""Fuzz targets and their inputs: the record decoder and the MCP endpoint, each a plain function.

Two drivers use this module: ``tests/test_fuzz.py`` (a bounded, seeded run in CI) and
``bench/fuzz.py`` (a long run, ``--minutes N``). Both hand a target the cases a Hypothesis
strategy draws (:func:`fuzz_test`); docs/fuzzing.md says why Hypothesis and not atheris.

* :func:`decode_record` sends one Kafka record (key, value bytes, headers, timestamp, size
  limit) through every decoding entry point the tail and the readers use: ``decode_event``,
  ``may_have_type``, ``event_from_record``, ``RecordDecoder.event`` / ``facts``, ``LazyEvent``
  and ``strictjson.loads`` (its msgspec fast path against ``loads_full``), and renders the event
  as a stream would. A case passes when each entry point answers an event or the module's typed
  error, and every event's JSON is wire JSON.
* :class:`Endpoint` serves one HTTP request to the real app of ``bridge/server/app.py`` through
  ``httpx.ASGITransport``, with in-memory collaborators in place of the Kafka-backed task
  service and stream hub (:class:`MemoryTasks`, :class:`MemoryStreams`); auth, host checks,
  classification, the handlers, admission, cursors, SSE framing and the renderer are the
  bridge's own. A case passes when the status and JSON-RPC code are among :data:`DOCUMENTED`,
  nothing is 5xx or -32603, no unhandled exception is logged, and every body is wire JSON.

Either target fails a case with :class:`FuzzFailure` (or the unexpected exception itself); a
case that takes longer than :data:`CASE_BOUND_S` of wall time fails with :class:`Hang`, and one
whose CPU time is above :data:`WORK_FLOOR_S` plus :data:`WORK_PER_KIB_S` per KiB of its input
fails with :class:`TooMuchWork` (a parser quadratic in its input stays under any fixed bound at
the sizes a fuzzer draws; per byte it does not). Not
covered here (they need Kafka): the events extension, ``subscriptions/listen``, forwarding.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import jwt
from aiokafka.structs import ConsumerRecord
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from test_envelope import event_types, json_objects, json_values, record
from test_strictjson import HOSTILE_TOKENS, hostile_json_texts

from bridge import strictjson
from bridge.config import Settings, ToolSpec, load_settings
from bridge.envelope import (
    AVRO_CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    JSON_CONTENT_TYPE,
    EnvelopeError,
    Item,
    TaskEvent,
    WireMembers,
    decode_event,
    encode_event,
    may_have_type,
)
from bridge.log.fanout import TaskFeed
from bridge.log.records import (
    Batch,
    LazyEvent,
    RecordDecoder,
    event_from_record,
    task_facts_of,
    task_id_of,
)
from bridge.metrics import KNOWN_METHODS, Metrics
from bridge.server.admission import Admission, Caller, Limits, Ticket
from bridge.server.app import Components, create_app
from bridge.server.auth import Authenticator
from bridge.server.classify import NAME_PARAM
from bridge.server.cursor import encode_cursor
from bridge.server.handlers import MethodHandlers
from bridge.server.http import McpHttp
from bridge.server.sse import renderer
from bridge.server.wire import (
    CLIENT_CAPS_META,
    LATEST_VERSION,
    LEGACY_VERSIONS,
    PROTOCOL_VERSION_META,
    TASKS_EXTENSION,
    cursor_ahead_error,
    events_gone_error,
)
from bridge.tasks.service import TaskNotFound, TaskView, TooManyTasks
from bridge.vocabulary import (
    EVENTS_GONE,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CAPABILITY,
    PARSE_ERROR,
    REVERSE_DNS_ONLY,
    UNSUPPORTED_VERSION,
    TaskEventTypes,
)

__all__ = [
    "CASE_BOUND_S",
    "DOCUMENTED",
    "WORK_FLOOR_S",
    "WORK_PER_KIB_S",
    "Endpoint",
    "FuzzFailure",
    "Hang",
    "RecordCase",
    "RequestCase",
    "TooMuchWork",
    "decode_record",
    "fuzz_test",
    "record_cases",
    "request_cases",
    "wall_bound",
    "work_bound",
    "work_bound_s",
]

T = TypeVar("T", bound="Sized")

#: Wall seconds one case may take (a decode takes milliseconds, a request tens of them; a
#: hang found is re-run while Hypothesis shrinks it, so the bound is not larger).
CASE_BOUND_S = 5.0
#: Hypothesis' own per-example deadline: generous, so a loaded machine never trips it.
DEADLINE_MS = 5_000
#: CPU seconds any case may take: 5x the costliest case measured (the first record case, 31 ms
#: with cold caches; a request costs 3 ms), so a quadratic scan fails it from a few KiB...
WORK_FLOOR_S = 0.15
#: ...plus this per KiB of the case's input: 3x the largest linear cost measured (a request,
#: 0.35 ms per KiB with its fixed cost; a record 0.04). docs/fuzzing.md has the measurements.
WORK_PER_KIB_S = 0.001


class FuzzFailure(AssertionError):
    """A case broke a target's contract; the message says which rule."""


class Hang(FuzzFailure):
    """A case ran past its wall bound."""


class TooMuchWork(FuzzFailure):
    """A case cost more CPU time than its input's size allows."""


class Sized(Protocol):
    """A case that knows how many bytes of input it carries (its work bound scales with them)."""

    def input_bytes(self) -> int: ...


def work_bound_s(case: Sized) -> float:
    """The CPU seconds ``case`` may take: a floor, plus a budget per KiB of its input."""
    return WORK_FLOOR_S + WORK_PER_KIB_S * case.input_bytes() / 1024


@contextlib.contextmanager
def work_bound(case: Sized) -> Iterator[None]:
    """Fail with :class:`TooMuchWork` when the block costs more CPU than :func:`work_bound_s`.

    CPU time of this thread, not wall time: other processes on the machine do not count. The
    garbage collector is paused meanwhile: a full collection of what Hypothesis holds (0.34 s
    once, in a 226-byte request) is not the case's work.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        started = time.thread_time()
        yield
        spent, bound = time.thread_time() - started, work_bound_s(case)
    finally:
        if collecting:
            gc.enable()
    if spent > bound:
        size = case.input_bytes()
        raise TooMuchWork(
            f"{type(case).__name__} of {size} bytes took {spent:.2f} s of CPU (bound {bound:.2f} s)"
        )


# --- bounds and drivers --------------------------------------------------------------------------


@contextlib.contextmanager
def wall_bound(seconds: float, what: str) -> Iterator[None]:
    """Fail with :class:`Hang` when the block runs longer than ``seconds`` of wall time.

    SIGALRM interrupts even a loop that never yields; a timer already set (pytest-timeout's) is
    put back afterwards with what remains of it. Off the main thread, where signals cannot be
    delivered, the block runs unbounded (the drivers run on the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hung(signum: int, frame: Any) -> None:
        raise Hang(f"{what} took more than {seconds:g} s")

    started = time.monotonic()
    outer_handler = signal.signal(signal.SIGALRM, hung)
    outer_left, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left > 0:
            left = max(outer_left - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def fuzz_test(
    target: Callable[[T], object],
    cases: st.SearchStrategy[T],
    *,
    examples: int,
    seed_value: int,
    explicit: tuple[T, ...] = (),
) -> Callable[[], None]:
    """A Hypothesis test running ``target`` on ``explicit`` cases, then on ``examples`` cases
    drawn with ``seed_value``.

    No example database. The same seed and Hypothesis version draw the same cases, but which
    outcomes a drawn sample reaches is not stable across machines (the CI run of a clean clone
    drew no SSE stream where the development machine drew 8): ``explicit`` cases are always run.
    """

    def run_explicit(test: Callable[[T], None]) -> Callable[[T], None]:
        for case in reversed(explicit):
            test = example(case)(test)
        return test

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=DEADLINE_MS,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases)
    @run_explicit
    def run(case: T) -> None:
        with wall_bound(CASE_BOUND_S, type(case).__name__), work_bound(case):
            target(case)

    return run


# --- target 1: a record through every decoding entry point -----------------------------------

PREFIX = "io.mcpbridge"
OWN = TaskEventTypes.of(PREFIX)
FACT_TYPES = frozenset({OWN.created, OWN.status})

Headers = list[tuple[str, bytes]]


def _one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in ``n`` draws. A middle value of the range: Hypothesis draws a range's
    ends (and a list's first items) far more often than the rest."""
    return bool(draw(st.integers(0, n - 1)) == n // 2)


@dataclass(frozen=True)
class RecordCase:
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    max_bytes: int
    tupled_headers: bool  # aiokafka hands out a tuple; producers and tests may pass a list

    def input_bytes(self) -> int:
        """The bytes a producer chose: key, value, header names and values."""
        headers = sum(
            len(name.encode("utf-8", "surrogatepass")) + len(value or b"")
            for name, value in self.headers
        )
        return len(self.key or b"") + len(self.value or b"") + headers

    def consumer_record(self) -> ConsumerRecord[bytes, bytes]:
        headers: Any = tuple(self.headers) if self.tupled_headers else self.headers
        size = -1 if self.value is None else len(self.value)
        return ConsumerRecord(
            "events", 0, 42, self.timestamp_ms, 0, self.key, self.value, None, 4, size, headers
        )


def decode_record(case: RecordCase) -> str:
    """One record through the decoders; returns what it decoded to (a label for the stats)."""
    value, headers = case.value, case.headers
    try:
        event: TaskEvent | None = decode_event(
            value, headers, max_bytes=case.max_bytes, record_timestamp_ms=case.timestamp_ms
        )
    except EnvelopeError as exc:
        _check_error_text(exc)
        event, outcome = None, exc.reason
    else:
        _check_wire_event(event, "decode_event")
        outcome = "event"
    types = FACT_TYPES | ({event.type} if event is not None else frozenset())
    if event is not None and not may_have_type(value, headers, types):
        raise FuzzFailure(f"may_have_type said no to a record that decodes to {event.type!r}")
    rec = case.consumer_record()
    task_id_of(rec)  # any key bytes: a str or None, never an exception
    decoder = RecordDecoder(PREFIX, case.max_bytes, REVERSE_DNS_ONLY)
    eager = decoder.event(rec)
    _check_wire_event(eager, "RecordDecoder.event")
    if not REVERSE_DNS_ONLY.is_prefixed(eager.type):
        raise FuzzFailure(f"the readers would emit the unprefixed type {eager.type!r}")
    plain = event_from_record(rec, prefix=PREFIX, max_bytes=case.max_bytes)
    if _fields(plain) != _fields(eager):
        raise FuzzFailure("event_from_record and RecordDecoder.event disagree")
    facts, decoded = decoder.facts(rec)
    if facts != task_facts_of(eager, PREFIX):
        raise FuzzFailure("the tail's facts differ from those of the readers' event")
    lazy = decoded if decoded is not None else LazyEvent(rec, decoder).get()
    if _fields(lazy) != _fields(eager):
        raise FuzzFailure("the tail's (lazy) event differs from the readers' (eager) one")
    _check_json_paths(value)
    return outcome


def _fields(event: TaskEvent) -> tuple[Any, ...]:
    return event.type, event.payload, event.meta, event.timestamp_ms, event.payload_json


def _check_error_text(exc: EnvelopeError) -> None:
    if len(exc.message) > 300:
        raise FuzzFailure(f"an envelope error's message is {len(exc.message)} characters")
    strictjson.dumps({"reason": exc.reason, "error": exc.message})


def _check_wire_event(event: TaskEvent, where: str) -> None:
    """The event as a stream sends it: one line of wire JSON carrying its type and payload."""
    for text in (event.payload_json, event.meta_json):
        if text is not None and ("\n" in text or "\r" in text):
            raise FuzzFailure(f"{where}: JSON text with a raw line break would split an SSE line")
    line = renderer("task-1", PREFIX)(7, event)
    if "\n" in line or "\r" in line:
        raise FuzzFailure(f"{where}: the rendered notification is not one line")
    try:
        # The notification and its params are two levels around the payload, which may nest
        # as deep as the bound itself (strictjson.MAX_DEPTH allows for a few such levels).
        text = line.encode("utf-8")
        params = strictjson.loads(text, max_depth=strictjson.MAX_DEPTH + 2)["params"]
    except (strictjson.NotWireJson, UnicodeEncodeError) as exc:
        raise FuzzFailure(f"{where}: the rendered notification is not wire JSON: {exc}") from None
    if (params["type"], params["payload"]) != (event.type, event.payload):
        raise FuzzFailure(f"{where}: the stream would not send the event's type and payload")


def _check_json_paths(value: bytes | None) -> None:
    """The payload validator: the fast path answers exactly as the authoritative one."""
    if value is None:
        return
    outcomes = []
    for parse in (strictjson.loads, strictjson.loads_full):
        try:
            outcomes.append(("ok", parse(value)))
        except strictjson.NotWireJson:
            outcomes.append(("refused", None))
    if outcomes[0] != outcomes[1]:
        raise FuzzFailure(f"strictjson's fast path says {outcomes[0]}, the full one {outcomes[1]}")


# The inputs: valid encodings first, then careless texts, then bytes mutated on top of them.

_CONTENT_TYPES = [
    AVRO_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    "text/json",
    "Application/JSON; charset=utf-8",
    " application/vnd.mcpbridge.task-event+avro ; v=1",
    "text/plain",
    "",
]
_INTERESTING_BYTES = b'\x00\x01\x02\x7f\x80\xc3\xff"\\{}[],:0'
record_types = (
    st.sampled_from([OWN.created, OWN.status, OWN.progress, OWN.undecodable, "tool.started"])
    | event_types
    | st.text(max_size=8)
)
_status_payloads = st.fixed_dictionaries(
    {"status": st.sampled_from(["working", "completed", "failed", "Completed"]) | st.integers()}
)
_created_payloads = st.fixed_dictionaries(
    {"owner": st.sampled_from(["ab" * 16, "zz" * 16, "short"]), "createdMs": st.integers(-1)},
    optional={"pollIntervalMs": st.integers(-1), "ttlMs": st.none() | st.integers(-1)},
)


@st.composite
def _valid_values(draw: st.DrawFn, fmt: str) -> bytes:
    type_ = draw(record_types.filter(lambda t: 0 < len(t) <= 256))
    payload = draw(json_objects | _status_payloads | _created_payloads)
    meta = draw(st.none() | json_objects)
    event = TaskEvent(type_, payload, meta, draw(st.integers(0, 2**41)))
    return encode_event(event, fmt="avro" if fmt == "avro" else "json")[0]


@st.composite
def _careless_values(draw: st.DrawFn, fmt: str) -> bytes:
    """Envelopes around JSON texts no careful producer writes (NaN, surrogates, deep nesting)."""
    in_object = hostile_json_texts.map(lambda text: '{"v":' + text + "}")
    payload = draw(in_object | st.sampled_from(HOSTILE_TOKENS) | hostile_json_texts)
    meta = draw(st.none() | in_object)
    return record(fmt, draw(record_types), payload, meta)


@st.composite
def _mutated(draw: st.DrawFn, base: bytes, at_least: int = 0) -> bytes:
    """``base`` after a few byte-level mutations, as a fuzzer makes them."""
    data = bytearray(base)
    for _ in range(draw(st.integers(at_least, 4))):
        where = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "repeat", "pump", "cut"]))
        if op == "flip" and where < len(data):
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and where < len(data):
            data[where] = draw(st.sampled_from(_INTERESTING_BYTES))
        elif op == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[where : where + draw(st.integers(1, 8))]
        elif op == "repeat":
            data[where:where] = data[where : where + draw(st.integers(1, 16))]
        elif op == "pump":  # a short range over and over, what worst cases are made of
            piece = bytes(data[where : where + draw(st.integers(1, 4))])
            data[where:where] = piece * (draw(st.integers(1, PUMP_BYTES)) // max(len(piece), 1))
        elif op == "cut":
            del data[where:]
    return bytes(data)


#: The most bytes one pump mutation adds: below the endpoint's body limit, so the body is parsed.
PUMP_BYTES = 48 * 1024

_NOISE_PREFIXES = [b"", b"\xc3\x01", encode_event(TaskEvent("a.b", {}))[0][:10]]


@st.composite
def _record_values(draw: st.DrawFn) -> tuple[bytes, str]:
    """A value (valid, careless or noise; mutated or not) and the content type it was made as."""
    fmt = draw(st.sampled_from(["avro", "json"]))
    kind = draw(st.sampled_from(["valid", "valid", "careless", "noise"]))
    if kind == "valid":
        value = draw(_valid_values(fmt))
    elif kind == "careless":
        value = draw(_careless_values(fmt))
    else:  # behind nothing, the Avro marker, or the whole Avro header
        value = draw(st.sampled_from(_NOISE_PREFIXES)) + draw(st.binary(max_size=64))
    if draw(st.booleans()):
        value = draw(_mutated(value, at_least=1))
    return value, AVRO_CONTENT_TYPE if fmt == "avro" else JSON_CONTENT_TYPE


@st.composite
def _record_headers(draw: st.DrawFn, made_as: str) -> Headers:
    """No content-type (the first bytes decide), the right one, or a wrong or odd one; and,
    once in a while, more headers of any name."""
    header_names = st.sampled_from([CONTENT_TYPE_HEADER, "Content-Type", "traceparent", "x"])
    if _one_in(draw, 6):
        content_type: bytes | None = draw(st.binary(max_size=12))
    else:
        content_types = [None, made_as, *_CONTENT_TYPES]
        content_type = (draw(st.sampled_from(content_types)) or "").encode() or None
    headers = [] if content_type is None else [(draw(header_names), content_type)]
    if _one_in(draw, 5):
        names = header_names | st.text(max_size=4)
        values = st.sampled_from([ct.encode() for ct in _CONTENT_TYPES]) | st.binary(max_size=12)
        headers += draw(st.lists(st.tuples(names, values), max_size=3))
    return headers


@st.composite
def record_cases(draw: st.DrawFn) -> RecordCase:
    value, made_as = draw(_record_values())
    headers = draw(_record_headers(made_as))
    size = len(value)
    return RecordCase(
        key=draw(st.sampled_from([b"task-1", None, b""]) | st.binary(max_size=8)),
        value=None if _one_in(draw, 20) else value,  # a tombstone
        headers=headers,
        timestamp_ms=draw(st.sampled_from([1_700_000_000_000, -1, 0, 2**63 - 1])),
        max_bytes=draw(st.sampled_from([1_048_576, size, max(size - 1, 0)])),
        tupled_headers=draw(st.booleans()),
    )


# --- target 2: one HTTP request to the MCP endpoint ----------------------------------------------

#: The HTTP statuses the endpoint answers and, for each, the JSON-RPC error codes its body may
#: carry (None: a result, an SSE stream, or a body that is not JSON-RPC). Collected from
#: docs/tasks-stream.md §4.1 and §5.6 and the modules that raise them (bridge/server/http.py,
#: classify.py, handlers.py, admission.py, auth.py). 5xx are documented only for a fault, a
#: moving partition, an owner not answering and the replica's stream cap: none of which an
#: in-process request without Kafka may meet, so here every 5xx is a failure, and so is -32603.
DOCUMENTED: dict[int, frozenset[int | None]] = {
    200: frozenset({None, INVALID_PARAMS, INVALID_REQUEST, EVENTS_GONE}),
    202: frozenset({None}),  # a notification
    400: frozenset(
        {
            PARSE_ERROR,
            INVALID_REQUEST,
            INVALID_PARAMS,
            HEADER_MISMATCH,
            MISSING_CAPABILITY,
            UNSUPPORTED_VERSION,
        }
    ),
    401: frozenset({None}),  # {"error": "..."}: credentials missing or invalid
    403: frozenset({None}),  # {"error": "forbidden host or origin"}
    404: frozenset({METHOD_NOT_FOUND, INVALID_PARAMS}),  # unknown method; GET of an unknown task
    405: frozenset({None}),  # GET without Last-Event-ID, DELETE
    410: frozenset({EVENTS_GONE}),  # GET of a cursor whose events are gone
    413: frozenset({INVALID_REQUEST}),
    429: frozenset({INVALID_REQUEST}),
}
#: JSON-RPC errors a started stream may end with (docs/tasks-stream.md §4.2, canary excluded).
STREAM_ERRORS = frozenset({EVENTS_GONE, INVALID_PARAMS})

PRINCIPAL = "alice"
BEARER_TOKEN = "fuzz-bearer-token-0123456789"
JWT_SECRET = "fuzz-jwt-secret-0123456789abcdef0123456789"
JWT_AUDIENCE = "mcp-kafka-bridge-fuzz"
JWT_ISSUER = "https://issuer.fuzz/"
AUTH_MODES = ("none", "bearer", "jwt")
MAX_REQUEST_BYTES = 64 * 1024

# The tasks every case starts with (status by id); a stream of any has seqs 0..4, 0 and 1 gone.
SEEDED = {"t-work": "working", "t-input": "input_required", "t-done": "completed"}
EARLIEST_SEQ, NEXT_SEQ = 2, 5

TOOLS = [
    ToolSpec(
        name="greet",
        task="optional",
        input_schema={
            "type": "object",
            "properties": {"name": {"type": "string", "x-mcp-header": "Name"}},
            "required": ["name"],
        },
    ),
    ToolSpec(name="long_job", task="required"),
    ToolSpec(name="ask", task="forbidden", input_before={"k": {"method": "elicitation/create"}}),
    ToolSpec(name="sample", requires={"sampling": {}}),
]


class MemoryTasks:
    """The task service's interface in memory: seeded tasks, and direct calls that complete
    at once (so no call waits for a worker that is not there)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.views = {task_id: self._view(task_id, status) for task_id, status in SEEDED.items()}

    @staticmethod
    def _view(task_id: str, status: str) -> TaskView:
        result = {"content": [{"type": "text", "text": "done"}]} if status == "completed" else None
        inputs = {"k": {"method": "elicitation/create"}} if status == "input_required" else None
        return TaskView(task_id, status, 1000, 2000, 60_000, 500, None, result, None, inputs)

    def new_task_id(self) -> str:
        return f"direct-{len(self.views)}"

    async def create(
        self,
        tool: ToolSpec,
        arguments: dict[str, Any],
        principal: str,
        *,
        task_id: str | None = None,
        input_responses: dict[str, Any] | None = None,
    ) -> TaskView:
        if len(self.views) >= 64:
            raise TooManyTasks(64)
        direct = task_id is not None
        task_id = task_id or f"task-{len(self.views)}"
        self.views[task_id] = self._view(task_id, "completed" if direct else "working")
        return self.views[task_id]

    async def get(self, task_id: str, principal: str) -> TaskView:
        view = self.views.get(task_id)
        if view is None or principal != self.owner:
            raise TaskNotFound()
        return view

    async def update(self, task_id: str, principal: str, responses: dict[str, Any]) -> None:
        await self.get(task_id, principal)

    async def cancel(self, task_id: str, principal: str) -> None:
        await self.get(task_id, principal)

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[TaskFeed]:
        yield TaskFeed(task_id, 16)


class MemoryStreams:
    """The stream hub's interface: the real admission; each task's retained seqs are
    ``EARLIEST_SEQ .. NEXT_SEQ - 1``, served in one batch, then a keep-alive."""

    def __init__(self) -> None:
        self.admission = Admission(Limits(4, 1_000_000, 1_000_000))
        self.draining = asyncio.Event()

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket:
        return self.admission.admit(caller, task_id, request_id)

    def release(self, ticket: Ticket) -> None:
        self.admission.release(ticket)

    async def check_cursor(self, task_id: str, after: int | None) -> int | None:
        if after is not None and after + 1 < EARLIEST_SEQ:
            raise events_gone_error(task_id, EARLIEST_SEQ)
        if after is not None and after >= NEXT_SEQ:
            raise cursor_ahead_error(task_id, NEXT_SEQ)
        return None  # no log start: nothing to hand the read

    async def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool
    ) -> AsyncIterator[Batch[Item] | None]:
        first = EARLIEST_SEQ if after is None else after + 1
        meta = {"note": "line\nbreak \u2028"}
        seqs = range(first, NEXT_SEQ)
        # With wire (what tasks/stream asks for), odd seqs come as a replay's wire members.
        items: list[Item] = [
            WireMembers(f'"type":"com.example.step","payload":{{"i":{seq}}}')
            if wire and seq % 2
            else TaskEvent("com.example.step", {"i": seq}, meta, 5)
            for seq in seqs
        ]
        full = [i for i, item in enumerate(items) if isinstance(item, TaskEvent)]
        yield Batch(seqs, list(seqs), items, full)
        yield None

    def count_gone(self) -> None:
        pass

    def cancel(self, client: str, request_id: str | int) -> int:
        return self.admission.cancel(client, request_id)


@dataclass(frozen=True)
class RequestCase:
    mode: str  # the auth mode of the app that serves it
    method: str  # the HTTP method
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def input_bytes(self) -> int:
        """The bytes a client chose: the body, header names and values."""
        return len(self.body) + sum(len(name) + len(value) for name, value in self.headers)


def task_case(method: str, task_id: str = "t-work") -> RequestCase:
    """A valid request of ``method`` (``tasks/stream``, ``tasks/get``, ...) on a seeded task on
    the app without authentication: a request that reaches the handlers (and a stream, or a
    JSON result) whatever the drawn cases reach."""
    params = {"taskId": task_id, "_meta": _VALID_META}
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = [
        (b"mcp-protocol-version", LATEST_VERSION.encode()),
        (b"mcp-method", method.encode()),
        (b"mcp-name", task_id.encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
    ]
    return RequestCase("none", "POST", headers, json.dumps(message).encode())


def stream_case(task_id: str = "t-work") -> RequestCase:
    """:func:`task_case` of ``tasks/stream``."""
    return task_case("tasks/stream", task_id)


class Endpoint:
    """The real app of each auth mode, and a loop to call it from synchronous code.

    A context manager; every case gets fresh in-memory collaborators, so a case's answer never
    depends on the cases before it (Hypothesis replays and shrinks failures).
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._runner = self._stack.enter_context(asyncio.Runner())
        keys = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
        self._rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._rsa.public_key()))
        (keys / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
        auth = {
            "none": {"mode": "none"},
            "bearer": {"mode": "bearer", "tokens": {BEARER_TOKEN: PRINCIPAL}},
            "jwt": {
                "mode": "jwt",
                "jwt_algorithms": ["HS256", "RS256"],
                "jwt_secret": JWT_SECRET,
                "jwks_file": str(keys / "jwks.json"),
                "jwt_audience": JWT_AUDIENCE,
                "jwt_issuer": JWT_ISSUER,
            },
        }
        self._apps: dict[str, tuple[Settings, Authenticator, Any]] = {}
        for mode in AUTH_MODES:
            config = load_settings(
                kafka={"bootstrap_servers": "127.0.0.1:1"},
                tool_packs=[],
                auth=auth[mode],
                server={"max_request_bytes": MAX_REQUEST_BYTES},
            )
            self._apps[mode] = (config, Authenticator(config.auth), create_app(config))
        self._errors = _ErrorLog()

    def credentials(self) -> list[str]:
        """Authorization values that pass in some mode (the strategies mutate them)."""
        exp = int(time.time()) + 3600
        claims = {"sub": PRINCIPAL, "exp": exp, "aud": JWT_AUDIENCE, "iss": JWT_ISSUER}
        return [
            f"Bearer {BEARER_TOKEN}",
            "Bearer " + jwt.encode(claims, JWT_SECRET, algorithm="HS256"),
            "Bearer " + jwt.encode(claims, self._rsa, algorithm="RS256", headers={"kid": "k1"}),
        ]

    def __enter__(self) -> Endpoint:
        logging.getLogger("bridge").addHandler(self._errors)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("bridge").removeHandler(self._errors)
        self._stack.close()

    def __call__(self, case: RequestCase) -> str:
        """Serve ``case``; returns ``"<status> <code>"`` (a label for the stats)."""
        config, auth, app = self._apps[case.mode]
        owner = "anonymous" if case.mode == "none" else PRINCIPAL
        tasks, streams = MemoryTasks(owner), MemoryStreams()
        handlers = MethodHandlers(config, tasks, TOOLS, streams)  # type: ignore[arg-type]
        endpoint = McpHttp(config, auth, handlers, Metrics(), on_cancelled=streams.cancel)
        none: Any = None  # the Kafka-side components: no route of /mcp reaches them
        app.state.components = Components(config, none, none, none, tasks, streams, endpoint)  # type: ignore[arg-type]
        self._errors.records.clear()
        reply = self._runner.run(self._send(app, case))
        if self._errors.records:
            raise FuzzFailure(f"the bridge logged an error: {self._errors.records[0]}")
        if streams.admission.active:
            raise FuzzFailure("a stream's admission slot was not given back")
        return _check_reply(case, reply)

    @staticmethod
    async def _send(app: Any, case: RequestCase) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            async with asyncio.timeout(CASE_BOUND_S / 2):
                return await http.request(
                    case.method, "/mcp", headers=case.headers, content=case.body
                )


class _ErrorLog(logging.Handler):
    """Keeps what the bridge logs at ERROR: ``log.exception`` marks an unhandled fault."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()} {record.exc_text or ''}")


def _check_reply(case: RequestCase, reply: httpx.Response) -> str:
    status = reply.status_code
    if status not in DOCUMENTED:
        raise FuzzFailure(f"status {status} is not documented: {reply.content[:300]!r}")
    kind = reply.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        if status != 200:
            raise FuzzFailure(f"an SSE stream with status {status}")
        return f"200 sse{_check_sse(reply.content)}"
    if not reply.content:
        code = None
    else:
        message = _wire_json(reply.content, "the response body")
        error = message.get("error") if isinstance(message, dict) else None
        code = error.get("code") if isinstance(error, dict) and "jsonrpc" in message else None
        if code is not None:
            _check_echoed_id(case, status, message)
    if code not in DOCUMENTED[status]:
        raise FuzzFailure(f"status {status} with JSON-RPC code {code} is not documented")
    return f"{status} {code or ''}".rstrip()


def _check_sse(body: bytes) -> str:
    """Every event of a stream is one line of wire JSON; an error ends it with a stream code."""
    ended_with = ""
    for line in body.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        message = _wire_json(line[len(b"data: ") :], "an SSE data line")
        error = message.get("error")
        if error is not None:
            if error.get("code") not in STREAM_ERRORS:
                raise FuzzFailure(f"a stream ended with the undocumented error {error}")
            ended_with = f" {error['code']}"
    return ended_with


def _wire_json(data: bytes, what: str) -> Any:
    try:
        return strictjson.loads(data)
    except strictjson.NotWireJson as exc:
        raise FuzzFailure(f"{what} is not wire JSON: {exc}: {data[:200]!r}") from None


def _check_echoed_id(case: RequestCase, status: int, message: dict[str, Any]) -> None:
    """A JSON-RPC error echoes the request's id whenever the body was read and had one."""
    if case.method != "POST" or status == 413:
        return
    try:
        sent = strictjson.loads(case.body)
    except strictjson.NotWireJson:
        return
    wanted = sent.get("id") if isinstance(sent, dict) else None
    if isinstance(wanted, bool) or not isinstance(wanted, str | int):
        wanted = None
    if message.get("id") != wanted:
        raise FuzzFailure(f"the error answers id {message.get('id')!r}, the request had {wanted!r}")


# The inputs: near-valid JSON-RPC for every method, mutated, beside bytes and JSON of any shape.

_OTHERS = ["initialize", "ping", "notifications/cancelled", "notifications/initialized"]
# Every method the server knows (the metrics' list, so a new method is fuzzed without an edit
# here), sorted so the seeded draws stay the same across runs.
_MODERN = sorted(KNOWN_METHODS - set(_OTHERS))
_UNKNOWN = ["tasks/result", "events/list", "subscriptions/listen", "", "TOOLS/LIST"]


@st.composite
def _task_ids(draw: st.DrawFn) -> str:
    """Mostly a seeded task's id; else an unknown, too long, empty or any id."""
    if _one_in(draw, 8):
        return draw(st.text(max_size=8))
    return draw(st.sampled_from([*SEEDED, "nope", "t" * 300, ""]))


_seqs = st.sampled_from([-1, 0, 1, 2, 3, 4, 5, 2**63 - 1, 2**63, 1.0, 1.5, "3", True, None])
_deep = st.integers(1, 140).map(lambda depth: json.loads("[" * depth + "]" * depth))
_odd_values = st.one_of(
    json_values, _deep, st.sampled_from([10**40, -0.0, "\ud800", "x" * (MAX_REQUEST_BYTES + 1)])
)
_VALID_META = {
    PROTOCOL_VERSION_META: LATEST_VERSION,
    CLIENT_CAPS_META: {"extensions": {TASKS_EXTENSION: {}}},
}
_good_metas = st.sampled_from(
    [
        _VALID_META,
        {**_VALID_META, CLIENT_CAPS_META: {}},
        {**_VALID_META, CLIENT_CAPS_META: {"sampling": {}, "extensions": {TASKS_EXTENSION: {}}}},
        {**_VALID_META, "progressToken": "p1"},
    ]
)
_odd_metas = st.sampled_from(
    [
        {**_VALID_META, PROTOCOL_VERSION_META: "2099-01-01"},
        {**_VALID_META, PROTOCOL_VERSION_META: LEGACY_VERSIONS[0]},
        {PROTOCOL_VERSION_META: LATEST_VERSION},
        {},
        "meta",
    ]
)
_arguments = st.sampled_from([{"name": "Ada"}, {}, {"name": 7}, None]) | json_objects


@st.composite
def _params(draw: st.DrawFn, method: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if method.startswith("tasks/"):
        params["taskId"] = draw(_task_ids())
        if draw(st.booleans()):
            params["after"] = draw(_seqs)
        if method == "tasks/update" or _one_in(draw, 10):
            params["inputResponses"] = draw(st.sampled_from([{"k": "yes"}, {}, None, "x"]))
    elif method == "tools/call":
        params["name"] = draw(st.sampled_from([t.name for t in TOOLS] + ["nope", 3]))
        params["arguments"] = draw(_arguments)
        if draw(st.booleans()):
            params["inputResponses"] = draw(st.sampled_from([{"k": "yes"}, {}, []]))
        if _one_in(draw, 4):
            params["requestState"] = draw(_task_ids())
    elif method == "initialize":
        params = {
            "protocolVersion": draw(st.sampled_from([*LEGACY_VERSIONS, "1", 1])),
            "capabilities": {},
        }
    elif method == "notifications/cancelled":
        params["requestId"] = draw(st.sampled_from([1, "r", None, True, [1]]))
    elif method in ("prompts/get", "resources/read"):
        params["name" if method == "prompts/get" else "uri"] = draw(st.text(max_size=6))
    if not _one_in(draw, 8):
        params["_meta"] = draw(_odd_metas if _one_in(draw, 6) else _good_metas)
    for _ in range(draw(st.integers(0, 2))):  # a wrong type, a huge or deep value somewhere
        key = draw(st.sampled_from(sorted(params) or ["x"]) | st.text(max_size=3))
        params[key] = draw(_odd_values)
    if params and _one_in(draw, 4):  # a member left out
        del params[draw(st.sampled_from(sorted(params)))]
    return params


@st.composite
def _rpc_message(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    names = _MODERN + _OTHERS + _UNKNOWN
    method = draw(st.text(max_size=12)) if _one_in(draw, 10) else draw(st.sampled_from(names))
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if not method.startswith("notifications/") or _one_in(draw, 10):
        odd_ids = st.sampled_from([None, True, 1.5, [1], 2**70])
        ids = odd_ids if _one_in(draw, 10) else st.integers(-5, 2**53) | st.text(max_size=6)
        message["id"] = draw(ids)
    if not _one_in(draw, 10):
        message["params"] = draw(_params(method))
    if _one_in(draw, 10):  # a mutation of the envelope itself
        message[draw(st.sampled_from(["jsonrpc", "method", "params", "extra"]))] = draw(_odd_values)
    return method, message


#: Header bytes a real HTTP server lets through (no control characters but tab).
_garbage = st.lists(
    st.sampled_from([b for b in range(0x20, 0x100) if b != 0x7F] + [0x09]), max_size=24
).map(bytes)


def _header_value(draw: st.DrawFn, values: list[str | None], odd: int = 8) -> str | bytes | None:
    """One of ``values`` (the first ones most often), or once in ``odd`` draws any bytes."""
    return draw(_garbage) if _one_in(draw, odd) else draw(st.sampled_from(values))


def _header(name: str, value: str | bytes | None) -> list[tuple[bytes, bytes]]:
    if value is None:
        return []
    # A lone surrogate (params may hold one) is sent as the bytes a careless client would send.
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return [(name.encode(), data)]


def _b64_form(text: str) -> str:
    return "=?base64?" + base64.b64encode(text.encode("utf-8", "surrogatepass")).decode() + "?="


@st.composite
def _routing_headers(draw: st.DrawFn, method: str, params: Any) -> list[tuple[bytes, bytes]]:
    """``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``, ``Mcp-Param-Name``: mostly
    right for the request, or one of them (or all) another version, method or name, a base64
    form, bytes."""
    params = params if isinstance(params, dict) else {}
    name = params.get(NAME_PARAM.get(method, "taskId"))
    name_text = name if isinstance(name, str) else "t-work"
    arguments = params.get("arguments")
    argument = str(arguments.get("name")) if isinstance(arguments, dict) else None
    meta = params.get("_meta")
    version = meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
    right: dict[str, str | None] = {  # the version header is right when it matches _meta
        "mcp-protocol-version": version if isinstance(version, str) else LATEST_VERSION,
        "mcp-method": method,
        "mcp-name": draw(st.sampled_from([name_text, _b64_form(name_text)])),
        "mcp-param-name": argument,
    }
    wrong: dict[str, list[str | None]] = {
        "mcp-protocol-version": [*LEGACY_VERSIONS, "2099-01-01", f" {LATEST_VERSION} ", None],
        "mcp-method": ["tools/list", f" {method}", None],
        "mcp-name": ["t-done", "=?base64?!!!?=", "=?base64?/w==?=", f"{name_text} ", None],
        "mcp-param-name": ["other", _b64_form(str(argument)), "None", None],
    }
    perturbed = draw(st.sampled_from([None, None, None, "all", *right]))
    out = []
    for header, value in right.items():
        if perturbed in (header, "all"):
            out += _header(header, _header_value(draw, wrong[header], odd=3))
        else:
            out += _header(header, value)
    return out


@st.composite
def _authorization(draw: st.DrawFn, mode: str, credentials: list[str]) -> str | bytes | None:
    """Mostly the mode's own valid credential; else another's, a mutated token, bytes."""
    valid = {"none": [None], "bearer": credentials[:1], "jwt": credentials[1:]}[mode]
    if not _one_in(draw, 4):
        return draw(st.sampled_from(valid))
    odd = [*credentials, "Bearer", "Basic YTpi", "bearer  x.y.z", None]
    if _one_in(draw, 2):
        return draw(_mutated(draw(st.sampled_from(credentials)).encode("latin-1")))
    return _header_value(draw, odd, odd=3)


@st.composite
def _cursor(draw: st.DrawFn) -> str | bytes:
    """A ``Last-Event-ID``: a cursor of a task that may exist, mutated or not, or none."""
    request_id = draw(st.integers(-5, 5) | st.text(max_size=4))
    seq = draw(st.integers(0, 7) | st.just(10**30))
    cursor = encode_cursor(request_id, draw(_task_ids().filter(bool)), seq)
    if _one_in(draw, 4):
        return draw(_mutated(cursor.encode()))
    return _header_value(draw, [cursor, "nonsense", "v1..", "v1.aTEAdA.1"], odd=6) or cursor


@st.composite
def request_cases(draw: st.DrawFn, credentials: list[str]) -> RequestCase:
    """A request to ``/mcp``: mostly a near-valid POST, with headers to match or not."""
    mode = draw(st.sampled_from(AUTH_MODES))
    http_method = draw(st.sampled_from(["POST"] * 10 + ["GET", "GET", "DELETE"]))
    kind = draw(st.sampled_from(["rpc"] * 10 + ["json", "bytes"]))
    method, message = draw(_rpc_message())
    if kind == "rpc":
        ascii_only = draw(st.booleans())
        body = json.dumps(message, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
        if _one_in(draw, 6):
            body = draw(_mutated(body))
    elif kind == "json":
        body = draw(hostile_json_texts).encode("utf-8", "surrogatepass")
    else:
        body = draw(st.binary(max_size=64))
    headers = draw(_routing_headers(method, message.get("params")))
    headers += _header("authorization", draw(_authorization(mode, credentials)))
    content_types = ["application/json", "text/plain", "application/json; charset=latin-1", None]
    headers += _header("content-type", _header_value(draw, content_types))
    accepts = ["application/json, text/event-stream", "application/json", "*/*", None]
    headers += _header("accept", _header_value(draw, accepts))
    if _one_in(draw, 10):
        hosts = ["evil.example", "localhost:8080", "[::1]:1", "127.0.0.1:", ""]
        headers += _header("host", _header_value(draw, hosts, odd=3))
    if _one_in(draw, 10):
        origins = ["http://localhost:3000", "http://evil.example", "null", "http://[::1"]
        headers += _header("origin", _header_value(draw, origins, odd=3))
    if _one_in(draw, 20):
        headers += _header("content-length", draw(st.sampled_from(["99999999", "١٢", "-1"])))
    if http_method == "GET" and not _one_in(draw, 6):
        headers += _header("last-event-id", draw(_cursor()))
    return RequestCase(mode, http_method, headers, body)

"""The task event envelope and its codec: bytes in a Kafka record <-> :class:`TaskEvent`.

Producers (our publisher, or any existing pipeline) write one record per event, keyed by task
id. The value is either

* Avro single-object encoding (the default): ``C3 01``, the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's canonical form, then the Avro binary body of
  ``schemas/task_event.avsc``; or
* plain JSON ``{"type": ..., "payload": {...}, "_meta": {...}, "timestamp": ms}`` so that kcat and
  pipelines without Avro can attach. ``_meta`` and ``timestamp`` may be left out.

A ``content-type`` record header names the format; without it the first bytes decide. Decoding
never raises anything but :class:`EnvelopeError` subclasses. :func:`may_have_type` answers, without
decoding, whether a record could decode to one of a few types: the indexer's tail asks it so that
it decodes only the events whose payload the index folds. ``payload`` and ``_meta`` are parsed
with the wire's rules (:mod:`bridge.strictjson`): a record the bridge could not write back out
(``1e999``, a lone surrogate, nesting past ``MAX_DEPTH``) is refused here, as malformed, instead
of failing every stream that replays it. A decoded event keeps that JSON text too
(:attr:`TaskEvent.payload_json`), so a stream sends it without serialising it again. This module
knows nothing of seq, Kafka clients or MCP.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal, NewType, Protocol, TypeVar, cast

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from bridge import strictjson

__all__ = [
    "AVRO_CONTENT_TYPE",
    "CONTENT_TYPE_HEADER",
    "JSON_CONTENT_TYPE",
    "MAX_TIMESTAMP_MS",
    "EnvelopeError",
    "EnvelopeTooLarge",
    "Item",
    "MalformedEnvelope",
    "RecordLike",
    "TaskEvent",
    "UnknownSchema",
    "UnsupportedContentType",
    "WireMembers",
    "decode_event",
    "decode_usual",
    "encode_event",
    "may_have_type",
    "splice_usual",
    "usual_parts",
]

CONTENT_TYPE_HEADER = "content-type"
AVRO_CONTENT_TYPE = "application/vnd.mcpbridge.task-event+avro"
JSON_CONTENT_TYPE = "application/json"
_JSON_CONTENT_TYPES = (JSON_CONTENT_TYPE, "text/json")
_SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_SCHEMA_FILE = "task_event.avsc"
#: 9999-12-31T23:59:59.999Z: the last instant Avro tools can represent as a timestamp-millis.
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: Error messages end up in placeholder events on the wire: keep them short.
_MAX_MESSAGE_CHARS = 300

Headers = Sequence[tuple[str, bytes]]


class EnvelopeError(Exception):
    """A record value that is not a valid task event. ``reason`` is a short stable code."""

    reason = "malformed"

    def __init__(self, message: str) -> None:
        message = _wire_safe(message)
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


def _wire_safe(message: str) -> str:
    """Bounded, and encodable as UTF-8 even when it quotes a record's lone surrogates."""
    # Escape first: each lone surrogate becomes six characters, which the bound must count.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[: _MAX_MESSAGE_CHARS - 3] + "..."
    return message


class MalformedEnvelope(EnvelopeError):
    reason = "malformed"


class UnknownSchema(EnvelopeError):
    reason = "unknown_schema"


class UnsupportedContentType(EnvelopeError):
    reason = "unsupported_content_type"


class EnvelopeTooLarge(EnvelopeError):
    reason = "too_large"


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One event as producers write it. ``seq`` is not part of it: the log assigns that.

    A decoded event also carries its ``payload`` and ``meta`` as wire JSON text
    (``payload_json``, ``meta_json``; None when not known): one line of JSON, validated like
    the dict and equal to it in value (save a duplicate key, which the text keeps as the
    producer wrote it and the dict holds once, with its last value), that the stream renderer
    sends as it is instead of serialising the dict again. For the Avro envelope it is the
    producer's own text (whitespace CR/LF made spaces); for the JSON envelope the dict
    re-encoded. Both are left out of comparisons and ``repr``.
    """

    type: str
    payload: dict[str, Any]
    meta: dict[str, Any] | None = None
    timestamp_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    payload_json: str | None = field(default=None, compare=False, repr=False)
    meta_json: str | None = field(default=None, compare=False, repr=False)
    #: The record's W3C trace headers, kept by the readers while tracing is on (bridge.tracing).
    trace: tuple[tuple[str, bytes], ...] | None = field(default=None, compare=False, repr=False)


WireMembers = NewType("WireMembers", str)
"""A record's event as checked wire JSON object members, ``"type":<type>,"payload":<text>``
(no ``_meta``, no braces): what :func:`splice_usual` makes of a record of the usual shape
instead of a :class:`TaskEvent`. Only :func:`splice_usual` makes one, after checking the
payload text is one line of the wire's JSON and an object, so a stream may splice it into its
notification as it is. A str at run time (no object per record on a replay's hot path); the
type keeps any other str from passing for one."""

#: What a stream sends of a record: its event, or its checked wire members.
Item = TaskEvent | WireMembers


_SLOTS = tuple(
    getattr(TaskEvent, name).__set__
    for name in ("type", "payload", "meta", "timestamp_ms", "payload_json", "meta_json", "trace")
)


def _new_event(
    type_: str,
    payload: dict[str, Any],
    meta: dict[str, Any] | None,
    timestamp_ms: int,
    payload_json: str | None,
    meta_json: str | None,
) -> TaskEvent:
    """``TaskEvent(...)`` for the decoder, with the values already checked: about half the cost
    of the frozen dataclass's ``__init__`` (which sets each field through
    ``object.__setattr__``), and a replay makes one per record."""
    event: TaskEvent = object.__new__(TaskEvent)
    set_type, set_payload, set_meta, set_ts, set_payload_json, set_meta_json, set_trace = _SLOTS
    set_type(event, type_)
    set_payload(event, payload)
    set_meta(event, meta)
    set_ts(event, timestamp_ms)
    set_payload_json(event, payload_json)
    set_meta_json(event, meta_json)
    set_trace(event, None)  # a slot never set would raise on reading it
    return event


# --- schema ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Schema:
    parsed: Any
    fingerprint: bytes  # 8 bytes, little endian


def _schema_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here.parent / "schemas", here / "schemas"]


@cache
def _writer_schema() -> _Schema:
    for folder in _schema_dirs():
        path = folder / _SCHEMA_FILE
        if path.is_file():
            raw = json.loads(path.read_text(encoding="utf-8"))
            parsed = fastavro.parse_schema(raw)
            canonical = to_parsing_canonical_form(raw)
            # fastavro's CRC-64-AVRO hex is the fingerprint's little-endian bytes, as the
            # single-object header carries them.
            return _Schema(parsed, bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")))
    raise RuntimeError(f"{_SCHEMA_FILE} not found in {[str(p) for p in _schema_dirs()]}")


@cache
def _known_schemas() -> dict[bytes, _Schema]:
    # Readers accept every writer schema they know; there is one version so far.
    schema = _writer_schema()
    return {schema.fingerprint: schema}


# --- encode --------------------------------------------------------------------------------------


def _max_depth(envelope: bool) -> int:
    # The JSON envelope is one object level around payload and _meta: both formats allow
    # the same nesting inside them.
    return strictjson.MAX_DEPTH + 1 if envelope else strictjson.MAX_DEPTH


def _json_text(value: Mapping[str, Any], *, envelope: bool = False) -> str:
    try:
        return strictjson.dumps(value, max_depth=_max_depth(envelope))
    except strictjson.NotWireJson as exc:
        raise MalformedEnvelope(str(exc)) from None


def encode_event(
    event: TaskEvent, *, fmt: Literal["avro", "json"] = "avro"
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Encode ``event``; returns ``(value, headers)`` for a Kafka record."""
    _check_fields(event.type, event.payload, event.meta)
    _check_timestamp(event.timestamp_ms)
    if fmt == "json":
        body: dict[str, Any] = {"type": event.type, "payload": event.payload}
        if event.meta is not None:
            body["_meta"] = event.meta
        body["timestamp"] = event.timestamp_ms
        return _json_text(body, envelope=True).encode("utf-8"), [
            (CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE.encode())
        ]
    schema = _writer_schema()
    record = {
        "type": event.type,
        "payload": _json_text(event.payload),
        "_meta": None if event.meta is None else _json_text(event.meta),
        "timestamp": event.timestamp_ms,
    }
    out = io.BytesIO()
    out.write(_SINGLE_OBJECT_MAGIC)
    out.write(schema.fingerprint)
    fastavro.schemaless_writer(out, schema.parsed, record)
    return out.getvalue(), [(CONTENT_TYPE_HEADER, AVRO_CONTENT_TYPE.encode())]


# --- decode --------------------------------------------------------------------------------------


def _parse_json(text: str | bytes, what: str, *, envelope: bool = False) -> Any:
    try:
        return strictjson.loads(text, max_depth=_max_depth(envelope))
    except strictjson.NotWireJson as exc:
        raise MalformedEnvelope(f"{what} is not valid JSON: {exc}") from None


def _check_fields(type_: Any, payload: Any, meta: Any) -> None:
    if not isinstance(type_, str) or not type_ or len(type_) > 256:
        raise MalformedEnvelope("type must be a non-empty string of at most 256 characters")
    if not isinstance(payload, dict):
        raise MalformedEnvelope("payload must be a JSON object")
    if meta is not None and not isinstance(meta, dict):
        raise MalformedEnvelope("_meta must be a JSON object when present")


def _check_timestamp(timestamp: Any) -> None:
    if (
        not isinstance(timestamp, int)
        or isinstance(timestamp, bool)
        or not 0 <= timestamp <= MAX_TIMESTAMP_MS
    ):
        raise MalformedEnvelope(
            "timestamp must be an integer of ms since the epoch, before year 10000"
        )


#: The headers last looked up and their content type. A replay's records nearly all carry
#: equal headers, each in a new tuple: comparing it with the last is cheaper than hashing it
#: for the cache (which was 5% of a replay's CPU). The content type is a function of the
#: headers' values, so equal headers have the same one.
_last_headers: list[Any] = [None, None]


def _content_type(headers: Headers | None) -> str | None:
    if isinstance(headers, tuple):  # what aiokafka hands out: hashable, and a few shapes repeat
        last = _last_headers
        if headers == last[0]:
            return cast("str | None", last[1])
        # try/except, not contextlib.suppress: this runs for every record, and building the
        # context manager cost more than the cached lookup itself.
        try:
            content_type = _cached_content_type(headers)
        except TypeError:  # unless a caller put an unhashable value in it
            return _header_content_type(headers)
        last[0], last[1] = headers, content_type  # not when it raised: refused every time
        return content_type
    return _header_content_type(headers)


@lru_cache(maxsize=256)
def _cached_content_type(headers: tuple[tuple[str, bytes], ...]) -> str | None:
    # Exceptions are not cached: a bad header is re-examined (and refused) every time.
    return _header_content_type(headers)


def _header_content_type(headers: Headers | None) -> str | None:
    for key, value in headers or ():
        if key.lower() == CONTENT_TYPE_HEADER:
            try:
                return value.decode("ascii").split(";")[0].strip().lower()
            except (UnicodeDecodeError, AttributeError):
                raise UnsupportedContentType("content-type header is not ASCII") from None
    return None


def _format_of(value: bytes, headers: Headers | None) -> str:
    """The content type :func:`decode_event` decodes ``value`` as (header first, then magic)."""
    content_type = _content_type(headers)
    if content_type is not None:
        return content_type
    return AVRO_CONTENT_TYPE if value[:2] == _SINGLE_OBJECT_MAGIC else JSON_CONTENT_TYPE


class _Truncated(Exception):
    pass


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint of at most 10 bytes) at ``pos``; ``(value, next position)``.

    Every record's decode reads a few of these: one-byte values return at once, longer ones
    (the timestamp: six bytes) loop over a slice of the at most nine bytes that may follow.
    """
    if pos >= len(buf):
        raise _Truncated
    byte = buf[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    result, shift = byte & 0x7F, 7
    for byte in buf[pos + 1 : pos + 10]:
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
    raise _Truncated  # the buffer ended, or a tenth byte still said "more"


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    if pos < len(buf) and buf[pos] < 0x80:  # a one-byte length, under 64 bytes: no call
        size, pos = (buf[pos] >> 1) ^ -(buf[pos] & 1), pos + 1
    else:
        size, pos = _read_long(buf, pos)
    end = pos + size
    if size < 0 or end > len(buf):
        raise _Truncated
    return buf[pos:end].decode("utf-8"), end


def _decode_avro(value: bytes) -> TaskEvent:
    """Decode the one writer schema we know by hand: it is four fields, and the hot path.

    (fastavro's generic reader, plus its timestamp-millis conversion to datetime and back, cost
    about four times as much per event; encoding still goes through fastavro.) The usual
    lengths are read inline, without a call: a type under 64 bytes (a one-byte length), a
    payload under 8 KiB (one or two bytes), no ``_meta``; anything else takes
    :func:`_read_long`, with the same result. A replay reads most records with the shortcut
    :func:`decode_usual` instead.
    """
    size = len(value)
    if size < 10 or value[:2] != _SINGLE_OBJECT_MAGIC:
        raise MalformedEnvelope("not Avro single-object encoding (missing C3 01 marker)")
    if value[2:10] not in _known_schemas():
        raise UnknownSchema(f"unknown writer schema fingerprint {value[2:10].hex()}")
    try:
        n = value[10]  # the type's length
        if n < 0x80:
            n, pos = (n >> 1) ^ -(n & 1), 11
        else:
            n, pos = _read_long(value, 10)
        end = pos + n
        if n < 0 or end > size:
            raise _Truncated
        type_ = value[pos:end].decode("utf-8")
        n = value[end]  # the payload's length
        if n < 0x80:
            n, pos = (n >> 1) ^ -(n & 1), end + 1
        elif value[end + 1] < 0x80:
            n = (n & 0x7F) | (value[end + 1] << 7)
            n, pos = (n >> 1) ^ -(n & 1), end + 2
        else:
            n, pos = _read_long(value, end)
        end = pos + n
        if n < 0 or end > size:
            raise _Truncated
        payload_text = value[pos:end].decode("utf-8")
        pos = end
        if value[pos] == 0:  # no _meta: the common case, one byte
            meta_text, pos = None, pos + 1
        else:
            branch, pos = _read_long(value, pos)
            if branch != 1:
                raise MalformedEnvelope(f"_meta union branch {branch} does not exist")
            meta_text, pos = _read_string(value, pos)
        timestamp, pos = _read_long(value, pos)
    except (_Truncated, IndexError, UnicodeDecodeError):
        raise MalformedEnvelope("Avro body does not decode (truncated or not UTF-8)") from None
    if pos != size:
        raise MalformedEnvelope("trailing bytes after the Avro body")
    payload = _parse_json(payload_text, "payload")
    meta = None if meta_text is None else _parse_json(meta_text, "_meta")
    if (
        not 0 < len(type_) <= 256
        or type(payload) is not dict
        or not (meta is None or type(meta) is dict)
    ):
        _check_fields(type_, payload, meta)  # raises, with the message that fits
    if not 0 <= timestamp <= MAX_TIMESTAMP_MS:
        _check_timestamp(timestamp)  # raises
    # The texts just parsed are wire JSON: the stream sends them as they are (one line).
    return _new_event(
        type_,
        payload,
        meta,
        timestamp,
        _one_line(payload_text),
        None if meta_text is None else _one_line(meta_text),
    )


#: Magic and fingerprint of the writer schema: the first ten bytes of every record it wrote.
_usual_head: list[bytes] = []


def usual_parts(
    value: bytes | None, headers: Headers | None, max_bytes: int
) -> tuple[bytes, bytes, int] | None:
    """The framing of a record of the usual shape, checked, without decoding its texts:
    ``(type bytes, payload bytes, where the timestamp starts)``; None for any other record.

    The usual shape: Avro of the current writer schema (by its content-type header, or no
    header), at most ``max_bytes``, a type under 64 bytes, a payload under 8 KiB, no ``_meta``,
    a six-byte timestamp that is not negative, ending the value. What the texts hold (UTF-8,
    the wire's JSON) is left to the caller: :func:`decode_usual` decodes them, a replay's
    splice (:meth:`bridge.log.records.RecordDecoder.wire_events`) checks them. Never raises.
    """
    if not _usual_head:
        _usual_head.append(_SINGLE_OBJECT_MAGIC + _writer_schema().fingerprint)
    if type(value) is not bytes or len(value) > max_bytes or value[:10] != _usual_head[0]:
        return None
    try:
        content_type = _content_type(headers)
        if content_type is not None and content_type != AVRO_CONTENT_TYPE:
            return None
        n = value[10]  # the type's length: one byte, even (zig-zag: not negative), not 0
        if n >= 0x80 or n & 1 or not n:
            return None
        end = 11 + (n >> 1)
        m = value[end]  # the payload's length: one or two bytes, not negative
        if m >= 0x80:
            m, pos = (m & 0x7F) | (value[end + 1] << 7), end + 2
            if value[end + 1] >= 0x80:
                return None
        else:
            pos = end + 1
        if m & 1:
            return None
        last = pos + (m >> 1)
        # Then no _meta (one zero byte) and a six-byte timestamp, ending the value: five bytes
        # with their high bit set, a last one without, and zig-zag's sign bit clear.
        if len(value) - last != 7 or value[last] != 0 or value[last + 6] >= 0x80:
            return None
        if (
            not value[last + 1]
            & value[last + 2]
            & value[last + 3]
            & value[last + 4]
            & value[last + 5]
            & 0x80
        ) or value[last + 1] & 1:
            return None
    except (UnsupportedContentType, IndexError):
        return None
    return value[11:end], value[pos:last], last + 1


def decode_usual(value: bytes | None, headers: Headers | None, max_bytes: int) -> TaskEvent | None:
    """``decode_event(value, headers, max_bytes=max_bytes)`` for a record of the usual shape
    (:func:`usual_parts`) whose payload is under 257 characters of JSON text on one line, read
    without a call per field; None for any other record (ask :func:`decode_event`).

    A replay of a long task decodes records by the thousand, nearly all of this shape: this
    takes 2.4 µs per record where :func:`decode_event` takes 4 (the calls between its steps).
    Never raises.
    """
    parts = usual_parts(value, headers, max_bytes)
    if parts is None:
        return None
    raw_type, raw_payload, at = parts
    assert value is not None  # usual_parts said so
    try:
        # Six bytes of seven bits each, least significant first: gathered in one go.
        ts = int.from_bytes(value[at:], "little")
        ts = (
            (ts & 0x7F)
            | (ts >> 1 & 0x3F80)
            | (ts >> 2 & 0x1FC000)
            | (ts >> 3 & 0xFE00000)
            | (ts >> 4 & 0x7F0000000)
            | (ts >> 5 & 0x3F800000000)
        )
        type_ = raw_type.decode("utf-8")
        text = raw_payload.decode("utf-8")
        if len(text) > 2 * strictjson.MAX_DEPTH or "\n" in text or "\r" in text:
            return None
        payload = strictjson.loads_short(text)
    except (UnicodeDecodeError, strictjson.NotWireJson):
        return None
    if type(payload) is not dict:
        return None
    return _new_event(type_, payload, None, ts >> 1, text, None)


#: The last seven bytes of the usual record, little-endian, under this mask: no ``_meta`` (a
#: zero byte), then a six-byte timestamp (five bytes with their high bit set, zig-zag's sign
#: bit, the lowest of the first, clear; a last byte without it).
_USUAL_END_MASK = int.from_bytes(b"\xff\x81\x80\x80\x80\x80\x80", "little")
_USUAL_END = int.from_bytes(b"\x00\x80\x80\x80\x80\x80\x00", "little")


class RecordLike(Protocol):
    """What :func:`splice_usual` reads of a record (a Kafka consumer record has both)."""

    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Headers | None: ...


_R = TypeVar("_R", bound=RecordLike)


def splice_usual(
    records: Sequence[_R],
    max_bytes: int,
    heads: Mapping[bytes, str],
    head_of: Callable[[bytes], str],
    other: Callable[[_R], TaskEvent],
) -> tuple[list[Item], list[int]]:
    """Each record's event as a stream writes it, without decoding the usual ones: for a
    record of the usual shape (:func:`usual_parts`) whose payload text is one line of the
    wire's JSON, an object, ``head + the producer's text``, where ``head`` is ``heads[type
    bytes]`` (else ``head_of(type bytes)``, which may remember it); ``other(record)`` for every
    other record, and for a type whose head is "". Returns the items and the indexes of the
    ``other`` ones.

    :func:`usual_parts`' checks, inline in one loop, and the payload's check in C
    (:data:`bridge.strictjson.fast_decode`): about 1 µs per record against 3.1 to decode and
    render its event. A replay's records come in runs of one type with the same headers: the
    headers are looked at once per batch when they are all equal, and the bytes up to the
    payload once per run (one comparison with the run's first record for the others). Every
    record the checks do not clear goes to ``other``, the authoritative path: a shortcut only
    ever says yes sooner.
    """
    if not _usual_head:
        _usual_head.append(_SINGLE_OBJECT_MAGIC + _writer_schema().fingerprint)
    usual, decode, deep = _usual_head[0], strictjson.fast_decode, 2 * strictjson.MAX_DEPTH
    items: list[Item] = []
    full: list[int] = []
    append = items.append
    headers = list(map(_HEADERS, records))
    each = bool(headers) and headers.count(headers[0]) != len(headers)  # a rule per record
    avro = each or (bool(headers) and _is_avro(headers[0]))
    # The run: the bytes up to the payload's length (magic, fingerprint, type) and its head.
    prefix: bytes | None = None
    head, size = "", 0
    for record in records:
        # None (a tombstone) raises TypeError below, and goes the full way.
        value: bytes = record.value  # type: ignore[assignment]
        # Made a WireMembers only by the checks below (no NewType call per record: a replay's
        # hot loop).
        text: WireMembers | None = None
        try:
            if avro and (not each or _is_avro(record.headers)):
                if value[:size] != prefix:  # (a TypeError for a record without a value)
                    prefix, head, size = _run_of(value, usual, heads, head_of)
                if head and len(value) <= max_bytes:
                    m = value[size]  # the payload's length: one or two bytes, even
                    if m >= 0x80:
                        m, pos = (m & 0x7F) | (value[size + 1] << 7), size + 2
                    else:
                        pos = size + 1
                    last = pos + (m >> 1)
                    # No _meta, then a six-byte timestamp, not negative, ending the value.
                    if (
                        not m & 0x4001
                        and len(value) - last == 7
                        and int.from_bytes(value[last:], "little") & _USUAL_END_MASK == _USUAL_END
                    ):
                        raw = value[pos:last]
                        if (
                            0x0A not in raw  # LF, CR: an int is found ten times faster
                            and 0x0D not in raw  # than b"\n" (no buffer to take)
                            and (len(raw) <= deep or not strictjson.may_nest_deeper(raw))
                            and type(decode(raw)) is dict
                        ):
                            text = head + raw.decode()  # type: ignore[assignment]
        except (IndexError, ValueError, TypeError):  # short, not UTF-8, refused, no value
            text = None
        if text is None:
            full.append(len(items))
            append(other(record))
        else:
            append(text)
    return items, full


_HEADERS = operator.attrgetter("headers")


def _is_avro(headers: Headers | None) -> bool:
    """Whether ``headers`` let a record of the usual head be read as Avro."""
    try:
        content_type = _content_type(headers)
    except UnsupportedContentType:
        return False
    return content_type is None or content_type == AVRO_CONTENT_TYPE


def _run_of(
    value: bytes, usual: bytes, heads: Mapping[bytes, str], head_of: Callable[[bytes], str]
) -> tuple[bytes | None, str, int]:
    """For :func:`splice_usual`: ``(the value's bytes up to its payload length, the head of its
    type, their length)`` for a value of the usual head and a one-byte type length, else
    ``(None, "", 0)``. Raises TypeError for a value that is not bytes."""
    if type(value) is not bytes:
        raise TypeError("no value")
    n = value[10] if len(value) > 10 and value[:10] == usual else 0
    if not n or n & 0x81:  # none, more than one byte, or negative
        return None, "", 0
    end = 11 + (n >> 1)
    type_ = value[11:end]
    head = heads.get(type_)
    if head is None:
        head = head_of(type_)
    return value[:end], head, end


def _one_line(text: str) -> str:
    """Valid JSON ``text`` on one line: a raw CR or LF in it can only be whitespace between
    tokens (inside a string it must be escaped), so a space in its place means the same."""
    if "\n" in text or "\r" in text:
        return text.replace("\r", " ").replace("\n", " ")
    return text


def _decode_json(value: bytes, record_timestamp_ms: int | None) -> TaskEvent:
    doc = _parse_json(value, "record value", envelope=True)
    if not isinstance(doc, dict):
        raise MalformedEnvelope("JSON envelope must be an object")
    unknown = set(doc) - {"type", "payload", "_meta", "timestamp"}
    if unknown:
        raise MalformedEnvelope(f"unknown JSON envelope fields: {sorted(unknown)}")
    _check_fields(doc.get("type"), doc.get("payload"), doc.get("_meta"))
    timestamp = doc.get("timestamp", record_timestamp_ms)
    if isinstance(timestamp, float) and math.isfinite(timestamp) and timestamp.is_integer():
        timestamp = int(timestamp)
    if timestamp is None:
        timestamp = 0
    _check_timestamp(timestamp)
    payload, meta = doc["payload"], doc.get("_meta")
    # The envelope's text holds payload and _meta among other fields: re-encoding the parsed
    # values (fast, compact) is cheaper than finding their spans, and carries exactly the
    # values the index folds (a duplicate key's last value).
    return TaskEvent(
        doc["type"],
        payload,
        meta,
        timestamp,
        strictjson.dumps_parsed(payload),
        None if meta is None else strictjson.dumps_parsed(meta),
    )


def decode_event(
    value: bytes | None,
    headers: Headers | None = None,
    *,
    max_bytes: int | None = None,
    record_timestamp_ms: int | None = None,
) -> TaskEvent:
    """Decode one record value. Raises only :class:`EnvelopeError` subclasses.

    ``record_timestamp_ms`` (the Kafka record's timestamp) stands in for a JSON envelope
    without its own ``timestamp``.
    """
    if value is None:
        raise MalformedEnvelope("record has no value (tombstone)")
    if max_bytes is not None and len(value) > max_bytes:
        raise EnvelopeTooLarge(f"record value is {len(value)} bytes, limit is {max_bytes}")
    content_type = _format_of(value, headers)
    if content_type == AVRO_CONTENT_TYPE:
        return _decode_avro(value)
    if content_type in _JSON_CONTENT_TYPES:
        return _decode_json(value, record_timestamp_ms)
    raise UnsupportedContentType(f"content-type {content_type!r} is not a task event format")


# --- the tail's shortcut: could this record be one of a few types? -----------------------------

#: A text that starts with one of these is decoded as UTF-16 (json.detect_encoding).
_UTF16_BOMS = (codecs.BOM_UTF16_BE, codecs.BOM_UTF16_LE)


@cache
def _type_marks(types: frozenset[str]) -> tuple[frozenset[bytes], tuple[bytes, ...]]:
    """Each type as Avro's string bytes and as a JSON string token without escapes."""
    raw = frozenset(t.encode("utf-8") for t in types)
    return raw, tuple(b'"' + t + b'"' for t in raw)


def _avro_type_bytes(value: bytes) -> bytes | None:
    """The raw bytes of the first string after the 10-byte header (the type), if it is whole."""
    if len(value) > 10 and value[10] < 0x80:  # a one-byte length: every type under 64 bytes
        size, pos = (value[10] >> 1) ^ -(value[10] & 1), 11
    else:
        try:  # a longer type, or a length spelt in more bytes than needed: decoding accepts both
            size, pos = _read_long(value, 10)
        except _Truncated:
            return None
    if size < 0 or pos + size > len(value):
        return None
    return value[pos : pos + size]


def _json_may_spell(value: bytes, tokens: tuple[bytes, ...]) -> bool:
    # An escape can spell any string; a text decoded as UTF-16/32 (a BOM, or NUL bytes: see
    # json.detect_encoding) does not hold the tokens as UTF-8 bytes. Only parsing could tell.
    if b"\\" in value or b"\x00" in value or value.startswith(_UTF16_BOMS):
        return True
    return any(token in value for token in tokens)


def may_have_type(value: bytes | None, headers: Headers | None, types: frozenset[str]) -> bool:
    """False only when :func:`decode_event` cannot return an event whose type is in ``types``.

    It decodes nothing: Avro's type is the first string of the body, compared as bytes; a JSON
    text is searched for each type as a quoted string token (a text with any backslash escape,
    or not in UTF-8, answers True: only parsing it could tell). True means "decode to know":
    the record may still be malformed or of another type. Never raises.
    """
    if value is None:
        return False
    try:
        content_type = _format_of(value, headers)
    except UnsupportedContentType:
        return False
    raw, tokens = _type_marks(types)
    if content_type == AVRO_CONTENT_TYPE:
        return _avro_type_bytes(value) in raw
    if content_type in _JSON_CONTENT_TYPES:
        return _json_may_spell(value, tokens)
    return False

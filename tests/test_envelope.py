"""The event envelope codec: round trips, the single-object header, and typed errors."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import fastavro
import fastavro.schema
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bridge.envelope import (
    AVRO_CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    JSON_CONTENT_TYPE,
    MAX_TIMESTAMP_MS,
    EnvelopeError,
    EnvelopeTooLarge,
    MalformedEnvelope,
    TaskEvent,
    UnknownSchema,
    UnsupportedContentType,
    decode_event,
    decode_usual,
    encode_event,
    may_have_type,
)

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "task_event.avsc"

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=8)
event_types = st.from_regex(r"\A[a-z]{1,8}(\.[a-z0-9_-]{1,8}){1,4}\Z")


@given(event_types, json_objects, st.none() | json_objects, st.integers(0, MAX_TIMESTAMP_MS))
@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_any_json_object_payload_round_trips(fmt, type_, payload, meta, ts):
    event = TaskEvent(type_, payload, meta, ts)
    value, headers = encode_event(event, fmt=fmt)
    assert decode_event(value, headers) == event
    # without the header the first bytes decide
    assert decode_event(value) == event


def test_avro_value_is_single_object_encoding_with_the_schema_fingerprint():
    value, headers = encode_event(TaskEvent("com.example.x", {"k": "v"}, None, 1))
    raw = json.loads(SCHEMA.read_text())
    canonical = fastavro.schema.to_parsing_canonical_form(raw)
    assert value[:2] == b"\xc3\x01"
    assert value[2:10].hex() == fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")
    assert headers == [(CONTENT_TYPE_HEADER, AVRO_CONTENT_TYPE.encode())]


def test_the_fingerprint_algorithm_matches_the_avro_specification_vector():
    # Avro's test vector: the CRC-64-AVRO fingerprint of the schema "null", as the 8 bytes
    # (little endian) a single-object header carries.
    expected = (7195948357588979594).to_bytes(8, "little").hex()
    assert fastavro.schema.fingerprint('"null"', "CRC-64-AVRO") == expected


def test_plain_json_from_a_foreign_producer_uses_the_record_timestamp_when_absent():
    value = b'{"type": "com.example.log", "payload": {"line": "hi"}}'
    event = decode_event(
        value, [(CONTENT_TYPE_HEADER, b"application/json; charset=utf-8")], record_timestamp_ms=42
    )
    assert event == TaskEvent("com.example.log", {"line": "hi"}, None, 42)


@pytest.mark.parametrize(
    ("value", "headers", "error"),
    [
        (None, None, MalformedEnvelope),
        (b"", None, MalformedEnvelope),
        (b"\xc3\x01\x00", None, MalformedEnvelope),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02ab", None, UnknownSchema),
        (b"not json", None, MalformedEnvelope),
        (b"[1, 2]", None, MalformedEnvelope),
        (b'{"type": "a.b", "payload": [1]}', None, MalformedEnvelope),
        (b'{"type": "", "payload": {}}', None, MalformedEnvelope),
        (b'{"type": "a.b", "payload": {}, "extra": 1}', None, MalformedEnvelope),
        (b'{"type": "a.b", "payload": {"x": NaN}}', None, MalformedEnvelope),
        (b'{"type": "a.b", "payload": {}, "timestamp": -1}', None, MalformedEnvelope),
        (
            b'{"type": "a.b", "payload": {}}',
            [(CONTENT_TYPE_HEADER, b"text/plain")],
            UnsupportedContentType,
        ),
        (
            b'{"type": "a.b", "payload": {}}',
            [(CONTENT_TYPE_HEADER, b"\xff")],
            UnsupportedContentType,
        ),
        (b"\xff\xfe\x00", None, MalformedEnvelope),
    ],
)
def test_bad_values_raise_a_typed_envelope_error(value, headers, error):
    with pytest.raises(error) as info:
        decode_event(value, headers)
    assert isinstance(info.value, EnvelopeError)
    assert str(info.value).startswith(info.value.reason)


def test_truncated_or_padded_avro_bodies_are_malformed():
    value, _ = encode_event(TaskEvent("com.example.x", {"k": "v" * 50}, {"m": 1}, 1))
    for cut in range(10, len(value)):
        with pytest.raises(EnvelopeError):
            decode_event(value[:cut])
    with pytest.raises(MalformedEnvelope):
        decode_event(value + b"\x00")


def _varint(n: int, pad: int = 0) -> bytes:
    """Avro's zig-zag varint of ``n``, spelt with ``pad`` more bytes than needed (allowed)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    for _ in range(pad):
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def _avro(type_: bytes, payload: bytes, meta: bytes | None, ts: int, pads: list[int]) -> bytes:
    header = encode_event(TaskEvent("a.b", {}, None, 0))[0][:10]
    body = _varint(len(type_), pads[0]) + type_ + _varint(len(payload), pads[1]) + payload
    body += b"\x00" if meta is None else b"\x02" + _varint(len(meta), pads[2]) + meta
    return header + body + _varint(ts, pads[3])


@given(
    st.integers(-(2**63), 2**63 - 1) | st.integers(2**34, 2**41),
    st.sampled_from(["a.b", "com.example." + "t" * 60]),
    st.integers(0, 9000),
    st.none() | st.integers(0, 200),
    st.lists(st.integers(0, 2), min_size=4, max_size=4),
)
def test_the_hand_decoder_reads_every_spelling_of_the_avro_body_like_fastavro(
    ts, type_, payload_size, meta_size, pads
):
    # The decoder reads the usual lengths and six-byte timestamps inline; every other shape
    # (long types and payloads, _meta, other timestamps, lengths spelt in more bytes than
    # needed, which Avro readers accept) takes the general path: all must agree.
    payload = json.dumps({"p": "x" * payload_size}, separators=(",", ":")).encode()
    meta = None if meta_size is None else json.dumps({"m": "y" * meta_size}).encode()
    value = _avro(type_.encode(), payload, meta, ts, pads)
    if pads[3] == 0 and 0 <= ts <= MAX_TIMESTAMP_MS:  # fastavro writes minimal varints only
        schema = fastavro.parse_schema(json.loads(SCHEMA.read_text()))
        with_fastavro = io.BytesIO()
        fastavro.schemaless_writer(
            with_fastavro,
            schema,
            {
                "type": type_,
                "payload": payload.decode(),
                "_meta": meta and meta.decode(),
                "timestamp": ts,
            },
        )
        assert value[10:] == with_fastavro.getvalue() or any(pads[:3])
    if not 0 <= ts <= MAX_TIMESTAMP_MS:
        with pytest.raises(MalformedEnvelope):
            decode_event(value)
        return
    event = decode_event(value)
    assert (event.type, event.timestamp_ms) == (type_, ts)
    assert event.payload_json == payload.decode()
    assert event.meta_json == (meta and meta.decode())
    with pytest.raises(MalformedEnvelope):  # cut short in its last varint
        decode_event(value[:-1])


def _fields(event: TaskEvent) -> tuple[object, ...]:
    return (event.type, event.payload, event.meta, event.timestamp_ms, event.payload_json)


@given(
    st.integers(-(2**63), 2**63 - 1)
    | st.integers(2**34, 2**41 - 1)
    | st.integers(-(2**41), -(2**34)),
    st.sampled_from(["a.b", "com.example." + "t" * 60, "é.x", ""]),
    st.integers(0, 300),
    st.none() | st.integers(0, 20),
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
    st.sampled_from([None, AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE, "text/plain"]),
    st.sampled_from(['{"p":"%s"}', '["%s"]', '{"p":"%s"\n}', '{"p":1e999,"q":"%s"}']),
    st.integers(0, 2),
)
@example(2**40, "a.b", 10, None, [0, 0, 0, 0], None, '{"p":"%s"}', 0)  # the usual shape
@example(
    2**40, "com.example." + "t" * 60, 10, None, [0, 0, 0, 0], None, '{"p":"%s"}', 0
)  # a long type
@example(
    2**40, "com.example." + "t" * 60, 10, None, [0, 0, 0, 0], None, '{"p":"%s"}', 0
)  # long type
@example(2**40, "a.b", 150, None, [0, 0, 0, 0], AVRO_CONTENT_TYPE, '{"p":"%s"}', 0)  # 2-byte length
@example(-(2**40), "a.b", 10, None, [0, 0, 0, 0], None, '{"p":"%s"}', 0)  # negative timestamp
@example(2**40, "a.b", 10, None, [0, 0, 0, 0], JSON_CONTENT_TYPE, '{"p":"%s"}', 0)  # not Avro
@example(2**40, "a.b", 10, None, [0, 0, 0, 0], None, '{"p":"%s"\n}', 0)  # a raw newline
@example(2**40, "a.b", 10, None, [0, 0, 0, 0], None, '{"p":1e999,"q":"%s"}', 0)  # not wire JSON
def test_the_usual_shape_is_read_exactly_as_decode_event_reads_it(
    ts, type_, size, meta_size, pads, content_type, shape, cut
):
    # decode_usual is the replay's shortcut: whatever it answers must be decode_event's event
    # (payload text included); None sends the record the full way.
    payload = (shape % ("x" * size)).encode()
    meta = None if meta_size is None else json.dumps({"m": "y" * meta_size}).encode()
    value = _avro(type_.encode(), payload, meta, ts, pads)
    value = value[: len(value) - cut] if cut < 2 else value + b"\x00"
    headers = None if content_type is None else [(CONTENT_TYPE_HEADER, content_type.encode())]
    usual = decode_usual(value, None if headers is None else tuple(headers), 1_048_576)
    if usual is not None:
        assert _fields(usual) == _fields(decode_event(value, headers))
    plain = cut == 0 and meta is None and not any(pads) and shape == '{"p":"%s"}'
    if (
        plain
        and 0 < len(type_.encode()) < 64  # a one-byte Avro length (usual_parts)
        and size < 200
        and 2**34 <= ts < 2**41
        and content_type
        in (
            None,
            AVRO_CONTENT_TYPE,
        )
    ):
        assert usual is not None, "the usual shape must take the shortcut"


@given(st.binary(max_size=120), st.sampled_from([None, AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE]))
@example(b"\x06a.b\x05{}\x00\x80\x80\x80\x80\x80\x40", None)  # a negative payload length
@example(b"\x07a.b\x04{}\x00\x80\x80\x80\x80\x80\x40", None)  # a negative type length
def test_any_bytes_after_the_usual_header_are_read_as_decode_event_reads_them(tail, ct):
    head = encode_event(TaskEvent("a.b", {}, None, 0))[0][:10]
    headers = None if ct is None else ((CONTENT_TYPE_HEADER, ct.encode()),)
    usual = decode_usual(head + tail, headers, 1_048_576)
    if usual is not None:
        assert _fields(usual) == _fields(decode_event(head + tail, headers))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_decoder(data):
    for value in (
        data,
        b"\xc3\x01" + data,
        b"\xc3\x01" + encode_event(TaskEvent("a.b", {}))[0][2:10] + data,
    ):
        try:
            event = decode_event(value)
        except EnvelopeError:
            continue
        assert isinstance(event, TaskEvent)


def test_oversized_values_are_rejected_before_decoding():
    value, headers = encode_event(TaskEvent("com.example.x", {"blob": "x" * 5000}))
    with pytest.raises(EnvelopeTooLarge):
        decode_event(value, headers, max_bytes=1024)
    assert decode_event(value, headers, max_bytes=len(value)).payload["blob"] == "x" * 5000


def test_encoding_refuses_what_could_not_be_decoded():
    with pytest.raises(MalformedEnvelope):
        encode_event(TaskEvent("com.example.x", {"x": float("nan")}))
    with pytest.raises(MalformedEnvelope):
        encode_event(TaskEvent("com.example.x", {"x": object()}))
    with pytest.raises(MalformedEnvelope):
        encode_event(TaskEvent("", {}))
    with pytest.raises(MalformedEnvelope):
        encode_event(TaskEvent("com.example.x", {}, None, MAX_TIMESTAMP_MS + 1))


def test_json_encoding_is_labelled_json():
    value, headers = encode_event(TaskEvent("com.example.x", {}, None, 7), fmt="json")
    assert headers == [(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE.encode())]
    assert json.loads(value) == {"type": "com.example.x", "payload": {}, "timestamp": 7}
    assert struct.calcsize("<Q") == 8


def test_the_schema_ships_inside_the_package_too():
    import bridge

    packaged = Path(bridge.__file__).resolve().parent / "schemas" / "task_event.avsc"
    assert packaged.read_bytes() == SCHEMA.read_bytes()


# --- records the bridge could not write back out: strict decoding with the wire's rules --------

from test_strictjson import (  # noqa: E402
    HOSTILE_TOKENS,
    as_bytes,
    careless_strings,
    hostile_json_texts,
    nested,
    wire_bytes,
)

from bridge.strictjson import MAX_DEPTH  # noqa: E402


def _avro_long(n: int) -> bytes:
    zigzag, out = (n << 1) ^ (n >> 63), bytearray()
    while zigzag > 0x7F:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    return bytes([*out, zigzag])


def _avro_string(text: str) -> bytes:
    data = as_bytes(text)
    return _avro_long(len(data)) + data


def avro_record(type_: str, payload_text: str, meta_text: str | None, ts: int = 1) -> bytes:
    """An Avro record around JSON texts as a careless producer might write them (unchecked)."""
    fingerprint = encode_event(TaskEvent("a.b", {}))[0][2:10]
    meta = b"\x00" if meta_text is None else b"\x02" + _avro_string(meta_text)
    body = _avro_string(type_) + _avro_string(payload_text) + meta + _avro_long(ts)
    return b"\xc3\x01" + fingerprint + body


def json_record(type_: str, payload_text: str, meta_text: str | None) -> bytes:
    """A plain JSON envelope around JSON texts, written without any check."""
    fields = [f'"type":{json.dumps(type_)}', f'"payload":{payload_text}']
    if meta_text is not None:
        fields.append(f'"_meta":{meta_text}')
    return as_bytes("{" + ",".join(fields) + "}")


def record(fmt: str, type_: str, payload_text: str, meta_text: str | None) -> bytes:
    build = avro_record if fmt == "avro" else json_record
    return build(type_, payload_text, meta_text)


def assert_wire_event_or_envelope_error(value: bytes | None, headers=None) -> TaskEvent | None:
    """decode_event's contract: an event the wire can write, or EnvelopeError, nothing else."""
    try:
        event = decode_event(value, headers)
    except EnvelopeError as exc:
        wire_bytes({"reason": exc.reason, "error": exc.message})
        assert len(exc.message) <= 300
        return None
    wire_bytes(event.payload)
    wire_bytes(event.meta)
    wire_bytes(event.type)
    return event


in_an_object = hostile_json_texts.map(lambda text: '{"v":' + text + "}")


@given(in_an_object | hostile_json_texts, st.none() | in_an_object, st.booleans())
@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_hostile_json_in_payload_or_meta_decodes_to_wire_json_or_an_envelope_error(
    fmt, payload_text, meta_text, labelled
):
    value = record(fmt, "com.example.careless", payload_text, meta_text)
    content_type = AVRO_CONTENT_TYPE if fmt == "avro" else JSON_CONTENT_TYPE
    assert_wire_event_or_envelope_error(
        value, [(CONTENT_TYPE_HEADER, content_type.encode())] if labelled else None
    )


@pytest.mark.parametrize("fmt", ["avro", "json"])
@pytest.mark.parametrize(
    "hostile",
    [
        "1e999",
        "-1e999",
        '"\\ud800"',
        '"partial delta cut by UTF-16 code unit \\ud83d"',
        "1" * 5000,
        nested("1", MAX_DEPTH),
        nested("1", 500),
        nested("1", 5000),
        "NaN",
    ],
)
@pytest.mark.parametrize("where", ["payload", "_meta"])
def test_records_the_bridge_could_not_write_back_are_malformed(fmt, hostile, where):
    text = '{"v":' + hostile + "}"
    payload, meta = (text, None) if where == "payload" else ("{}", text)
    with pytest.raises(MalformedEnvelope):
        decode_event(record(fmt, "com.example.careless", payload, meta))


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_payload_and_meta_may_nest_to_the_same_depth_in_both_formats(fmt):
    deepest = '{"v":' + nested("1", MAX_DEPTH - 1) + "}"
    event = decode_event(record(fmt, "com.example.deep", deepest, deepest))
    assert event.payload == event.meta == json.loads(deepest)
    assert decode_event(*encode_event(event, fmt=fmt)) == event
    with pytest.raises(MalformedEnvelope):
        encode_event(TaskEvent("com.example.deep", {"v": [event.payload]}), fmt=fmt)


def test_surrogate_pairs_and_escaped_backslashes_are_ordinary_text():
    payload = '{"emoji": "\\ud83d\\ude00", "path": "C:\\\\ud800"}'
    event = decode_event(record("json", "com.example.text", payload, None))
    assert event.payload == {"emoji": "\U0001f600", "path": "C:\\ud800"}


@given(st.binary(max_size=200), st.sampled_from([None, AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE]))
def test_arbitrary_record_bytes_decode_to_wire_json_or_an_envelope_error(data, content_type):
    headers = None if content_type is None else [(CONTENT_TYPE_HEADER, content_type.encode())]
    prefix = encode_event(TaskEvent("a.b", {}))[0][:10]
    for value in (data, b"\xc3\x01" + data, prefix + data):
        assert_wire_event_or_envelope_error(value, headers)


@given(careless_strings, st.integers(0, 5000))
def test_envelope_error_text_is_bounded_and_encodable_whatever_it_quotes(quoted, repeat):
    error = MalformedEnvelope(f"unknown JSON envelope fields: {[quoted] * repeat} {quoted}")
    assert len(error.message) <= 300
    wire_bytes({"error": error.message, "str": str(error)})
    assert MalformedEnvelope("short and plain").message == "short and plain"


def test_the_unknown_fields_error_of_a_huge_envelope_stays_short():
    fields = ",".join(f'"f{i}":{i}' for i in range(5000))
    with pytest.raises(MalformedEnvelope) as info:
        decode_event(('{"type":"a.b","payload":{},' + fields + "}").encode())
    assert len(info.value.message) <= 300


def test_every_hostile_token_is_either_refused_or_kept_exactly():
    for token in HOSTILE_TOKENS:
        event = assert_wire_event_or_envelope_error(
            record("avro", "com.example.t", '{"v":' + token + "}", None)
        )
        if event is not None:
            assert event.payload == {"v": json.loads(token)}


def test_an_error_quoting_many_lone_surrogates_stays_within_the_bound():
    """Found by the property above in a full run: escaping came after the cut, so each
    surrogate's six-character escape pushed the text past the bound."""
    quoted = "\x1f\x1f\ud7fc\ud800\ud800\ud800"
    error = MalformedEnvelope(f"unknown JSON envelope fields: {[quoted] * 7} {quoted}")
    assert len(error.message) <= 300


# --- may_have_type: the tail's look at a record's type, without decoding it ---------------------

OWN_TYPES = frozenset({"io.mcpbridge.task.created", "io.mcpbridge.task.status"})


@given(
    st.binary(max_size=60),
    event_types | st.sampled_from(sorted(OWN_TYPES)),
    st.sampled_from([None, AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE]),
    st.sampled_from(["avro", "json"]),
)
def test_may_have_type_says_no_only_to_records_that_cannot_decode_to_those_types(
    noise, event_type, content_type, fmt
):
    headers = None if content_type is None else [(CONTENT_TYPE_HEADER, content_type.encode())]
    value = encode_event(TaskEvent(event_type, {"i": 1}), fmt=fmt)[0]
    for candidate in (noise, value, value[: len(noise)], value + noise, noise + value):
        try:
            event = decode_event(candidate, headers)
        except EnvelopeError:
            continue
        if event.type in OWN_TYPES:
            assert may_have_type(candidate, headers, OWN_TYPES)


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_may_have_type_tells_other_types_apart_without_decoding(fmt):
    other = encode_event(TaskEvent("com.example.step", {"i": 1}), fmt=fmt)
    own = encode_event(TaskEvent("io.mcpbridge.task.status", {"status": "working"}), fmt=fmt)
    assert not may_have_type(*other, OWN_TYPES)
    assert may_have_type(*own, OWN_TYPES)
    assert not may_have_type(None, None, OWN_TYPES)
    assert not may_have_type(own[0], [(CONTENT_TYPE_HEADER, b"text/plain")], OWN_TYPES)

"""The event envelope codec: round trips, the single-object header, and typed errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import fastavro.schema
import pytest
from hypothesis import given
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
    crc64_avro,
    decode_event,
    encode_event,
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


def test_crc64_matches_the_avro_specification_vector():
    # Avro's test vector: the fingerprint of the schema "null".
    assert crc64_avro(b'"null"') == 7195948357588979594


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

"""Strict JSON (bridge.strictjson): what parses is exactly what the wire can write back out.

The strategies here (hostile JSON texts, surrogate-bearing strings) are shared with the envelope
tests and the end-to-end careless-records test.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bridge.strictjson import MAX_DEPTH, NotWireJson, dumps, dumps_parsed, loads, loads_full

# --- the wire's rule, and hostile inputs ------------------------------------------------------------

#: How many extra frames a server may sit on when it serialises a value (uvicorn, starlette,
#: our handlers): what parses must still serialise from there.
DEEP_STACK_FRAMES = 600


def wire_bytes(value: Any, frames: int = DEEP_STACK_FRAMES) -> bytes:
    """The wire's encoding of ``value``, done ``frames`` calls deep (raises what it raises)."""
    if frames:
        return wire_bytes(value, frames - 1)
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def nested(inner: str, depth: int, *, objects: bool = False) -> str:
    """``inner`` wrapped in ``depth`` arrays (or single-key objects)."""
    if objects:
        return '{"k":' * depth + inner + "}" * depth
    return "[" * depth + inner + "]" * depth


#: JSON texts Python's parser takes but the wire cannot write, and near misses it can.
HOSTILE_TOKENS = [
    "1e999",
    "-1e999",
    "1E+400",
    "1" + "0" * 400 + ".5",
    "NaN",
    "-Infinity",
    "Infinity",
    '"\\ud800"',
    '"cut in half \\ud83d"',
    '"\\udc00 tail"',
    '"\\uDBFF\\uDBFF"',
    "9" * 4301,
    "-" + "1" * 5000,
    # near misses: all of these are wire JSON
    '"\\\\ud800"',
    '"\\ud83d\\ude00"',
    "9" * 4300,
    "4.9e-324",
    "1.7976931348623157e308",
    "1e-999",
    "-0.0",
]
NESTING = [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 500, 990, 5000]

lone_surrogates = st.integers(0xD800, 0xDFFF).map(chr)
#: Strings that may hold raw lone surrogates (Hypothesis' text() never does by default).
careless_strings = st.text(st.characters() | lone_surrogates, max_size=6)
plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)
json_strings = careless_strings.flatmap(
    lambda s: st.sampled_from([json.dumps(s), json.dumps(s, ensure_ascii=False)])
)
json_scalars = st.sampled_from(HOSTILE_TOKENS) | plain_values.map(json.dumps) | json_strings


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(items: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{key}:{value}" for key, value in items) + "}"


hostile_json_texts = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3).map(_array)
        | st.lists(st.tuples(json_strings, children), max_size=3).map(_object)
        | st.builds(nested, children, st.sampled_from(NESTING), objects=st.booleans())
    ),
    max_leaves=6,
)


def as_bytes(text: str) -> bytes:
    """UTF-8 bytes of ``text``, raw surrogates included (as careless producers write them)."""
    return text.encode("utf-8", "surrogatepass")


def legacy_request_parse(body: bytes) -> Any:
    """The MCP endpoint's request body parser before strictjson (loads must refuse a superset)."""

    def reject(name: str) -> Any:
        raise ValueError(name)

    message = json.loads(body, parse_constant=reject)
    json.dumps(message, ensure_ascii=False).encode("utf-8")
    return message


# --- explicit cases --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[1e999]",
        "[-1e999]",
        '{"x": 1E400}',
        "[" + "1" * 400 + ".0]",
        "NaN",
        '{"x": -Infinity}',
        '{"text": "\\ud800"}',
        '{"text": "a JS string cut between its halves \\ud83d"}',
        '{"\\udfff": 1}',
        '"\\ud800\\u0041"',
        '"\\udc00\\ud800"',
        "[" + "7" * 4301 + "]",
        nested("1", MAX_DEPTH + 1),
        nested("1", MAX_DEPTH + 1, objects=True),
        nested("1", 990),
        nested("1", 100_000),
        "",
        "{",
        "[1] [2]",
        '"\ud800"',
    ],
)
def test_loads_refuses_json_the_wire_cannot_write(text):
    for form in (text, as_bytes(text)):
        with pytest.raises(NotWireJson) as info:
            loads(form)
        assert len(str(info.value)) < 200
        str(info.value).encode("utf-8")


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud83d\\ude00"',
        '"\\\\ud800"',
        '"\\\\\\ud83d\\ude00"',
        "[" + "7" * 4300 + "]",
        "[1.7976931348623157e308, -1.7976931348623157e308, 1e-999, 5e-324]",
        nested("1", MAX_DEPTH),
        nested("1", MAX_DEPTH, objects=True),
        '"\ufeff in the middle is fine"',
    ],
)
def test_loads_accepts_wire_json_near_the_limits_and_agrees_with_the_standard_parser(text):
    for form in (text, as_bytes(text)):
        assert loads(form) == json.loads(text)


def test_bytes_are_decoded_strictly_so_raw_surrogates_cannot_slip_through():
    raw = b'{"text": "\xed\xa0\x80"}'  # a UTF-8 encoded lone surrogate: json.loads takes it
    assert json.loads(raw) == {"text": "\ud800"}
    with pytest.raises(NotWireJson):
        loads(raw)
    for encoding in ("utf-16-le", "utf-32-be"):
        assert loads('{"k": "\U0001f600"}'.encode(encoding)) == {"k": "\U0001f600"}


def test_the_nesting_bound_is_exact_and_can_be_moved_per_call():
    assert loads(nested("0", 3), max_depth=3) == [[[0]]]
    with pytest.raises(NotWireJson, match="deeper than 2 levels"):
        loads(nested("0", 3), max_depth=2)
    assert dumps([[[0]]], max_depth=3) == "[[[0]]]"
    with pytest.raises(NotWireJson):
        dumps([[[0]]], max_depth=2)


def test_not_wire_json_is_a_value_error_so_existing_handlers_still_catch_it():
    assert issubclass(NotWireJson, ValueError)


@pytest.mark.parametrize(
    "value",
    [
        {"x": float("nan")},
        {"x": float("inf")},
        {"text": "\ud800"},
        {"\udfff": 1},
        {"x": object()},
        {"n": 10**5000},
        json.loads(nested("1", MAX_DEPTH + 1)),
        ((((0,),),),),
    ],
)
def test_dumps_refuses_what_loads_would_refuse(value):
    with pytest.raises(NotWireJson):
        dumps(value, max_depth=3 if isinstance(value, tuple) else MAX_DEPTH)


# --- properties ------------------------------------------------------------------------------------


@given(hostile_json_texts)
@example(nested("[1e999]", 1))
@example(nested('"\\ud800"', MAX_DEPTH - 1, objects=True))
@example(nested("1", 500))
def test_whatever_loads_accepts_the_wire_can_write_from_deep_in_a_server_stack(text):
    for form in (text, as_bytes(text)):
        try:
            value = loads(form)
        except NotWireJson:
            continue
        wire_bytes(value)
        assert value == json.loads(text)


@given(hostile_json_texts.map(as_bytes) | st.binary(max_size=64) | careless_strings.map(as_bytes))
def test_loads_refuses_every_request_body_the_old_parser_refused(body):
    try:
        legacy_request_parse(body)
    except (ValueError, RecursionError):
        with pytest.raises(NotWireJson):
            loads(body)


@given(st.binary(max_size=200) | careless_strings | hostile_json_texts)
def test_loads_raises_nothing_but_not_wire_json(data):
    with contextlib.suppress(NotWireJson):
        loads(data)


python_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | careless_strings
    | st.sampled_from([4299, 4300]).map(lambda digits: 10**digits),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(careless_strings, children, max_size=3)
        | st.builds(
            lambda v, d: [*json.loads(nested("0", d)), v], children, st.sampled_from(NESTING[:4])
        )
    ),
    max_leaves=8,
)


@given(python_values)
def test_dumps_either_refuses_or_writes_what_loads_reads_back_identically(value):
    try:
        text = dumps(value)
    except NotWireJson:
        return
    wire_bytes(value)
    assert loads(text) == value


# --- the fast path (msgspec) against the full one ------------------------------------------------


def _outcome(parse: Any, text: str | bytes) -> Any:
    try:
        return ("ok", parse(text))
    except Exception:
        return ("refused", None)


#: (text, what msgspec alone does, what orjson alone does, what the wire's rule says).
#: msgspec never says yes where the rule says no, except for nesting (the pre-check's job);
#: orjson also turns integers past 64 bits into floats, which is why it is not the fast path.
EDGE_CASES = [
    ("1e999", "refused", "refused", "refused"),
    ("[1E+400]", "refused", "refused", "refused"),
    ('"\\ud800"', "refused", "refused", "refused"),
    ('{"\\udc00": 1}', "refused", "refused", "refused"),
    ('"\\ud83d\\ude00"', "ok", "ok", "ok"),
    ("NaN", "refused", "refused", "refused"),
    ("-Infinity", "refused", "refused", "refused"),
    ('{"a": 1, "a": 2}', "ok", "ok", "ok"),
    ("9" * 30, "ok", "lossy", "ok"),
    ("-" + "9" * 4300, "refused", "refused", "ok"),
    ("9" * 4301, "refused", "refused", "refused"),
    ("\ufeff{}", "refused", "refused", "refused"),
    (nested("1", MAX_DEPTH + 1), "ok", "ok", "refused"),
    ("1e-400", "ok", "ok", "ok"),
    ('{"a":\r\n1}', "ok", "ok", "ok"),
    ('"a\nb"', "refused", "refused", "refused"),
]


@pytest.mark.parametrize(("text", "by_msgspec", "by_orjson", "rule"), EDGE_CASES)
def test_what_the_fast_libraries_take_and_what_the_rule_takes(text, by_msgspec, by_orjson, rule):
    fast = _outcome(msgspec.json.Decoder().decode, text)
    full = _outcome(loads_full, text)
    other = _outcome(orjson.loads, text)
    assert full[0] == rule
    assert fast[0] == by_msgspec
    if fast[0] == "ok" and rule == "ok":
        assert fast[1] == full[1]  # equal values, big integers exact
    lossy = other[0] == "ok" and full[0] == "ok" and other[1] != full[1]
    assert ("lossy" if lossy else other[0]) == by_orjson
    # Whatever the libraries do, loads answers as the rule does.
    assert _outcome(loads, text) == full


@pytest.mark.parametrize(
    "data",
    [
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 BOM: json.detect_encoding reads it as utf-8-sig
        '{"a": 1}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-16-le"),
        '{"k": "\U0001f600"}'.encode("utf-32-be"),
        b'{"a": "\xed\xa0\x80"}',  # a UTF-8 encoded lone surrogate
        b'{"a": "x\x00"}',
    ],
)
def test_bytes_the_fast_path_leaves_to_the_full_one_get_the_full_answer(data):
    assert _outcome(loads, data) == _outcome(loads_full, data)


@given(hostile_json_texts)
def test_the_fast_path_answers_exactly_as_the_full_one(text):
    for form in (text, as_bytes(text)):
        assert _outcome(loads, form) == _outcome(loads_full, form)


@given(plain_values)
def test_dumps_parsed_writes_the_value_loads_gave(value):
    parsed = loads(json.dumps(value))
    text = dumps_parsed(parsed)
    assert loads_full(text) == parsed
    assert "\n" not in text and "\r" not in text


def _refusal_at_depth(text: str, frames: int) -> str:
    """loads' refusal of ``text`` asked from ``frames`` calls deeper in the stack."""
    if frames:
        return _refusal_at_depth(text, frames - 1)
    with pytest.raises(NotWireJson) as refused:
        loads(text)
    return str(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 900 + "1e999" + "]" * 900,  # deep, and a number no double holds at the bottom
        '{"v":' + "[" * 700 + '"\\ud800"' + "]" * 700 + "}",
        "[" * 200 + "]" * 199,  # deep and cut short
    ],
)
def test_a_deep_text_is_refused_the_same_way_whoever_asks(text: str) -> None:
    # The parser's recursion limit depends on the caller's stack: a record replayed from deep
    # in a stream and the same record read by the tail must get the same placeholder.
    shallow = _refusal_at_depth(text, 0)
    assert shallow == _refusal_at_depth(text, 400)
    assert "nest deeper than" in shallow

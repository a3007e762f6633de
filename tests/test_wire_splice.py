"""A replay's splice: the usual records go to the wire as their producer's text, unparsed.

:meth:`RecordDecoder.wire_events` hands a stream each usual record as its checked wire JSON
members (:data:`~bridge.envelope.WireMembers`) instead of an event, and :func:`take_next`
takes such a batch (consecutive seqs) in slices. Both
are shortcuts, so the properties here hold them to the long way: the notification text of a
spliced record is exactly the one its event renders (for any bytes a producer can write), and
a wire batch is taken exactly as the same events one by one. Pure, in-process, fast; the
streams over real HTTP (tests/test_stream_wire.py, tests/test_careless_records.py) send every
replay through the splice.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_admission import Ev
from test_envelope import avro_record
from test_lazy_decode import OWN, PREFIX, consumer_record, events, records
from test_strictjson import hostile_json_texts

from bridge.envelope import (
    CONTENT_TYPE_HEADER,
    JSON_CONTENT_TYPE,
    Item,
    TaskEvent,
    WireMembers,
    encode_event,
)
from bridge.log.records import Batch, RecordDecoder
from bridge.server.sse import RecentTexts, renderer, sse_events
from bridge.server.streams import Step, take_next
from bridge.vocabulary import REVERSE_DNS_ONLY

TASK = "a" * 32
render = renderer(TASK, PREFIX)

payload_texts = (
    hostile_json_texts
    | hostile_json_texts.map(lambda text: '{"v":' + text + "}")
    | st.sampled_from(
        [
            '{"i":1}',
            '{ "i" : 1 }',
            '{"i":1,\n"j":2}',  # whitespace CR/LF: the event's text is made one line
            '{"i":1,\r"j":2}',
            '{"a":1,"a":2}',  # a duplicate key goes out as written
            '{"v":1e999}',
            '{"v":"\\ud800"}',
            '{"v":' + "[" * 200 + "]" * 200 + "}",  # past MAX_DEPTH
            '{"v":' + "[" * 100 + "]" * 100 + "}",  # deep, within it, longer than 256
            '{"pad":"' + "x" * 5000 + '"}',  # a two-byte length
            "\ufeff{}",
            "[]",
            "",
        ]
    )
)
wire_types = st.sampled_from(
    [
        "com.example.step",
        "tool.started",  # unprefixed: its event wraps it
        OWN.status,
        OWN.created,
        OWN.progress,
        "com.ex\u00e9mple.caf\u00e9",
        'com.example."quoted"',
    ]
)


@st.composite
def avro_texts(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, bytes]] | None]:
    """Avro records around any payload text, with and without _meta and content type."""
    value = avro_record(
        draw(wire_types),
        draw(payload_texts),
        draw(st.none() | st.just('{"k":"v"}')),
        draw(st.sampled_from([0, 1, 2**34, 2**40, 2**41 - 1, 2**45, -5, -(2**35)])),
    )
    headers = draw(
        st.sampled_from(
            [
                None,
                [(CONTENT_TYPE_HEADER, b"application/vnd.mcpbridge.task-event+avro")],
                [(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE.encode())],
            ]
        )
    )
    return value, headers


def _fields(event: TaskEvent) -> tuple[object, ...]:
    return (event.type, event.payload, event.meta, event.timestamp_ms, event.payload_json)


@given(st.lists(records() | avro_texts(), max_size=12), st.sampled_from([64, 1_048_576]))
@settings(suppress_health_check=[HealthCheck.too_slow])
@example([(avro_record("com.example.step", '{"i":1}', None, 2**40), None)], 1_048_576)
@example([(avro_record("com.example.step", '{"i":1,\n"j":2}', None, 2**40), None)], 1_048_576)
@example([(avro_record(OWN.status, '{"status":"completed"}', None, 2**40), None)], 1_048_576)
@example([(avro_record("com.example.step", '{"v":1e999}', None, 2**40), None)], 1_048_576)
@example([(avro_record("com.example.step", '{"i":1}', None, -(2**35)), None)], 1_048_576)
def test_a_spliced_record_renders_exactly_as_its_event(written, max_bytes):
    recs = [consumer_record(value, headers, offset=i) for i, (value, headers) in enumerate(written)]
    recs += recs  # the second time round, the type's wire members are remembered
    decoder = RecordDecoder(PREFIX, max_bytes, REVERSE_DNS_ONLY)
    items, full = decoder.wire_events(recs)
    assert len(items) == len(recs)
    assert full == [i for i, item in enumerate(items) if not isinstance(item, str)]
    for seq, (item, rec) in enumerate(zip(items, recs, strict=True)):
        event = RecordDecoder(PREFIX, max_bytes, REVERSE_DNS_ONLY).event(rec)
        assert render(seq, item) == render(seq, event)
        if isinstance(item, str):
            # Only prefixed types that are not the bridge's own facts, and no _meta.
            assert event.type not in (OWN.status, OWN.created) and event.meta is None
            assert REVERSE_DNS_ONLY.is_prefixed(event.type)
        else:
            assert _fields(item) == _fields(event)


def test_the_usual_record_is_spliced_and_others_are_events():
    decoder = RecordDecoder(PREFIX, 1_048_576)
    usual = encode_event(TaskEvent("com.example.step", {"i": 1, "pad": "x" * 32}))
    status = encode_event(TaskEvent(OWN.status, {"status": "completed"}))
    with_meta = encode_event(TaskEvent("com.example.step", {"i": 1}, {"k": "v"}))
    unprefixed = encode_event(TaskEvent("tool.started", {"i": 1}))
    json_fmt = encode_event(TaskEvent("com.example.step", {"i": 1}), fmt="json")
    written = [usual, status, with_meta, unprefixed, json_fmt, usual]
    recs = [consumer_record(v, list(h), offset=i) for i, (v, h) in enumerate(written)]
    items, full = decoder.wire_events(recs)
    assert items[0] == '"type":"com.example.step","payload":' + json.dumps(
        {"i": 1, "pad": "x" * 32}, separators=(",", ":")
    )
    assert items[5] == items[0]
    assert full == [1, 2, 3, 4]


# --- take_next: the delivery rule on a wire batch, in slices --------------------------------

STATUS = OWN.status


@settings(deadline=None)
@given(
    n=st.integers(1, 30),
    start=st.integers(0, 29),
    last=st.integers(-1, 32),
    data=st.data(),
    any_first=st.booleans(),
)
def test_a_wire_batch_is_taken_exactly_as_the_same_events_one_by_one(
    n: int, start: int, last: int, data: st.DataObject, any_first: bool
) -> None:
    statuses = set(data.draw(st.lists(st.integers(start, start + n - 1), max_size=3)))
    terminal = data.draw(st.sampled_from([-1, *sorted(statuses)]), label="terminal")
    spliced = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="spliced")
    events = [
        Ev(
            seq,
            10 * seq,
            TaskEvent(STATUS if seq in statuses else "com.example.e", {"i": seq}, None, 0),
        )
        for seq in range(start, start + n)
    ]
    # A status is never spliced; any other event may be (its text stands for it).
    items: list[Item] = [
        WireMembers(f"text {e.seq}") if spliced[i] and e.seq not in statuses else e.event
        for i, e in enumerate(events)
    ]
    full = [i for i, item in enumerate(items) if not isinstance(item, str)]
    asked: list[int] = []

    def ends(offset: int, event: TaskEvent) -> bool:
        asked.append(offset)
        return offset == 10 * terminal

    wire = Batch(range(start, start + n), [e.offset for e in events], items, full)
    taken, wire_last, wire_step = take_next(wire, last, ends, end_type=STATUS, any_first=any_first)
    assert all(offset // 10 in statuses for offset in asked)  # ends: only about statuses
    expected, exp_last, exp_step = take_next(
        Batch.of(events),
        last,
        lambda o, e: o == 10 * terminal,
        any_first=any_first,
        end_type=STATUS,
    )
    assert type(expected.seqs) is list  # the item-by-item way
    assert (wire_last, wire_step) == (exp_last, exp_step)
    assert list(taken.seqs) == list(expected.seqs)
    assert taken.items == [items[seq - start] for seq in expected.seqs]
    assert taken.full == [i for i, item in enumerate(taken.items) if isinstance(item, TaskEvent)]


def test_a_wire_batch_past_the_cursor_is_a_gap():
    items: list[Item] = [WireMembers("a"), WireMembers("b")]
    wire = Batch(range(5, 7), [50, 60], items, [])
    never = lambda offset, event: False  # noqa: E731
    taken, last, step = take_next(wire, 2, never, end_type=STATUS)
    assert (len(taken), last, step) == (0, 2, Step.GAP)
    assert take_next(wire, 2, never, end_type=STATUS, any_first=True)[1:] == (6, Step.MORE)


# --- framing: a batch's SSE text in one go is its texts framed one by one --------------------


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(
        events() | st.sampled_from(['"type":"com.example.step","payload":{"i":1}', '"t":1']),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([1, 3, RecentTexts.KEPT_BATCH, RecentTexts.KEPT_BATCH + 1, 600]),
    st.integers(0, 2**40),
    st.sampled_from([0, 0, 2]),
)
def test_a_batch_is_framed_exactly_as_its_texts_one_by_one(kinds, size, first, gap):
    render = renderer(TASK, PREFIX)
    # A stream's batches have consecutive seqs; any other is framed one by one, as well.
    pairs = [(first + i + gap * (2 * i > size), kinds[i % len(kinds)]) for i in range(size)]
    seqs = [seq for seq, _ in pairs]
    items = [item for _, item in pairs]
    full = [i for i, item in enumerate(items) if isinstance(item, TaskEvent)]
    batch = Batch(range(first, first + size) if not gap else seqs, [0] * size, items, full)
    cursor = "c1-"
    expected = sse_events(cursor, seqs, [render(seq, item) for seq, item in pairs])
    assert expected.count("\n\n") == size
    assert render.frames(cursor, batch) == expected
    assert RecentTexts().frames(TASK, cursor, batch, render) == expected

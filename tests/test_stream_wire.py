"""The stream's wire pieces as pure functions: rendered notifications and cursors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import TaskEvent, decode_event, encode_event
from bridge.log.records import Batch
from bridge.server.cursor import decode_cursor, encode_cursor
from bridge.server.sse import RecentTexts, Renderer, renderer, sse_events
from bridge.server.wire import dumps, notification

texts = st.text(max_size=20)
metas = st.none() | st.dictionaries(texts, st.integers() | texts, max_size=3)


@given(
    texts.filter(bool),
    st.integers(0, 2**40),
    texts.filter(bool),
    st.dictionaries(texts, st.integers() | texts),
    metas,
)
def test_the_fast_renderer_writes_exactly_the_notification_json(task_id, seq, type_, payload, meta):
    event = TaskEvent(type_, payload, meta, 1)
    rendered = renderer(task_id, "io.mcpbridge")(seq, event)
    assert rendered == dumps(notification(task_id, seq, event))
    params = json.loads(rendered)["params"]
    assert params["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert "\n" not in rendered


@given(
    st.one_of(st.integers(0, 2**31), texts.filter(lambda t: "\x00" not in t)),
    texts.filter(lambda t: t and "\x00" not in t),
    st.integers(0, 2**50),
)
def test_cursors_round_trip(request_id, task_id, seq):
    assert decode_cursor(encode_cursor(request_id, task_id, seq)) == (request_id, task_id, seq)


@pytest.mark.parametrize(
    "bad", ["", "v1.", "v1.!!!.3", "v1.aTEAdA.-1", "v1.aTEAdA.x", "v2.aTEAdA.3", "nonsense"]
)
def test_anything_else_is_not_a_cursor(bad):
    with pytest.raises(ValueError):
        decode_cursor(bad)


# --- events that carry their JSON text (decoded records) --------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)  # fmt: skip


@given(
    texts.filter(bool),
    st.integers(0, 2**40),
    st.sampled_from(["avro", "json"]),
    st.dictionaries(texts, json_values, max_size=4),
    st.none() | st.dictionaries(texts, json_values, max_size=3),
)
def test_a_decoded_event_is_rendered_from_its_text_to_the_same_notification(
    task_id, seq, fmt, payload, meta
):
    value, headers = encode_event(TaskEvent("com.example.thing", payload, meta, 5), fmt=fmt)
    event = decode_event(value, headers)
    assert event.payload_json is not None
    rendered = renderer(task_id, "io.mcpbridge")(seq, event)
    assert json.loads(rendered) == json.loads(dumps(notification(task_id, seq, event)))
    assert "\n" not in rendered and "\r" not in rendered


def avro_record(payload_text: str, meta_text: str | None = None) -> bytes:
    """An Avro envelope around payload/_meta texts exactly as a producer wrote them."""
    value, _ = encode_event(
        TaskEvent("com.example.thing", {"x": 0}, {"m": 0} if meta_text else None, 5)
    )
    head = value[:10]

    def string(text: str) -> bytes:
        raw = text.encode("utf-8")
        return zigzag(len(raw)) + raw

    body = string("com.example.thing") + string(payload_text)
    body += b"\x00" if meta_text is None else b"\x02" + string(meta_text)
    return head + body + zigzag(5)


def zigzag(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while True:
        byte, z = z & 0x7F, z >> 7
        if not z:
            return bytes(out + bytes([byte]))
        out.append(byte | 0x80)


def test_the_producer_s_text_goes_out_as_written_on_one_line():
    payload = '{ "b" : [1, 2.50, 1e2],\r\n  "a" : "x\\ny" }'
    event = decode_event(avro_record(payload, '{"trace":\n"t-1"}'))
    line = renderer("t1", "io.mcpbridge")(3, event)
    assert "\n" not in line and "\r" not in line
    assert '{ "b" : [1, 2.50, 1e2],    "a" : "x\\ny" }' in line  # spacing and spelling kept
    params = json.loads(line)["params"]
    assert params["payload"] == {"b": [1, 2.5, 100.0], "a": "x\ny"}
    assert params["_meta"] == {
        "trace": "t-1",
        "io.modelcontextprotocol/related-task": {"taskId": "t1"},
    }


def test_a_duplicate_key_goes_out_as_the_producer_wrote_it_and_reads_as_the_bridge_does():
    event = decode_event(avro_record('{"status":"working","status":"completed"}'))
    assert event.payload == {"status": "completed"}  # what the index folds: the last one
    line = renderer("t1", "io.mcpbridge")(0, event)
    assert '"payload":{"status":"working","status":"completed"}' in line
    assert json.loads(line)["params"]["payload"] == event.payload


def test_a_producer_s_related_task_meta_is_replaced_not_duplicated():
    meta = '{"io.modelcontextprotocol/related-task": {"taskId": "someone-else"}, "k": 1}'
    event = decode_event(avro_record('{"a":1}', meta))
    line = renderer("t1", "io.mcpbridge")(0, event)
    assert line.count("related-task") == 1
    assert json.loads(line)["params"]["_meta"] == {
        "io.modelcontextprotocol/related-task": {"taskId": "t1"},
        "k": 1,
    }


def test_the_json_envelope_carries_the_parsed_values_compactly():
    value = b'{"type": "com.example.thing", "payload": {"a": 1, "a": 2, "n": 99999999999999999999}}'
    event = decode_event(value)
    assert event.payload_json == '{"a":2,"n":99999999999999999999}'
    line = renderer("t1", "io.mcpbridge")(0, event)
    assert json.loads(line)["params"]["payload"] == {"a": 2, "n": 99999999999999999999}


class CountingRender:
    """A stream's renderer that counts its calls."""

    def __init__(self, task_id: str) -> None:
        self.render = renderer(task_id, "io.mcpbridge")
        self.calls = 0

    def __call__(self, seq: int, event: TaskEvent) -> str:
        self.calls += 1
        return self.render(seq, event)


def test_an_event_sent_to_many_streams_of_its_task_is_rendered_once():
    texts = RecentTexts()
    event = TaskEvent("com.example.tick", {"n": 1})
    streams = [CountingRender("t1") for _ in range(50)]
    lines = {texts.text("t1", 4, event, render) for render in streams}
    assert lines == {renderer("t1", "io.mcpbridge")(4, event)}
    assert sum(render.calls for render in streams) == 1


def test_recent_texts_keep_tasks_and_seqs_apart_and_drop_the_oldest_when_full():
    texts = RecentTexts(limit=2)
    a, b = CountingRender("t1"), CountingRender("t2")
    event = TaskEvent("com.example.tick", {"n": 1})
    assert '"taskId":"t2"' in texts.text("t2", 0, event, b)  # not t1's text of seq 0
    texts.text("t1", 0, event, a)
    texts.text("t1", 1, event, a)  # full: t2's seq 0 goes
    assert (a.calls, b.calls) == (2, 1)
    texts.text("t1", 1, event, a)
    texts.text("t2", 0, event, b)
    assert (a.calls, b.calls) == (2, 2)


def test_recent_texts_hold_at_most_their_character_bound_and_never_a_large_text():
    texts = RecentTexts(max_chars=8_000)
    render = CountingRender("t1")
    for seq in range(50):  # ~300 characters each: 15,000 rendered
        texts.text("t1", seq, TaskEvent("com.example.tick", {"pad": "x" * 250}), render)
    assert 0 < texts.chars <= 8_000
    large = TaskEvent("com.example.tick", {"pad": "x" * 2_000})  # above an eighth of the bound
    texts.text("t1", 99, large, render)
    texts.text("t1", 99, large, render)
    assert render.calls == 52, "a large text is rendered for each stream, never kept"


def batch_of(pairs: list[tuple[int, TaskEvent | str]]) -> Batch:
    """A stream's batch of ``pairs`` (consecutive seqs)."""
    items = [item for _, item in pairs]
    full = [i for i, item in enumerate(items) if isinstance(item, TaskEvent)]
    return Batch(range(pairs[0][0], pairs[0][0] + len(pairs)), [0] * len(pairs), items, full)


def test_a_long_replay_batch_is_served_from_recent_texts_but_not_kept_in_them():
    texts = RecentTexts()
    render = CountingRender("t1")
    event = TaskEvent("com.example.tick", {"n": 1})
    texts.text("t1", 0, event, render)  # live: kept
    long_batch = [(seq, event) for seq in range(RecentTexts.KEPT_BATCH + 1)]
    lines = texts.texts("t1", batch_of(long_batch), render)
    assert lines == [renderer("t1", "io.mcpbridge")(seq, event) for seq, _ in long_batch]
    assert render.calls == 1 + RecentTexts.KEPT_BATCH, "seq 0 came from the cache"
    texts.texts("t1", batch_of(long_batch[:2]), render)  # short: seq 1 was not kept, now is
    texts.texts("t1", batch_of(long_batch[:2]), render)
    assert render.calls == 2 + RecentTexts.KEPT_BATCH


class CountingRenderer(Renderer):
    """A task's renderer that counts the events it renders (wire texts need none)."""

    calls = 0

    def __call__(self, seq: int, event: TaskEvent | str) -> str:
        self.calls += 1
        return super().__call__(seq, event)


def test_a_long_batch_of_live_events_is_framed_from_recent_texts():
    # A slow stream's batch after a burst: the texts its task's other streams rendered.
    texts = RecentTexts()
    event = TaskEvent("com.example.tick", {"n": 1})
    first = CountingRenderer("t1", "io.mcpbridge")
    for seq in range(100):
        texts.text("t1", seq, event, first)  # live, a few at a time: kept
    slow = CountingRenderer("t1", "io.mcpbridge")
    batch = [(seq, event) for seq in range(RecentTexts.KEPT_BATCH + 44)]
    framed = texts.frames("t1", "c-", batch_of(batch), slow)
    assert framed == sse_events("c-", [s for s, _ in batch], [first(s, e) for s, e in batch])
    assert slow.calls == len(batch) - 100, "the first 100 came from the cache"


def test_a_long_replay_read_is_framed_without_the_cache():
    texts = RecentTexts()
    render = CountingRenderer("t1", "io.mcpbridge")
    wire = '"type":"com.example.tick","payload":{"n":1}'
    created = TaskEvent("io.mcpbridge.task.created", {"n": 0})
    batch: list[tuple[int, TaskEvent | str]] = [(0, created)]
    batch += [(seq, wire) for seq in range(1, RecentTexts.KEPT_BATCH + 10)]
    texts.frames("t1", "c-", batch_of(batch), render)
    assert render.calls == 1 and texts.chars == 0, "only the event rendered, nothing kept"

"""The stream's wire pieces as pure functions: rendered notifications and cursors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import TaskEvent
from bridge.server.cursor import decode_cursor, encode_cursor
from bridge.server.wire import dumps, notification, renderer

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

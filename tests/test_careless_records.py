"""Careless producers end to end: whatever bytes land in a task's log, its stream replays them all.

A real broker, a real `bridge serve --with-workers` subprocess and real HTTP. A task waits for
input (so nothing else writes to it); a plain Kafka producer then writes a Hypothesis-drawn
list of record values keyed by the task id (arbitrary bytes, tombstones, Avro and JSON
envelopes around hostile JSON: ``1e999``, lone surrogates, 5000-digit integers, deep nesting,
with and without content-type headers), and finally a terminal status. tasks/get answers in
between and after, and tasks/stream delivers every seq 0..n-1 exactly once, then its result.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.layout import fresh_prefix, make_settings
from support.mcp import create_task, read_stream, result
from support.procs import Bridge, running_bridge
from support.waits import BOUND
from test_envelope import in_an_object, record
from test_strictjson import HOSTILE_TOKENS, json_strings, nested

from bridge.client import TaskStreamClient
from bridge.config import Settings
from bridge.envelope import (
    AVRO_CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    JSON_CONTENT_TYPE,
    EnvelopeError,
    TaskEvent,
    decode_event,
    encode_event,
)
from bridge.kafka.clients import idempotent_producer
from bridge.vocabulary import EventSuffix

pytestmark = pytest.mark.kafka

PREFIX = "io.mcpbridge"  # the default event type prefix of the bridge under test
STATUS = f"{PREFIX}.{EventSuffix.STATUS}"
#: Room for the 5000-digit and deeply nested records, so that they are decoded, not oversized.
MAX_EVENT_BYTES = 65_536
RESULT = {"content": [{"type": "text", "text": "done despite careless producers"}]}
PLACEHOLDERS = {f"{PREFIX}.{EventSuffix.UNDECODABLE}", f"{PREFIX}.{EventSuffix.OVERSIZED}"}
UNPREFIXED = f"{PREFIX}.{EventSuffix.UNPREFIXED}"

Record = tuple[bytes | None, list[tuple[str, bytes]]]
TERMINAL: Record = encode_event(TaskEvent(STATUS, {"status": "completed", "result": RESULT}))


@pytest.fixture(scope="module")
def careless_bridge(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bridge]:
    """One `bridge serve --with-workers` for every example (starting one costs seconds)."""
    settings = make_settings(
        kafka_bootstrap, fresh_prefix("c"), tasks={"max_event_bytes": MAX_EVENT_BYTES}
    )
    logs = tmp_path_factory.mktemp("careless")
    with running_bridge(settings, logs, workers=0, with_workers=True) as bridge:
        yield bridge


# --- what careless producers write ---------------------------------------------------------------

formats = st.sampled_from(["avro", "json"])
event_types = st.sampled_from(
    ["com.example.careless", f"{PREFIX}.progress", "content.partial", "x" * 300]
)
envelopes = st.builds(
    record, formats, event_types, in_an_object, st.none() | in_an_object
) | st.builds(record, formats, event_types, st.sampled_from(HOSTILE_TOKENS), st.none())
#: A status that moves tasks/get, with a statusMessage a JavaScript producer cut carelessly.
careless_statuses = st.builds(
    lambda fmt, message: record(
        fmt, STATUS, '{"status":"working","statusMessage":' + message + "}", None
    ),
    formats,
    json_strings | st.sampled_from(['"cut \\ud83d"', "1e999", nested('"deep"', 500)]),
)
values = st.binary(max_size=64) | st.none() | envelopes | careless_statuses
content_types = st.sampled_from([None, AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE, "text/plain"])
records = st.lists(
    st.tuples(
        values,
        content_types.map(lambda ct: [] if ct is None else [(CONTENT_TYPE_HEADER, ct.encode())]),
    ),
    max_size=8,
)

#: Always run: the issue's cases (before the fix the status made tasks/get fail with HTTP 500,
#: and the numbers decoded as infinities the stream could not write), other undecodable
#: records, and neighbours that decode and must arrive as written.
ISSUE_CASES: list[Record] = [
    (record("json", "com.example.delta", '{"text":"\\ud83d"}', None), []),
    (record("avro", "com.example.delta", '{"text":"ok"}', '{"cut":"\\udc00"}'), []),
    (record("avro", "com.example.number", '{"v":1e999}', None), []),
    (record("json", "com.example.number", '{"v":-1e999}', None), []),
    (record("avro", "com.example.big", '{"v":' + "7" * 5000 + "}", None), []),
    (record("json", "com.example.deep", '{"v":' + nested("1", 600) + "}", None), []),
    (b"\xc3\x01 not avro at all", [(CONTENT_TYPE_HEADER, AVRO_CONTENT_TYPE.encode())]),
    (None, []),
    (record("avro", STATUS, '{"status":"working","statusMessage":"\\ud800"}', None), []),
    # and records that decode: an ordinary one, an emoji as a surrogate pair, an unprefixed type
    (record("avro", "com.example.fine", '{"text":"ok"}', None), []),
    (record("json", "com.example.fine", '{"text":"\\ud83d\\ude00"}', '{"k":[1.5]}'), []),
    (record("json", "content.partial", '{"text":"wrapped"}', None), []),
]


# --- the scenario ----------------------------------------------------------------------------------


async def _wait_for_input_required(url: str, task_id: str) -> int:
    """The seq of the task's input_required status: nothing else writes to it after that."""
    client = TaskStreamClient(url, backoff_s=0.1)
    async with asyncio.timeout(BOUND), contextlib.aclosing(client.stream(task_id)) as events:
        async for event in events:
            if event.type == STATUS and event.payload.get("status") == "input_required":
                return event.seq
    raise AssertionError(f"task {task_id} ended before asking for input")


async def _produce(settings: Settings, task_id: str, values: list[Record]) -> list[int]:
    """Write ``values`` keyed by the task with a plain producer; returns their offsets."""
    producer = idempotent_producer(settings, role="careless")
    await producer.start()
    try:
        topic, key = settings.topics.events, task_id.encode()
        sent = [
            await producer.send_and_wait(topic, value, key=key, headers=headers)
            for value, headers in values
        ]
    finally:
        await producer.stop()
    return [meta.offset for meta in sent]


def _assert_delivered_as_written(written: Record, event: dict[str, Any], offset: int) -> None:
    """A record that decodes arrives as itself; any other one as a placeholder in its place."""
    try:
        expected = decode_event(*written, max_bytes=MAX_EVENT_BYTES)
    except EnvelopeError:
        assert event["type"] in PLACEHOLDERS and event["payload"]["offset"] == offset, event
        return
    if event["type"] == UNPREFIXED:
        assert event["payload"] == {"type": expected.type, "payload": expected.payload}
    else:
        assert (event["type"], event["payload"]) == (expected.type, expected.payload)


async def _tasks_get(url: str, task_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=BOUND) as http:
        return await result(http, url, "tasks/get", {"taskId": task_id})


async def _replay_is_complete(bridge: Bridge, values: list[Record]) -> None:
    url = bridge.url
    async with httpx.AsyncClient(timeout=BOUND) as http:
        task_id = await create_task(http, url, "confirm_delete", {"filename": "careless.txt"})
    asked = await _wait_for_input_required(url, task_id)
    offsets = await _produce(bridge.settings, task_id, values)
    # tasks/get answers with careless records (statuses among them) last in the log ...
    assert (await _tasks_get(url, task_id))["status"] in ("working", "input_required")
    offsets += await _produce(bridge.settings, task_id, [TERMINAL])
    async with asyncio.timeout(BOUND):
        out = await read_stream(url, task_id)
    n = asked + 1 + len(values) + 1
    assert out.error is None, out.error
    assert out.seqs == list(range(n)), (out.seqs, n)
    assert out.result == {"resultType": "complete"}
    for written, event, offset in zip(
        [*values, TERMINAL], out.events[asked + 1 :], offsets, strict=True
    ):
        _assert_delivered_as_written(written, event, offset)
    # ... and after the terminal status
    view = await _tasks_get(url, task_id)
    assert view["status"] == "completed" and view["result"] == RESULT


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(records)
@example(ISSUE_CASES)
def test_a_replay_delivers_every_seq_of_careless_records_once_and_ends_with_its_result(
    careless_bridge, values
):
    asyncio.run(_replay_is_complete(careless_bridge, values))

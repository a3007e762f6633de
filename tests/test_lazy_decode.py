"""The cheaper tail: the indexer decodes only the records whose payload the index folds.

Pure properties first: for arbitrary record bytes and headers, what the tail takes from a record
without decoding it (its facts, and whether it is of the bridge's own created or status type)
is exactly what the eager decode gives, and a lazily decoded event is the eager event,
placeholders included. Then the real broker: an indexer's listeners and its reader see the same
events, and the index folds the same statuses, as an eager recount of the log.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.layout import changed
from support.waits import BOUND
from test_envelope import as_bytes, avro_record, json_objects, record

from bridge.config import Settings
from bridge.envelope import (
    AVRO_CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    JSON_CONTENT_TYPE,
    TaskEvent,
    encode_event,
)
from bridge.kafka.clients import idempotent_producer
from bridge.log.indexer import IndexedEvent, Indexer
from bridge.log.reader import Reader
from bridge.log.records import (
    LazyEvent,
    RecordDecoder,
    event_from_record,
    task_facts_of,
)
from bridge.log.seqindex import PartitionIndex
from bridge.vocabulary import REVERSE_DNS_ONLY, TaskEventTypes, TaskStatus

PREFIX = "io.mcpbridge"
OWN = TaskEventTypes.of(PREFIX)
OWNER = "ab" * 16

Headers = list[tuple[str, bytes]] | None


# --- records as anyone may write them ------------------------------------------------------------

statuses = st.sampled_from(
    ["working", "input_required", "completed", "failed", "cancelled", "Completed", "unknown"]
) | st.integers(0, 5)
created_payloads = st.fixed_dictionaries(
    {"tool": st.just("t"), "createdMs": st.integers(0, 10**13), "pollIntervalMs": st.integers(1)},
    optional={"owner": st.sampled_from([OWNER, "short", 7]), "ttlMs": st.none() | st.integers(-1)},
)
types = st.sampled_from(
    [OWN.created, OWN.status, OWN.progress, OWN.undecodable, "com.example.step", "tool.started"]
)


@st.composite
def events(draw: st.DrawFn) -> TaskEvent:
    event_type = draw(types)
    if event_type == OWN.created:
        payload = draw(created_payloads)
    elif event_type == OWN.status:
        payload = {"status": draw(statuses), **draw(json_objects)}
    else:
        payload = draw(json_objects)
    meta = draw(st.none() | st.just({"k": "v"}))
    return TaskEvent(event_type, payload, meta, draw(st.integers(0, 2**41)))


def _escaped(value: bytes, event_type: str) -> bytes:
    """The JSON text with its type spelt through \\u escapes (same document when parsed)."""
    spelt = "".join(f"\\u{ord(c):04x}" for c in event_type)
    return value.replace(json.dumps(event_type).encode(), f'"{spelt}"'.encode(), 1)


def _avro_wide_length(value: bytes) -> bytes:
    """The Avro record with its type's length spelt in two bytes (decoding accepts that)."""
    size = value[10] >> 1
    return value[:10] + bytes([(size << 1) | 0x80, 0]) + value[11:]


def _json_mutations(event: TaskEvent, value: bytes) -> list[bytes]:
    text = value.decode()
    return [
        _escaped(value, event.type),
        text.encode("utf-16"),
        text.encode("utf-32-le"),
        b"\xef\xbb\xbf" + value,
        # duplicate keys: the last "type" wins, so either may be the one decoded
        value.replace(b"{", b'{"type":"com.example.decoy",', 1),
        value.replace(b"{", f'{{"type":{json.dumps(OWN.status)},'.encode(), 1),
    ]


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes | None, Headers]:
    event = draw(events())
    fmt = draw(st.sampled_from(["avro", "json"]))
    value, _ = encode_event(event, fmt=fmt)
    mutations = _json_mutations(event, value) if fmt == "json" else [_avro_wide_length(value)]
    value = draw(st.sampled_from([value, *mutations]))
    cut = draw(st.integers(0, len(value)))
    value = draw(st.sampled_from([value, value[:cut], value[:cut] + b"\x00" + value[cut:]]))
    content_type = draw(
        st.sampled_from(
            [
                None,
                AVRO_CONTENT_TYPE,
                JSON_CONTENT_TYPE,
                "text/json",
                "Application/JSON; charset=utf-8",
                "text/plain",
            ]
        )
    )
    headers = None if content_type is None else [(CONTENT_TYPE_HEADER, content_type.encode())]
    tombstone = draw(st.integers(0, 19)) == 0
    return None if tombstone else value, headers


def consumer_record(
    value: bytes | None, headers: Headers, offset: int = 7, tupled: bool = True
) -> ConsumerRecord[bytes, bytes]:
    """As aiokafka hands records out (headers as a tuple), or as a test may (a list)."""
    hs: Any = tuple(headers or ()) if tupled else headers
    size = -1 if value is None else len(value)
    return ConsumerRecord("events", 0, offset, 1234, 0, b"task", value, None, 4, size, hs)


def assert_tail_agrees_with_eager(rec: ConsumerRecord[bytes, bytes], max_bytes: int) -> None:
    decoder = RecordDecoder(PREFIX, max_bytes, REVERSE_DNS_ONLY)
    eager = event_from_record(rec, prefix=PREFIX, max_bytes=max_bytes, types=REVERSE_DNS_ONLY)
    facts, decoded = decoder.facts(rec)
    assert facts == task_facts_of(eager, PREFIX)
    if decoded is not None:
        assert decoded == eager
    indexed = IndexedEvent("task", 0, rec.offset, 3, decoded or LazyEvent(rec, decoder))
    for event_type in (OWN.created, OWN.status, OWN.progress, eager.type):
        assert indexed.has_type(event_type) == (eager.type == event_type), event_type
    lazy = indexed.event
    assert (lazy.type, lazy.payload, lazy.meta, lazy.timestamp_ms) == (
        eager.type,
        eager.payload,
        eager.meta,
        eager.timestamp_ms,
    )


# --- the properties ------------------------------------------------------------------------------


ESCAPED_STATUS = _escaped(
    encode_event(TaskEvent(OWN.status, {"status": "completed"}), fmt="json")[0], OWN.status
)
UTF16_STATUS = encode_event(TaskEvent(OWN.status, {"status": "failed"}), fmt="json")[0].decode()
WIDE_CREATED = _avro_wide_length(encode_event(TaskEvent(OWN.created, {"x": 1}))[0])


@given(records(), st.sampled_from([64, 1_048_576]), st.booleans())
@example((ESCAPED_STATUS, None), 1_048_576, True)
@example((WIDE_CREATED, None), 1_048_576, True)
@example((UTF16_STATUS.encode("utf-16"), None), 1_048_576, False)
@settings(suppress_health_check=[HealthCheck.too_slow])  # generation is slow on a busy machine
def test_the_tail_takes_the_same_facts_types_and_events_as_an_eager_decode(
    written, max_bytes, tupled
):
    value, headers = written
    assert_tail_agrees_with_eager(consumer_record(value, headers, tupled=tupled), max_bytes)


@given(st.binary(max_size=120), st.sampled_from([None, AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE]))
def test_arbitrary_bytes_behind_an_own_type_agree_with_an_eager_decode(tail, content_type):
    headers = None if content_type is None else [(CONTENT_TYPE_HEADER, content_type.encode())]
    own_avro = encode_event(TaskEvent(OWN.status, {}))[0][:11] + OWN.status.encode()
    own_json = b'{"type":' + json.dumps(OWN.status).encode()
    for value in (tail, own_avro + tail, own_json + tail):
        assert_tail_agrees_with_eager(consumer_record(value, headers), 1_048_576)


def _fields(event: TaskEvent) -> tuple[Any, ...]:
    return (
        event.type,
        event.payload,
        event.meta,
        event.timestamp_ms,
        event.payload_json,
        event.meta_json,
        event.trace,
    )


@given(st.lists(records(), max_size=12), st.sampled_from([64, 1_048_576]))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_a_replay_s_batch_decode_gives_each_record_s_eager_event(written, max_bytes):
    # RecordDecoder.events is the readers' one call per fetch: placeholders, unprefixed types
    # (a type seen first unprefixed, then again) and the wire texts must be the eager ones.
    recs = [consumer_record(value, headers, offset=i) for i, (value, headers) in enumerate(written)]
    recs += recs  # the second time round, the type rule's answers are remembered
    decoder = RecordDecoder(PREFIX, max_bytes, REVERSE_DNS_ONLY)
    eager = [
        event_from_record(r, prefix=PREFIX, max_bytes=max_bytes, types=REVERSE_DNS_ONLY)
        for r in recs
    ]
    assert [_fields(e) for e in decoder.events(recs)] == [_fields(e) for e in eager]


def test_placeholders_are_served_lazily_exactly_as_eagerly():
    undecodable = b"\xc3\x01 not avro at all"
    oversized = avro_record("com.example.big", '{"v":"' + "x" * 100 + '"}', None)
    unprefixed = record("json", "tool.started", '{"v":1}', None)
    for value in (undecodable, oversized, unprefixed, None):
        assert_tail_agrees_with_eager(consumer_record(value, None), max_bytes=100)


def test_other_types_are_not_decoded_until_their_event_is_read():
    decoder = RecordDecoder(PREFIX, 1_048_576)
    value, headers = encode_event(TaskEvent("com.example.step", {"i": 1}))
    rec = consumer_record(value, headers)
    assert decoder.facts(rec) == ((False, None, None), None)
    lazy = LazyEvent(rec, decoder)
    indexed = IndexedEvent("task", 0, 7, 0, lazy)
    assert not indexed.has_type(OWN.created) and not indexed.has_type(OWN.status)
    assert not lazy.decoded
    assert indexed.has_type("com.example.step") and lazy.decoded


def test_the_bridge_s_own_created_and_status_records_are_decoded_for_the_index():
    decoder = RecordDecoder(PREFIX, 1_048_576)
    created = {"tool": "t", "owner": OWNER, "createdMs": 1, "ttlMs": None, "pollIntervalMs": 5}
    for event in (TaskEvent(OWN.created, created), TaskEvent(OWN.status, {"status": "failed"})):
        for fmt in ("avro", "json"):
            facts, decoded = decoder.facts(consumer_record(*encode_event(event, fmt=fmt)))
            assert decoded == event and facts == task_facts_of(event, PREFIX)
    long_prefix = "com.example." + "x" * 60  # a type of more than 63 bytes: a two-byte length
    value, headers = encode_event(TaskEvent(f"{long_prefix}.task.status", {"status": "failed"}))
    facts, decoded = RecordDecoder(long_prefix, 1_048_576).facts(consumer_record(value, headers))
    assert decoded is not None and facts[1] is not None


def test_unhashable_headers_are_read_like_any_others():
    value = as_bytes('{"type":"com.example.a","payload":{}}')
    headers: Any = ((CONTENT_TYPE_HEADER, bytearray(b"text/plain")),)
    rec = ConsumerRecord("events", 0, 7, 1, 0, b"t", value, None, 1, len(value), headers)
    assert RecordDecoder(PREFIX, 1_048_576).event(rec).type == OWN.undecodable


# --- on the broker: listeners and readers see what an eager recount sees -----------------------


async def _produce(
    config: Settings, key: bytes, values: list[tuple[bytes | None, Headers]]
) -> None:
    producer = idempotent_producer(config, role="lazy-test")
    await producer.start()
    try:
        for value, headers in values:
            await producer.send_and_wait(config.topics.events, value, key=key, headers=headers)
    finally:
        await producer.stop()


def _mixed_log() -> list[tuple[bytes | None, Headers]]:
    created = {"tool": "t", "owner": OWNER, "createdMs": 1, "ttlMs": None, "pollIntervalMs": 5}
    escaped_failed = _escaped(
        encode_event(TaskEvent(OWN.status, {"status": "failed"}), fmt="json")[0], OWN.status
    )
    return [
        encode_event(TaskEvent(OWN.created, created)),
        encode_event(TaskEvent("com.example.step", {"i": 1})),
        (b"\xc3\x01 not avro at all", [(CONTENT_TYPE_HEADER, AVRO_CONTENT_TYPE.encode())]),
        (avro_record("com.example.big", '{"v":"' + "x" * 2000 + '"}', None), []),
        (record("json", "tool.started", '{"v":1}', None), []),
        encode_event(TaskEvent(OWN.status, {"status": "input_required"}), fmt="json"),
        (None, []),
        (escaped_failed, []),
        encode_event(TaskEvent(OWN.status, {"status": "working"})),
    ]


@pytest.mark.kafka
async def test_listeners_readers_and_the_index_agree_with_an_eager_recount(topics):
    config = changed(topics, tasks={"max_event_bytes": 1024})
    log = _mixed_log()
    await _produce(config, b"task-lazy", log)
    seen: list[IndexedEvent] = []
    indexer = Indexer(config)
    indexer.add_listener(seen.append)  # before it starts: it sees every record
    async with indexer, Reader(config, indexer) as reader:
        async with asyncio.timeout(BOUND):
            await indexer.catch_up()
            read = [(e.seq, e.event) async for e in reader.read("task-lazy")]
        entry = indexer.lookup("task-lazy")
    assert entry is not None
    recount = PartitionIndex(entry[0], config.tasks.checkpoint_interval)
    assert [i.seq for i in seen] == [seq for seq, _ in read] == list(range(len(log)))
    for (value, headers), indexed, (_, read_event) in zip(log, seen, read, strict=True):
        rec = consumer_record(value, headers, offset=indexed.offset)
        expected = event_from_record(rec, prefix=PREFIX, max_bytes=1024, types=config.type_rule)
        created, status, identity = task_facts_of(expected, PREFIX)
        recount.apply(
            "task-lazy", indexed.offset, created=created, status=status, identity=identity
        )
        for event in (indexed.event, read_event):  # timestamps are the broker's: not compared
            assert (event.type, event.payload, event.meta) == (
                expected.type,
                expected.payload,
                expected.meta,
            )
    assert entry[1] == recount.get("task-lazy")  # the escaped "failed" status folded too
    assert entry[1].status == TaskStatus.FAILED
    kinds = [i.event.type.rpartition(".event.")[2] for i in seen]
    assert kinds.count("undecodable") == 2 and "oversized" in kinds and "unprefixed" in kinds

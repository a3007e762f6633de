"""Event sources read by offset, in-process: the cursors, the settings of configured sources, and
poll and push of ``task.updated`` and of a configured source over a fake of the Kafka reader
(partitions of records in memory) and of the live tail (a feed the test offers chunks to)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from bridge.config import EventSourceSpec, Settings
from bridge.events_extension.configured import ConfiguredSource, NotPermitted, input_schema
from bridge.events_extension.cursor import (
    BadCursor,
    decode_offsets,
    decode_partition,
    encode_offsets,
    encode_partition,
    encode_task,
    topic_tag,
)
from bridge.events_extension.kafkalog import Chunk, TopicFeed
from bridge.events_extension.occurrences import Active, Heartbeat, Occurrence, StreamItem
from bridge.events_extension.offsets import OffsetSource
from bridge.events_extension.taskupdates import TaskUpdates, owner_record_key
from bridge.kafka.port import OffsetOutOfRange
from bridge.server.admission import Caller
from bridge.server.events import EVENT_ID_META, EventsMethods, FittedBodies
from bridge.server.handlers import Call
from bridge.server.wire import JsonRpcRequest, RpcError
from bridge.tasks.service import TaskNotFound

NOW_MS = 10_000_000
UPDATES = "io.mcpbridge.task.updated"
ORDERS = "com.example.orders.shipped"


# --- fakes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    """What the sources read of a Kafka record."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = NOW_MS
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class FakeTopic:
    """A topic's partitions in memory; offsets below ``begins`` were deleted by retention."""

    records: dict[int, list[Rec]]
    begins: dict[int, int] = field(default_factory=dict)
    per_fetch: int = 2
    fetches: int = 0

    def add(self, partition: int, **kw: Any) -> Rec:
        rec = Rec(partition, self.end(partition), **kw)
        self.records[partition].append(rec)
        return rec

    def end(self, partition: int) -> int:
        return len(self.records[partition])

    async def partitions(self, topic: str) -> list[int]:
        return sorted(self.records)

    async def bounds(
        self, topic: str, partitions: Sequence[int]
    ) -> tuple[dict[int, int], dict[int, int]]:
        return (
            {p: self.begins.get(p, 0) for p in partitions},
            {p: self.end(p) for p in partitions},
        )

    async def offsets_at(
        self, topic: str, partitions: Sequence[int], timestamp_ms: int
    ) -> dict[int, int | None]:
        return {
            p: next((r.offset for r in self.records[p] if r.timestamp >= timestamp_ms), None)
            for p in partitions
        }

    async def fetch(self, topic: str, partition: int, offset: int) -> Chunk:
        self.fetches += 1
        if offset < self.begins.get(partition, 0):
            raise OffsetOutOfRange(())
        records = self.records[partition][offset : offset + self.per_fetch]
        return Chunk(partition, offset, offset + len(records), records)

    async def close(self) -> None:
        pass


class WatchedFeed(TopicFeed):
    """A feed that says when its stream waits on it (the stream is then in its live phase)."""

    def __init__(self, topic: str, limit: int) -> None:
        super().__init__(topic, limit)
        self.waiting = asyncio.Event()

    async def wait(self, idle_s: float | None = None) -> bool:
        self.waiting.set()
        return await super().wait(idle_s)


class FakeLive:
    """The live tail: the test offers chunks to the feed of the (one) subscriber."""

    def __init__(self) -> None:
        self._feed: WatchedFeed | None = None

    @property
    def feed(self) -> WatchedFeed:
        assert self._feed is not None, "no stream subscribed"
        return self._feed

    async def live(self) -> WatchedFeed:
        """The feed, once its stream waits on it for live chunks."""
        await self.feed.waiting.wait()
        return self.feed

    @contextlib.asynccontextmanager
    async def subscribe(self, topic: str, limit: int) -> AsyncIterator[TopicFeed]:
        self._feed = WatchedFeed(topic, limit)
        yield self._feed

    async def close(self) -> None:
        pass


@dataclass
class View:
    status: str = "working"


class FakeTasks:
    """alice owns "t1" (working) and "t9" (completed); nobody else has a task."""

    async def get(self, task_id: str, principal: str) -> View:
        if principal != "alice" or task_id not in ("t1", "t9"):
            raise TaskNotFound()
        return View("completed" if task_id == "t9" else "working")


def update_value(task: str, seq: int, status: str, **extra: Any) -> bytes:
    body = {"v": 1, "taskId": task, "seq": seq, "status": status, "partition": 0, "offset": seq}
    return json.dumps({**body, "ts": NOW_MS - 5, **extra}).encode()


def add_update(
    topic: FakeTopic, principal: str, task: str, seq: int, status: str, **kw: Any
) -> Rec:
    key = owner_record_key(principal)
    return topic.add(0, key=key, value=update_value(task, seq, status, **kw))


def updates_source(topic: FakeTopic, live: FakeLive | None = None) -> TaskUpdates:
    return TaskUpdates(
        UPDATES,
        "p.task-updates",
        topic,
        live or FakeLive(),
        tasks=FakeTasks(),
        next_poll_ms=1000,
        queue_size=8,
        heartbeat_s=0.2,
        now_ms=lambda: NOW_MS,
    )


def spec(**kw: Any) -> EventSourceSpec:
    base: dict[str, Any] = {"name": ORDERS, "topic": "orders", "principals": ["alice"]}
    return EventSourceSpec.model_validate({**base, **kw})


def orders_source(topic: FakeTopic, live: FakeLive | None = None, **kw: Any) -> ConfiguredSource:
    return ConfiguredSource(
        spec(**kw),
        topic,
        live or FakeLive(),
        max_value_bytes=1024,
        queue_size=8,
        heartbeat_s=0.2,
        now_ms=lambda: NOW_MS,
    )


def call(method: str, params: dict[str, Any], principal: str = "alice") -> Call:
    rpc = JsonRpcRequest(jsonrpc="2.0", id=7, method=method, params=params)
    return Call(rpc, Caller(principal, "conn"), legacy=False, params=params)


async def poll(source: Any, principal: str = "alice", **params: Any) -> dict[str, Any]:
    body = {"name": source.name, "arguments": {}, **params}
    out = await EventsMethods([source], streams=None).poll(call("events/poll", body, principal))
    return dict(out)  # type: ignore[arg-type]


# --- cursors -----------------------------------------------------------------------------------


def test_offset_cursors_round_trip_and_are_bound_to_their_topic() -> None:
    assert decode_partition(encode_partition(3, 42)) == (3, 42)
    vector = {0: 5, 1: 0, 2: 2**63 - 1}
    assert decode_offsets(encode_offsets(topic_tag("a"), vector), topic_tag("a")) == vector
    with pytest.raises(BadCursor):
        decode_offsets(encode_offsets(topic_tag("a"), vector), topic_tag("b"))


@pytest.mark.parametrize(
    "bad",
    [
        "",
        encode_task(3),
        encode_partition(1, 2)[:-2],
        "dTEuMS4wMQ",  # "u1.1.01": a spelling this server never writes
        "dTEuLTEuMA",  # "u1.-1.0"
        "dTEuMS4yLjM",  # "u1.1.2.3"
        "A" * 20_000,
    ],
)
def test_a_task_update_cursor_this_server_did_not_mint_is_refused(bad: str) -> None:
    with pytest.raises(BadCursor):
        decode_partition(bad)


# --- settings ----------------------------------------------------------------------------------


def test_a_configured_source_takes_one_key_rule_and_a_real_json_schema() -> None:
    with pytest.raises(ValidationError, match="key or key_argument"):
        spec(key="a", key_argument="customerId")
    with pytest.raises(ValidationError, match="not a JSON Schema"):
        spec(payload_schema={"type": 12})
    with pytest.raises(ValidationError, match="not an argument name"):
        spec(header_arguments={"has space": "h"})
    assert (
        spec().principals == ["alice"] and EventSourceSpec(name="a.b", topic="t").principals == []
    )


def test_a_configured_source_may_not_shadow_a_name_or_read_the_bridges_own_topics() -> None:
    own = {"name": "io.mcpbridge.task.updated", "topic": "orders"}
    twice = [{"name": ORDERS, "topic": "a"}, {"name": ORDERS, "topic": "b"}]
    ours = {"name": ORDERS, "topic": "mcpbridge.task-events"}
    for sources, words in ((own, "already taken"), (ours, "own topics")):
        with pytest.raises(ValidationError, match=words):
            Settings(events={"sources": [sources]})
    with pytest.raises(ValidationError, match="already taken"):
        Settings(events={"sources": twice})


def test_the_input_schema_has_the_key_argument_required_and_the_header_arguments() -> None:
    schema = input_schema(spec(key_argument="customerId", header_arguments={"region": "x-region"}))
    assert schema["required"] == ["customerId"] and set(schema["properties"]) == {
        "customerId",
        "region",
    }
    assert schema["additionalProperties"] is False


# --- task.updated: poll ------------------------------------------------------------------------


async def test_task_updated_polls_only_the_callers_updates_with_their_outcome_request() -> None:
    topic = FakeTopic({0: []})
    source = updates_source(topic)
    start = await poll(source, cursor=None)
    assert start["events"] == [] and start["hasMore"] is False and start["nextPollMs"] == 1000
    add_update(topic, "alice", "t1", 0, "working")
    add_update(topic, "bob", "tb", 0, "working")
    add_update(topic, "alice", "t1", 3, "completed", statusMessage="done")
    add_update(topic, "alice", "t2", 1, "failed")
    out = await poll(source, cursor=start["cursor"])
    assert [e["eventId"] for e in out["events"]] == ["t1.0.updated", "t1.3.updated", "t2.1.updated"]
    done = out["events"][1]["data"]
    assert done == {
        "taskId": "t1",
        "seq": 3,
        "status": "completed",
        "statusMessage": "done",
        "resultRequest": {"method": "tasks/get", "params": {"taskId": "t1"}},
    }
    assert "resultRequest" not in out["events"][0]["data"]
    assert out["events"][2]["data"]["resultRequest"]["method"] == "tasks/get"
    assert decode_partition(out["cursor"]) == (0, 4) and out["truncated"] is False
    bob = await poll(source, "bob", cursor=start["cursor"])
    assert [e["eventId"] for e in bob["events"]] == ["tb.0.updated"]


async def test_task_updated_narrowed_to_a_task_is_authorized_like_tasks_get() -> None:
    topic = FakeTopic({0: []})
    add_update(topic, "alice", "t1", 0, "working")
    add_update(topic, "alice", "t2", 0, "working")
    source = updates_source(topic)
    first = encode_partition(0, 0)
    out = await poll(source, arguments={"taskId": "t1"}, cursor=first)
    assert [e["eventId"] for e in out["events"]] == ["t1.0.updated"]
    for who, task in (("bob", "t1"), ("alice", "nope")):
        with pytest.raises(RpcError) as refused:
            await poll(source, who, arguments={"taskId": task}, cursor=None)
        assert refused.value.code == -32023 and refused.value.data == {"kind": "task"}
    with pytest.raises(RpcError) as bad:
        await poll(source, arguments={"taskId": "t1", "more": 1}, cursor=None)
    assert bad.value.code == -32602


async def test_unreadable_update_records_are_skipped_and_counted_never_fatal() -> None:
    topic = FakeTopic({0: []})
    key = owner_record_key("alice")
    for value in (b"\xff\xfe", b"[]", b'{"v": 2}', None, update_value("t1", 1, "paused")):
        topic.add(0, key=key, value=value)
    add_update(topic, "alice", "t1", 2, "working")
    source = updates_source(topic)
    out = await poll(source, cursor=encode_partition(0, 0))
    assert [e["eventId"] for e in out["events"]] == ["t1.2.updated"]
    assert source.skips.counts == {"unreadable": 4, "unknown_status": 1}


async def test_max_events_stops_mid_fetch_and_the_next_poll_resumes_after_the_last_given() -> None:
    topic = FakeTopic({0: []}, per_fetch=10)
    for seq in range(5):
        add_update(topic, "alice", "t1", seq, "working")
    source = updates_source(topic)
    first = await poll(source, cursor=encode_partition(0, 0), maxEvents=2)
    assert [e["data"]["seq"] for e in first["events"]] == [0, 1] and first["hasMore"] is True
    rest = await poll(source, cursor=first["cursor"])
    assert [e["data"]["seq"] for e in rest["events"]] == [2, 3, 4] and rest["hasMore"] is False


async def test_a_cursor_older_than_retention_or_past_the_end_restarts_with_truncated() -> None:
    topic = FakeTopic({0: []}, begins={0: 2})
    for seq in range(4):
        add_update(topic, "alice", "t1", seq, "working")
    source = updates_source(topic)
    old = await poll(source, cursor=encode_partition(0, 0))
    assert [e["data"]["seq"] for e in old["events"]] == [2, 3] and old["truncated"] is True
    ahead = await poll(source, cursor=encode_partition(0, 99))
    assert ahead["events"] == [] and ahead["truncated"] is True
    assert decode_partition(ahead["cursor"]) == (0, 4)
    current = await poll(source, cursor=old["cursor"])
    assert current["truncated"] is False


async def test_max_age_seeks_by_time_and_says_it_skipped() -> None:
    topic = FakeTopic({0: []})
    for seq in range(4):
        rec = add_update(topic, "alice", "t1", seq, "working")
        object.__setattr__(rec, "timestamp", NOW_MS - (60_000 if seq < 2 else 1_000))
    source = updates_source(topic)
    out = await poll(source, cursor=encode_partition(0, 0), maxAgeMs=10_000)
    assert [e["data"]["seq"] for e in out["events"]] == [2, 3] and out["truncated"] is True
    none_young = await poll(source, cursor=encode_partition(0, 0), maxAgeMs=10)
    assert none_young["events"] == [] and none_young["truncated"] is True


async def test_a_cursor_of_another_partition_is_refused() -> None:
    topic = FakeTopic({0: [], 1: []})
    source = updates_source(topic)
    mine = decode_partition((await poll(source, cursor=None))["cursor"])[0]
    with pytest.raises(RpcError) as bad:
        await poll(source, cursor=encode_partition(1 - mine, 0))
    assert bad.value.code == -32602


async def test_a_poll_over_many_foreign_records_stops_at_its_scan_budget_with_has_more() -> None:
    topic = FakeTopic({0: []}, per_fetch=4)
    for seq in range(10):
        add_update(topic, "bob", "tb", seq, "working")
    source = updates_source(topic)
    source.scan_limit = 6
    out = await poll(source, cursor=encode_partition(0, 0))
    assert out["events"] == [] and out["hasMore"] is True
    assert decode_partition(out["cursor"]) == (0, 6)


# --- configured sources ------------------------------------------------------------------------


def order(topic: FakeTopic, partition: int, value: Any, **kw: Any) -> Rec:
    raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
    return topic.add(partition, value=raw, **{"key": b"c1", **kw})


async def test_a_configured_source_reads_every_partition_and_skips_bad_values_counted() -> None:
    topic = FakeTopic({0: [], 1: []})
    source = orders_source(topic, payload_schema={"type": "object", "required": ["order"]})
    start = await poll(source, cursor=None)
    order(topic, 0, {"order": 1})
    for bad in (b"\xff", b"NaN", b"[1]", {"other": 1}, None, b'{"order": "' + b"x" * 2000 + b'"}'):
        order(topic, 1, bad)
    order(topic, 1, {"order": 2})
    out = await poll(source, cursor=start["cursor"])
    assert [e["data"] for e in out["events"]] == [{"order": 1}, {"order": 2}]
    assert [e["eventId"] for e in out["events"]] == [f"{ORDERS}/0-0", f"{ORDERS}/1-6"]
    assert source.skips.counts == {
        "not_json": 2,
        "not_object": 1,
        "schema": 1,
        "no_value": 1,
        "too_large": 1,
    }
    assert decode_offsets(out["cursor"], topic_tag("orders")) == {0: 1, 1: 7}
    assert out["nextPollMs"] == 5000


async def test_key_and_header_filters_select_records_before_their_value_is_read() -> None:
    topic = FakeTopic({0: []})
    source = orders_source(
        topic,
        key_argument="customerId",
        headers={"type": "shipped"},
        header_arguments={"r": "region"},
    )
    shipped = (("type", b"shipped"), ("region", b"eu"))
    order(topic, 0, {"n": 1}, key=b"c1", headers=shipped)
    order(topic, 0, b"not json", key=b"c2", headers=shipped)  # another key: never decoded
    order(topic, 0, {"n": 3}, key=b"c1", headers=(("type", b"created"),))
    order(topic, 0, {"n": 4}, key=b"c1", headers=(("type", b"shipped"), ("region", b"us")))
    first = encode_offsets(topic_tag("orders"), {0: 0})
    out = await poll(source, arguments={"customerId": "c1"}, cursor=first)
    assert [e["data"]["n"] for e in out["events"]] == [1, 4]
    eu = await poll(source, arguments={"customerId": "c1", "r": "eu"}, cursor=first)
    assert [e["data"]["n"] for e in eu["events"]] == [1]
    assert source.skips.counts == {}
    with pytest.raises(RpcError) as missing:
        await poll(source, arguments={}, cursor=None)
    assert missing.value.code == -32602


async def test_only_the_listed_principals_may_read_a_configured_source() -> None:
    topic = FakeTopic({0: []})
    with pytest.raises(RpcError) as refused:
        await poll(orders_source(topic), "bob", cursor=None)
    assert refused.value.code == -32024 and refused.value.message == "Forbidden"
    with pytest.raises(NotPermitted):
        await orders_source(topic, principals=[]).select("alice", {})
    assert (await poll(orders_source(topic, principals=["*"]), "bob", cursor=None))["events"] == []


async def test_a_partition_the_cursor_does_not_name_is_read_from_its_start() -> None:
    topic = FakeTopic({0: [], 1: []})
    order(topic, 0, {"n": 0})
    order(topic, 1, {"n": 1})
    source = orders_source(topic)
    out = await poll(source, cursor=encode_offsets(topic_tag("orders"), {0: 1}))
    assert [e["data"]["n"] for e in out["events"]] == [1] and out["truncated"] is False


async def test_the_list_has_each_source_with_its_schemas() -> None:
    topic = FakeTopic({0: []})
    methods = EventsMethods(
        [updates_source(topic), orders_source(topic, description="Shipped")], streams=None
    )
    listed = await methods.list(call("events/list", {}))
    updates, orders = listed["events"]  # type: ignore[index]
    assert updates["name"] == UPDATES and updates["delivery"] == ["poll", "push"]
    assert updates["inputSchema"]["properties"]["taskId"]["type"] == "string"
    assert orders == {
        "name": ORDERS,
        "description": "Shipped",
        "delivery": ["poll", "push"],
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "payloadSchema": {"type": "object"},
    }


# --- one occurrence by its eventId (an oversized webhook body's resultRequest) ---------------


def _order(topic: FakeTopic, partition: int, order: str, key: bytes = b"c1") -> Rec:
    return topic.add(partition, key=key, value=json.dumps({"orderId": order}).encode())


async def test_an_oversized_record_s_request_reads_that_record_across_two_partitions() -> None:
    # One record per fetch: the delivery order is A (p0), B (p1), A2 (p0). A poll of one event
    # from the cursor before B reads the lowest partition first, so it would return A2.
    topic = FakeTopic({0: [], 1: []}, per_fetch=1)
    source = orders_source(topic)
    start = (await source.poll("alice", {}, None, None, 100)).cursor
    _order(topic, 0, "A"), _order(topic, 0, "A2"), _order(topic, 1, "B")
    batch = await source.poll("alice", {}, start, None, 100)
    assert [e.data["orderId"] for e in batch.events] == ["A", "B", "A2"]
    b = batch.events[1]
    sub: Any = SimpleNamespace(name=ORDERS, arguments={}, principal="alice")
    stub = await FittedBodies(1, "io.mcpbridge.task.updated", None)(sub, b, batch.events[0].cursor)
    request = stub["data"]["resultRequest"]
    assert request["method"] == "events/poll"
    read = await EventsMethods([source], streams=None).poll(call("events/poll", request["params"]))
    assert [(e["eventId"], e["data"]) for e in read["events"]] == [(b.event_id, {"orderId": "B"})]
    assert read["cursor"] == request["params"]["cursor"] and read["hasMore"] is False


async def test_a_read_by_event_id_applies_the_source_s_authorization_and_filters() -> None:
    topic = FakeTopic({0: [], 1: []})
    source = orders_source(topic, key_argument="customerId")
    theirs = _order(topic, 1, "X", key=b"c2")
    mine = _order(topic, 0, "M", key=b"c1")

    async def read(event_id: Any, principal: str = "alice", customer: str = "c1") -> Any:
        params = {"customerId": customer}
        return await poll(
            source, principal, arguments=params, cursor=None, _meta={EVENT_ID_META: event_id}
        )

    assert [e["data"] for e in (await read(f"{ORDERS}/0-{mine.offset}"))["events"]] == [
        {"orderId": "M"}
    ]
    assert (await read(f"{ORDERS}/1-{theirs.offset}"))["events"] == []  # another key: filtered
    for missing in (
        f"{ORDERS}/0-99",
        f"{ORDERS}/7-0",
        "other/0-0",
        f"{ORDERS}/0-x",
        f"{ORDERS}/-0",
    ):
        assert (await read(missing))["events"] == []
    with pytest.raises(RpcError) as refused:
        await read(f"{ORDERS}/0-{mine.offset}", principal="bob")
    assert refused.value.code == -32024  # Forbidden, as any poll of bob's
    with pytest.raises(RpcError) as bad:
        await read(7)
    assert bad.value.code == -32602


async def test_a_read_by_event_id_of_a_one_log_source_is_the_next_occurrence_or_nothing() -> None:
    topic = FakeTopic({0: []})
    source = updates_source(topic)
    start = (await source.poll("alice", {"taskId": "t1"}, None, None, 10)).cursor
    add_update(topic, "alice", "t1", 1, "working")
    add_update(topic, "alice", "t1", 2, "completed")
    batch = await source.poll("alice", {"taskId": "t1"}, start, None, 10)
    first, second = batch.events

    async def read(cursor: str | None, event_id: str) -> list[str]:
        out = await poll(
            source, arguments={"taskId": "t1"}, cursor=cursor, _meta={EVENT_ID_META: event_id}
        )
        return [e["eventId"] for e in out["events"]]

    assert await read(first.cursor, second.event_id) == [second.event_id]
    assert await read(start, second.event_id) == []  # not the next one: nothing, never another


# --- push --------------------------------------------------------------------------------------


async def items(
    source: OffsetSource, arguments: dict[str, Any], cursor: str | None
) -> AsyncIterator[StreamItem]:
    return await source.open_stream("alice", arguments, cursor, None)


def live_chunk(topic: FakeTopic, partition: int, start: int) -> Chunk:
    records = topic.records[partition][start:]
    return Chunk(partition, start, topic.end(partition), records)


async def test_push_replays_then_takes_live_chunks_and_heartbeats_with_the_position() -> None:
    topic = FakeTopic({0: []})
    live = FakeLive()
    add_update(topic, "alice", "t1", 0, "working")
    stream = await items(updates_source(topic, live), {}, encode_partition(0, 0))
    async with asyncio.timeout(10), contextlib.aclosing(stream):  # type: ignore[type-var]
        active = await anext(stream)
        assert isinstance(active, Active) and active.truncated is False
        replayed = await anext(stream)
        assert isinstance(replayed, Occurrence) and replayed.event_id == "t1.0.updated"
        assert replayed.cursor == encode_partition(0, 1)
        add_update(topic, "bob", "tb", 0, "working")
        live.feed.offer(live_chunk(topic, 0, 1))  # bob's: moves the position, sends nothing
        beat = await anext(stream)
        assert isinstance(beat, Heartbeat) and beat.cursor == encode_partition(0, 2)
        add_update(topic, "alice", "t1", 1, "input_required")
        live.feed.offer(live_chunk(topic, 0, 2))
        got = await anext(stream)
        assert isinstance(got, Occurrence) and got.event_id == "t1.1.updated"


async def test_push_reads_kafka_again_after_a_hole_in_the_live_chunks() -> None:
    topic = FakeTopic({0: []})
    live = FakeLive()
    stream = await items(updates_source(topic, live), {}, None)
    async with asyncio.timeout(10), contextlib.aclosing(stream):  # type: ignore[type-var]
        await anext(stream)
        first = asyncio.ensure_future(anext(stream))
        feed = await live.live()
        add_update(topic, "alice", "t1", 0, "working")
        add_update(topic, "alice", "t1", 1, "working")
        feed.offer(live_chunk(topic, 0, 1))  # starts after the position: a hole
        ids = [(await first).event_id, (await anext(stream)).event_id]  # type: ignore[union-attr]
    assert ids == ["t1.0.updated", "t1.1.updated"]


async def test_push_of_one_task_ends_after_its_terminal_status() -> None:
    topic = FakeTopic({0: []})
    add_update(topic, "alice", "t1", 0, "working")
    add_update(topic, "alice", "t2", 0, "completed")
    add_update(topic, "alice", "t1", 4, "cancelled")
    add_update(topic, "alice", "t1", 5, "working")  # cannot follow: never sent
    stream = await items(updates_source(topic), {"taskId": "t1"}, encode_partition(0, 0))
    async with asyncio.timeout(10):
        got = [item async for item in stream]
    assert [type(i).__name__ for i in got] == ["Active", "Occurrence", "Occurrence"]
    assert [i.data["seq"] for i in got[1:]] == [0, 4]  # type: ignore[union-attr]


async def test_push_of_an_ended_task_from_now_ends_at_once_and_a_foreign_one_is_refused() -> None:
    source = updates_source(FakeTopic({0: []}))
    async with asyncio.timeout(10):
        got = [item async for item in await items(source, {"taskId": "t9"}, None)]
    assert len(got) == 1 and isinstance(got[0], Active)
    with pytest.raises(TaskNotFound):
        await source.open_stream("bob", {"taskId": "t1"}, None, None)
    with pytest.raises(BadCursor):
        await source.open_stream("alice", {}, encode_task(1), None)


async def test_push_of_a_configured_source_reads_kafka_again_after_the_feed_overflowed() -> None:
    topic = FakeTopic({0: [], 1: []})
    live = FakeLive()
    stream = await items(orders_source(topic, live), {}, None)
    async with asyncio.timeout(10), contextlib.aclosing(stream):  # type: ignore[type-var]
        await anext(stream)
        first = asyncio.ensure_future(anext(stream))
        feed = await live.live()
        for n in range(10):
            order(topic, n % 2, {"n": n})
        feed.offer(live_chunk(topic, 0, 0))
        feed.offer(live_chunk(topic, 1, 0))  # 10 records > the feed's 8: overflowed
        got = [(await first).data["n"]]  # type: ignore[union-attr]
        got += [(await anext(stream)).data["n"] for _ in range(9)]  # type: ignore[union-attr]
    assert sorted(got) == list(range(10))


async def test_push_of_one_task_ends_after_its_terminal_status_delivered_live() -> None:
    topic = FakeTopic({0: []})
    live = FakeLive()
    stream = await items(updates_source(topic, live), {"taskId": "t1"}, None)
    async with asyncio.timeout(10):
        await anext(stream)
        rest = asyncio.ensure_future(collect(stream))
        feed = await live.live()
        add_update(topic, "alice", "t1", 2, "failed")
        add_update(topic, "alice", "t1", 3, "working")
        feed.offer(live_chunk(topic, 0, 0))
        got = await rest
    assert [i.data["seq"] for i in got] == [2]  # type: ignore[union-attr]


async def collect(stream: AsyncIterator[StreamItem]) -> list[StreamItem]:
    return [item async for item in stream]


async def test_max_age_also_drops_an_old_record_written_after_young_ones_by_poll_and_push() -> None:
    topic = FakeTopic({0: []})
    for seq, age_ms in enumerate((1_000, 60_000, 60_000, 1_000)):
        rec = add_update(topic, "alice", "t1", seq, "working")
        object.__setattr__(rec, "timestamp", NOW_MS - age_ms)
    source = updates_source(topic)
    polled = await poll(source, cursor=encode_partition(0, 0), maxAgeMs=10_000)
    assert [e["data"]["seq"] for e in polled["events"]] == [0, 3] and polled["truncated"] is True
    stream = await source.open_stream("alice", {}, encode_partition(0, 0), 10_000)
    async with asyncio.timeout(10), contextlib.aclosing(stream):  # type: ignore[type-var]
        got = [await anext(stream) for _ in range(4)]
    assert [type(i).__name__ for i in got] == ["Active", "Occurrence", "Active", "Occurrence"]
    assert got[2].truncated is True and got[2].cursor == encode_partition(0, 2)  # type: ignore[union-attr]
    assert [i.data["seq"] for i in got if isinstance(i, Occurrence)] == [0, 3]

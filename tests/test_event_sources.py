"""Event sources read by offset, through the whole bridge over real HTTP: on the in-memory log
(tests/support/inmemory.py), and two end-to-end cases on real Kafka and a real `bridge serve`
(cursors that survive a restart; a configured source's push through the adapter's live tail).

``io.mcpbridge.task.updated`` over the task-updates topic (records produced here in the format of
:mod:`bridge.log.updates`, as the index writer will write them) and a configured source over a
pipeline's topic: poll with cursors that survive a restart, maxAgeMs and retention, only the
caller's updates, garbage records skipped, authorization, and push with live records,
heartbeats carrying the cursor and the end of a one-task stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from conformance.wire import loads
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge
from support.layout import fresh_prefix, make_settings
from support.mcp import call, create_task, request, result
from support.procs import Bridge, running_bearer_bridge
from support.sse import sse_events
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.events_extension.cursor import decode_partition
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.clients import partition_for_key
from bridge.kafka.port import Log, TopicPart
from bridge.log.publisher import TaskEventPublisher
from bridge.log.seqindex import owner_key
from bridge.log.updates import TaskUpdate
from bridge.tasks.messages import owner_digest

UPDATED = "io.mcpbridge.task.updated"
ORDERS = "com.example.orders.shipped"
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
HEARTBEAT_S = 0.5
SID = "io.modelcontextprotocol/subscriptionId"


def pipeline_topic(settings: Settings) -> str:
    return f"pipe-{settings.topics.prefix}.orders"


def orders_source(settings: Settings) -> dict[str, Any]:
    return {
        "name": ORDERS,
        "topic": pipeline_topic(settings),
        "description": "An order of the customer was shipped",
        "key_argument": "customerId",
        "headers": {"type": "shipped"},
        "payload_schema": {
            "type": "object",
            "properties": {"orderId": {"type": "string"}},
            "required": ["orderId"],
        },
        "principals": ["alice"],
        "poll_interval_ms": 1000,
    }


AnyBridge = Bridge | MemoryBridge


@pytest.fixture(scope="module")
def sbridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryBridge]:
    """The whole bridge in process over the in-memory log, with the pipeline's topic."""
    root: Path = tmp_path_factory.mktemp("sources")
    tokens_file = root / "tokens.json"
    tokens_file.write_text(json.dumps(TOKENS))
    prefix = fresh_prefix("s")
    settings = make_settings(NO_BROKER, prefix)
    settings = make_settings(
        NO_BROKER,
        prefix,
        auth={"mode": "bearer", "tokens_file": str(tokens_file)},
        streams={"keepalive_s": HEARTBEAT_S},
        events={"sources": [orders_source(settings)]},
    )
    with memory_bridge(settings) as running:

        async def create() -> None:
            running.memory.create_topic(pipeline_topic(settings), 3)

        running.call(create())
        yield running


@pytest.fixture(scope="module")
def kafka_sbridge(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bridge]:
    """`bridge serve` and `bridge workers` on the broker: the end-to-end path (restarts, the
    adapter's pool and live tail)."""
    root: Path = tmp_path_factory.mktemp("sources-kafka")
    settings = make_settings(kafka_bootstrap, fresh_prefix("s"))
    asyncio.run(create_pipeline_topic(settings))
    with running_bearer_bridge(
        settings,
        root,
        TOKENS,
        BRIDGE_STREAMS__KEEPALIVE_S=str(HEARTBEAT_S),
        BRIDGE_EVENTS__SOURCES=json.dumps([orders_source(settings)]),
    ) as running:
        yield running


async def create_pipeline_topic(settings: Settings) -> None:
    from aiokafka.admin import NewTopic

    from bridge.kafka.admin import kafka_admin

    async with kafka_admin(settings) as admin:
        await admin.create_topics([NewTopic(pipeline_topic(settings), 3, 1)])


@asynccontextmanager
async def log_of(bridge: AnyBridge) -> AsyncIterator[Log]:
    """The log the bridge reads: its memory log, or the broker through the adapter."""
    if isinstance(bridge, MemoryBridge):
        yield bridge.log
        return
    kafka = KafkaLog(bridge.settings)
    try:
        yield kafka
    finally:
        await kafka.close()


async def produce(
    bridge: AnyBridge,
    topic: str,
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int | None]],
) -> None:
    """Records ``(key, value, headers, timestamp_ms)`` on ``topic``, as a pipeline writes."""
    async with log_of(bridge) as log:
        producer = log.producer("pipeline")
        await producer.start()
        try:
            for key, value, headers, timestamp_ms in records:
                await producer.send(
                    topic, value, key=key, headers=headers, timestamp_ms=timestamp_ms
                )
        finally:
            await producer.close()


def client(token: str = "tok-alice") -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer {token}"})


async def poll(
    bridge: AnyBridge, name: str, params: dict[str, Any], token: str = "tok-alice"
) -> dict[str, Any]:
    async with client(token) as http:
        return await call(http, bridge.url, "events/poll", {"name": name, **params})


async def polled(
    bridge: AnyBridge, name: str, params: dict[str, Any], token: str = "tok-alice"
) -> dict[str, Any]:
    out = await poll(bridge, name, params, token)
    assert "result" in out, out
    return dict(out["result"])


async def drain(
    bridge: AnyBridge, name: str, params: dict[str, Any], want: int, token: str = "tok-alice"
) -> tuple[list[dict[str, Any]], str]:
    """Poll from ``params["cursor"]`` until ``want`` events came (a bounded wait); the events
    and the last cursor."""
    got: list[dict[str, Any]] = []
    cursor = params["cursor"]

    async def more() -> bool:
        nonlocal cursor
        page = await polled(bridge, name, {**params, "cursor": cursor}, token)
        got.extend(page["events"])
        cursor = page["cursor"]
        return len(got) >= want

    await wait_until(more, what=f"{want} events of {name}")  # type: ignore[arg-type]
    return got, cursor


def owner(principal: str) -> int:
    return owner_key(owner_digest(principal))


async def produce_updates(bridge: AnyBridge, *updates: tuple[str, str, int, str]) -> None:
    """Task-updates records ``(principal, taskId, seq, status)`` in the topic's own format."""
    records = []
    for principal, task, seq, status in updates:
        update = TaskUpdate(owner(principal), task, seq, status, 0, seq, 1_700_000_000_000)
        records.append((update.key(), update.value(), [], None))
    await produce(bridge, bridge.settings.topics.updates, records)


async def produce_orders(
    bridge: AnyBridge, *records: tuple[bytes | None, bytes | None, str]
) -> None:
    """Records ``(key, value, type header)`` on the pipeline topic, as any producer writes."""
    await produce(
        bridge,
        pipeline_topic(bridge.settings),
        [(key, value, [("type", kind.encode())], None) for key, value, kind in records],
    )


def shipped(order: str) -> bytes:
    return json.dumps({"orderId": order}).encode()


def server(bridge: Bridge) -> Any:
    assert bridge.server is not None
    return bridge.server


async def push(
    bridge: AnyBridge, name: str, params: dict[str, Any], token: str = "tok-alice"
) -> AsyncGenerator[dict[str, Any]]:
    headers, body = request("events/stream", {"name": name, **params})
    async with (
        client(token) as http,
        http.stream("POST", bridge.url, json=body, headers=headers) as reply,
    ):
        assert reply.status_code == 200
        async for event in sse_events(reply):
            yield loads(event.data)


# --- the tests ---------------------------------------------------------------------------------


async def test_the_list_offers_task_updated_and_the_configured_source(
    sbridge: MemoryBridge,
) -> None:
    async with client() as http:
        listed = await result(http, sbridge.url, "events/list")
    by_name = {entry["name"]: entry for entry in listed["events"]}
    assert list(by_name) == ["io.mcpbridge.task.event", UPDATED, ORDERS]
    # No key seals webhook secrets here, so no webhooks (the registry still needs a broker).
    assert by_name[UPDATED]["delivery"] == ["poll", "push"]
    orders = by_name[ORDERS]
    assert orders["inputSchema"]["required"] == ["customerId"]
    assert orders["payloadSchema"]["required"] == ["orderId"]


@pytest.mark.kafka
async def test_task_updated_polls_only_the_callers_updates_and_resumes_across_a_restart(
    kafka_sbridge: Bridge,
) -> None:
    start = await polled(kafka_sbridge, UPDATED, {"arguments": {}, "cursor": None})
    assert start["events"] == [] and start["hasMore"] is False and start["nextPollMs"] == 1000
    await produce_updates(
        kafka_sbridge,
        ("alice", "ta", 0, "working"),
        ("bob", "tb", 0, "working"),
        ("alice", "ta", 2, "input_required"),
        ("alice", "ta", 3, "completed"),
    )
    first, cursor = await drain(
        kafka_sbridge, UPDATED, {"arguments": {}, "cursor": start["cursor"]}, 3
    )
    assert [e["eventId"] for e in first] == ["ta.0.updated", "ta.2.updated", "ta.3.updated"]
    assert first[2]["data"]["resultRequest"] == {"method": "tasks/get", "params": {"taskId": "ta"}}
    bobs, _ = await drain(
        kafka_sbridge, UPDATED, {"arguments": {}, "cursor": start["cursor"]}, 1, "tok-bob"
    )
    assert [e["eventId"] for e in bobs] == ["tb.0.updated"]
    server(kafka_sbridge).stop()
    await produce_updates(
        kafka_sbridge, ("alice", "tc", 0, "working"), ("alice", "tc", 1, "failed")
    )
    kafka_sbridge.start_server()
    rest, _ = await drain(kafka_sbridge, UPDATED, {"arguments": {}, "cursor": cursor}, 2)
    assert [e["eventId"] for e in rest] == [
        "tc.0.updated",
        "tc.1.updated",
    ]  # nothing lost, nothing repeated


async def test_max_age_seeks_by_time_and_a_cursor_past_retention_is_truncated(
    sbridge: MemoryBridge,
) -> None:
    settings = sbridge.settings
    start = await polled(sbridge, UPDATED, {"arguments": {}, "cursor": None})
    key = TaskUpdate(owner("alice"), "x", 0, "working", 0, 0, 0).key()
    old_ms = 1_600_000_000_000  # 2020: far older than any maxAgeMs below
    old = []
    for seq in range(3):
        update = TaskUpdate(owner("alice"), "tm", seq, "working", 0, seq, old_ms)
        old.append((key, update.value(), [], old_ms))
    await produce(sbridge, settings.topics.updates, old)
    await produce_updates(sbridge, ("alice", "tm", 3, "working"))
    aged, _ = await drain(
        sbridge, UPDATED, {"arguments": {}, "cursor": start["cursor"], "maxAgeMs": 600_000}, 1
    )
    assert [e["eventId"] for e in aged] == ["tm.3.updated"]
    again = await polled(
        sbridge, UPDATED, {"arguments": {}, "cursor": start["cursor"], "maxAgeMs": 600_000}
    )
    assert again["truncated"] is True
    partition, end = decode_partition(again["cursor"])
    assert partition == partition_for_key(key, settings.topics.partitions)
    part = TopicPart(settings.topics.updates, partition)
    async with log_of(sbridge) as log:  # retention by hand: everything so far
        await log.delete_records_before(part, end)
    gone = await polled(sbridge, UPDATED, {"arguments": {}, "cursor": start["cursor"]})
    assert gone["truncated"] is True and gone["events"] == []


async def test_task_updated_push_of_one_task_delivers_live_beats_and_ends_with_it(
    sbridge: MemoryBridge,
) -> None:
    before = await polled(sbridge, UPDATED, {"arguments": {}, "cursor": None})
    async with client() as http:
        task = await create_task(http, sbridge.url, "slow_compute", {"seconds": 120, "label": "u"})
    # The bridge's own update of the new task (working, seq 0) is written at the owner's next
    # index flush: wait for it, so that the stream opened "now" below sees only what follows.
    mine = {"arguments": {"taskId": task}, "cursor": before["cursor"]}
    assert [e["eventId"] for e in (await drain(sbridge, UPDATED, mine, 1))[0]] == [
        f"{task}.0.updated"
    ]
    async with client("tok-bob") as http:
        foreign = await call(
            http, sbridge.url, "events/stream", {"name": UPDATED, "arguments": {"taskId": task}}
        )
    assert foreign["error"]["code"] == -32023, foreign
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(BOUND):
        messages = push(sbridge, UPDATED, {"arguments": {"taskId": task}, "cursor": None})
        active = await anext(messages)
        assert active["method"] == "notifications/events/active"
        beat = await anext(messages)
        assert beat["method"] == "notifications/events/heartbeat"
        assert beat["params"]["cursor"] == active["params"]["cursor"]
        await produce_updates(
            sbridge,
            ("alice", "other", 0, "working"),
            ("alice", task, 5, "working"),
            ("alice", task, 6, "cancelled"),
            ("alice", task, 7, "working"),
        )
        async for message in messages:
            seen.append(message)
    events = [m["params"] for m in seen if m.get("method") == "notifications/events/event"]
    assert [e["eventId"] for e in events] == [f"{task}.5.updated", f"{task}.6.updated"]
    sid = active["params"]["_meta"][SID]
    assert seen[-1]["result"] == {"resultType": "complete", "_meta": {SID: sid}}


async def test_a_configured_source_skips_garbage_filters_and_is_only_for_its_principals(
    sbridge: MemoryBridge,
) -> None:
    args = {"customerId": "c1"}
    start = await polled(sbridge, ORDERS, {"arguments": args, "cursor": None})
    assert start["nextPollMs"] == 1000
    await produce_orders(
        sbridge,
        (b"c1", shipped("o1"), "shipped"),
        (b"c1", b"\xff\xfe not json", "shipped"),
        (b"c1", b'{"n": NaN}', "shipped"),
        (b"c1", b"[1, 2]", "shipped"),
        (b"c1", b'{"orderId": 7}', "shipped"),
        (b"c1", None, "shipped"),
        (None, shipped("keyless"), "shipped"),
        (b"c2", shipped("o2"), "shipped"),
        (b"c1", shipped("o3"), "created"),
        (b"c1", shipped("o4"), "shipped"),
    )
    got, cursor = await drain(sbridge, ORDERS, {"arguments": args, "cursor": start["cursor"]}, 2)
    assert sorted(e["data"]["orderId"] for e in got) == ["o1", "o4"]
    assert all(e["name"] == ORDERS and e["eventId"].startswith(f"{ORDERS}/") for e in got)
    empty = await polled(sbridge, ORDERS, {"arguments": args, "cursor": cursor})
    assert empty["events"] == [] and empty["hasMore"] is False
    refused = await poll(sbridge, ORDERS, {"arguments": args, "cursor": None}, "tok-bob")
    assert refused["error"]["code"] == -32024, refused
    bad = await poll(sbridge, ORDERS, {"arguments": {}, "cursor": None})
    assert bad["error"]["code"] == -32602, bad
    other = await polled(sbridge, UPDATED, {"arguments": {}, "cursor": None})
    foreign = await poll(sbridge, ORDERS, {"arguments": args, "cursor": other["cursor"]})
    assert foreign["error"]["code"] == -32602, foreign  # another event type's cursor


@pytest.mark.kafka
async def test_a_configured_source_pushes_live_records_from_a_polled_cursor(
    kafka_sbridge: Bridge,
) -> None:
    args = {"customerId": "c9"}
    start = await polled(kafka_sbridge, ORDERS, {"arguments": args, "cursor": None})
    await produce_orders(kafka_sbridge, (b"c9", shipped("before"), "shipped"))
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(BOUND):
        messages = push(kafka_sbridge, ORDERS, {"arguments": args, "cursor": start["cursor"]})
        active = await anext(messages)
        assert active["params"]["truncated"] is False
        async for message in messages:
            if message["method"] == "notifications/events/event":
                got.append(message["params"])
                if len(got) == 1:
                    await produce_orders(kafka_sbridge, (b"c9", shipped("live"), "shipped"))
                else:
                    break
        await messages.aclose()
    assert [e["data"]["orderId"] for e in got] == ["before", "live"]
    assert got[1]["cursor"] != got[0]["cursor"]


async def test_the_bridges_own_status_changes_reach_task_updated_once_each(
    sbridge: MemoryBridge,
) -> None:
    """The partition owner's indexer writes the updates, in its index transaction."""
    settings = sbridge.settings
    start = await polled(sbridge, UPDATED, {"arguments": {}, "cursor": None})
    async with client() as http:
        task_id = await create_task(http, sbridge.url, "slow_compute", {"seconds": 600})
    async with log_of(sbridge) as log, TaskEventPublisher(settings, log=log) as pub:
        status = f"{settings.tasks.event_type_prefix}.task.status"
        await pub.publish(task_id, "com.example.step", {"i": 1})
        await pub.publish(task_id, status, {"status": "completed", "statusMessage": "done"})
        await pub.publish(task_id, status, {"status": "failed"})  # after a terminal: no change
    mine = {"arguments": {"taskId": task_id}, "cursor": start["cursor"]}
    got: list[dict[str, Any]] = []
    cursor = start["cursor"]
    while not got or got[-1]["data"]["status"] != "completed":  # the worker may add a working
        more, cursor = await drain(sbridge, UPDATED, {**mine, "cursor": cursor}, 1)
        got += more
    statuses = [e["data"]["status"] for e in got]
    assert statuses[0] == "working" and statuses[-1] == "completed", statuses
    assert set(statuses[1:-1]) <= {"working"}, statuses
    assert got[0]["eventId"] == f"{task_id}.0.updated"  # task.created: seq 0
    assert got[-1]["data"]["statusMessage"] == "done"
    seqs = [e["data"]["seq"] for e in got]
    assert seqs == sorted(set(seqs))  # each change once, in log order
    # Exactly once: nothing more for this task, however often the owner flushed since.
    await sbridge_flushed(sbridge)
    rest = await polled(sbridge, UPDATED, {**mine, "cursor": cursor})
    assert rest["events"] == []


async def sbridge_flushed(bridge: AnyBridge) -> None:
    """A later task's update has arrived: the owner has flushed past everything before it."""
    start = await polled(bridge, UPDATED, {"arguments": {}, "cursor": None})
    async with client() as http:
        later = await create_task(http, bridge.url, "slow_compute", {"seconds": 600})
    await drain(bridge, UPDATED, {"arguments": {"taskId": later}, "cursor": start["cursor"]}, 1)

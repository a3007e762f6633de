"""The Events extension (SEP-3415) end to end: real Kafka, a real `bridge serve`, real HTTP.

The task event source (``<prefix>.task.event``, arguments ``{taskId}``) by poll and by push:
resumable from its cursor across a bridge restart, heartbeats carrying the cursor, only the
caller's tasks, maxEvents/hasMore.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conformance.wire import loads
from support.layout import fresh_prefix, make_settings
from support.mcp import call, create_task, request, result
from support.procs import Bridge, running_bearer_bridge
from support.sse import sse_events
from support.waits import BOUND

from bridge.log.publisher import TaskEventPublisher

pytestmark = pytest.mark.kafka

EXTENSION = "io.modelcontextprotocol/events"
NAME = "io.mcpbridge.task.event"
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
HEARTBEAT_S = 0.5


@pytest.fixture(scope="module")
def ebridge(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    root: Path = tmp_path_factory.mktemp("events")
    settings = make_settings(kafka_bootstrap, fresh_prefix("e"))
    with running_bearer_bridge(
        settings, root, TOKENS, BRIDGE_STREAMS__KEEPALIVE_S=str(HEARTBEAT_S)
    ) as running:
        yield running


def client(token: str = "tok-alice") -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer {token}"})


async def started_task(bridge: Bridge, steps: int = 0) -> str:
    """A two-minute slow_compute task of alice's, with ``steps`` events ``{"i": i}`` after it."""
    async with client() as http:
        task = await create_task(
            http, bridge.url, "slow_compute", {"seconds": 120, "label": "events"}
        )
    await publish(bridge, task, steps)
    return task


async def publish(bridge: Bridge, task: str, n: int, start: int = 0) -> None:
    async with TaskEventPublisher(bridge.settings) as pub:
        for i in range(start, start + n):
            await pub.publish(task, "com.example.step", {"i": i})


async def poll(bridge: Bridge, params: dict[str, Any], token: str = "tok-alice") -> dict[str, Any]:
    async with client(token) as http:
        return await call(http, bridge.url, "events/poll", {"name": NAME, **params})


def steps_of(events: list[dict[str, Any]]) -> list[int]:
    return [e["data"]["payload"]["i"] for e in events if e["data"]["type"] == "com.example.step"]


async def test_discover_and_list_advertise_the_task_event_type_with_webhook_to_a_bearer(
    ebridge: Bridge,
) -> None:
    async with client() as http:
        found = await result(http, ebridge.url, "server/discover")
        listed = await result(http, ebridge.url, "events/list")
    assert found["capabilities"]["extensions"][EXTENSION] == {}
    entry = next(e for e in listed["events"] if e["name"] == NAME)  # task.updated follows it
    assert entry["name"] == NAME and entry["delivery"] == ["poll", "push", "webhook"]
    assert entry["inputSchema"]["required"] == ["taskId"] and "payloadSchema" in entry
    assert listed["resultType"] == "complete" and "nextCursor" not in listed


async def test_poll_resumes_from_its_cursor_across_a_restart_with_nothing_lost(
    ebridge: Bridge,
) -> None:
    task = await started_task(ebridge, steps=2)
    first = (await poll(ebridge, {"arguments": {"taskId": task}, "cursor": None}))["result"]
    assert first["events"] == [] and first["hasMore"] is False and first["nextPollMs"] >= 1000
    await publish(ebridge, task, 5, start=2)
    page = (
        await poll(
            ebridge, {"arguments": {"taskId": task}, "cursor": first["cursor"], "maxEvents": 3}
        )
    )["result"]
    assert len(page["events"]) == 3 and page["hasMore"] is True
    assert page["truncated"] is False and page["resultType"] == "complete"
    assert [e["eventId"] for e in page["events"]] == [
        f"{task}.{e['data']['seq']}" for e in page["events"]
    ]
    assert server(ebridge).alive()
    server(ebridge).stop()
    await publish(ebridge, task, 2, start=7)  # written while no bridge serves
    ebridge.start_server()
    rest = (await poll(ebridge, {"arguments": {"taskId": task}, "cursor": page["cursor"]}))[
        "result"
    ]
    assert steps_of(page["events"] + rest["events"]) == [2, 3, 4, 5, 6, 7, 8]
    again = (await poll(ebridge, {"arguments": {"taskId": task}, "cursor": rest["cursor"]}))[
        "result"
    ]
    seqs = [e["data"]["seq"] for e in page["events"] + rest["events"] + again["events"]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing lost, nothing repeated


def server(bridge: Bridge) -> Any:
    assert bridge.server is not None
    return bridge.server


async def test_a_foreign_task_is_not_found_by_poll_or_push(ebridge: Bridge) -> None:
    task = await started_task(ebridge)
    polled = await poll(ebridge, {"arguments": {"taskId": task}, "cursor": None}, "tok-bob")
    assert polled["error"]["code"] == -32023, polled
    async with client("tok-bob") as http:
        pushed = await call(
            http, ebridge.url, "events/stream", {"name": NAME, "arguments": {"taskId": task}}
        )
    assert pushed["error"]["code"] == -32023, pushed
    unknown = await poll(ebridge, {"arguments": {"taskId": "no-such-task"}})
    assert unknown["error"] == polled["error"]


async def test_unknown_event_bad_arguments_and_a_subscribe_without_delivery_get_the_drafts_errors(
    ebridge: Bridge,
) -> None:
    task = await started_task(ebridge)
    async with client() as http:
        name = await call(http, ebridge.url, "events/poll", {"name": "nope", "arguments": {}})
        args = await call(http, ebridge.url, "events/poll", {"name": NAME, "arguments": {}})
        cursor = await call(
            http,
            ebridge.url,
            "events/poll",
            {
                "name": NAME,
                "arguments": {"taskId": task},
                "cursor": "dDEuMDE",
            },  # "t1.01": not a spelling this server mints
        )
        hook = await call(http, ebridge.url, "events/subscribe", {"name": NAME, "arguments": {}})
    assert name["error"]["code"] == -32023 and name["error"]["data"] == {"kind": "event"}
    assert args["error"]["code"] == -32602
    assert cursor["error"]["code"] == -32602, cursor
    assert hook["error"]["code"] == -32602  # no delivery: statically invalid


async def push(bridge: Bridge, params: dict[str, Any]) -> AsyncGenerator[dict[str, Any]]:
    headers, body = request("events/stream", {"name": NAME, **params})
    async with (
        client() as http,
        http.stream("POST", bridge.url, json=body, headers=headers) as reply,
    ):
        assert reply.status_code == 200
        async for event in sse_events(reply):
            yield loads(event.data)


async def test_push_delivers_live_events_heartbeats_with_the_cursor_and_ends_with_the_task(
    ebridge: Bridge,
) -> None:
    task = await started_task(ebridge, steps=1)
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(BOUND):
        messages = push(ebridge, {"arguments": {"taskId": task}, "cursor": None})
        active = await anext(messages)
        assert active["method"] == "notifications/events/active"
        assert active["params"]["truncated"] is False
        sid = active["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
        checked = active["params"]["cursor"]
        async for beat in messages:  # the job's progress events may come first
            if beat["method"] == "notifications/events/heartbeat":
                break
            checked = beat["params"]["cursor"]
        assert beat["params"]["cursor"] == checked  # the position checked up to
        await publish(ebridge, task, 3, start=1)
        async with client() as http:
            await result(http, ebridge.url, "tasks/cancel", {"taskId": task})
        async for message in messages:
            seen.append(message)
    events = [m["params"] for m in seen if m.get("method") == "notifications/events/event"]
    assert steps_of(events) == [1, 2, 3]
    assert events[-1]["data"]["payload"]["status"] == "cancelled"
    assert seen[-1] == {
        "jsonrpc": "2.0",
        "id": sid,
        "result": {
            "resultType": "complete",
            "_meta": {"io.modelcontextprotocol/subscriptionId": sid},
        },
    }
    meta = {"io.modelcontextprotocol/subscriptionId": sid}
    assert all(m["params"]["_meta"] == meta for m in seen if "method" in m)


async def test_push_resumes_from_a_polled_cursor(ebridge: Bridge) -> None:
    task = await started_task(ebridge, steps=3)
    first = (await poll(ebridge, {"arguments": {"taskId": task}, "cursor": None}))["result"]
    await publish(ebridge, task, 2, start=3)
    async with asyncio.timeout(BOUND):
        messages = push(ebridge, {"arguments": {"taskId": task}, "cursor": first["cursor"]})
        got: list[dict[str, Any]] = []
        async for message in messages:
            if message.get("method") == "notifications/events/event":
                got.append(message["params"])
            if len(got) == 2:
                break
        await messages.aclose()
    assert steps_of(got) == [3, 4]

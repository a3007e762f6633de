"""The Events extension in-process: cursors, and events/poll and events/list over fakes of the
log and of tasks/get's authorization (no broker)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from bridge.envelope import TaskEvent
from bridge.events_extension import BadCursor, TaskEvents
from bridge.events_extension.cursor import decode_page, decode_task, encode_page, encode_task
from bridge.log.reader import NotRetained
from bridge.server.admission import Caller
from bridge.server.events import EventsMethods
from bridge.server.handlers import Call
from bridge.server.wire import JsonRpcRequest, RpcError
from bridge.tasks.service import TaskNotFound

NAME = "io.mcpbridge.task.event"
NOW_MS = 1_000_000


@dataclass
class View:
    status: str = "working"
    poll_interval_ms: int = 500


@dataclass(frozen=True)
class Read:
    seq: int
    event: TaskEvent


class FakeTasks:
    """alice owns task "t"; everyone else sees no task at all."""

    async def get(self, task_id: str, principal: str) -> View:
        if task_id != "t" or principal != "alice":
            raise TaskNotFound()
        return View()


class FakeLog:
    """Task "t" with ``n`` events, of which those below ``earliest`` are no longer retained."""

    def __init__(self, n: int, earliest: int = 0, old_below: int = 0) -> None:
        self.events = [
            Read(
                i,
                TaskEvent(
                    "com.example.step",
                    {"i": i},
                    timestamp_ms=NOW_MS - (10_000 if i < old_below else 0),
                ),
            )
            for i in range(n)
        ]
        self.earliest = earliest

    async def head(self, task_id: str) -> int:
        return len(self.events)

    async def read_batches(
        self, task_id: str, after: int | None = None
    ) -> AsyncIterator[list[Read]]:
        if after is not None and after + 1 < self.earliest:
            raise NotRetained(task_id, self.earliest)
        start = self.earliest if after is None else after + 1
        for i in range(start, len(self.events), 2):  # two per "fetch"
            yield self.events[i : i + 2]


def source(log: FakeLog) -> TaskEvents:
    return TaskEvents(
        NAME,
        FakeTasks(),
        log,
        live=None,  # type: ignore[arg-type]  # poll never goes live
        status_type="io.mcpbridge.task.status",
        queue_size=8,
        heartbeat_s=1.0,
        now_ms=lambda: NOW_MS,
    )


def call(method: str, params: dict[str, Any], principal: str = "alice") -> Call:
    rpc = JsonRpcRequest(jsonrpc="2.0", id=1, method=method, params=params)
    return Call(rpc, Caller(principal, "conn"), legacy=False, params=params)


async def poll(log: FakeLog, principal: str = "alice", **params: Any) -> dict[str, Any]:
    methods = EventsMethods([source(log)], streams=None)
    body = {"name": NAME, "arguments": {"taskId": "t"}, **params}
    return dict(await methods.poll(call("events/poll", body, principal)))  # type: ignore[arg-type]


def test_cursors_round_trip_and_are_opaque() -> None:
    for seq in (-1, 0, 7, 2**63 - 1):
        assert decode_task(encode_task(seq)) == seq
    assert "7" not in encode_task(7) and decode_page(encode_page(50)) == 50


@pytest.mark.parametrize("bad", ["", "!!", encode_page(3), "dDEuMDE", "dDEuLTI", "dDEuKzE"])
def test_a_cursor_this_server_did_not_mint_is_refused(bad: str) -> None:
    with pytest.raises(BadCursor):
        decode_task(bad)


async def test_a_null_cursor_starts_at_the_head_with_no_events() -> None:
    out = await poll(FakeLog(3), cursor=None)
    assert out["events"] == [] and decode_task(out["cursor"]) == 2
    assert out["truncated"] is False and out["hasMore"] is False and out["nextPollMs"] == 1000


async def test_max_events_returns_a_partial_batch_with_has_more_and_resumes_after_it() -> None:
    log = FakeLog(5)
    first = await poll(log, cursor=encode_task(-1), maxEvents=3)
    assert [e["data"]["seq"] for e in first["events"]] == [0, 1, 2] and first["hasMore"] is True
    assert [e["eventId"] for e in first["events"]] == ["t.0", "t.1", "t.2"]
    rest = await poll(log, cursor=first["cursor"], maxEvents=3)
    assert [e["data"]["seq"] for e in rest["events"]] == [3, 4] and rest["hasMore"] is False


async def test_a_cursor_older_than_retention_resumes_at_the_earliest_with_truncated() -> None:
    out = await poll(FakeLog(5, earliest=3), cursor=encode_task(0))
    assert [e["data"]["seq"] for e in out["events"]] == [3, 4] and out["truncated"] is True


async def test_max_age_skips_older_events_and_says_so() -> None:
    out = await poll(FakeLog(4, old_below=2), cursor=encode_task(-1), maxAgeMs=5_000)
    assert [e["data"]["seq"] for e in out["events"]] == [2, 3] and out["truncated"] is True


async def test_a_foreign_task_is_not_found_like_an_unknown_one() -> None:
    with pytest.raises(RpcError) as foreign:
        await poll(FakeLog(1), principal="bob", cursor=None)
    assert foreign.value.code == -32023 and foreign.value.data == {"kind": "task"}


async def test_list_pages_and_refuses_a_bad_page_cursor() -> None:
    methods = EventsMethods([source(FakeLog(0))], streams=None)
    listed = await methods.list(call("events/list", {}))
    assert [e["name"] for e in listed["events"]] == [NAME]  # type: ignore[index]
    assert "webhook" not in listed["events"][0]["delivery"]  # type: ignore[index]
    with pytest.raises(RpcError) as bad:
        await methods.list(call("events/list", {"cursor": "nope"}))
    assert bad.value.code == -32602
    assert methods.settings() == {} and asyncio.iscoroutinefunction(methods.stream)

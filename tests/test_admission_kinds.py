"""The slot of each kind of long-lived response is taken before its work starts (in-process).

A refused ``tools/call`` with progress creates no task, a refused ``events/stream`` opens no
read of its source, and a source that cannot open gives the slot back; against fakes of the
task service and a real :class:`~bridge.server.admission.Admission` (the servers' behaviour
over HTTP and Kafka is tests/test_stream_slots.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_server_inprocess import GREET, LONG, META, FakeStreams, FakeTasks, settings

from bridge.events_extension import StreamItem
from bridge.server.admission import Admission, Caller, Limits, label
from bridge.server.events import EventsMethods
from bridge.server.handlers import Call, MethodHandlers, Streamed
from bridge.server.wire import INVALID_PARAMS, INVALID_REQUEST, JsonRpcRequest, RpcError
from bridge.tasks.service import TaskNotFound

ALICE = Caller("alice", "alice", ("server", "alice:1"))
NAME = "io.mcpbridge.task.event"


def call(method: str, params: dict[str, Any], request_id: int, **headers: str) -> Call:
    full = {**params, "_meta": {**META, **params.get("_meta", {})}}
    rpc = JsonRpcRequest(jsonrpc="2.0", id=request_id, method=method, params=full)
    return Call(rpc, ALICE, legacy=False, params=full, headers=headers)


class DirectTasks(FakeTasks):
    """The fake task service, with the ids a direct call draws before it creates its task."""

    def new_task_id(self) -> str:
        return f"direct-{len(self.views)}"


def full_streams(limit: int = 1) -> FakeStreams:
    streams = FakeStreams()
    streams.admission = Admission(Limits(limit, 100, 100))
    return streams


async def test_a_refused_tools_call_with_progress_creates_no_task() -> None:
    tasks, streams = DirectTasks(), full_streams()
    handlers = MethodHandlers(settings(), tasks, [GREET, LONG], streams)  # type: ignore[arg-type]
    no_tasks = {"io.modelcontextprotocol/clientCapabilities": {}}  # greet runs as a direct call
    progress = {
        "name": "greet",
        "arguments": {"name": "x"},
        "_meta": {"progressToken": 1, **no_tasks},
    }
    first = await handlers.dispatch(call("tools/call", progress, 1, accept="text/event-stream"))
    assert isinstance(first, Streamed) and streams.admission.active == 1
    with pytest.raises(RpcError) as refused:
        await handlers.dispatch(call("tools/call", progress, 2, accept="text/event-stream"))
    assert refused.value.code == INVALID_REQUEST and refused.value.http_status == 429
    assert refused.value.data["reason"] == "too_many_streams"
    assert tasks.views == {}  # neither call has started its task: the admitted one streams it
    assert first.on_close is not None
    first.on_close()
    assert streams.admission.active == 0


class CountingSource:
    """An event source whose stream checks and reads are counted; checks fail for an unknown
    task (NotFound), bad arguments or a bad cursor (InvalidParams), as the SEP says."""

    name = NAME

    def __init__(self) -> None:
        self.checks = 0
        self.reads = 0

    async def open_stream(
        self, principal: str, arguments: dict[str, Any], cursor: str | None, max_age: int | None
    ) -> AsyncIterator[StreamItem]:
        self.checks += 1
        if not isinstance(arguments.get("taskId"), str) or cursor == "bad":
            raise RpcError(INVALID_PARAMS, "bad arguments or cursor")
        if arguments["taskId"] != "t":
            raise TaskNotFound()
        return self._items()

    async def _items(self) -> AsyncIterator[StreamItem]:
        self.reads += 1  # the first step of the items is the first read of the log
        return
        yield


async def test_a_refused_events_stream_reads_nothing_and_a_failed_check_takes_no_slot() -> None:
    source, streams = CountingSource(), full_streams()
    methods = EventsMethods([source], streams=streams)  # type: ignore[list-item]
    good = {"name": NAME, "arguments": {"taskId": "t"}}
    admitted = await methods.stream(call("events/stream", good, 1))
    assert isinstance(admitted, Streamed) and source.reads == 0
    with pytest.raises(RpcError) as refused:
        await methods.stream(call("events/stream", good, 2))
    assert refused.value.data["reason"] == "too_many_streams"
    assert source.checks == 2 and source.reads == 0  # checked, refused, never read
    assert admitted.on_close is not None
    admitted.on_close()
    with pytest.raises(RpcError) as unknown:  # the source refuses before any slot is taken
        await methods.stream(call("events/stream", {"name": NAME, "arguments": {"taskId": "u"}}, 3))
    assert unknown.value.code == -32023 and streams.admission.active == 0


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"arguments": {"taskId": "u"}}, -32023),  # NotFound: unknown, or another's, task
        ({"arguments": {"taskId": 7}}, INVALID_PARAMS),
        ({"arguments": {"taskId": "t"}, "cursor": "bad"}, INVALID_PARAMS),
    ],
    ids=["not_found", "bad_arguments", "bad_cursor"],
)
async def test_a_client_at_its_stream_limit_is_answered_what_is_wrong_with_its_request(
    params: dict[str, Any], code: int
) -> None:
    """The SEP answers a bad subscription at once with NotFound/Forbidden/InvalidParams; the
    stream limit must not turn that into "too many streams"."""
    source, streams = CountingSource(), full_streams()
    methods = EventsMethods([source], streams=streams)  # type: ignore[list-item]
    holding = await methods.stream(call("events/stream", {"name": NAME, **good_args()}, 1))
    assert isinstance(holding, Streamed) and streams.admission.active == 1
    with pytest.raises(RpcError) as refused:
        await methods.stream(call("events/stream", {"name": NAME, **params}, 2))
    assert refused.value.code == code and streams.admission.active == 1


def good_args() -> dict[str, Any]:
    return {"arguments": {"taskId": "t"}}


def test_responses_without_a_task_never_meet_the_connection_rule() -> None:
    gate = Admission(Limits(10, 100, 100))
    gate.admit(ALICE, label("events/stream", 1), 1)
    gate.admit(ALICE, label("tools/call", 1), 1)  # same request id, another kind
    gate.admit(ALICE, "t", 1)  # a task id: no label is one
    assert gate.active == 3 and " " in label("subscriptions/listen", "x")

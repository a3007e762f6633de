"""subscriptions/listen with notifications/tasks (bridge/server/listen.py).

In-process against fakes of the task service and the stream hub (real admission, real fan-out
subscriptions): the acknowledgement, the full task states, refusals, limits and how a listen
ends. Then once over real HTTP on the real broker, with bearer auth and two principals: a listen
on two tasks delivers each one's status changes as full task states, never the other
principal's task, and ends on notifications/cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from support.layout import fresh_prefix, make_settings
from support.mcp import call as rpc
from support.mcp import request, result
from support.procs import Bridge, running_bearer_bridge
from support.sse import sse_events
from support.waits import BOUND, wait_until

from bridge.config import Settings, load_settings
from bridge.events_extension import Active, Occurrence, StreamItem
from bridge.log.fanout import TaskFeed
from bridge.server import listen as listen_module
from bridge.server.admission import Admission, Caller, Limits, Ticket
from bridge.server.handlers import Call, MethodHandlers, Streamed, detailed_task
from bridge.server.listen import SUBSCRIPTION_ID_META, Listen
from bridge.server.routing import partition_moving_error
from bridge.server.sse import Frame
from bridge.server.wire import INTERNAL_ERROR, LATEST_VERSION, JsonRpcRequest, RpcError
from bridge.tasks.service import TaskNotFound, TaskView
from bridge.vocabulary import INVALID_PARAMS, INVALID_REQUEST, MISSING_CAPABILITY

TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
ERRORS_META = "io.mcpbridge/taskErrors"
ACK = "notifications/subscriptions/acknowledged"


# --- fakes ---------------------------------------------------------------------------------


class FakeTasks:
    """The task service's get/watch over a dict; ``change`` moves a task and wakes its watchers."""

    def __init__(self) -> None:
        self.views: dict[str, tuple[str, TaskView]] = {}
        self.subs: dict[str, list[TaskFeed]] = {}

    def add(self, task_id: str, owner: str, status: str = "working", **fields: Any) -> None:
        self.views[task_id] = (owner, TaskView(task_id, status, 1000, 1000, 60_000, 500, **fields))

    def change(self, task_id: str, status: str, **fields: Any) -> None:
        owner = self.views[task_id][0]
        self.add(task_id, owner, status, **fields)
        self.poke(task_id)

    def poke(self, task_id: str) -> None:
        """An event of the task reaches its subscriptions (its state may or may not change)."""
        for sub in self.subs.get(task_id, []):
            sub.offer(object())  # type: ignore[arg-type]  # opaque events

    async def get(self, task_id: str, principal: str) -> TaskView:
        owner, view = self.views.get(task_id, (None, None))
        if view is None or owner != principal:
            raise TaskNotFound()
        return view

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[TaskFeed]:
        sub = TaskFeed(task_id, 16)
        self.subs.setdefault(task_id, []).append(sub)
        try:
            yield sub
        finally:
            self.subs[task_id].remove(sub)

    def status_changed(self, sub: TaskFeed) -> bool:
        changed = sub.overflowed or bool(sub.take())
        sub.reset()
        return changed


class FakeStreams:
    """The stream hub's admission and drain flag, nothing else."""

    def __init__(self) -> None:
        self.admission = Admission(Limits(32, 100, 100))
        self.draining = asyncio.Event()

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket:
        return self.admission.admit(caller, task_id, request_id)

    def release(self, ticket: Ticket) -> None:
        self.admission.release(ticket)

    async def check_cursor(self, task_id: str, after: int | None) -> int | None:
        raise AssertionError("a listen checks no cursor")

    def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None
    ) -> AsyncIterator[Any]:
        raise AssertionError("a listen reads no task event stream")

    def count_gone(self) -> None:
        raise AssertionError("a listen is never events_gone")


def config(**overrides: Any) -> Settings:
    return load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}, tool_packs=[], **overrides)


@pytest.fixture
def tasks() -> FakeTasks:
    fake = FakeTasks()
    fake.add("a1", "alice")
    fake.add("a2", "alice", "input_required", input_requests={"ok": {"method": "x"}})
    fake.add("b1", "bob")
    return fake


@pytest.fixture
def streams() -> FakeStreams:
    return FakeStreams()


@pytest.fixture
def handlers(tasks: FakeTasks, streams: FakeStreams) -> MethodHandlers:
    # Keep-alives far apart: a listen that ends must be woken, not find out at its next tick.
    listen = Listen(config(streams={"keepalive_s": 3600}), tasks, streams, max_task_ids=3)
    return MethodHandlers(config(), tasks, [], streams, [listen])


ALICE = Caller("alice", "alice", ("server", "alice:1"))


def call(method: str, params: dict[str, Any], *, request_id: int = 41, caps: Any = TASKS) -> Call:
    meta = {
        "io.modelcontextprotocol/protocolVersion": LATEST_VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
    }
    full = {**params, "_meta": meta}
    rpc_request = JsonRpcRequest(jsonrpc="2.0", id=request_id, method=method, params=full)
    return Call(rpc_request, ALICE, legacy=False, params=full)


def listen_on(*task_ids: str, request_id: int = 41, caps: Any = TASKS) -> Call:
    params = {"notifications": {"taskIds": list(task_ids)}}
    return call("subscriptions/listen", params, request_id=request_id, caps=caps)


async def opened(handlers: MethodHandlers, c: Call) -> AsyncIterator[Any]:
    outcome = await handlers.dispatch(c)
    assert isinstance(outcome, Streamed) and outcome.request_id == c.rpc.id
    return outcome.messages


async def take(messages: AsyncIterator[Any], count: int) -> list[Any]:
    """The next ``count`` messages (keep-alives included), within a bound."""
    async with asyncio.timeout(BOUND):
        return [await anext(messages) for _ in range(count)]


async def waiting_after(
    messages: AsyncIterator[Any], count: int
) -> tuple[list[Any], asyncio.Task[None]]:
    """Read the stream in a task; returns once ``count`` messages are in and the stream waits
    for the next (nothing else is ready: the reader is parked in the listen's wait)."""
    got: list[Any] = []

    async def read() -> None:
        async for message in messages:
            got.append(message)

    reading = asyncio.create_task(read())
    await wait_until(lambda: len(got) >= count, what=f"{count} messages of the listen")
    return got, reading


async def tasks_get(handlers: MethodHandlers, task_id: str) -> dict[str, Any]:
    got = await handlers.dispatch(call("tasks/get", {"taskId": task_id}))
    assert isinstance(got, dict)
    return {k: v for k, v in got.items() if k != "resultType"}


def state_of(message: dict[str, Any]) -> dict[str, Any]:
    assert message["method"] == "notifications/tasks"
    return {k: v for k, v in message["params"].items() if k != "_meta"}


# --- in-process ----------------------------------------------------------------------------


async def test_the_acknowledgement_comes_first_then_each_tasks_state_as_tasks_get_answers_it(
    handlers: MethodHandlers,
) -> None:
    messages = await opened(handlers, listen_on("a1", "a2", "a1"))
    ack, first, second = await take(messages, 3)
    assert ack == {
        "jsonrpc": "2.0",
        "method": ACK,
        "params": {"_meta": {SUBSCRIPTION_ID_META: 41}, "notifications": {"taskIds": ["a1", "a2"]}},
    }
    assert state_of(first) == await tasks_get(handlers, "a1")
    assert state_of(second) == await tasks_get(handlers, "a2")
    assert second["params"]["inputRequests"] == {"ok": {"method": "x"}}
    assert first["params"]["_meta"] == {SUBSCRIPTION_ID_META: 41}


async def test_a_status_change_is_notified_with_the_full_state_and_an_event_without_one_is_not(
    handlers: MethodHandlers, tasks: FakeTasks, streams: FakeStreams
) -> None:
    messages = await opened(handlers, listen_on("a1", "a2"))
    await take(messages, 3)
    tasks.poke("a1")  # a progress event, say: tasks/get answers as before
    tasks.change("a2", "completed", result={"content": [{"type": "text", "text": "done"}]})
    (completed,) = await take(messages, 1)
    assert state_of(completed) == await tasks_get(handlers, "a2")
    assert completed["params"]["result"]["content"][0]["text"] == "done"
    tasks.change("a1", "failed", error={"code": -32603, "message": "boom"})
    (failed,) = await take(messages, 1)
    assert state_of(failed) == await tasks_get(handlers, "a1")
    assert failed["params"]["error"] == {"code": -32603, "message": "boom"}


async def test_a_task_the_caller_may_not_see_is_left_out_with_the_error_tasks_get_answers(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    messages = await opened(handlers, listen_on("a1", "b1", "nope"))
    ack, first = await take(messages, 2)
    assert ack["params"]["notifications"] == {"taskIds": ["a1"]}
    errors = ack["params"]["_meta"][ERRORS_META]
    for task_id in ("b1", "nope"):
        with pytest.raises(RpcError) as refused:
            await handlers.dispatch(call("tasks/get", {"taskId": task_id}))
        assert errors[task_id] == refused.value.error()
    assert errors["b1"] == errors["nope"]  # another principal's task reads as unknown
    assert state_of(first)["taskId"] == "a1"
    tasks.change("b1", "completed", result={"content": []})
    tasks.change("a1", "cancelled")
    (next_one,) = await take(messages, 1)
    assert state_of(next_one)["taskId"] == "a1"  # nothing of bob's task, ever


async def test_a_listen_without_task_ids_is_acknowledged_with_nothing_and_kept_alive(
    tasks: FakeTasks, streams: FakeStreams
) -> None:
    listen = Listen(config(streams={"keepalive_s": 0.01}), tasks, streams)
    handlers = MethodHandlers(config(), tasks, [], streams, [listen])
    c = call("subscriptions/listen", {"notifications": {"toolsListChanged": True}}, caps={})
    messages = await opened(handlers, c)
    ack, idle = await take(messages, 2)
    assert ack["params"]["notifications"] == {}  # unsupported types are left out
    assert idle == Frame(None)


async def test_task_ids_need_the_tasks_extension_in_that_request(
    handlers: MethodHandlers,
) -> None:
    with pytest.raises(RpcError) as refused:
        await handlers.dispatch(listen_on("a1", caps={}))
    assert refused.value.code == MISSING_CAPABILITY
    assert refused.value.data == {"requiredCapabilities": TASKS}


@pytest.mark.parametrize(
    "params",
    [{}, {"notifications": {"taskIds": "a1"}}, {"notifications": {"taskIds": [1]}}],
)
async def test_a_listen_without_a_filter_or_with_bad_task_ids_is_invalid_params(
    handlers: MethodHandlers, params: dict[str, Any]
) -> None:
    with pytest.raises(RpcError) as refused:
        await handlers.dispatch(call("subscriptions/listen", params))
    assert refused.value.code == INVALID_PARAMS


async def test_more_task_ids_than_the_limit_are_refused_before_any_lookup(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    with pytest.raises(RpcError) as refused:
        await handlers.dispatch(listen_on("a1", "a2", "b1", "x"))
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.data == {"reason": "too_many_task_ids", "limit": 3}
    assert streams.admission.active == 0


async def test_a_client_over_its_listens_is_refused_until_one_ends(
    tasks: FakeTasks, streams: FakeStreams
) -> None:
    listen = Listen(config(), tasks, streams, listens_per_client=2)
    handlers = MethodHandlers(config(), tasks, [], streams, [listen])
    first, _ = [await handlers.dispatch(listen_on("a1", request_id=i)) for i in (1, 2)]
    with pytest.raises(RpcError) as refused:
        await handlers.dispatch(listen_on("a1", request_id=3))
    assert (refused.value.code, refused.value.http_status) == (INVALID_REQUEST, 429)
    assert refused.value.data == {"reason": "too_many_listens", "limit": 2}
    assert isinstance(first, Streamed) and first.on_close is not None
    first.on_close()
    first.on_close()  # idempotent: the slot is given back once
    assert listen.active == 1 and streams.admission.active == 1
    assert isinstance(await handlers.dispatch(listen_on("a1", request_id=3)), Streamed)


async def test_notifications_cancelled_ends_the_listen_without_a_response(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    got, reading = await waiting_after(await opened(handlers, listen_on("a1")), 2)
    assert streams.admission.cancel("alice", 41) == 1
    async with asyncio.timeout(BOUND):
        await reading
    assert len(got) == 2  # the acknowledgement and the state: no response after them


async def test_a_draining_process_ends_the_listen_with_its_result(
    handlers: MethodHandlers, streams: FakeStreams
) -> None:
    got, reading = await waiting_after(await opened(handlers, listen_on("a1")), 2)
    streams.draining.set()
    async with asyncio.timeout(BOUND):
        await reading
    assert got[2:] == [
        {
            "jsonrpc": "2.0",
            "id": 41,
            "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_META: 41}},
        }
    ]


async def test_a_closed_listen_unsubscribes_from_every_task(
    handlers: MethodHandlers, tasks: FakeTasks
) -> None:
    messages = await opened(handlers, listen_on("a1", "a2"))
    await take(messages, 3)
    assert len(tasks.subs["a1"]) == len(tasks.subs["a2"]) == 1
    await messages.aclose()  # type: ignore[attr-defined]
    assert tasks.subs["a1"] == tasks.subs["a2"] == []


# --- several replicas (in-process) --------------------------------------------------------


class FakeReplicas:
    """Another replica's tasks (``there``: its task service) behind the hop, and the feed of
    status changes the task-updates topic would give."""

    def __init__(self) -> None:
        self.there = FakeTasks()
        self.there.add("r1", "alice")
        self.there.add("rb", "bob")
        self.moving: set[str] = set()
        self.unreachable = 0
        self.feed: asyncio.Queue[StreamItem] = asyncio.Queue()

    async def owner(self, task_id: str) -> str | None:
        if task_id in self.moving:
            raise partition_moving_error(task_id)
        return "http://replica-b" if task_id in self.there.views else None

    async def get(self, owner: str, task_id: str, caller: Caller) -> dict[str, Any]:
        if self.unreachable:
            self.unreachable -= 1
            raise RpcError(
                INTERNAL_ERROR, "owner down", {"reason": "owner_unavailable"}, http_status=503
            )
        try:
            return detailed_task(await self.there.get(task_id, caller.principal))
        except TaskNotFound as exc:
            raise RpcError(INVALID_PARAMS, f"Failed to retrieve task: {exc}") from None

    async def updates(self, principal: str, cursor: str | None) -> AsyncIterator[StreamItem]:
        async def items() -> AsyncIterator[StreamItem]:
            yield Active("u0", False)
            while True:
                yield await self.feed.get()

        return items()

    def changed(self, task_id: str, status: str, **fields: Any) -> None:
        """The owner folds a status change and writes it to the task-updates topic."""
        self.there.change(task_id, status, **fields)
        data = {"taskId": task_id, "seq": 1, "status": status}
        self.feed.put_nowait(Occurrence(f"{task_id}.1", "u", 1, data, "u1"))


@pytest.fixture
def replicas() -> FakeReplicas:
    return FakeReplicas()


@pytest.fixture
def grouped(tasks: FakeTasks, streams: FakeStreams, replicas: FakeReplicas) -> MethodHandlers:
    listen = Listen(config(streams={"keepalive_s": 3600}), tasks, streams, replicas=replicas)
    return MethodHandlers(config(), tasks, [], streams, [listen])


async def test_a_task_another_replica_owns_is_read_there_and_its_changes_come_from_the_updates(
    grouped: MethodHandlers, replicas: FakeReplicas
) -> None:
    messages = await opened(grouped, listen_on("a1", "r1", "rb", "nope"))
    got, reading = await waiting_after(messages, 3)
    try:
        ack = got[0]["params"]
        assert ack["notifications"] == {"taskIds": ["a1", "r1"]}
        assert set(ack["_meta"][ERRORS_META]) == {"rb", "nope"}
        assert ack["_meta"][ERRORS_META]["rb"] == ack["_meta"][ERRORS_META]["nope"]
        assert {state_of(m)["taskId"] for m in got[1:]} == {"a1", "r1"}
        replicas.changed("rb", "cancelled")  # bob's: not even read for alice
        replicas.changed("r1", "completed", result={"content": []})
        await wait_until(lambda: len(got) == 4, what="r1's change")
        assert state_of(got[3]) == detailed_task(await replicas.there.get("r1", "alice"))
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
    assert [state_of(m)["taskId"] for m in got[1:]].count("r1") == 2


async def test_a_listen_naming_a_task_whose_partition_is_moving_is_refused_as_retriable(
    grouped: MethodHandlers, replicas: FakeReplicas
) -> None:
    replicas.moving.add("r1")
    with pytest.raises(RpcError) as refused:
        await grouped.dispatch(listen_on("a1", "r1"))
    assert refused.value.http_status == 503
    assert refused.value.data["reason"] == "partition_moving"


async def test_a_state_its_owner_cannot_give_for_a_moment_is_read_again(
    grouped: MethodHandlers, replicas: FakeReplicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listen_module, "RETRY_S", 0.05)
    messages = await opened(grouped, listen_on("r1"))
    got, reading = await waiting_after(messages, 2)
    try:
        replicas.unreachable = 2
        replicas.changed("r1", "failed", error={"code": 1, "message": "x"})
        await wait_until(lambda: len(got) == 3, what="r1's change, read on a later try")
        assert state_of(got[2])["status"] == "failed"
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


# --- over real HTTP, on the real broker -----------------------------------------------------

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


@pytest.fixture(scope="module")
def bearer(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    root = tmp_path_factory.mktemp("listen")
    settings = make_settings(kafka_bootstrap, fresh_prefix("l"))
    with running_bearer_bridge(settings, root, TOKENS) as running:
        yield running


def client(token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer {token}"})


async def created(http: httpx.AsyncClient, url: str, tool: str, arguments: dict[str, Any]) -> str:
    task = await result(http, url, "tools/call", {"name": tool, "arguments": arguments})
    assert task["resultType"] == "task", task
    return str(task["taskId"])


async def read_listen(
    http: httpx.AsyncClient, url: str, task_ids: list[str], request_id: int, into: list[Any]
) -> None:
    """Open a listen and append each message it delivers to ``into`` until it ends."""
    params = {"notifications": {"taskIds": task_ids}}
    headers, body = request("subscriptions/listen", params, request_id=request_id)
    async with http.stream("POST", url, json=body, headers=headers) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for event in sse_events(reply):
            into.append(json.loads(event.data))


@pytest.mark.kafka
async def test_a_listen_delivers_the_callers_tasks_states_never_another_principals(
    bearer: Bridge,
) -> None:
    url, listen_id = bearer.url, 9001
    async with client("tok-alice") as alice, client("tok-bob") as bob:
        confirm = await created(alice, url, "confirm_delete", {"filename": "listen.txt"})
        slow = await created(alice, url, "slow_compute", {"seconds": 120, "label": "listen"})
        bobs = await created(bob, url, "slow_compute", {"seconds": 120, "label": "bob"})
        got: list[Any] = []
        reading = asyncio.create_task(
            read_listen(alice, url, [confirm, slow, bobs], listen_id, got)
        )

        def statuses(task_id: str) -> list[str]:
            assert not reading.done() or reading.exception() is None, reading
            return [
                m["params"]["status"]
                for m in got[1:]
                if m.get("method") == "notifications/tasks" and m["params"]["taskId"] == task_id
            ]

        try:
            await wait_until(lambda: "input_required" in statuses(confirm), what="confirm asks")
            await wait_until(lambda: statuses(slow) == ["working"], what="slow is working")
            ack = got[0]
            assert ack["method"] == ACK
            assert ack["params"]["notifications"] == {"taskIds": [confirm, slow]}
            foreign = await rpc(alice, url, "tasks/get", {"taskId": bobs})
            assert ack["params"]["_meta"][ERRORS_META] == {bobs: foreign["error"]}
            await result(
                alice,
                url,
                "tasks/update",
                {
                    "taskId": confirm,
                    "inputResponses": {
                        "confirm": {"action": "accept", "content": {"confirm": True}}
                    },
                },
            )
            await result(alice, url, "tasks/cancel", {"taskId": slow})
            await result(bob, url, "tasks/cancel", {"taskId": bobs})  # bob's change: not alice's
            await wait_until(lambda: statuses(confirm)[-1:] == ["completed"], what="confirm ends")
            await wait_until(lambda: statuses(slow) == ["working", "cancelled"], what="slow ends")
            for task_id in (confirm, slow):
                now = await result(alice, url, "tasks/get", {"taskId": task_id})
                last = [m for m in got if m.get("params", {}).get("taskId") == task_id][-1]
                assert {**last["params"], "resultType": "complete"} == {
                    **now,
                    "_meta": {SUBSCRIPTION_ID_META: listen_id},
                }
            sent = await alice.post(
                url,
                json={
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": listen_id},
                },
                headers={"MCP-Protocol-Version": LATEST_VERSION},
            )
            assert sent.status_code == 202
            async with asyncio.timeout(BOUND):
                await reading  # the listen ends on notifications/cancelled
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    assert all(m["params"]["_meta"][SUBSCRIPTION_ID_META] == listen_id for m in got)
    assert all(m.get("method") in (ACK, "notifications/tasks") for m in got)  # no result
    assert not any(m["params"].get("taskId") == bobs for m in got[1:])

"""A call waiting on a task whose partition moves ends, retriably, instead of freezing the replica.

A rebalance closes the fan-out subscriptions of the partitions a replica loses; a waiter that
did not see the closure looped on it without an await that suspends (no HTTP, no tail, no
heartbeats). Two in-process replicas (``replicas.ownership = "group"``, a task service each, no HTTP and
no workers): the first owns every partition while calls wait on a task in each of them; the
second joins and takes some; each wait on a partition that moved must end with the retriable
answer, the others wait on. :class:`TaskFeed.wait` is counted: a waiter that calls it
again and again without anything to take is spinning (the count, never the clock, says so).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import pytest
from support.layout import create_topics, fresh_prefix, make_settings
from support.services import task_service
from support.waits import BOUND, wait_until

from bridge.config import Settings, ToolSpec
from bridge.log.fanout import TaskFeed
from bridge.log.indexer import NotOwner
from bridge.server.admission import Caller
from bridge.server.handlers import Call, MethodHandlers, Streamed
from bridge.server.wire import LATEST_VERSION, JsonRpcRequest, RpcError
from bridge.tasks.messages import new_task_id
from bridge.tasks.service import TaskService

pytestmark = pytest.mark.kafka

PARTITIONS = 4
#: Calls of ``wait`` on one subscription past which its waiter is spinning: a waiter here
#: wakes once per event of its task, and these tasks (no worker runs them) have two.
SPINS = 100
#: A tool no worker runs: its tasks stay working, so a call waits on them until it is ended.
HOLD = ToolSpec(name="hold", description="Never picked up", task="optional")
ALICE = Caller("alice", "alice", ("server", "alice:1"))


@pytest.fixture
def spins(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Every subscription's calls of ``wait``; a spinning waiter fails at :data:`SPINS`."""
    calls: Counter[int] = Counter()
    original = TaskFeed.wait

    async def counted(self: TaskFeed, idle_s: float | None = None) -> bool:
        calls[id(self)] += 1
        if calls[id(self)] > SPINS:
            raise AssertionError("a waiter loops on its closed subscription without suspending")
        return await original(self, idle_s)

    monkeypatch.setattr(TaskFeed, "wait", counted)
    return calls


def replica(bootstrap: str, prefix: str, secret: str, i: int) -> Settings:
    return make_settings(
        bootstrap,
        prefix,
        topics={"prefix": prefix, "partitions": PARTITIONS, "min_insync_replicas": 1},
        replicas={"ownership": "group", "instance_id": f"moving-{i}", "session_timeout_ms": 6000},
        peers={
            "hosts": ["127.0.0.2", "127.0.0.3"],
            # No hop is made here; the owner URLs only need to be valid peer listeners' URLs.
            "advertised_url": f"http://127.0.0.{2 + i}:8081",
            "secret": secret,
        },
        tasks={"direct_result_timeout_s": 3600},  # the calls end by the move, never by this
    )


def one_task_per_partition(service: TaskService) -> dict[int, str]:
    ids: dict[int, str] = {}
    while len(ids) < PARTITIONS:
        task_id = new_task_id()
        ids.setdefault(service.indexer.partition_of(task_id), task_id)
    return ids


def direct_call(request_id: int, progress: bool) -> Call:
    """A ``tools/call`` of HOLD from a client without the tasks extension: a direct call,
    answered as JSON, or (``progress``) as a stream of its progress then its answer."""
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": LATEST_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {}
    if progress:
        meta["progressToken"] = request_id
        headers["accept"] = "application/json, text/event-stream"
    params = {"name": HOLD.name, "arguments": {}, "_meta": meta}
    rpc = JsonRpcRequest(jsonrpc="2.0", id=request_id, method="tools/call", params=params)
    return Call(rpc, ALICE, legacy=False, params=params, headers=headers)


class Slots:
    """The stream hub's admission, as far as a direct call with progress uses it."""

    def admit(self, caller: Caller, key: str, request_id: str | int | None) -> object:
        return object()

    def release(self, ticket: object) -> None:
        pass


async def across_a_rebalance(
    kafka_bootstrap: str, wait: Any, check: Any, spins: Counter[int]
) -> None:
    """Start ``wait(service, partition, task_id)`` on a task of every partition of the first
    replica, let a second one join, then ``check(service, waits, moved)``."""
    prefix, secret = fresh_prefix("mv"), secrets.token_urlsafe(32)
    await create_topics(replica(kafka_bootstrap, prefix, secret, 0), [HOLD.name])
    async with task_service(replica(kafka_bootstrap, prefix, secret, 0), tool=HOLD) as one:
        await wait_until(lambda: len(one.indexer.partitions) == PARTITIONS, what="one owns all")
        ids = one_task_per_partition(one)
        waits = {p: asyncio.create_task(wait(one, task_id)) for p, task_id in ids.items()}
        try:
            # Every call waits on its subscription before the partitions move.
            await wait_until(lambda: len(spins) == PARTITIONS, what="every call waits")
            async with task_service(replica(kafka_bootstrap, prefix, secret, 1), tool=HOLD) as two:

                def divided() -> bool:
                    owned = [set(s.indexer.partitions) for s in (one, two)]
                    return all(owned) and owned[0] | owned[1] == set(range(PARTITIONS))

                await wait_until(divided, what="the two replicas divide the partitions")
                moved = set(range(PARTITIONS)) - set(one.indexer.partitions)
                await check(one, waits, ids, moved)
        finally:
            for waiting in waits.values():
                waiting.cancel()
            await asyncio.gather(*waits.values(), return_exceptions=True)


async def outcome(waiting: Awaitable[Any]) -> BaseException | Any:
    try:
        async with asyncio.timeout(BOUND):
            return await waiting
    except Exception as exc:
        return exc


async def test_a_created_task_s_status_wait_ends_with_not_owner_when_its_partition_moves(
    kafka_bootstrap: str, spins: Counter[int]
) -> None:
    async def wait(service: TaskService, task_id: str) -> Any:
        await service.create(HOLD, {}, "alice", task_id=task_id)
        return await service.wait_terminal(task_id, "alice")

    async def check(service: TaskService, waits: dict, ids: dict, moved: set[int]) -> None:
        for partition in moved:
            ended = await outcome(waits[partition])
            assert isinstance(ended, NotOwner), ended
        for partition in set(waits) - moved:
            assert not waits[partition].done()  # its partition stayed: it waits on

    await across_a_rebalance(kafka_bootstrap, wait, check, spins)


@pytest.mark.parametrize("progress", [False, True], ids=["json", "streamed"])
async def test_a_direct_call_is_answered_partition_moving_and_its_job_cancelled(
    kafka_bootstrap: str, spins: Counter[int], progress: bool
) -> None:
    abandoned: list[str] = []

    def spy(service: TaskService) -> None:
        """Record the jobs the service is asked to cancel (once per service)."""
        if getattr(service, "spied", False):
            return
        abandon = getattr(service, "abandon", None)

        async def spied(task_id: str) -> None:
            abandoned.append(task_id)
            if abandon is not None:
                await abandon(task_id)

        service.abandon = spied  # type: ignore[method-assign]
        service.spied = True  # type: ignore[attr-defined]

    async def wait(service: TaskService, task_id: str) -> Any:
        spy(service)
        handlers = MethodHandlers(service.settings, service, [HOLD], Slots())  # type: ignore[arg-type]
        # The call's task id, drawn before its first await (so the calls cannot mix them up).
        service.new_task_id = lambda: task_id  # type: ignore[method-assign]
        answer = await handlers.dispatch(direct_call(len(spins), progress))
        if isinstance(answer, Streamed):  # its messages end with the answer, or raise the error
            async for _ in answer.messages:
                pass
        return answer

    async def check(service: TaskService, waits: dict, ids: dict, moved: set[int]) -> None:
        for partition in moved:
            ended = await outcome(waits[partition])
            assert isinstance(ended, RpcError), ended
            assert ended.http_status == 503
            assert ended.data["reason"] == "partition_moving"
            assert ended.data["taskId"] == ids[partition]
        assert sorted(abandoned) == sorted(ids[p] for p in moved)  # no job runs on unseen
        for partition in set(waits) - moved:
            assert not waits[partition].done()

    await across_a_rebalance(kafka_bootstrap, wait, check, spins)

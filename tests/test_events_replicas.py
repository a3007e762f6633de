"""Events, webhooks and subscriptions/listen when replicas divide the partitions (real broker).

Two replicas (``replicas.ownership = "group"``, six events partitions, three each) in auth mode bearer;
tasks are created through ``tools/call`` on each replica, so their ids land in that replica's
own partitions, and every request is sent to replica A, whichever replica owns the task:

* a ``subscriptions/listen`` on A names tasks of both replicas and another principal's task;
* webhook subscriptions to tasks of both replicas, spread over every partition of the
  subscriptions topic, so some are delivered by the replica that does not own their task;
* ``events/stream`` of tasks on every partition, while a third replica joins and takes two of
  them: those streams end without the final result and resume from their cursors.

No worker runs: the tests write the tasks' events and statuses themselves. In-process, without
a broker: how a push stream ends when its task moved, and how an owner's events/poll answer
becomes what a webhook delivery loop reads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from conformance.wire import loads
from support.https import serving
from support.layout import create_served_topics, fresh_prefix, make_settings
from support.mcp import call, create_task, request, result
from support.procs import (
    PEER_HOSTS,
    Proc,
    bridge_env,
    free_peer_port,
    free_port,
    peer_env,
    webhook_keys_env,
)
from support.sse import sse_events
from support.waits import BOUND, wait_until, wait_until_sync
from test_replicas import Replica, owned

from bridge.config import Settings
from bridge.events_extension import Active, Occurrence, PollBatch, StreamItem
from bridge.events_extension.cursor import encode_task
from bridge.events_extension.delivery import Revoked
from bridge.events_extension.sources import Moved
from bridge.events_extension.subscriptions import subscription_id
from bridge.kafka.clients import partition_for_key
from bridge.log.publisher import TaskEventPublisher
from bridge.server.admission import Caller
from bridge.server.events import EVENT_CURSORS_META, EventsMethods, owner_poll
from bridge.server.handlers import Call, Streamed
from bridge.server.peers import PeerIdentity
from bridge.server.wire import INTERNAL_ERROR, JsonRpcRequest, RpcError
from bridge.vocabulary import NOT_FOUND

kafka = pytest.mark.kafka

PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
EVENT = "io.mcpbridge.task.event"
STATUS = "io.mcpbridge.task.status"
SUBSCRIPTION_META = "io.modelcontextprotocol/subscriptionId"
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


# --- the replicas ------------------------------------------------------------------------------


@dataclass
class Cluster:
    settings: Settings
    logs: Path
    env: dict[str, str]
    replicas: list[Replica] = field(default_factory=list)
    peer_port: int = field(default_factory=free_peer_port)
    started: int = 0

    def start(self, name: str) -> Replica:
        port = free_port()
        self.started += 1
        env = {
            **self.env,
            **peer_env(self.started % len(PEER_HOSTS), self.peer_port),
            "BRIDGE_REPLICAS__INSTANCE_ID": name,
        }
        proc = Proc(name, ["serve", "--port", str(port)], env, self.logs / f"{name}.log")
        replica = Replica(name, port, proc.start())
        self.replicas.append(replica)
        wait_until_sync(replica.ready, 90, what=lambda: f"{name} ready:\n{proc.tail()}")
        return replica

    def stop(self, replica: Replica) -> None:
        replica.proc.stop()
        self.replicas.remove(replica)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def cluster(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA
) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("events-replicas")
    prefix = fresh_prefix("er")
    settings = make_settings(
        kafka_bootstrap,
        prefix,
        topics={"prefix": prefix, "partitions": PARTITIONS, "min_insync_replicas": 1},
    )
    create_served_topics(settings)
    (logs / "tokens.json").write_text(json.dumps(TOKENS))
    ca.cert_pem.write_to_path(str(logs / "ca.pem"))
    env = bridge_env(
        settings,
        BRIDGE_REPLICAS__OWNERSHIP="group",
        BRIDGE_PEERS__SECRET=secrets.token_urlsafe(32),
        BRIDGE_REPLICAS__SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
        BRIDGE_REPLICAS__OWNER_WAIT_S="20",
        BRIDGE_AUTH__MODE="bearer",
        BRIDGE_AUTH__TOKENS_FILE=str(logs / "tokens.json"),
        BRIDGE_STREAMS__KEEPALIVE_S="0.5",
        BRIDGE_WEBHOOKS__ALLOWLIST='["127.0.0.1/32"]',
        BRIDGE_WEBHOOKS__CA_FILE=str(logs / "ca.pem"),
        BRIDGE_WEBHOOKS__POLL_INTERVAL_S="0.2",
        BRIDGE_WEBHOOKS__TIMEOUT_S="2",
        # One principal verifies a callback URL per partition and task, all on one host.
        BRIDGE_WEBHOOKS__VERIFY_BURST="32",
        **webhook_keys_env(logs),
    )
    running = Cluster(settings, logs, env)
    try:
        running.start("replica-a")
        running.start("replica-b")
        wait_until_sync(lambda: owned(running.replicas) == [3, 3], 60, what="partitions 3 and 3")
        yield running
    finally:
        for replica in list(running.replicas):
            replica.proc.stop()


def client(principal: str = "alice") -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer tok-{principal}"})


async def task_on(replica: Replica, principal: str = "alice") -> str:
    """A task created through ``replica``: its id is in one of that replica's partitions."""
    async with client(principal) as http:
        return await create_task(http, replica.url, "slow_compute", {"seconds": 600})


async def write(settings: Settings, task_id: str, *events: tuple[str, dict[str, Any]]) -> None:
    async with TaskEventPublisher(settings) as pub:
        for event_type, payload in events:
            await pub.publish(task_id, event_type, payload)


def steps(*numbers: int) -> list[tuple[str, dict[str, Any]]]:
    return [("com.example.step", {"i": i}) for i in numbers]


def status(value: str, **more: Any) -> tuple[str, dict[str, Any]]:
    return (STATUS, {"status": value, **more})


COMPLETED = status("completed", result={"content": [{"type": "text", "text": "done"}]})


# --- subscriptions/listen ----------------------------------------------------------------------


async def read_listen(url: str, task_ids: list[str], listen_id: int, into: list[Any]) -> None:
    params = {"notifications": {"taskIds": task_ids}}
    headers, body = request("subscriptions/listen", params, request_id=listen_id)
    async with client() as http, http.stream("POST", url, json=body, headers=headers) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for event in sse_events(reply):
            into.append(loads(event.data))


@kafka
async def test_a_listen_on_one_replica_follows_tasks_of_both_as_tasks_get_answers(
    cluster: Cluster,
) -> None:
    a, b = cluster.replicas
    here, there = await task_on(a), await task_on(b)
    foreign = await task_on(b, "bob")
    got: list[Any] = []
    reading = asyncio.create_task(read_listen(a.url, [here, there, foreign], 7001, got))

    def statuses(task_id: str) -> list[str]:
        assert not reading.done() or reading.exception() is None, reading
        return [
            m["params"]["status"]
            for m in got[1:]
            if m.get("method") == "notifications/tasks" and m["params"]["taskId"] == task_id
        ]

    try:
        await wait_until(lambda: statuses(here) == statuses(there) == ["working"], what="working")
        ack = got[0]["params"]
        assert ack["notifications"] == {"taskIds": [here, there]}
        async with client() as alice:
            refused = await call(alice, a.url, "tasks/get", {"taskId": foreign})
        assert ack["_meta"]["io.mcpbridge/taskErrors"] == {foreign: refused["error"]}

        asked = {"ok": {"method": "elicitation/create", "params": {"message": "go on?"}}}
        await write(
            cluster.settings, there, *steps(0), status("input_required", inputRequests=asked)
        )
        await wait_until(lambda: statuses(there)[-1:] == ["input_required"], what="there asks")
        await write(cluster.settings, foreign, status("cancelled"))  # bob's: never alice's
        await write(cluster.settings, there, COMPLETED)
        await write(cluster.settings, here, status("failed", error={"code": -1, "message": "x"}))
        await wait_until(lambda: statuses(there)[-1:] == ["completed"], what="there completes")
        await wait_until(lambda: statuses(here)[-1:] == ["failed"], what="here fails")
        assert statuses(there) == ["working", "input_required", "completed"]
        async with client() as alice:
            for task_id in (here, there):
                now = await result(alice, a.url, "tasks/get", {"taskId": task_id})
                last = [m for m in got[1:] if m["params"]["taskId"] == task_id][-1]
                assert {**last["params"], "resultType": "complete"} == {
                    **now,
                    "_meta": {SUBSCRIPTION_META: 7001},
                }
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
    assert not any(m["params"].get("taskId") == foreign for m in got[1:])
    assert all(m["params"]["_meta"][SUBSCRIPTION_META] == 7001 for m in got)


# --- webhooks ----------------------------------------------------------------------------------


@dataclass
class Receiver:
    """An HTTPS listener on 127.0.0.1 that echoes challenges and records every event body."""

    port: int = 0
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}/hooks/{path}"

    def steps(self, path: str) -> list[int]:
        return [
            m["data"]["payload"]["i"]
            for m in self.events.get(f"/hooks/{path}", [])
            if m["data"]["type"] == "com.example.step"
        ]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer = b""
            if message.get("type") == "verification":
                answer = json.dumps({"challenge": message["challenge"]}).encode()
            elif "eventId" in message:
                receiver.events.setdefault(self.path, []).append(message)
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def receiver(ca: trustme.CA) -> Iterator[Receiver]:
    receiver = Receiver()
    with serving(_handler(receiver), ca) as receiver.port:
        yield receiver


def paths_in_every_partition(receiver: Receiver, task_id: str) -> list[str]:
    """One callback path per partition of the subscriptions topic for a subscription to
    ``task_id``: whichever replica delivers a partition, it delivers one of them."""
    found: dict[int, str] = {}
    for n in range(1000):
        path = f"{task_id[:8]}-{n}"
        sub_id = subscription_id("alice", receiver.url(path), EVENT, {"taskId": task_id})
        found.setdefault(partition_for_key(sub_id.encode(), PARTITIONS), path)
        if len(found) == PARTITIONS:
            return list(found.values())
    raise AssertionError("no path for some partition")


@kafka
async def test_webhooks_of_tasks_on_either_replica_are_delivered_whoever_delivers_them(
    cluster: Cluster, receiver: Receiver
) -> None:
    a, b = cluster.replicas
    tasks = [await task_on(a), await task_on(b)]
    paths = {task_id: paths_in_every_partition(receiver, task_id) for task_id in tasks}
    async with client() as alice:
        for task_id, hooks in paths.items():
            for path in hooks:
                delivery = {"mode": "webhook", "url": receiver.url(path), "secret": SECRET}
                params = {"name": EVENT, "arguments": {"taskId": task_id}, "delivery": delivery}
                await result(alice, a.url, "events/subscribe", params)
    for task_id in tasks:
        await write(cluster.settings, task_id, *steps(0, 1, 2))
    everywhere = [path for hooks in paths.values() for path in hooks]
    await wait_until(
        lambda: all(receiver.steps(path) == [0, 1, 2] for path in everywhere),
        what=lambda: "steps at every hook: " + str({p: receiver.steps(p) for p in everywhere}),
    )
    for hooks in paths.values():
        for path in hooks:
            cursors = [m["cursor"] for m in receiver.events[f"/hooks/{path}"]]
            assert len(set(cursors)) == len(cursors)  # each event its own position


# --- events/stream while a partition moves ------------------------------------------------------


@dataclass
class Push:
    """One task's push stream through its pieces: what arrived and how each piece ended."""

    task_id: str
    cursor: str | None = encode_task(-1)  # before the task's first event
    seqs: list[int] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    active: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, message: dict[str, Any]) -> None:
        if "result" in message:
            self.ends.append("result")
        elif "error" in message:
            self.ends.append(f"error {message['error']}")
        elif message["method"] == "notifications/events/terminated":
            self.ends.append("terminated")
        else:
            params = message["params"]
            self.cursor = params.get("cursor", self.cursor)
            if message["method"] == "notifications/events/event":
                self.seqs.append(params["data"]["seq"])
            elif message["method"] == "notifications/events/active":
                self.active.set()


async def follow(url: str, push: Push) -> None:
    """Read one piece of ``push`` until the server closes it (with its result, or without)."""
    push.active.clear()
    ended = len(push.ends)
    params = {"name": EVENT, "arguments": {"taskId": push.task_id}, "cursor": push.cursor}
    headers, body = request("events/stream", params)
    async with client() as http, http.stream("POST", url, json=body, headers=headers) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for event in sse_events(reply):
            push.take(loads(event.data))
    if len(push.ends) == ended:
        push.ends.append("closed")


async def tasks_on_every_partition(cluster: Cluster) -> dict[int, str]:
    found: dict[int, str] = {}
    for n in range(200):
        task_id = await task_on(cluster.replicas[n % 2])
        found.setdefault(partition_for_key(task_id.encode(), PARTITIONS), task_id)
        if len(found) == PARTITIONS:
            return found
    raise AssertionError(f"tasks on partitions {sorted(found)} only")


@contextlib.asynccontextmanager
async def following(url: str, pushes: list[Push]) -> AsyncIterator[list[asyncio.Task[None]]]:
    readers = [asyncio.create_task(follow(url, push)) for push in pushes]
    try:
        yield readers
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


@kafka
async def test_a_push_stream_whose_partition_moves_ends_without_its_result_and_resumes(
    cluster: Cluster,
) -> None:
    a = cluster.replicas[0]
    by_partition = await tasks_on_every_partition(cluster)
    pushes = [Push(task_id) for task_id in by_partition.values()]
    for push in pushes:
        await write(cluster.settings, push.task_id, *steps(0, 1))
    async with following(a.url, pushes) as readers:
        await wait_until(
            lambda: all(len(p.seqs) == 3 for p in pushes), what="created and two steps each"
        )
        c = cluster.start("replica-c")  # takes one partition of each replica
        try:
            await wait_until(lambda: owned(cluster.replicas) == [2, 2, 2], what="2, 2 and 2")
            await wait_until(
                lambda: sum(r.done() for r in readers) == 2,
                what="the moved partitions' streams end",
            )
            moved = [p for p, r in zip(pushes, readers, strict=True) if r.done()]
            kept = [p for p, r in zip(pushes, readers, strict=True) if not r.done()]
            assert [p.ends for p in moved] == [["closed"], ["closed"]]  # no result, no error
            async with following(c.url, moved) as resumed:
                await wait_until(lambda: all(p.active.is_set() for p in moved), what="resumed")
                for push in pushes:
                    await write(cluster.settings, push.task_id, *steps(2), COMPLETED)
                async with asyncio.timeout(BOUND):
                    await asyncio.gather(*readers, *resumed)
        finally:
            cluster.stop(c)
    for push in pushes:
        assert push.seqs == [0, 1, 2, 3, 4], (push.task_id, push.seqs, push.ends)
    assert all(p.ends == ["result"] for p in kept)
    assert all(p.ends == ["closed", "result"] for p in moved)


# --- in-process ----------------------------------------------------------------------------------


class MovingSource:
    """An event type whose stream says ``active``, then finds its task's partition gone."""

    name = EVENT

    def descriptor(self) -> dict[str, Any]:
        return {"name": EVENT, "delivery": ["poll", "push"], "inputSchema": {}}

    async def poll(self, *args: Any) -> PollBatch:
        first = Occurrence("t.1", EVENT, 1_000, {"seq": 1}, "c1")
        return PollBatch(
            [first, Occurrence("t.2", EVENT, 2_000, {"seq": 2}, "c2")], "c2", False, False, 1000
        )

    async def open_stream(self, *args: Any) -> AsyncIterator[StreamItem]:
        async def items() -> AsyncIterator[StreamItem]:
            yield Active("c0", False)
            raise Moved("t")

        return items()


def events_call(method: str, params: dict[str, Any]) -> Call:
    rpc = JsonRpcRequest(jsonrpc="2.0", id=5, method=method, params=params)
    return Call(rpc, Caller("alice", "alice"), legacy=False, params=params)


async def test_a_push_stream_whose_task_moved_ends_without_a_result_or_a_termination() -> None:
    methods = EventsMethods([MovingSource()], streams=None, retry_s=0)
    outcome = await methods.stream(events_call("events/stream", {"name": EVENT, "arguments": {}}))
    assert isinstance(outcome, Streamed)
    async with asyncio.timeout(BOUND):
        messages = [message async for message in outcome.messages]
    assert [m.get("method") for m in messages] == ["notifications/events/active"]


async def test_a_poll_that_asks_for_event_cursors_gets_each_occurrences_own() -> None:
    methods = EventsMethods([MovingSource()], streams=None)
    plain = await methods.poll(events_call("events/poll", {"name": EVENT}))
    asked = {"name": EVENT, "_meta": {EVENT_CURSORS_META: True}}
    flagged = await methods.poll(events_call("events/poll", asked))
    assert isinstance(plain, dict) and isinstance(flagged, dict)
    assert ["cursor" in e for e in plain["events"]] == [False, False]
    assert [e["cursor"] for e in flagged["events"]] == ["c1", "c2"]


class OwnerAnswers:
    """``Peers.call`` of a replica that answers events/poll with ``answer`` (or raises it)."""

    def __init__(self, answer: dict[str, Any] | RpcError) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, dict[str, Any], PeerIdentity]] = []

    async def call(
        self, owner: str, method: str, params: dict[str, Any], identity: PeerIdentity
    ) -> dict[str, Any]:
        self.asked.append((owner, method, params, identity))
        if isinstance(self.answer, RpcError):
            raise self.answer
        return self.answer


async def test_an_owners_poll_answer_is_the_batch_a_delivery_loop_reads() -> None:
    methods = EventsMethods([MovingSource()], streams=None)
    asked = {"name": EVENT, "_meta": {EVENT_CURSORS_META: True}}
    answer = await methods.poll(events_call("events/poll", asked))
    assert isinstance(answer, dict)
    peers = OwnerAnswers(answer)
    batch = await owner_poll(peers, "http://b", "alice", asked)  # type: ignore[arg-type]
    assert batch == await MovingSource().poll()
    assert peers.asked == [("http://b", "events/poll", asked, PeerIdentity("alice", "alice"))]


async def test_an_owners_not_found_ends_the_subscription_and_a_moving_partition_is_retried() -> (
    None
):
    gone = RpcError(NOT_FOUND, "Task not found", {"kind": "task"})
    with pytest.raises(Revoked) as revoked:
        await owner_poll(OwnerAnswers(gone), "http://b", "alice", {})  # type: ignore[arg-type]
    assert revoked.value.error == gone.error()
    moving = RpcError(INTERNAL_ERROR, "moving", {"reason": "partition_moving"}, http_status=503)
    with pytest.raises(RpcError):
        await owner_poll(OwnerAnswers(moving), "http://b", "alice", {})  # type: ignore[arg-type]

"""Three replicas divide the work on a real broker; one is SIGKILLed under load.

Every client streams through whichever replica it reaches (a request about another replica's
partition goes to its owner in one hop), resumes with its cursor on a surviving replica when
its stream ends without a result or its replica dies, and is checked against the ground truth
read from Kafka (each task's committed records in partition order): nothing lost, nothing
different, no seq but the log's, on any replica. Then ``bridge verify`` agrees with the index
the replicas wrote.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import secrets
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conformance.wire import loads
from support.layout import create_served_topics, make_settings
from support.mcp import create_task, request
from support.procs import Proc, bridge_env, free_peer_port, free_port, peer_env
from support.sse import sse_events
from support.waits import wait_until, wait_until_sync

from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import TopicPart
from bridge.log.publisher import TaskEventPublisher
from bridge.log.restore import read_to_end
from bridge.log.verify import verify_index

pytestmark = pytest.mark.kafka

REPLICAS = 3
PARTITIONS = 6
TASKS = 12
STREAMS_PER_TASK = 2
EVENTS_PER_TASK = 120
SESSION_TIMEOUT_MS = 6000
#: A client's pause before it reconnects after its stream broke (its retry policy).
RECONNECT_BACKOFF_S = 0.2


@dataclass
class Replica:
    name: str
    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False


def start_replicas(settings: Settings, logs: Path, secret: str) -> list[Replica]:
    replicas, peer_port = [], free_peer_port()
    for i in range(REPLICAS):
        port = free_port()
        env = bridge_env(
            settings,
            **peer_env(i, peer_port),  # hops go to each replica's peer listener
            BRIDGE_REPLICAS__OWNERSHIP="group",
            BRIDGE_REPLICAS__INSTANCE_ID=f"replica-{i}",
            BRIDGE_PEERS__SECRET=secret,
            BRIDGE_REPLICAS__SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
            BRIDGE_REPLICAS__OWNER_WAIT_S="20",
        )
        proc = Proc(f"replica{i}", ["serve", "--port", str(port)], env, logs / f"replica{i}.log")
        replicas.append(Replica(f"replica{i}", port, proc.start()))
    return replicas


def owned(replicas: list[Replica]) -> list[int]:
    return [int(r.metric("bridge_owned_partitions")) for r in replicas if r.proc.alive()]


@dataclass
class Client:
    """One viewer of one task: what it was handed, and how often it had to resume."""

    task_id: str
    got: list[tuple[int, str]] = field(default_factory=list)
    resumes: int = 0
    finished: bool = False
    #: When it was handed its first event after the kill (for the failover time).
    first_after_kill: float | None = None

    @property
    def last(self) -> int | None:
        return max((seq for seq, _ in self.got), default=None)


def digest(event: dict[str, Any]) -> str:
    body = json.dumps([event["type"], event["payload"]], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


async def follow(client: Client, replicas: list[Replica], rng: random.Random, kill: dict) -> None:
    """Stream the task to its end through live replicas, resuming with the cursor."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as http:
        while not client.finished:
            live = [r for r in replicas if r.proc.alive()]
            replica = rng.choice(live)
            params: dict[str, Any] = {"taskId": client.task_id}
            if client.last is not None:
                params["after"] = client.last
            headers, body = request("tasks/stream", params)
            try:
                async with http.stream("POST", replica.url, json=body, headers=headers) as reply:
                    if reply.status_code != 200:
                        await reply.aread()
                        raise ConnectionError(f"HTTP {reply.status_code}")
                    async for event in sse_events(reply):
                        message = loads(event.data)
                        if "result" in message:
                            client.finished = True
                        elif "error" in message:
                            raise ConnectionError(str(message["error"]))
                        else:
                            params_ = message["params"]
                            client.got.append((params_["seq"], digest(params_)))
                            if kill.get("at") and client.first_after_kill is None:
                                client.first_after_kill = time.monotonic()
            except (httpx.HTTPError, ConnectionError):
                pass
            if not client.finished:
                client.resumes += 1
                await asyncio.sleep(RECONNECT_BACKOFF_S)  # the client's retry backoff


async def ground_truth(settings: Settings) -> dict[str, list[str]]:
    """Each task's events in seq order, derived from the committed log (the checker's truth)."""
    from bridge.log.records import RecordDecoder

    decoder = RecordDecoder(
        settings.tasks.event_type_prefix, settings.tasks.max_event_bytes, settings.type_rule
    )
    truth: dict[str, list[str]] = {}

    def take(record) -> None:
        if record.key is None:
            return
        event = decoder.event(record)
        wire = {"type": event.type, "payload": event.payload}
        truth.setdefault(record.key.decode(), []).append(digest(wire))

    kafka = KafkaLog(settings, pool_size=1)
    try:
        topic = settings.topics.events
        await read_to_end(kafka, [TopicPart(topic, p) for p in range(PARTITIONS)], take)
    finally:
        await kafka.close()
    return truth


async def produce(settings: Settings, task_ids: list[str], kill_at: int, kill) -> None:
    """Several tasks writing at once; the kill happens a third of the way through."""
    async with TaskEventPublisher(settings) as pub:
        for i in range(EVENTS_PER_TASK):
            await asyncio.gather(
                *(pub.publish(t, "com.example.step", {"i": i, "task": t}) for t in task_ids)
            )
            if i == kill_at:
                kill()
        for t in task_ids:
            await pub.publish(
                t, f"{settings.tasks.event_type_prefix}.task.status", {"status": "completed"}
            )


async def test_three_replicas_divide_the_partitions_and_a_killed_ones_streams_resume_exactly(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(
        kafka_bootstrap,
        topic_prefix,
        topics={"prefix": topic_prefix, "partitions": PARTITIONS, "min_insync_replicas": 1},
    )
    create_served_topics(settings)
    replicas = start_replicas(settings, tmp_path, secrets.token_urlsafe(32))
    rng = random.Random(2694)
    try:
        for replica in replicas:
            wait_until_sync(replica.ready, 90, what=lambda r=replica: f"{r.name} ready")
        await wait_until(
            lambda: owned(replicas) == [2, 2, 2], 60, what="six partitions divided 2/2/2"
        )
        async with httpx.AsyncClient(timeout=30) as http:
            # Created through any replica: the id lands in the creator's own partitions.
            task_ids = [
                await create_task(
                    http, replicas[i % REPLICAS].url, "slow_compute", {"seconds": 600}
                )
                for i in range(TASKS)
            ]
        # No worker runs: the tasks stay working, and this test is their pipeline.
        clients = [Client(t) for t in task_ids for _ in range(STREAMS_PER_TASK)]
        kill: dict[str, float] = {}
        victim = replicas[1]

        def sigkill() -> None:
            victim.proc.kill()
            kill["at"] = time.monotonic()

        followers = [asyncio.create_task(follow(c, replicas, rng, kill)) for c in clients]
        await produce(settings, task_ids, EVENTS_PER_TASK // 3, sigkill)
        try:
            async with asyncio.timeout(120):
                await asyncio.gather(*followers)
        except TimeoutError:
            for replica in replicas:  # where each one is, for the bug report
                if replica.proc.alive() and replica.proc.popen is not None:
                    replica.proc.popen.send_signal(signal.SIGUSR1)
                    replica.proc.popen.send_signal(signal.SIGUSR2)
            stuck = [(c.task_id[:8], c.last, c.resumes) for c in clients if not c.finished]
            raise AssertionError(
                f"streams not finished (task, last seq, resumes): {stuck}"
            ) from None
        survivors = [r for r in replicas if r.proc.alive()]
        await wait_until(lambda: owned(survivors) == [3, 3], 30, what="survivors own 3 and 3")

        truth = await ground_truth(settings)
        for client in clients:
            seqs = [seq for seq, _ in client.got]
            by_seq = dict(client.got)
            assert sorted(by_seq) == list(range(len(truth[client.task_id]))), client.task_id
            assert [by_seq[s] for s in sorted(by_seq)] == truth[client.task_id]
            # Nothing repeated beyond what a resume from the last delivered seq can repeat: none.
            assert len(seqs) == len(by_seq), f"duplicates for {client.task_id}"
        assert sum(c.resumes for c in clients) > 0  # the kill did interrupt streams

        # The same seq through every surviving replica, served or forwarded.
        async with httpx.AsyncClient(timeout=30) as http:
            for task_id in task_ids[:4]:
                views = []
                for replica in survivors:
                    headers, body = request("tasks/stream", {"taskId": task_id})
                    reply = await http.post(replica.url, json=body, headers=headers)
                    events = [
                        loads(line[6:])["params"]
                        for line in reply.text.splitlines()
                        if line.startswith("data: ") and "notifications/tasks/event" in line
                    ]
                    views.append([(e["seq"], digest(e)) for e in events])
                assert views[0] == views[1] == list(enumerate(truth[task_id]))

        failover = max(c.first_after_kill or 0 for c in clients) - kill["at"]
        print(f"failover: last stream's first event after the kill in {failover:.1f} s")
        forwarded = sum(
            r.metric('bridge_forwarded_requests_total{method="tasks/stream",outcome="ok"}')
            for r in survivors
        )
        print(f"forwarded streams: {forwarded}")
    finally:
        for replica in replicas:
            replica.proc.stop()
    report = await verify_index(settings)
    assert report.ok, report.mismatches[:10]
    assert report.tasks_checked == TASKS

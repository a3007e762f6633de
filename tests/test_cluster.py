"""The three-broker cluster (bridgedev.kafka.cluster) against itself and the bridge's clients:
an RF-3 layout, acks=all produce with brokers down, a restart that rejoins the ISR, a freeze,
and the fault proxy cutting the clients off.

Every test gets the session cluster healthy (all nodes running and thawed, the proxy
forwarding) and leaves it so, whatever it broke. The nodes are combined brokers and
controllers: with two of three down the controller quorum is gone too, so no ISR can shrink.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from support.layout import fresh_prefix, make_settings
from support.waits import wait_until

from bridge.config import Settings
from bridge.kafka.admin import kafka_admin
from bridge.kafka.clients import (
    AIOKafkaProducer,
    TopicPartition,
    admin_client,
    committed_consumer,
    idempotent_producer,
)
from bridge.kafka.probe import _api_versions
from bridge.kafka.topics import create_layout, describe_topic_configs
from bridgedev.kafka import ClusterNode, LocalCluster
from bridgedev.kafka.local import _sweep_orphans

pytestmark = pytest.mark.slow

#: Bound of a produce expected to succeed (a leader may have to move first).
PRODUCE_BOUND_S = 60.0
#: The producers' request timeout, also how long a leader waits for acks=all.
REQUEST_TIMEOUT_MS = 5_000


@pytest.fixture
def cluster(kafka_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The session cluster, put back together after the test."""
    yield kafka_cluster
    assert kafka_cluster.proxy is not None
    kafka_cluster.proxy.clear()
    for node in kafka_cluster.nodes:
        node.thaw()
        if node.pid is None:
            node.start()


@pytest.fixture
async def layout(cluster: LocalCluster) -> Settings:
    """Settings of a fresh RF-3, min ISR 2 layout, created with the bridge's create_layout."""
    settings = make_settings(
        cluster.bootstrap_servers,
        fresh_prefix(),
        topics={
            "prefix": fresh_prefix(),
            "partitions": 3,
            "replication_factor": 3,
            "min_insync_replicas": 2,
        },
    )
    await create_layout(settings)
    return settings


@pytest.fixture
async def producer(layout: Settings) -> AsyncIterator[AIOKafkaProducer]:
    async with _producer(layout, REQUEST_TIMEOUT_MS) as started:
        yield started


@contextlib.asynccontextmanager
async def _producer(settings: Settings, request_timeout_ms: int) -> AsyncIterator[AIOKafkaProducer]:
    started = idempotent_producer(settings, request_timeout_ms=request_timeout_ms)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def _partitions(settings: Settings, topic: str) -> list[dict[str, object]]:
    async with kafka_admin(settings) as admin:
        (described,) = await admin.describe_topics([topic])
    return list(described["partitions"])


async def _leader(settings: Settings, topic: str, partition: int) -> int:
    for entry in await _partitions(settings, topic):
        if entry["partition"] == partition:
            return int(str(entry["leader"]))
    raise AssertionError(f"{topic} has no partition {partition}")


async def _produce(producer: AIOKafkaProducer, topic: str, value: bytes) -> None:
    async with asyncio.timeout(PRODUCE_BOUND_S):
        await producer.send_and_wait(topic, value, partition=0)


def _others(cluster: LocalCluster, node_id: int) -> list[ClusterNode]:
    return [node for node in cluster.nodes if node.node_id != node_id]


async def test_the_events_layout_gets_three_replicas_and_min_insync_replicas_two(
    layout: Settings,
) -> None:
    topic = layout.topics.events
    partitions = await _partitions(layout, topic)
    assert len(partitions) == 3
    assert all(sorted(p["replicas"]) == [1, 2, 3] for p in partitions), partitions
    async with kafka_admin(layout) as admin:
        configs = await describe_topic_configs(admin, [topic])
    assert configs[topic]["min.insync.replicas"] == "2"


async def test_an_acks_all_produce_succeeds_with_the_leader_killed(
    cluster: LocalCluster, layout: Settings, producer: AIOKafkaProducer
) -> None:
    topic = layout.topics.events
    await _produce(producer, topic, b"all up")
    leader = await _leader(layout, topic, 0)
    cluster.node(leader).kill()
    await _produce(producer, topic, b"one down")
    new_leader = await _leader(layout, topic, 0)
    assert new_leader != leader


async def test_an_acks_all_produce_is_held_with_two_brokers_down_and_lands_when_one_returns(
    cluster: LocalCluster, layout: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    topic = layout.topics.events
    async with _producer(layout, REQUEST_TIMEOUT_MS) as producer:
        await _produce(producer, topic, b"all up")
        leader = await _leader(layout, topic, 0)
        down = _others(cluster, leader)
        for node in down:
            node.kill()
        # The leader stays up, but the quorum went with the two controllers: the ISR cannot
        # shrink to one (which would answer NOT_ENOUGH_REPLICAS), so the leader waits for two
        # dead followers until the request times out. An idempotent producer never expires a
        # batch: it retries, and the send stays pending instead of failing.
        sending = asyncio.ensure_future(producer.send_and_wait(topic, b"two down", partition=0))
        await wait_until(
            lambda: "RequestTimedOutError" in caplog.text,
            what="the leader answering REQUEST_TIMED_OUT to the produce",
        )
        assert not sending.done()

        down[0].start()
        async with asyncio.timeout(PRODUCE_BOUND_S):
            await sending
    assert await _values(layout, topic) == [b"all up", b"two down"]


async def test_a_killed_broker_restarts_with_its_data_and_rejoins_the_isr(
    cluster: LocalCluster, layout: Settings, producer: AIOKafkaProducer
) -> None:
    topic = layout.topics.events
    await _produce(producer, topic, b"before the kill")
    leader = await _leader(layout, topic, 0)
    victim = _others(cluster, leader)[0]
    log = victim.root / "kraft" / f"{topic}-0" / "00000000000000000000.log"
    kept = await wait_until(lambda: _size(log), what=f"node {victim.node_id} wrote {log.name}")
    victim.kill()
    await _produce(producer, topic, b"while it was down")
    await wait_until(
        lambda: _isr_lacks(layout, topic, victim.node_id),
        what=f"node {victim.node_id} fenced out of the ISR",
    )
    assert _size(log) == kept  # the storage outlives the process

    victim.start()
    await wait_until(
        lambda: _isr_full(layout, topic),
        what=f"node {victim.node_id} back in the ISR of every partition",
    )
    assert _size(log) > kept  # it caught up on what it missed
    assert await _values(layout, topic) == [b"before the kill", b"while it was down"]


async def test_a_frozen_broker_stops_answering_until_it_is_thawed(
    cluster: LocalCluster, layout: Settings, producer: AIOKafkaProducer
) -> None:
    node = cluster.nodes[0]
    node.freeze()
    with pytest.raises(TimeoutError):
        _api_versions("127.0.0.1", node.port, 1.0)
    assert node.pid is not None  # frozen, not dead
    node.thaw()
    assert _api_versions("127.0.0.1", node.port, 10.0) > 0
    await _produce(producer, layout.topics.events, b"after the thaw")


async def test_a_proxy_cut_fails_metadata_requests_and_a_restore_ends_it(
    cluster: LocalCluster, layout: Settings
) -> None:
    assert cluster.proxy is not None
    cluster.proxy.cut()
    admin = admin_client(layout)
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        await admin.start()  # its bootstrap is a metadata request
    await admin.close()
    # the cluster itself is whole: its brokers answer past the proxy
    assert all(_api_versions("127.0.0.1", node.port, 10.0) for node in cluster.nodes)

    cluster.proxy.restore()
    async with kafka_admin(layout) as again:
        brokers = (await again.describe_cluster())["brokers"]
    # every broker is advertised at its proxy port: nothing reaches one past the proxy
    assert {b["port"] for b in brokers} == {r.listen_port for r in cluster.proxy.routes}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def _isr_lacks(settings: Settings, topic: str, node_id: int) -> bool:
    return all(node_id not in p["isr"] for p in await _partitions(settings, topic))


async def _isr_full(settings: Settings, topic: str) -> bool:
    return all(len(p["isr"]) == 3 for p in await _partitions(settings, topic))


async def _values(settings: Settings, topic: str) -> list[bytes | None]:
    consumer = committed_consumer(settings)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes | None] = []
        async with asyncio.timeout(PRODUCE_BOUND_S):
            while len(values) < end:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                values += [record.value for record in batch.get(tp, [])]
        return values
    finally:
        await consumer.stop()


def test_the_orphan_sweep_kills_every_node_a_dead_owner_left_and_removes_its_directory() -> None:
    root = Path(tempfile.mkdtemp(prefix="bridge-kafka-"))
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    # stand-ins for the nodes' JVMs: their command lines name the directory, as a node's does
    nodes = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)", str(root / f"node-{i}")],
            start_new_session=True,
        )
        for i in (1, 2)
    ]
    try:
        (root / "owner.json").write_text(
            json.dumps({"owner_pid": dead_owner.pid, "java_pids": [p.pid for p in nodes]})
        )
        _sweep_orphans()
        assert [p.wait(timeout=10) for p in nodes] == [-9, -9]
        assert not root.exists()
    finally:
        for p in nodes:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)

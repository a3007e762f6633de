"""Shared pytest fixtures.

Sections are owned by different parts of the code base; add new fixtures in a section of their
own below the existing ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bridge.config import load_settings
from bridgedev.kafka import Broker, KafkaProviderError, provide_broker

# =============================================================================================
# Kafka broker (bridgedev.kafka)
#
# `kafka_broker` (session): the one broker of the test run, from `provide_broker` — the cluster
# in BRIDGE_KAFKA__BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS if set, else Docker, else a local
# broker from the Maven jars. When none can be had the tests needing it are skipped, except
# under CI (CI=true), where they fail. Tests marked `@pytest.mark.kafka` get it automatically,
# and a test using a broker fixture is marked `kafka` from it (pytest_collection_modifyitems).
# The provider used and its start time are printed in the plain pytest output.
# =============================================================================================


def _kafka_say(config: pytest.Config, message: str) -> None:
    """One line to the real terminal, past output capturing (also under -q and in CI logs)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    line = f"[kafka] {message}"
    if reporter is None:
        print(line)
        return
    if capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)
    else:
        reporter.write_line(line)


_KAFKA_SUMMARY = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    config = request.config
    started = time.monotonic()
    broker: Broker | None = None
    try:
        broker = provide_broker(load_settings(), progress=lambda msg: _kafka_say(config, msg))
    except KafkaProviderError as exc:
        reason = f"no Kafka broker could be provided: {exc}"
    if broker is None:
        config.stash[_KAFKA_SUMMARY] = reason
        unavailable(reason)
    summary = (
        f"broker provider={broker.info.provider} bootstrap={broker.info.bootstrap_servers} "
        f"started in {time.monotonic() - started:.1f} s ({broker.info.detail})"
    )
    config.stash[_KAFKA_SUMMARY] = summary
    _kafka_say(config, summary)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    return kafka_broker.info.bootstrap_servers


@pytest.fixture(autouse=True)
def _kafka_marker_gets_broker(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("kafka")
    if marker is not None and "from_fixture" not in marker.kwargs:
        request.getfixturevalue("kafka_broker")


#: The fixtures that need a running broker: a test using any of them (directly or through
#: another fixture) is marked `kafka`, so `-m "not kafka"` is exactly the broker-free tier.
BROKER_FIXTURES = frozenset({"kafka_broker", "kafka_bootstrap", "secure_kafka", "kafka_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("kafka") is not None:
            continue
        needs = sorted(BROKER_FIXTURES & set(getattr(item, "fixturenames", ())))
        if needs:
            # Marked from its fixture: the fixture itself provides what the test needs.
            item.add_marker(pytest.mark.kafka(from_fixture=needs[0]))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    summary = terminalreporter.config.stash.get(_KAFKA_SUMMARY, None)
    if summary is not None:
        terminalreporter.write_line(f"[kafka] {summary}")


# =============================================================================================
# (end of the Kafka broker section)
# =============================================================================================


# =============================================================================================
# Topics and bridges for tests (helpers in tests/support; the names below stay importable from
# conftest for the test modules that import them from here).
# =============================================================================================

from support.layout import create_topics, fresh_prefix, make_settings  # noqa: E402
from support.procs import Bridge, bridge_env, free_port, running_bridge  # noqa: E402
from support.unavailable import unavailable  # noqa: E402

from bridge.config import Settings  # noqa: E402

__all__ = ["Bridge", "bridge_env", "free_port", "make_settings", "running_bridge"]


@pytest.fixture
def topic_prefix() -> str:
    """A fresh prefix per test (``t-<12 hex>``) so tests never share topics."""
    return fresh_prefix()


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str) -> Settings:
    return make_settings(kafka_bootstrap, topic_prefix)


@pytest.fixture
async def topics(settings: Settings) -> Settings:
    """``settings`` with its topic layout created on the broker."""
    return await create_topics(settings)


@pytest.fixture(scope="module")
def kafka_bridge_module(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bridge]:
    """`bridge serve` and one conformance-pack `bridge workers`, on topics of their own on the
    broker, for a test module (a module that moved to ``memory_bridge_module`` keeps its
    end-to-end smoke on this one)."""
    settings = make_settings(kafka_bootstrap, fresh_prefix("m"))
    with running_bridge(settings, tmp_path_factory.mktemp("bridge")) as running:
        yield running


@pytest.fixture(scope="module")
def bridge(kafka_bridge_module: Bridge) -> Bridge:
    """The module's bridge: the subprocesses on the broker unless the module overrides it."""
    return kafka_bridge_module


# =============================================================================================
# The bridge in process over the in-memory log (support.inmemory): no broker, real HTTP.
#
# `memory_bridge_module` (module): ``bridge serve`` with the conformance pack's worker, composed
# in this process over a memory log of its own and served by uvicorn on a loopback port from a
# background thread. A module whose tests are about the bridge's logic rather than Kafka's
# overrides `bridge` with it: ``def bridge(memory_bridge_module): return memory_bridge_module``.
# Its settings name no broker (support.inmemory.NO_BROKER): what still reads Kafka fails loudly.
# =============================================================================================

from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge  # noqa: E402


@pytest.fixture(scope="module")
def memory_bridge_module() -> Iterator[MemoryBridge]:
    """A bridge with one conformance-pack worker over a memory log, for a test module."""
    with memory_bridge(make_settings(NO_BROKER, fresh_prefix("m"))) as running:
        yield running


# =============================================================================================
# Secured Kafka broker (bridgedev.kafka.start_secure)
#
# `secure_kafka` (session): a throwaway local broker whose one client listener is SASL_SSL
# (a CA made for the session), with the StandardAuthorizer and no ACL meaning no access. Its
# `info` (a SecureBrokerInfo) has the bootstrap, the CA file, the super user `admin` and the
# users below with their passwords (each may use PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512;
# OAUTHBEARER takes any unsigned token's `sub`); `info.client_settings(user)` are settings
# overrides for a user. Always from the Maven jars, never the configured cluster or Docker:
# its users are created when its storage is formatted. Skipped when it cannot be started,
# except under CI, where the tests needing it fail.
# =============================================================================================

from bridgedev.kafka import SecureBroker, start_secure  # noqa: E402

#: One user per role of docs/kafka-security.md, and one that no ACL names.
SECURE_KAFKA_USERS = ("server", "index-writer", "worker", "pipeline", "nobody")


@pytest.fixture(scope="session")
def secure_kafka(request: pytest.FixtureRequest) -> Iterator[SecureBroker]:
    config = request.config
    started = time.monotonic()
    try:
        broker = start_secure(
            load_settings(),
            progress=lambda msg: _kafka_say(config, f"secured: {msg}"),
            users=SECURE_KAFKA_USERS,
        )
    except KafkaProviderError as exc:
        unavailable(f"no secured Kafka broker could be started: {exc}")
    _kafka_say(
        config,
        f"secured broker bootstrap={broker.info.bootstrap_servers} (SASL_SSL, CA "
        f"{broker.info.ca_file}) started in {time.monotonic() - started:.1f} s",
    )
    try:
        yield broker
    finally:
        broker.stop()


# =============================================================================================
# (end of the secured Kafka broker section)
# =============================================================================================


# =============================================================================================
# Three-broker Kafka cluster (bridgedev.kafka.start_cluster)
#
# `kafka_cluster` (session): a throwaway cluster of three combined KRaft nodes from the Maven
# jars (replication factor 3, min.insync.replicas 2) whose clients' listeners are advertised
# at a fault proxy: `kafka_cluster.proxy` cuts, restores and slows the way to every broker
# without partitioning the cluster, and `kafka_cluster.nodes` kill, freeze, thaw and restart
# single brokers. Ready once every node answers and an RF-3 topic could be created through the
# proxy; the start time is printed. Skipped when it cannot be started, except under CI, where
# the tests needing it fail. Tests that break it put it back (see tests/test_cluster.py).
# =============================================================================================

import asyncio  # noqa: E402

from aiokafka.admin import NewTopic  # noqa: E402
from support.waits import wait_until  # noqa: E402

from bridge.kafka.admin import kafka_admin  # noqa: E402
from bridge.kafka.clients import KafkaError  # noqa: E402
from bridgedev.kafka import LocalCluster, start_cluster  # noqa: E402

#: Start-up of three JVMs on a shared 2-core machine, the first RF-3 topic included.
CLUSTER_READY_BOUND_S = 120.0


async def _create_rf3_probe_topic(bootstrap: str) -> None:
    """Wait until the cluster creates a topic with three replicas (every broker registered)."""
    settings = load_settings(kafka={"bootstrap_servers": bootstrap})
    name = f"cluster-ready-{fresh_prefix()}"

    async def created() -> bool:
        try:
            async with kafka_admin(settings) as admin:
                await admin.create_topics([NewTopic(name, 1, 3)], timeout_ms=10_000)
        except KafkaError:
            return False  # too few brokers unfenced yet: INVALID_REPLICATION_FACTOR
        return True

    await wait_until(created, CLUSTER_READY_BOUND_S, what="an RF-3 topic created", poll_s=0.5)


@pytest.fixture(scope="session")
def kafka_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    config = request.config
    started = time.monotonic()
    try:
        cluster = start_cluster(
            load_settings(),
            proxied=True,
            progress=lambda msg: _kafka_say(config, f"cluster: {msg}"),
        )
    except KafkaProviderError as exc:
        unavailable(f"no three-broker Kafka cluster could be started: {exc}")
    try:
        answering = time.monotonic() - started
        asyncio.run(_create_rf3_probe_topic(cluster.bootstrap_servers))
        _kafka_say(
            config,
            f"cluster bootstrap={cluster.bootstrap_servers} (through the fault proxy) answering "
            f"in {answering:.1f} s, an RF-3 topic created at {time.monotonic() - started:.1f} s",
        )
        yield cluster
    finally:
        cluster.stop()


# =============================================================================================
# (end of the three-broker Kafka cluster section)
# =============================================================================================

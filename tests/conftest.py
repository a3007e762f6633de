"""Shared pytest fixtures.

Sections are owned by different parts of the code base; add new fixtures in a section of their
own below the existing ones.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from bridge.config import load_settings, running_in_ci
from bridge.kafka.broker import Broker, KafkaProviderError, provide_broker

# =============================================================================================
# Kafka broker (bridge.kafka.broker)
#
# `kafka_broker` (session): the one broker of the test run, from `provide_broker` — the cluster
# in BRIDGE_KAFKA_BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS if set, else Docker, else a local
# broker from the Maven jars. When none can be had the tests needing it are skipped, except
# under CI (CI=true), where they fail. Tests marked `@pytest.mark.kafka` get it automatically.
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
        if running_in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
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


@pytest.fixture
def topic_prefix() -> str:
    """A fresh prefix per test (``t-<12 hex>``) so tests never share topics."""
    return f"t-{secrets.token_hex(6)}"


@pytest.fixture(autouse=True)
def _kafka_marker_gets_broker(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("kafka") is not None:
        request.getfixturevalue("kafka_broker")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    summary = terminalreporter.config.stash.get(_KAFKA_SUMMARY, None)
    if summary is not None:
        terminalreporter.write_line(f"[kafka] {summary}")


# =============================================================================================
# (end of the Kafka broker section)
# =============================================================================================


# =============================================================================================
# The log side (bridge.log): settings pointing at the test broker, topics created per test.
# =============================================================================================

from bridge.config import Settings  # noqa: E402
from bridge.kafka.clients import admin_client  # noqa: E402
from bridge.kafka.topics import ensure_topics  # noqa: E402


def make_settings(bootstrap: str, prefix: str, **overrides: object) -> Settings:
    """Small, test-sized settings: 3 events partitions, checkpoints every 4 events."""
    values: dict[str, object] = {
        "kafka_bootstrap_servers": bootstrap,
        "topics": {
            "prefix": prefix,
            "partitions": 3,
            "index_partitions": 2,
            "min_insync_replicas": 1,
        },
        "checkpoint_interval": 4,
        "max_event_bytes": 4096,
    }
    values.update(overrides)
    return load_settings(**values)


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str) -> Settings:
    return make_settings(kafka_bootstrap, topic_prefix)


@pytest.fixture
async def topics(settings: Settings) -> Settings:
    """``settings`` with its topic layout created on the broker."""
    admin = admin_client(settings)
    await admin.start()
    try:
        await ensure_topics(admin, settings)
    finally:
        await admin.close()
    return settings

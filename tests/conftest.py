"""Shared pytest fixtures.

Sections are owned by different parts of the code base; add new fixtures in a section of their
own below the existing ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bridge.config import load_settings, running_in_ci
from bridge.devkafka import Broker, KafkaProviderError, provide_broker

# =============================================================================================
# Kafka broker (bridge.devkafka)
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
# Topics and bridges for tests (helpers in tests/support; the names below stay importable from
# conftest for the test modules that import them from here).
# =============================================================================================

from support.layout import create_topics, fresh_prefix, make_settings  # noqa: E402
from support.procs import Bridge, bridge_env, free_port, running_bridge  # noqa: E402

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
def bridge(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    """A bridge with one conformance-pack worker, on topics of its own, for a test module."""
    settings = make_settings(kafka_bootstrap, fresh_prefix("m"))
    with running_bridge(settings, tmp_path_factory.mktemp("bridge")) as running:
        yield running


# =============================================================================================
# Secured Kafka broker (bridge.devkafka.start_secure)
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

from bridge.devkafka import SecureBroker, start_secure  # noqa: E402

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
        reason = f"no secured Kafka broker could be started: {exc}"
        if running_in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
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

"""Shared pytest fixtures.

Sections are owned by different parts of the code base; add new fixtures in a section of their
own below the existing ones.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bridge.config import load_settings, running_in_ci
from bridge.devkafka import Broker, KafkaProviderError, provide_broker

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
    values: dict[str, Any] = {
        "kafka_bootstrap_servers": bootstrap,
        "topics": {
            "prefix": prefix,
            "partitions": 3,
            "index_partitions": 2,
            "min_insync_replicas": 1,
        },
        "checkpoint_interval": 4,
        "max_event_bytes": 4096,
        # Production offers no built-in tools by default; the tests opt in to the fixtures.
        "tool_packs": ["conformance"],
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


# =============================================================================================
# A real bridge (`bridge serve`) and real workers (`bridge workers`) as subprocesses.
# =============================================================================================

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bridge_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment that makes a `bridge` subprocess use ``settings``' broker and topics."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    t = settings.topics
    env.update(
        BRIDGE_KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers or "",
        BRIDGE_TOPICS__PREFIX=t.prefix,
        BRIDGE_TOPICS__PARTITIONS=str(t.partitions),
        BRIDGE_TOPICS__INDEX_PARTITIONS=str(t.index_partitions),
        BRIDGE_TOPICS__MIN_INSYNC_REPLICAS=str(t.min_insync_replicas),
        BRIDGE_CHECKPOINT_INTERVAL=str(settings.checkpoint_interval),
        BRIDGE_MAX_EVENT_BYTES=str(settings.max_event_bytes),
        BRIDGE_TOOL_PACKS=json.dumps(settings.tool_packs),
        BRIDGE_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Proc:
    """A `bridge` subprocess whose output goes to a log file (shown when a test fails)."""

    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Bridge:
    """A running bridge (and its workers) for one test module."""

    settings: Settings
    port: int
    env: dict[str, str]
    logs: Path
    server: Proc | None = None
    workers: list[Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start_server(self) -> Proc:
        self.server = Proc(
            "bridge", ["serve", "--port", str(self.port)], self.env, self.logs / "bridge.log"
        ).start()
        self.wait_ready()
        return self.server

    def start_worker(self, *packs: str) -> Proc:
        args = ["workers"] + [a for p in packs for a in ("--pack", p)]
        proc = Proc(
            f"worker{len(self.workers)}",
            args,
            self.env,
            self.logs / f"worker{len(self.workers)}.log",
        )
        self.workers.append(proc.start())
        return proc

    def wait_ready(self, bound: float = 90.0) -> None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            assert self.server is not None and self.server.alive(), (
                f"bridge exited:\n{self.server.tail() if self.server else ''}"
            )
            url = f"http://127.0.0.1:{self.port}/readyz"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
            time.sleep(0.1)  # poll interval of a bounded wait for a subprocess to listen
        raise AssertionError(
            f"bridge not ready within {bound}s:\n{self.server.tail() if self.server else ''}"
        )

    def stop(self) -> None:
        for proc in [*self.workers, *([self.server] if self.server else [])]:
            proc.stop()


async def ensure_layout(settings: Settings) -> None:
    """Create the topics, the job topics of every pack tool included."""
    from bridge.server.app import tool_catalog

    jobs = [t.job_topic or settings.topics.jobs(t.name) for t in tool_catalog(settings)]
    admin = admin_client(settings)
    await admin.start()
    try:
        await ensure_topics(admin, settings, job_topics=jobs)
    finally:
        await admin.close()


@contextlib.contextmanager
def running_bridge(
    settings: Settings, logs: Path, *, workers: int = 1, **env: str
) -> Iterator[Bridge]:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # callable from inside a running event loop too
        pool.submit(asyncio.run, ensure_layout(settings)).result()
    bridge = Bridge(settings, free_port(), bridge_env(settings, **env), logs)
    try:
        for _ in range(workers):
            bridge.start_worker()
        bridge.start_server()
        yield bridge
    finally:
        bridge.stop()


@pytest.fixture(scope="module")
def bridge(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    """A bridge with one conformance-pack worker, on topics of its own, for a test module."""
    prefix = f"m-{secrets.token_hex(6)}"
    settings = make_settings(kafka_bootstrap, prefix)
    with running_bridge(settings, tmp_path_factory.mktemp("bridge")) as running:
        yield running

"""The Kafka provider (bridgedev.kafka) against real brokers and real processes."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic
from support.layout import changed
from support.unavailable import unavailable
from support.waits import wait_until_sync

from bridge.config import Settings, load_settings
from bridge.kafka.admin import kafka_admin
from bridgedev.kafka import (
    Broker,
    KafkaProviderError,
    LocalBroker,
    check_bootstrap,
    detect_docker,
    ensure_kafka_jars,
    local_status,
    provide_broker,
    start_local_detached,
    stop_local_detached,
)

T = TypeVar("T")


# --- helpers -----------------------------------------------------------------------------------


def _local_settings(state_dir: Path | None = None, **local: object) -> Settings:
    """The test run's settings, forced to the local-jars provider (shared jar cache)."""
    base = load_settings()
    update: dict[str, object] = {"use_docker": False, **local}
    if state_dir is not None:
        update["state_dir"] = state_dir
    local = base.kafka.local.model_copy(update=update)
    return changed(base, kafka={"bootstrap_servers": None, "local": local})


def _or_skip(call: Callable[[], T]) -> T:
    """Run a provider call; without Java/Maven skip locally, fail under CI."""
    try:
        return call()
    except KafkaProviderError as exc:
        unavailable(f"local Kafka unavailable: {exc}")


def _pids_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _round_trip(bootstrap: str, topic: str) -> bytes:
    async with kafka_admin(load_settings(kafka={"bootstrap_servers": bootstrap})) as admin:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"hello", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
    finally:
        await consumer.stop()
    assert record.value is not None
    return bytes(record.value)


async def _topics(bootstrap: str) -> set[str]:
    async with kafka_admin(load_settings(kafka={"bootstrap_servers": bootstrap})) as admin:
        return set(await admin.list_topics())


# --- the provided broker -----------------------------------------------------------------------


@pytest.mark.kafka
async def test_provided_broker_answers(kafka_bootstrap: str, topic_prefix: str) -> None:
    assert await _round_trip(kafka_bootstrap, f"{topic_prefix}.rt") == b"hello"


@pytest.mark.kafka
def test_external_bootstrap_that_answers(kafka_broker: Broker) -> None:
    settings = load_settings(kafka={"bootstrap_servers": kafka_broker.info.bootstrap_servers})
    with provide_broker(settings, progress=lambda _: None) as external:
        assert external.info.provider == "external"
        assert external.info.bootstrap_servers == kafka_broker.info.bootstrap_servers
    external.stop()  # no-op, and idempotent
    assert check_bootstrap(kafka_broker.info.bootstrap_servers, timeout_s=5.0)


def test_external_bootstrap_refused_fails_fast() -> None:
    port = _closed_port()
    settings = load_settings(kafka={"bootstrap_servers": f"127.0.0.1:{port}"})
    started = time.monotonic()
    with pytest.raises(KafkaProviderError, match="does not answer") as info:
        provide_broker(settings, progress=lambda _: None)
    assert time.monotonic() - started < 2.0
    assert f"127.0.0.1:{port}: connection refused" in str(info.value)


def test_external_bootstrap_silent_is_bounded(silent_listener: int) -> None:
    started = time.monotonic()
    with pytest.raises(KafkaProviderError, match="timed out"):
        check_bootstrap(f"localhost:{_closed_port()},127.0.0.1:{silent_listener}", timeout_s=1.0)
    assert time.monotonic() - started < 2.5


def test_bad_bootstrap_syntax() -> None:
    with pytest.raises(KafkaProviderError, match="not host:port"):
        check_bootstrap("nonsense", timeout_s=1.0)


def test_docker_detection_is_fast() -> None:
    started = time.monotonic()
    probe = detect_docker()
    assert time.monotonic() - started < 2.0
    if not probe.available:
        assert probe.reason


def test_docker_detection_bounded_when_engine_hangs(
    silent_listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{silent_listener}")
    started = time.monotonic()
    probe = detect_docker(timeout_s=1.0)
    assert time.monotonic() - started < 2.0
    assert not probe.available


# --- the throwaway local broker ------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_local_broker_stop_leaves_nothing_behind() -> None:
    messages: list[str] = []
    broker = _or_skip(lambda: provide_broker(_local_settings(), progress=messages.append))
    assert isinstance(broker, LocalBroker)
    assert broker.info.provider == "local"
    assert any("ready" in m for m in messages)
    pid, root = broker.pid, broker.root
    assert _alive(pid)
    assert pid in _pids_mentioning(str(root))
    check_bootstrap(broker.info.bootstrap_servers, timeout_s=5.0)
    broker.stop()
    broker.stop()  # idempotent
    assert not _alive(pid)
    assert _pids_mentioning(str(root)) == []
    assert not root.exists()


_CHILD = """
import json, os, signal, sys, time
from bridge.config import load_settings
from bridgedev.kafka import provide_broker
base = load_settings()
local = base.kafka.local.model_copy(update={"use_docker": False})
kafka = base.kafka.model_copy(update={"bootstrap_servers": None, "local": local})
settings = base.model_copy(update={"kafka": kafka})
broker = provide_broker(settings, progress=lambda _: None)
print(json.dumps({"pid": broker.process.pid, "root": str(broker.root)}), flush=True)
if sys.argv[1] == "hang":
    time.sleep(600)
"""


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_local_broker_dies_with_its_python_process(ending: str) -> None:
    """atexit stops the broker on a normal exit; PR_SET_PDEATHSIG when Python is killed."""
    _needs_local_jars()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, "exit" if ending == "exit" else "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            pytest.fail(f"child failed: {child.communicate(timeout=30)[1][-3000:]}")
        started = json.loads(line)
        if ending == "sigkill":
            assert _alive(started["pid"])
            child.kill()
        child.wait(timeout=60)
        wait_until_sync(lambda: not _alive(started["pid"]), 20, what="the broker died")
        assert _pids_mentioning(started["root"]) == []
        if ending == "exit":
            assert not Path(started["root"]).exists()
    finally:
        child.kill()
        child.wait()


def _needs_local_jars() -> None:
    """Skip (fail under CI) when the jars cannot be had: no Java, no Maven."""
    _or_skip(lambda: ensure_kafka_jars(_local_settings(), progress=lambda _: None))


@pytest.mark.kafka
def test_local_broker_start_failure_shows_log() -> None:
    _needs_local_jars()
    started = time.monotonic()
    with pytest.raises(KafkaProviderError, match="exited during start-up") as info:
        provide_broker(_local_settings(heap="1k"), progress=lambda _: None)
    assert "heap" in str(info.value).lower()  # the JVM's own complaint, from the log tail
    assert time.monotonic() - started < 60


def test_bad_heap_setting() -> None:
    started = time.monotonic()
    with pytest.raises(KafkaProviderError, match="not a JVM heap size"):
        provide_broker(_local_settings(heap="lots"), progress=lambda _: None)
    with pytest.raises(KafkaProviderError, match="not a JVM heap size"):
        start_local_detached(_local_settings(heap="lots"), progress=lambda _: None)
    assert time.monotonic() - started < 1.0


# --- the detached broker -----------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_detached_start_status_stop(tmp_path: Path, topic_prefix: str) -> None:
    state_dir = tmp_path / "state"
    settings = _local_settings(state_dir=state_dir)
    assert local_status(settings) is None
    assert stop_local_detached(settings) is False
    info = _or_skip(lambda: start_local_detached(settings, progress=lambda _: None))
    try:
        assert info.provider == "local"
        state = json.loads((state_dir / "state.json").read_text())
        pid = int(state["pid"])
        assert _alive(pid)
        assert Path(state["log"]).is_file()
        # the broker is not our child: it is meant to outlive the CLI
        assert Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1] != str(
            os.getpid()
        )
        # idempotent start, and status agrees
        assert start_local_detached(settings, progress=lambda _: None) == info
        assert local_status(settings) == info
        assert asyncio.run(_round_trip(info.bootstrap_servers, f"{topic_prefix}.keep")) == b"hello"

        assert stop_local_detached(settings) is True
        assert not _alive(pid)
        assert _pids_mentioning(str(state_dir)) == []
        assert stop_local_detached(settings) is False
        assert local_status(settings) is None

        # the data survives a stop/start
        restarted = start_local_detached(settings, progress=lambda _: None)
        assert local_status(settings) == restarted
        assert f"{topic_prefix}.keep" in asyncio.run(_topics(restarted.bootstrap_servers))
    finally:
        stop_local_detached(settings)
    assert _pids_mentioning(str(state_dir)) == []
    assert local_status(settings) is None


def test_status_cleans_stale_state(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state_dir / "state.json").write_text(
        json.dumps({"pid": dead.pid, "port": _closed_port(), "bootstrap_servers": "x:1"})
    )
    settings = _local_settings(state_dir=state_dir)
    assert local_status(settings) is None
    assert not (state_dir / "state.json").exists()
    assert stop_local_detached(settings) is False


# --- the jars ----------------------------------------------------------------------------------


def test_jars_are_fetched_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _local_settings()
    libs = _or_skip(lambda: ensure_kafka_jars(settings, progress=lambda _: None))
    jars = {p.name for p in libs.glob("*.jar")}
    assert f"kafka_2.13-{settings.kafka.local.version}.jar" in jars
    assert any(j.startswith("log4j-slf4j") for j in jars)  # the slf4j binding Kafka lacks
    # cached: no Maven needed any more
    monkeypatch.setenv("PATH", str(tmp_path))
    messages: list[str] = []
    assert ensure_kafka_jars(settings, progress=messages.append) == libs
    assert messages == []


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    settings = _local_settings(cache_dir=tmp_path / "cache")
    with pytest.raises(KafkaProviderError, match="Maven"):
        ensure_kafka_jars(settings, progress=lambda _: None)


@pytest.mark.slow
def test_concurrent_fetch_redoes_a_partial_one(tmp_path: Path) -> None:
    settings = _local_settings(cache_dir=tmp_path / "cache")
    home = tmp_path / "cache" / f"kafka-{settings.kafka.local.version}"
    # what a crashed fetch leaves: jars without the completion marker
    (home / "libs").mkdir(parents=True)
    (home / "libs" / "junk.jar").write_text("not a jar")
    (home / "libs.partial").mkdir()
    messages: list[str] = []
    results: list[Path | BaseException] = []

    def fetch() -> None:
        try:
            results.append(ensure_kafka_jars(settings, progress=messages.append))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors and isinstance(errors[0], KafkaProviderError):
        unavailable(f"local Kafka unavailable: {errors[0]}")
    assert len(results) == 2 and not errors, results
    assert results[0] == results[1] == home / "libs"
    assert sum("fetching Kafka" in m for m in messages) == 1, messages
    assert not (home / "libs" / "junk.jar").exists()
    assert not (home / "libs.partial").exists()
    assert (
        json.loads((home / "complete.json").read_text())["version"] == settings.kafka.local.version
    )

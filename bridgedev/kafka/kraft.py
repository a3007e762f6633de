"""A KRaft broker in a directory (a single node, or one node of a cluster): its configuration files, its storage format, its
JVM command line, its listener ports, and the wait until it answers.

Layout of a broker directory (``root``): ``server.properties``, ``log4j2.properties``,
``server.log`` (the JVM's stdout+stderr; log4j writes INFO there), ``format.log`` and
``kraft/`` (Kafka's ``log.dirs``).

Plaintext by default; given a :class:`~bridgedev.kafka.security.BrokerSecurity`, the listeners
are the secured ones it describes and the storage format adds its SCRAM users.

Shared by the throwaway broker (:mod:`bridgedev.kafka.local`) and the long-lived one
(:mod:`bridgedev.kafka.detached`); the Docker broker takes its single-node settings from here.
It fetches no jars and owns no process: the callers spawn the command and stop it.
"""

from __future__ import annotations

import base64
import contextlib
import re
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path

from bridge.kafka.probe import _api_versions
from bridgedev.kafka.broker import KafkaProviderError
from bridgedev.kafka.files import _tail_file, _write_atomic
from bridgedev.kafka.process import _pid_alive
from bridgedev.kafka.security import BrokerSecurity

# Measured on 2 cores (Kafka 4.1.1): serial GC + C1 only starts the broker in ~3.4 s instead of
# ~6.8 s with the default G1 + C2, and the storage format in ~1.5 s instead of ~3 s.
_JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def _replication_config(factor: int, min_isr: int) -> dict[str, str]:
    """Replication of Kafka's internal topics (consumer offsets, transactions, share state)."""
    return {
        "offsets.topic.replication.factor": str(factor),
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": str(min_isr),
    }


# Settings of every development broker, however many nodes: no rebalance delay, no topic
# created by accident, and retention observable within a test.
_OBSERVABLE_CONFIG: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
}

# Broker settings shared by the local and the Docker provider (single node, observable
# retention in tests). Kafka ignores (with a warning) the ones an older version lacks.
_SINGLE_NODE_CONFIG: dict[str, str] = {**_replication_config(1, 1), **_OBSERVABLE_CONFIG}


_LOG4J2_BROKER = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""
_LOG4J2_TOOL = _LOG4J2_BROKER.replace("rootLogger.level = INFO", "rootLogger.level = WARN")


def _broker_command(java: str, libs: Path, root: Path, heap: str) -> list[str]:
    xms = "256m" if _heap_bytes(heap) >= 256 * 2**20 else heap
    return [
        java,
        f"-Xms{xms}",
        f"-Xmx{heap}",
        *_JVM_FLAGS,
        f"-Dlog4j2.configurationFile={root / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(root / "server.properties"),
    ]


def _heap_bytes(heap: str) -> int:
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", heap.strip())
    if not match:
        raise KafkaProviderError(
            f"kafka.local.heap {heap!r} is not a JVM heap size such as 512m or 1g"
        )
    unit = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2).lower()]
    return int(match.group(1)) * unit


def _write_config(
    root: Path, port: int, cport: int, security: BrokerSecurity | None = None
) -> None:
    # a secured broker's properties hold the PLAIN passwords
    _write_node_files(root, _server_config(root, port, cport, security), private=bool(security))


def _write_node_files(root: Path, config: dict[str, str], *, private: bool = False) -> None:
    """``server.properties`` (``config``) and the log4j files of the node directory ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    _write_atomic(root / "server.properties", _properties_text(config), private=private)
    _write_atomic(root / "log4j2.properties", _LOG4J2_BROKER)
    _write_atomic(root / "log4j2-tool.properties", _LOG4J2_TOOL)


def _server_config(
    root: Path, port: int, cport: int, security: BrokerSecurity | None = None
) -> dict[str, str]:
    """``server.properties`` of a single-node broker and controller on 127.0.0.1, plaintext
    unless ``security`` secures it."""
    listeners = (
        _listener_config(port, cport) if security is None else security.server_config(port, cport)
    )
    return _node_config(root, 1, f"1@127.0.0.1:{cport}", listeners)


def _node_config(
    root: Path,
    node_id: int,
    voters: str,
    listeners: dict[str, str],
    overrides: dict[str, str] | None = None,
) -> dict[str, str]:
    """``server.properties`` of one combined broker and controller among ``voters``
    (``id@host:port,...``); ``overrides`` replace the single-node defaults in place."""
    config = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        **listeners,
        "log.dirs": str(root / "kraft"),
        "num.partitions": "1",
        **_SINGLE_NODE_CONFIG,
    }
    config.update(overrides or {})
    return config


def _listener_config(
    port: int,
    cport: int,
    *,
    advertised_port: int | None = None,
    broker_port: int | None = None,
) -> dict[str, str]:
    """The listeners, all plaintext: clients on ``port`` (advertised at ``advertised_port``
    when a proxy stands in front), the controller on ``cport``, and brokers talking to each
    other on ``broker_port`` if given (else on the client listener)."""
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}"
    advertised = f"PLAINTEXT://127.0.0.1:{advertised_port or port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    inter_broker = "PLAINTEXT"
    if broker_port is not None:
        listeners += f",BROKER://127.0.0.1:{broker_port}"
        advertised += f",BROKER://127.0.0.1:{broker_port}"
        protocols += ",BROKER:PLAINTEXT"
        inter_broker = "BROKER"
    return {
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": inter_broker,
        "listener.security.protocol.map": protocols,
    }


def _properties_text(config: dict[str, str]) -> str:
    lines = ["# generated by bridgedev.kafka.kraft; rewritten at every start"]
    lines += [f"{key}={value}" for key, value in config.items()]
    return "\n".join(lines) + "\n"


def _format_storage(
    java: str,
    libs: Path,
    root: Path,
    security: BrokerSecurity | None = None,
    cluster_id: str | None = None,
) -> None:
    """Format ``root``'s storage; every node of one cluster is formatted with one ``cluster_id``
    (a fresh one when None)."""
    cmd = _format_command(java, libs, root, cluster_id)
    if security is not None:
        cmd += security.scram_format_args()
    with (root / "format.log").open("wb") as log:
        try:
            done = subprocess.run(
                cmd,
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=120,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaProviderError("formatting the Kafka storage took over 120 s") from exc
    if done.returncode != 0:
        # the SCRAM arguments hold the users' passwords: not in an error message
        shown = _format_command(java, libs, root) + (["--add-scram ..."] if security else [])
        raise KafkaProviderError(
            f"formatting the Kafka storage failed (exit {done.returncode}): "
            f"{' '.join(shown)}\n{_tail_file(root / 'format.log', 30)}"
        )


def _format_command(java: str, libs: Path, root: Path, cluster_id: str | None = None) -> list[str]:
    """``kafka-storage format`` of ``root``'s ``log.dirs`` under ``cluster_id`` (else a fresh
    one)."""
    return [
        java,
        "-Xmx256m",
        *_JVM_FLAGS,
        f"-Dlog4j2.configurationFile={root / 'log4j2-tool.properties'}",
        "-cp",
        f"{libs}/*",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id or _cluster_id(),
        "-c",
        str(root / "server.properties"),
    ]


def _cluster_id() -> str:
    """A random Kafka cluster id: 22 chars of URL-safe base64, never starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _wait_ready(
    pid: int,
    root: Path,
    port: int,
    timeout_s: float,
    log_offset: int,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Wait until the broker answers ApiVersions on its client ``port`` (over ``tls`` if given).

    The broker opens its client listener only at the very end of start-up: on 4.1.1 the first
    answer comes at the same instant as the log line "Kafka Server started". ``log_offset`` is
    where this run's output starts in ``server.log`` (the detached broker appends to it).
    """
    log = root / "server.log"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _api_versions("127.0.0.1", port, 1.0, tls)
            return
        except (OSError, ValueError):
            pass
        if not _pid_alive(pid):
            raise KafkaProviderError(
                f"the local Kafka broker (pid {pid}) exited during start-up; "
                f"last lines of {log}:\n{_tail_file(log, 30, since=log_offset)}"
            )
        if time.monotonic() > deadline:
            raise KafkaProviderError(
                f"the local Kafka broker (pid {pid}) did not answer within {timeout_s:g} s "
                f"(kafka.local.start_timeout_s); last lines of {log}:\n"
                f"{_tail_file(log, 30, since=log_offset)}"
            )
        time.sleep(0.1)


def _port_clash(root: Path, log_offset: int) -> bool:
    return "Address already in use" in _tail_file(root / "server.log", 200, since=log_offset)


def _free_port_pair() -> tuple[int, int]:
    """Two distinct free ports on 127.0.0.1 (bound to port 0 together, then released)."""
    first, second = _free_ports(2)
    return first, second


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (bound to port 0 together, then released)."""
    with contextlib.ExitStack() as stack:
        socks = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

"""One Kafka provider for the CLI and the tests.

:func:`provide_broker` hands out a running broker, trying in order

1. the cluster named by ``settings.kafka_bootstrap_servers`` (checked with an ApiVersions
   request; :meth:`Broker.stop` leaves it alone),
2. a Docker engine, if ``settings.local_kafka.use_docker`` and one answers within ~1.5 s
   (testcontainers' ``KafkaContainer`` in KRaft mode),
3. a single-node KRaft broker run from the Maven Central jars of
   ``org.apache.kafka:kafka_2.13:<settings.local_kafka.version>`` in a fresh temporary
   directory, killed (process group) on :meth:`Broker.stop` and at interpreter exit.

:func:`start_local_detached`, :func:`local_status` and :func:`stop_local_detached` manage the
long-lived broker of ``bridge kafka start|status|stop``: same jars, but its data, config, log
and ``state.json`` live in ``settings.local_kafka.state_dir`` and it outlives the CLI.

Layout of a broker directory (``root``): ``server.properties``, ``log4j2.properties``,
``server.log`` (the JVM's stdout+stderr; log4j writes INFO there), ``format.log`` and
``kraft/`` (Kafka's ``log.dirs``).
"""

from __future__ import annotations

import abc
import atexit
import base64
import contextlib
import fcntl
import importlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from bridge.config import Settings

__all__ = [
    "DOCKER_IMAGE",
    "Broker",
    "BrokerInfo",
    "DockerBroker",
    "DockerProbe",
    "ExternalBroker",
    "KafkaProviderError",
    "LocalBroker",
    "check_bootstrap",
    "detect_docker",
    "ensure_kafka_jars",
    "local_status",
    "provide_broker",
    "start_local",
    "start_local_detached",
    "stop_local_detached",
]

Progress = Callable[[str], None]

#: Image for the Docker provider. Confluent Platform 7.9 is Kafka 3.9; testcontainers'
#: ``KafkaContainer.with_kraft()`` does not work with the 8.x (Kafka 4) images.
DOCKER_IMAGE = "confluentinc/cp-kafka:7.9.0"
#: Bound of the "does the external cluster answer" check of :func:`provide_broker`.
EXTERNAL_PROBE_TIMEOUT_S = 5.0
#: Bound of the Docker engine probe.
DOCKER_PROBE_TIMEOUT_S = 1.5
#: Grace between SIGTERM and SIGKILL when stopping an in-process (throwaway) broker.
EPHEMERAL_STOP_GRACE_S = 10.0

# Measured on 2 cores (Kafka 4.1.1): serial GC + C1 only starts the broker in ~3.4 s instead of
# ~6.8 s with the default G1 + C2, and the storage format in ~1.5 s instead of ~3 s.
_JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
_MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
#: log4j2 version when the Kafka version brings none at runtime (4.0.x needs it to start).
_DEFAULT_LOG4J = "2.24.3"
_DEFAULT_SLF4J = "1.7.36"
_MAVEN_TIMEOUT_S = 900.0
_TMP_PREFIX = "bridge-kafka-"

# Broker settings shared by the local and the Docker provider (single node, observable
# retention in tests). Kafka ignores (with a warning) the ones an older version lacks.
_SINGLE_NODE_CONFIG: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
}

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


# --- public types ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerInfo:
    """Where a broker answers and what provides it."""

    bootstrap_servers: str
    provider: Literal["external", "docker", "local"]
    #: Human text: version, pid, log file, container id...
    detail: str


class KafkaProviderError(Exception):
    """No broker could be provided; the message says why and what to do next."""


class Broker(abc.ABC):
    """A running broker. :meth:`stop` is idempotent; also a context manager."""

    info: BrokerInfo

    def __init__(self, info: BrokerInfo) -> None:
        self.info = info

    @property
    def bootstrap_servers(self) -> str:
        return self.info.bootstrap_servers

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the broker (if this handle owns it); safe to call more than once."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.provider} {self.info.bootstrap_servers}>"


class ExternalBroker(Broker):
    """A cluster somebody else runs: :meth:`stop` does nothing."""

    def stop(self) -> None:
        return None


class DockerBroker(Broker):
    """A testcontainers ``KafkaContainer``; :meth:`stop` removes the container."""

    def __init__(self, info: BrokerInfo, container: Any) -> None:
        super().__init__(info)
        self._container: Any = container
        self._lock = threading.Lock()

    def stop(self) -> None:
        with self._lock:
            container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()


class LocalBroker(Broker):
    """A throwaway local broker: its own process group and temporary directory.

    :meth:`stop` kills the process group and deletes the directory; the same happens at
    interpreter exit for brokers still running then. The broker also gets ``SIGKILL`` when the
    Python process dies (``PR_SET_PDEATHSIG``) if it was started from the main thread.
    """

    def __init__(self, info: BrokerInfo, process: subprocess.Popen[bytes], root: Path) -> None:
        super().__init__(info)
        self.process = process
        self.root = root
        self._lock = threading.Lock()
        self._stopped = False
        _LIVE_BROKERS.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            _terminate_group(self.process.pid, EPHEMERAL_STOP_GRACE_S, self.process)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            _LIVE_BROKERS.discard(self)


_LIVE_BROKERS: set[LocalBroker] = set()


@atexit.register
def _stop_live_brokers() -> None:
    for broker in list(_LIVE_BROKERS):
        with contextlib.suppress(Exception):
            broker.stop()


# --- the provider ------------------------------------------------------------------------------


def provide_broker(settings: Settings, *, progress: Progress | None = None) -> Broker:
    """A running broker: the configured cluster, else Docker, else local jars (see module doc)."""
    say = progress or _stderr_progress
    if settings.kafka_bootstrap_servers:
        addr = check_bootstrap(
            settings.kafka_bootstrap_servers,
            settings.kafka_security_protocol,
            timeout_s=EXTERNAL_PROBE_TIMEOUT_S,
        )
        return ExternalBroker(
            BrokerInfo(
                settings.kafka_bootstrap_servers,
                "external",
                f"configured cluster ({settings.kafka_security_protocol}); {addr} answered",
            )
        )
    if settings.local_kafka.use_docker:
        probe = detect_docker()
        if probe.available:
            try:
                return _start_docker(settings, say)
            except KafkaProviderError as exc:
                say(f"Docker Kafka failed, falling back to local jars: {exc}")
        else:
            say(f"{probe.reason}; using local Kafka jars")
    return start_local(settings, progress=say)


def check_bootstrap(
    bootstrap_servers: str,
    security_protocol: str = "PLAINTEXT",
    *,
    timeout_s: float = EXTERNAL_PROBE_TIMEOUT_S,
) -> str:
    """Check that a broker of ``bootstrap_servers`` answers; returns the address that did.

    Plaintext and SASL_PLAINTEXT listeners get a Kafka ApiVersions request (answered before
    authentication); TLS listeners only a TCP connect. All addresses share ``timeout_s``.
    """
    addresses = _parse_bootstrap(bootstrap_servers)
    deadline = time.monotonic() + timeout_s
    errors: list[str] = []
    for host, port in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            errors.append(f"{host}:{port}: not tried (time budget of {timeout_s:g} s spent)")
            continue
        try:
            if security_protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
                _api_versions(host, port, remaining)
            else:
                socket.create_connection((host, port), timeout=remaining).close()
        except (OSError, ValueError) as exc:
            errors.append(f"{host}:{port}: {_describe_socket_error(exc)}")
        else:
            return f"{host}:{port}"
    raise KafkaProviderError(
        f"the configured Kafka cluster {bootstrap_servers!r} does not answer ("
        + "; ".join(errors)
        + "). Start it, fix BRIDGE_KAFKA_BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS, or unset "
        "them to use a local broker."
    )


# --- Docker ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DockerProbe:
    available: bool
    reason: str


def detect_docker(timeout_s: float = DOCKER_PROBE_TIMEOUT_S) -> DockerProbe:
    """Whether a Docker engine answers a ping within ``timeout_s`` (never takes much longer).

    Uses testcontainers' idea of the Docker host (its properties file, ``DOCKER_HOST``, the
    current Docker context). The probe runs in a daemon thread so that even an engine that
    accepts connections and never answers cannot hold the caller past the bound.
    """
    result: list[DockerProbe] = []

    def probe() -> None:
        try:
            docker = importlib.import_module("docker")
            tc_client = importlib.import_module("testcontainers.core.docker_client")
        except ImportError as exc:
            result.append(DockerProbe(False, f"docker/testcontainers not installed ({exc})"))
            return
        try:
            host = tc_client.get_docker_host()
            if host:
                client = docker.DockerClient(base_url=host, timeout=timeout_s)
            else:
                client = docker.from_env(timeout=timeout_s)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:
            result.append(DockerProbe(False, f"no Docker engine answers ({_one_line(exc)})"))
        else:
            result.append(DockerProbe(True, f"Docker engine at {host or 'the default socket'}"))

    thread = threading.Thread(target=probe, name="docker-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.2)
    if not result:
        return DockerProbe(False, f"the Docker engine did not answer within {timeout_s:g} s")
    return result[0]


def _start_docker(settings: Settings, say: Progress) -> Broker:
    try:
        tc_kafka = importlib.import_module("testcontainers.community.kafka")
    except ImportError as exc:
        raise KafkaProviderError(f"testcontainers' Kafka module is missing: {exc}") from exc
    say(f"starting Kafka in Docker ({DOCKER_IMAGE}, KRaft)")
    started = time.monotonic()
    container: Any = None
    try:
        container = tc_kafka.KafkaContainer(image=DOCKER_IMAGE).with_kraft()
        for key, value in _SINGLE_NODE_CONFIG.items():
            if not key.startswith("share."):  # Kafka 3.9 has no share coordinator
                container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
        container.start(timeout=int(settings.local_kafka.start_timeout_s))
        bootstrap = container.get_bootstrap_server()
        _api_versions(*_parse_bootstrap(bootstrap)[0], timeout_s=10.0)
        container_id = container.get_wrapped_container().short_id
    except Exception as exc:
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()
        raise KafkaProviderError(f"Kafka in Docker did not start: {_one_line(exc)}") from exc
    say(f"Kafka (Docker) ready at {bootstrap} in {time.monotonic() - started:.1f} s")
    return DockerBroker(
        BrokerInfo(bootstrap, "docker", f"{DOCKER_IMAGE}, container {container_id}"), container
    )


# --- jars --------------------------------------------------------------------------------------


def ensure_kafka_jars(settings: Settings, progress: Progress | None = None) -> Path:
    """The directory with every jar the broker needs, fetched with Maven on first use.

    ``<cache_dir>/kafka-<version>/libs``; ``complete.json`` beside it is written last, so a
    crashed fetch is redone; an ``fcntl`` lock serialises concurrent fetchers (the loser waits
    and then finds the jars complete).
    """
    say = progress or _stderr_progress
    version = settings.local_kafka.version
    home = _abs(settings.local_kafka.cache_dir) / f"kafka-{version}"
    libs = home / "libs"
    marker = home / "complete.json"
    if _jars_complete(libs, marker):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaProviderError(
            "Maven (`mvn`) is not on PATH; it fetches the Kafka jars for the local broker. "
            "Install Maven (e.g. `apt-get install maven`) or point BRIDGE_KAFKA_BOOTSTRAP_SERVERS "
            "at a running cluster."
        )
    _java_command()  # a missing/old Java is worth knowing before a 100 MB download
    home.mkdir(parents=True, exist_ok=True)
    with _file_lock(home / ".fetch.lock", say, "another process is fetching the Kafka jars"):
        if _jars_complete(libs, marker):
            return libs
        marker.unlink(missing_ok=True)
        partial = home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(libs, ignore_errors=True)
        say(f"fetching Kafka {version} jars with Maven into {libs} (first use only, ~45 MB)")
        started = time.monotonic()
        kafka_pom = home / "pom-kafka.xml"
        kafka_pom.write_text(
            _pom("kafka", [("org.apache.kafka", "kafka_2.13", version)]), encoding="utf-8"
        )
        _run_maven(mvn, kafka_pom, partial, transitive=True)
        if not (partial / f"kafka_2.13-{version}.jar").is_file():
            raise KafkaProviderError(f"Maven did not deliver kafka_2.13-{version}.jar to {partial}")
        logging_deps = _logging_dependencies(partial)
        log_pom = home / "pom-logging.xml"
        log_pom.write_text(_pom("logging", logging_deps), encoding="utf-8")
        _run_maven(mvn, log_pom, partial, transitive=False)
        jars = sorted(p.name for p in partial.glob("*.jar"))
        os.replace(partial, libs)
        _write_atomic(
            marker,
            json.dumps(
                {"version": version, "logging": [":".join(d) for d in logging_deps], "jars": jars},
                indent=1,
            ),
        )
        size = sum((libs / j).stat().st_size for j in jars)
        say(
            f"fetched {len(jars)} jars ({size / 2**20:.0f} MB) in {time.monotonic() - started:.1f} s"
        )
    return libs


def _jars_complete(libs: Path, marker: Path) -> bool:
    try:
        jars = json.loads(marker.read_text(encoding="utf-8"))["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(jars) and all((libs / j).is_file() for j in jars)


def _logging_dependencies(libs: Path) -> list[tuple[str, str, str]]:
    """The log4j2 backend the resolved Kafka jars lack, matched to their slf4j and log4j.

    Kafka 4.x logs through slf4j-api 1.7.36 but ships no binding in its Maven metadata; 4.1+
    brings log4j-api/-core (via kafka-server), 4.0 none at all. The slf4j 1 binding is
    ``log4j-slf4j-impl``; an slf4j 2 API would need ``log4j-slf4j2-impl``.
    """
    slf4j = _jar_version(libs, "slf4j-api")
    log4j = _jar_version(libs, "log4j-core") or _jar_version(libs, "log4j-api") or _DEFAULT_LOG4J
    deps: list[tuple[str, str, str]] = []
    if slf4j is None:
        slf4j = _DEFAULT_SLF4J
        deps.append(("org.slf4j", "slf4j-api", slf4j))
    for artifact in ("log4j-api", "log4j-core"):
        if _jar_version(libs, artifact) is None:
            deps.append(("org.apache.logging.log4j", artifact, log4j))
    binding = "log4j-slf4j2-impl" if int(slf4j.split(".")[0]) >= 2 else "log4j-slf4j-impl"
    deps.append(("org.apache.logging.log4j", binding, log4j))
    return deps


def _jar_version(libs: Path, artifact: str) -> str | None:
    pattern = re.compile(rf"^{re.escape(artifact)}-(\d+\.\d+[^/]*)\.jar$")
    for jar in libs.glob(f"{artifact}-*.jar"):
        match = pattern.match(jar.name)
        if match:
            return match.group(1)
    return None


def _pom(name: str, deps: list[tuple[str, str, str]]) -> str:
    dependencies = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by bridge.kafka.broker: the jars of the local Kafka broker -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.mcp-kafka-bridge</groupId>
  <artifactId>kafka-broker-{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def _run_maven(mvn: str, pom: Path, out: Path, *, transitive: bool) -> None:
    cmd = [
        mvn,
        "-B",
        "-q",
        "-Dstyle.color=never",
        "-f",
        str(pom),
        f"{_MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out}",
    ]
    if not transitive:
        cmd.append("-DexcludeTransitive=true")
    try:
        done = subprocess.run(
            cmd,
            cwd=pom.parent,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_MAVEN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaProviderError(
            f"Maven did not finish fetching the Kafka jars within {_MAVEN_TIMEOUT_S:g} s: "
            f"{' '.join(cmd)}"
        ) from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
        raise KafkaProviderError(
            f"Maven failed (exit {done.returncode}) fetching the Kafka jars with "
            f"`{' '.join(cmd)}`; is Maven Central reachable and the version "
            f"right? Last lines:\n{_tail_text(output, 25)}"
        )


# --- the throwaway local broker ------------------------------------------------------------------


def start_local(settings: Settings, *, progress: Progress | None = None) -> LocalBroker:
    """Start a throwaway single-node broker in a fresh temporary directory."""
    say = progress or _stderr_progress
    _heap_bytes(settings.local_kafka.heap)  # a bad setting fails before any slow step
    libs = ensure_kafka_jars(settings, say)
    java = _java_command()
    _sweep_orphans()
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
    try:
        _write_atomic(root / "owner.json", json.dumps({"owner_pid": os.getpid()}))
        port, cport = _free_port_pair()
        _write_config(root, port, cport)
        say(f"formatting Kafka storage in {root}")
        _format_storage(java, libs, root)
        for attempt in (1, 2, 3):
            say(
                f"starting local Kafka {settings.local_kafka.version} (heap {settings.local_kafka.heap})"
            )
            log_offset = _file_size(root / "server.log")
            process = _spawn_child(java, libs, root, settings.local_kafka.heap)
            _write_atomic(
                root / "owner.json",
                json.dumps({"owner_pid": os.getpid(), "java_pid": process.pid}),
            )
            try:
                _wait_ready(
                    process.pid, root, port, settings.local_kafka.start_timeout_s, log_offset
                )
                break
            except KafkaProviderError:
                _terminate_group(process.pid, 0.0, process)
                if attempt == 3 or not _port_clash(root, log_offset):
                    raise
                port, cport = _free_port_pair()  # someone took a port we picked; new ones
                _write_config(root, port, cport)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    bootstrap = f"127.0.0.1:{port}"
    elapsed = time.monotonic() - started
    say(f"local Kafka ready at {bootstrap} in {elapsed:.1f} s (pid {process.pid})")
    info = BrokerInfo(
        bootstrap,
        "local",
        f"Kafka {settings.local_kafka.version} from Maven jars, pid {process.pid}, "
        f"log {root / 'server.log'} (temporary)",
    )
    return LocalBroker(info, process, root)


def _spawn_child(java: str, libs: Path, root: Path, heap: str) -> subprocess.Popen[bytes]:
    pdeathsig = (
        _pdeathsig_preexec() if threading.current_thread() is threading.main_thread() else None
    )
    with (root / "server.log").open("ab") as log:
        return subprocess.Popen(
            _broker_command(java, libs, root, heap),
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=pdeathsig,
        )


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the child get SIGKILL when this process dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _sweep_orphans() -> None:
    """Remove temp dirs (and kill brokers) of throwaway brokers whose Python process died."""
    for root in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*"):
        try:
            owner = json.loads((root / "owner.json").read_text(encoding="utf-8"))
            owner_pid = int(owner["owner_pid"])
            java_pid = int(owner.get("java_pid", 0))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _pid_alive(owner_pid):
            continue
        if java_pid and _pid_alive(java_pid) and str(root) in _cmdline(java_pid):
            _terminate_group(java_pid, 0.0, None)
        shutil.rmtree(root, ignore_errors=True)


# --- the detached local broker (bridge kafka start/status/stop) --------------------------------


def start_local_detached(settings: Settings, progress: Progress | None = None) -> BrokerInfo:
    """Start the long-lived local broker in ``state_dir`` (or return the running one's info).

    The broker runs in its own session, not as a child of this process, so it outlives the
    CLI. Its data (``state_dir/kraft``) persists across stop/start.
    """
    say = progress or _stderr_progress
    _heap_bytes(settings.local_kafka.heap)  # a bad setting fails before any slow step
    state_dir = _abs(settings.local_kafka.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(state_dir / ".lock", say, "another `bridge kafka` command holds the lock"):
        state = _read_state(state_dir)
        if state is not None:
            if _state_process_alive(state_dir, state):
                if _answers(state):
                    return _state_info(state)
                say(f"local Kafka pid {state['pid']} is running but does not answer; restarting it")
                _terminate_group(int(state["pid"]), 30.0, None)
            (state_dir / "state.json").unlink(missing_ok=True)
        libs = ensure_kafka_jars(settings, say)
        java = _java_command()
        started = time.monotonic()
        port, cport = _preferred_ports(state_dir)
        _write_config(state_dir, port, cport)
        if not (state_dir / "kraft" / "meta.properties").is_file():
            say(f"formatting Kafka storage in {state_dir / 'kraft'}")
            _format_storage(java, libs, state_dir)
        _rotate_log(state_dir / "server.log")
        log_offset = _file_size(state_dir / "server.log")
        say(f"starting local Kafka {settings.local_kafka.version} in the background")
        pid = _spawn_detached(
            _broker_command(java, libs, state_dir, settings.local_kafka.heap),
            state_dir,
            state_dir / "server.log",
        )
        state = {
            "pid": pid,
            "bootstrap_servers": f"127.0.0.1:{port}",
            "port": port,
            "controller_port": cport,
            "version": settings.local_kafka.version,
            "log": str(state_dir / "server.log"),
            "data_dir": str(state_dir / "kraft"),
            "config": str(state_dir / "server.properties"),
            "started_at": time.time(),
        }
        _write_atomic(state_dir / "state.json", json.dumps(state, indent=1))
        _write_atomic(
            state_dir / "ports.json", json.dumps({"port": port, "controller_port": cport})
        )
        try:
            _wait_ready(pid, state_dir, port, settings.local_kafka.start_timeout_s, log_offset)
        except KafkaProviderError:
            _terminate_group(pid, 0.0, None)
            (state_dir / "state.json").unlink(missing_ok=True)
            raise
        say(f"local Kafka ready at 127.0.0.1:{port} in {time.monotonic() - started:.1f} s")
        return _state_info(state)


def stop_local_detached(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop the detached broker: SIGTERM, then SIGKILL after ``timeout_s``. False if none ran."""
    state_dir = _abs(settings.local_kafka.state_dir)
    if not (state_dir / "state.json").exists():
        return False
    with _file_lock(state_dir / ".lock", None, ""):
        state = _read_state(state_dir)
        if state is None:
            return False
        running = _state_process_alive(state_dir, state)
        if running:
            _terminate_group(int(state["pid"]), timeout_s, None)
        (state_dir / "state.json").unlink(missing_ok=True)
        return running


def local_status(settings: Settings) -> BrokerInfo | None:
    """The detached broker's info if it runs and answers, else None (stale state removed)."""
    state_dir = _abs(settings.local_kafka.state_dir)
    state = _read_state(state_dir)
    if state is None:
        return None
    if not _state_process_alive(state_dir, state):
        with contextlib.suppress(OSError), _try_lock(state_dir / ".lock") as locked:
            if locked:
                again = _read_state(state_dir)
                if again is not None and not _state_process_alive(state_dir, again):
                    (state_dir / "state.json").unlink(missing_ok=True)
        return None
    return _state_info(state) if _answers(state) else None


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((state_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not {"pid", "port", "bootstrap_servers"} <= state.keys():
        return None
    return state


def _state_process_alive(state_dir: Path, state: dict[str, Any]) -> bool:
    pid = int(state["pid"])
    return _pid_alive(pid) and str(state_dir / "server.properties") in _cmdline(pid)


def _answers(state: dict[str, Any]) -> bool:
    try:
        _api_versions("127.0.0.1", int(state["port"]), 2.0)
    except (OSError, ValueError):
        return False
    return True


def _state_info(state: dict[str, Any]) -> BrokerInfo:
    return BrokerInfo(
        str(state["bootstrap_servers"]),
        "local",
        f"Kafka {state.get('version', '?')} from Maven jars, pid {state['pid']}, "
        f"log {state.get('log', '?')}, data {state.get('data_dir', '?')}",
    )


def _preferred_ports(state_dir: Path) -> tuple[int, int]:
    """The ports of the previous run if both are still free (stable address), else new ones."""
    try:
        previous = json.loads((state_dir / "ports.json").read_text(encoding="utf-8"))
        port, cport = int(previous["port"]), int(previous["controller_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return _free_port_pair()
    if port != cport and _port_free(port) and _port_free(cport):
        return port, cport
    return _free_port_pair()


def _spawn_detached(cmd: list[str], cwd: Path, log_path: Path) -> int:
    """Start ``cmd`` in a new session via a short-lived intermediate process; returns its pid.

    The broker is then nobody's child here: it outlives us and never becomes our zombie.
    """
    launcher = (
        "import json, subprocess, sys\n"
        "a = json.loads(sys.argv[1])\n"
        "log = open(a['log'], 'ab')\n"
        "p = subprocess.Popen(a['cmd'], cwd=a['cwd'], stdin=subprocess.DEVNULL, stdout=log,\n"
        "                     stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)\n"
        "print(p.pid, flush=True)\n"
        "p.returncode = 0  # we do not wait for it; silence the 'still running' warning\n"
    )
    arg = json.dumps({"cmd": cmd, "cwd": str(cwd), "log": str(log_path)})
    done = subprocess.run(
        [sys.executable, "-c", launcher, arg],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = done.stdout.decode().strip()
    if done.returncode != 0 or not out.isdigit():
        raise KafkaProviderError(
            f"could not launch the Kafka broker: {_tail_text(done.stderr.decode(), 10)}"
        )
    return int(out)


def _rotate_log(log: Path, limit: int = 32 * 2**20) -> None:
    with contextlib.suppress(OSError):
        if log.stat().st_size > limit:
            os.replace(log, log.with_name(log.name + ".1"))


# --- shared local-broker machinery -------------------------------------------------------------


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
            f"local_kafka.heap {heap!r} is not a JVM heap size such as 512m or 1g"
        )
    unit = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2).lower()]
    return int(match.group(1)) * unit


def _write_config(root: Path, port: int, cport: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{cport}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(root / "kraft"),
        "num.partitions": "1",
        **_SINGLE_NODE_CONFIG,
    }
    lines = ["# generated by bridge.kafka.broker; rewritten at every start"]
    lines += [f"{key}={value}" for key, value in config.items()]
    _write_atomic(root / "server.properties", "\n".join(lines) + "\n")
    _write_atomic(root / "log4j2.properties", _LOG4J2_BROKER)
    _write_atomic(root / "log4j2-tool.properties", _LOG4J2_TOOL)


def _format_storage(java: str, libs: Path, root: Path) -> None:
    cmd = [
        java,
        "-Xmx256m",
        *_JVM_FLAGS,
        f"-Dlog4j2.configurationFile={root / 'log4j2-tool.properties'}",
        "-cp",
        f"{libs}/*",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        _cluster_id(),
        "-c",
        str(root / "server.properties"),
    ]
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
        raise KafkaProviderError(
            f"formatting the Kafka storage failed (exit {done.returncode}): "
            f"{' '.join(cmd)}\n{_tail_file(root / 'format.log', 30)}"
        )


def _cluster_id() -> str:
    """A random Kafka cluster id: 22 chars of URL-safe base64, never starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _wait_ready(pid: int, root: Path, port: int, timeout_s: float, log_offset: int) -> None:
    """Wait until the broker answers ApiVersions on its client ``port``.

    The broker opens its client listener only at the very end of start-up: on 4.1.1 the first
    answer comes at the same instant as the log line "Kafka Server started". ``log_offset`` is
    where this run's output starts in ``server.log`` (the detached broker appends to it).
    """
    log = root / "server.log"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _api_versions("127.0.0.1", port, 1.0)
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
                f"(local_kafka.start_timeout_s); last lines of {log}:\n"
                f"{_tail_file(log, 30, since=log_offset)}"
            )
        time.sleep(0.1)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _port_clash(root: Path, log_offset: int) -> bool:
    return "Address already in use" in _tail_file(root / "server.log", 200, since=log_offset)


_JAVA: dict[str, str] = {}


def _java_command() -> str:
    """The ``java`` on PATH, checked once per process to be Java 17 or newer."""
    java = shutil.which("java")
    if java is None:
        raise KafkaProviderError(
            "Java (`java`) is not on PATH; the local Kafka broker needs Java 17+. Install a JDK "
            "(e.g. `apt-get install openjdk-17-jre-headless`) or set BRIDGE_KAFKA_BOOTSTRAP_SERVERS."
        )
    if java in _JAVA:
        return _JAVA[java]
    try:
        done = subprocess.run(
            [java, "-version"],
            capture_output=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaProviderError(f"`{java} -version` failed: {exc}") from exc
    text = (done.stderr + done.stdout).decode("utf-8", "replace")
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise KafkaProviderError(f"cannot tell the Java version from `{java} -version`: {text!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # 1.8 style
        major = int(match.group(2))
    if major < 17:
        raise KafkaProviderError(
            f"{java} is Java {major}; Kafka 4 needs Java 17 or newer. Install a newer JDK or set "
            "BRIDGE_KAFKA_BOOTSTRAP_SERVERS to a running cluster."
        )
    _JAVA[java] = java
    return java


# --- processes ---------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs; a zombie counts as gone (a Popen child is reaped by its wait)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    # the state follows the parenthesised command name, which may itself contain ')'
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode("utf-8", "replace")
        )
    except OSError:
        return ""


def _terminate_group(pid: int, grace_s: float, process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the process group led by ``pid``; SIGKILL it after ``grace_s``; wait for it."""
    if grace_s > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        if _wait_gone(pid, grace_s, process):
            return  # (the broker JVM starts no processes of its own)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _wait_gone(pid, 10.0, process)


def _wait_gone(pid: int, timeout_s: float, process: subprocess.Popen[bytes] | None) -> bool:
    if process is not None:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- small helpers -----------------------------------------------------------------------------


def _abs(path: Path) -> Path:
    """``~`` expanded and made absolute: the JVM runs elsewhere, and pids are matched by path."""
    return path.expanduser().absolute()


def _stderr_progress(message: str) -> None:
    print(f"[kafka] {message}", file=sys.stderr, flush=True)


def _parse_bootstrap(bootstrap_servers: str) -> list[tuple[str, int]]:
    addresses: list[tuple[str, int]] = []
    for raw in bootstrap_servers.split(","):
        item = raw.strip()
        if not item:
            continue
        item = item.split("://", 1)[-1]
        match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", item)
        if match is None:
            raise KafkaProviderError(
                f"bootstrap server {raw.strip()!r} is not host:port (in {bootstrap_servers!r})"
            )
        host = match.group(1) or match.group(3)
        port = int(match.group(2) or match.group(4))
        if not 0 < port < 65536:
            raise KafkaProviderError(f"bootstrap server {raw.strip()!r} has no valid port")
        addresses.append((host, port))
    if not addresses:
        raise KafkaProviderError(f"no bootstrap server in {bootstrap_servers!r}")
    return addresses


def _api_versions(host: str, port: int, timeout_s: float) -> int:
    """Send a Kafka ApiVersions v0 request; returns the number of APIs the broker lists.

    Raises OSError when nothing answers in time, ValueError when the answer is not Kafka's.
    """
    deadline = time.monotonic() + timeout_s
    correlation_id = int.from_bytes(os.urandom(3), "big")
    client_id = b"mcp-kafka-bridge-probe"
    request = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout_s) as sock:

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {timeout_s:g} s")
            return left

        sock.settimeout(remaining())
        sock.sendall(struct.pack(">i", len(request)) + request)

        def recv_exact(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                sock.settimeout(remaining())
                chunk = sock.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("connection closed before a full answer")
                buf += chunk
            return buf

        (size,) = struct.unpack(">i", recv_exact(4))
        if not 6 <= size <= 1 << 20:
            raise ValueError(f"not a Kafka answer (frame size {size})")
        payload = recv_exact(size)
    got_id, error_code = struct.unpack(">ih", payload[:6])
    if got_id != correlation_id:
        raise ValueError("not a Kafka answer (correlation id mismatch)")
    if error_code not in (0, 35):  # 35 UNSUPPORTED_VERSION: still a Kafka broker
        raise ValueError(f"ApiVersions answered with error code {error_code}")
    if error_code == 0 and len(payload) >= 10:
        return int(struct.unpack(">i", payload[6:10])[0])
    return 0


def _describe_socket_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out ({exc})" if str(exc) else "timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host ({exc.strerror})"
    return _one_line(exc)


def _free_port_pair() -> tuple[int, int]:
    """Two distinct free ports on 127.0.0.1 (bound to port 0 together, then released)."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first,
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as second,
    ):
        first.bind(("127.0.0.1", 0))
        second.bind(("127.0.0.1", 0))
        return int(first.getsockname()[1]), int(second.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _file_lock(path: Path, say: Progress | None, waiting_message: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say is not None and waiting_message:
                say(f"waiting: {waiting_message} ({path})")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _try_lock(path: Path) -> Iterator[bool]:
    with path.open("a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _tail_file(path: Path, lines: int, since: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(since, fh.tell() - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return _tail_text(data, lines)


def _tail_text(text: str, lines: int) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join("    " + line for line in kept) or "    (no output)"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

"""The throwaway local broker: a single-node KRaft broker from the Maven jars, in a fresh
temporary directory, owned by this Python process.

:func:`start_local` hands out a :class:`LocalBroker`, :func:`start_secure` a
:class:`SecureBroker` (SASL_SSL under ACLs, :mod:`bridgedev.kafka.security`); stopping it (or this process exiting, or
dying) kills the broker's process group and deletes its directory, and a later start sweeps
what a killed owner left. The long-lived broker of ``bridge kafka start`` is
:mod:`bridgedev.kafka.detached`; choosing between providers is :mod:`bridgedev.kafka.provider`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from bridge.config import Settings
from bridgedev.kafka.broker import (
    Broker,
    BrokerInfo,
    KafkaProviderError,
    Progress,
    SecureBrokerInfo,
    _stderr_progress,
)
from bridgedev.kafka.files import _file_size, _write_atomic
from bridgedev.kafka.jars import _java_command, ensure_kafka_jars
from bridgedev.kafka.kraft import (
    _broker_command,
    _format_storage,
    _free_port_pair,
    _heap_bytes,
    _port_clash,
    _wait_ready,
    _write_config,
)
from bridgedev.kafka.process import _cmdline, _pdeathsig_preexec, _pid_alive, _terminate_group
from bridgedev.kafka.security import BrokerSecurity, new_security

#: Grace between SIGTERM and SIGKILL when stopping an in-process (throwaway) broker.
EPHEMERAL_STOP_GRACE_S = 10.0
_TMP_PREFIX = "bridge-kafka-"


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


#: Throwaway brokers (and clusters, bridgedev.kafka.cluster) to stop at interpreter exit.
_LIVE_BROKERS: set[Broker] = set()


@atexit.register
def _stop_live_brokers() -> None:
    for broker in list(_LIVE_BROKERS):
        with contextlib.suppress(Exception):
            broker.stop()


def start_local(settings: Settings, *, progress: Progress | None = None) -> LocalBroker:
    """Start a throwaway single-node broker in a fresh temporary directory."""
    say = progress or _stderr_progress
    java, libs = _java_and_jars(settings, say)
    with _temp_root() as root:
        process, bootstrap = _run_broker(settings, say, java, libs, root, None)
    return LocalBroker(
        BrokerInfo(bootstrap, "local", _detail(settings, process, root)), process, root
    )


class SecureBroker(LocalBroker):
    """A throwaway local broker whose one client listener is SASL_SSL, under ACLs.

    Its :attr:`info` is a :class:`SecureBrokerInfo`: the bootstrap, the CA file, the admin (a
    super user) and every user created with the storage.
    """

    info: SecureBrokerInfo

    def __init__(
        self, info: SecureBrokerInfo, process: subprocess.Popen[bytes], root: Path
    ) -> None:
        super().__init__(info, process, root)


def start_secure(
    settings: Settings, *, progress: Progress | None = None, users: Iterable[str] = ()
) -> SecureBroker:
    """Start a throwaway broker secured as :mod:`bridgedev.kafka.security` describes.

    ``users``: names to create beside ``admin``, with random passwords (in ``info.users``).
    SCRAM users can only be created with the storage (the Kafka client layer has no call to
    add them later), so ask for all of them here.
    """
    say = progress or _stderr_progress
    java, libs = _java_and_jars(settings, say)
    with _temp_root() as root:
        security = new_security(root, users)
        process, bootstrap = _run_broker(settings, say, java, libs, root, security)
    detail = _detail(settings, process, root) + ", SASL_SSL under ACLs"
    return SecureBroker(security.info(bootstrap, detail), process, root)


def _java_and_jars(settings: Settings, say: Progress) -> tuple[str, Path]:
    """The checks and the fetch before any broker directory exists."""
    _heap_bytes(settings.kafka.local.heap)  # a bad setting fails before any slow step
    libs = ensure_kafka_jars(settings, say)
    java = _java_command()
    _sweep_orphans()
    return java, libs


@contextlib.contextmanager
def _temp_root() -> Iterator[Path]:
    """A fresh broker directory, removed if the start fails."""
    root = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
    try:
        _write_atomic(root / "owner.json", json.dumps({"owner_pid": os.getpid()}))
        yield root
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _run_broker(
    settings: Settings,
    say: Progress,
    java: str,
    libs: Path,
    root: Path,
    security: BrokerSecurity | None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Format ``root``'s storage and run its broker until it answers: the process, the bootstrap."""
    started = time.monotonic()
    port, cport = _free_port_pair()
    _write_config(root, port, cport, security)
    say(f"formatting Kafka storage in {root}")
    _format_storage(java, libs, root, security)
    tls = security.ssl_context() if security else None
    for attempt in (1, 2, 3):
        say(
            f"starting local Kafka {settings.kafka.local.version} (heap {settings.kafka.local.heap})"
        )
        log_offset = _file_size(root / "server.log")
        process = _spawn_child(java, libs, root, settings.kafka.local.heap)
        _write_atomic(
            root / "owner.json", json.dumps({"owner_pid": os.getpid(), "java_pid": process.pid})
        )
        try:
            _wait_ready(
                process.pid, root, port, settings.kafka.local.start_timeout_s, log_offset, tls
            )
            break
        except KafkaProviderError:
            _terminate_group(process.pid, 0.0, process)
            if attempt == 3 or not _port_clash(root, log_offset):
                raise
            port, cport = _free_port_pair()  # someone took a port we picked; new ones
            _write_config(root, port, cport, security)
    bootstrap = f"127.0.0.1:{port}"
    elapsed = time.monotonic() - started
    say(f"local Kafka ready at {bootstrap} in {elapsed:.1f} s (pid {process.pid})")
    return process, bootstrap


def _detail(settings: Settings, process: subprocess.Popen[bytes], root: Path) -> str:
    return (
        f"Kafka {settings.kafka.local.version} from Maven jars, pid {process.pid}, "
        f"log {root / 'server.log'} (temporary)"
    )


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


def _sweep_orphans() -> None:
    """Remove temp dirs (and kill brokers) of throwaway brokers whose Python process died."""
    for root in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*"):
        try:
            owner = json.loads((root / "owner.json").read_text(encoding="utf-8"))
            owner_pid = int(owner["owner_pid"])
            # a cluster (bridgedev.kafka.cluster) lists the JVMs of all its nodes
            java_pids = [int(pid) for pid in owner.get("java_pids", [owner.get("java_pid", 0)])]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _pid_alive(owner_pid):
            continue
        for java_pid in java_pids:
            if java_pid and _pid_alive(java_pid) and str(root) in _cmdline(java_pid):
                _terminate_group(java_pid, 0.0, None)
        shutil.rmtree(root, ignore_errors=True)

"""`bridge serve` and `bridge workers` as subprocesses of a test, on the test's own topics.

Output goes to a log file per process (its tail is shown when a test fails); a process still
running when its test ends is stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bridge.config import Settings
from bridge.log.identity import keyring_env

from .layout import create_served_topics
from .waits import wait_until_sync

__all__ = [
    "Bridge",
    "Proc",
    "bridge_env",
    "free_peer_port",
    "free_port",
    "peer_env",
    "running_bearer_bridge",
    "running_bridge",
    "webhook_keys_env",
]

#: The loopback addresses replicas' peer listeners bind, one each: replicas share one peer port
#: (as pods do), and an owner URL must name it (BRIDGE_PEERS__PORT) and one of these hosts.
PEER_HOSTS = [f"127.0.0.{k}" for k in range(2, 10)]

#: Seconds a bridge may take to answer /readyz (it restores the index and checks Kafka first).
READY_S = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_peer_port() -> int:
    """A port free on every one of :data:`PEER_HOSTS` (held open together while chosen)."""
    with contextlib.ExitStack() as held:
        first = held.enter_context(socket.socket())
        first.bind((PEER_HOSTS[0], 0))
        port = int(first.getsockname()[1])
        try:
            for host in PEER_HOSTS[1:]:
                held.enter_context(socket.socket()).bind((host, port))
        except OSError:
            return free_peer_port()  # taken on another address: draw again
        return port


def peer_env(index: int, port: int) -> dict[str, str]:
    """What replica ``index`` of a group needs for hops: its peer listener on its own loopback
    address and the shared ``port``, advertised as such."""
    host = PEER_HOSTS[index]
    return {
        "BRIDGE_PEERS__ADVERTISED_URL": f"http://{host}:{port}",
        "BRIDGE_PEERS__HOST": host,
        "BRIDGE_PEERS__PORT": str(port),
        "BRIDGE_PEERS__HOSTS": json.dumps(PEER_HOSTS),
    }


def bridge_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment that makes a `bridge` subprocess use ``settings``' broker, topics and tools."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    t = settings.topics
    env.update(
        BRIDGE_KAFKA__BOOTSTRAP_SERVERS=settings.kafka.bootstrap_servers or "",
        BRIDGE_TOPICS__PREFIX=t.prefix,
        BRIDGE_TOPICS__PARTITIONS=str(t.partitions),
        BRIDGE_TOPICS__MIN_INSYNC_REPLICAS=str(t.min_insync_replicas),
        BRIDGE_TASKS__CHECKPOINT_INTERVAL=str(settings.tasks.checkpoint_interval),
        BRIDGE_TASKS__MAX_EVENT_BYTES=str(settings.tasks.max_event_bytes),
        BRIDGE_TOOL_PACKS=json.dumps(settings.tool_packs),
        BRIDGE_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    if settings.kafka.request_timeout_ms is not None:
        env["BRIDGE_KAFKA__REQUEST_TIMEOUT_MS"] = str(settings.kafka.request_timeout_ms)
    env.update(keyring_env(settings))  # replicas verify what the test's publishers sign
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
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "bridge.cli", *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.kill()
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        self.popen.terminate()
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Bridge:
    """A running bridge (and its workers) for a test or a test module."""

    settings: Settings
    port: int
    env: dict[str, str]
    logs: Path
    #: Serve with ``--with-workers`` (the tools run in the server process).
    with_workers: bool = False
    server: Proc | None = None
    workers: list[Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start_server(self) -> Proc:
        args = ["serve", "--port", str(self.port)]
        args += ["--with-workers"] if self.with_workers else []
        self.server = Proc("bridge", args, self.env, self.logs / "bridge.log").start()
        self.wait_ready()
        return self.server

    def start_worker(self, *packs: str) -> Proc:
        args = ["workers"] + [a for p in packs for a in ("--pack", p)]
        name = f"worker{len(self.workers)}"
        proc = Proc(name, args, self.env, self.logs / f"{name}.log")
        self.workers.append(proc.start())
        return proc

    def _ready(self) -> bool:
        server = self.server
        assert server is not None and server.alive(), f"bridge exited:\n{self._tail()}"
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as reply,
        ):
            return bool(reply.status == 200)
        return False

    def _tail(self) -> str:
        return self.server.tail() if self.server else ""

    def wait_ready(self, bound: float = READY_S) -> None:
        wait_until_sync(self._ready, bound, what=lambda: f"the bridge is ready:\n{self._tail()}")

    def stop(self) -> None:
        for proc in [*self.workers, *([self.server] if self.server else [])]:
            proc.stop()


@contextlib.contextmanager
def running_bridge(
    settings: Settings,
    logs: Path,
    *,
    workers: int = 1,
    with_workers: bool = False,
    **env: str,
) -> Iterator[Bridge]:
    """`bridge serve` (and ``workers`` `bridge workers` processes) on ``settings``' topics,
    created first; ``with_workers``: the tools run in the server process instead.
    ``env`` adds to (or overrides) the subprocesses' environment."""
    create_served_topics(settings)
    bridge = Bridge(settings, free_port(), bridge_env(settings, **env), logs, with_workers)
    try:
        for _ in range(workers):
            bridge.start_worker()
        bridge.start_server()
        yield bridge
    finally:
        bridge.stop()


@contextlib.contextmanager
def running_bearer_bridge(
    settings: Settings, logs: Path, tokens: dict[str, str], **env: str
) -> Iterator[Bridge]:
    """:func:`running_bridge` in auth mode ``bearer`` with ``tokens`` (token -> principal),
    written to a tokens file under ``logs``."""
    tokens_file = logs / "tokens.json"
    tokens_file.write_text(json.dumps(tokens))
    auth = {"BRIDGE_AUTH__MODE": "bearer", "BRIDGE_AUTH__TOKENS_FILE": str(tokens_file)}
    with running_bridge(settings, logs, **{**webhook_keys_env(logs), **auth, **env}) as bridge:
        yield bridge


def webhook_keys_env(logs: Path) -> dict[str, str]:
    """The environment of a bridge that seals webhook secrets with a key file under ``logs``
    (made once, shared by every replica started with it)."""
    # Imported here: the upgrade fixtures' generators run these helpers on 8fd441c's code.
    from bridge.sealing import KeyRing

    keys = logs / "webhook-keys.json"
    if not keys.exists():
        KeyRing.with_new_key(keys)
    return {"BRIDGE_WEBHOOKS__KEYS__FILE": str(keys)}

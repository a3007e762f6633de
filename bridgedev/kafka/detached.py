"""The long-lived local broker of ``bridge kafka start|status|stop``.

Same jars and configuration as the throwaway broker (:mod:`bridgedev.kafka.kraft`), but its
data, config, log and ``state.json`` live in ``settings.kafka.local.state_dir``, it runs in a
session of its own and outlives the CLI; its data persists across stop/start. A lock file in
the state directory serialises the commands. Nothing here is used by the test fixtures'
throwaway broker (:mod:`bridgedev.kafka.local`).

``bridge kafka start --secure`` runs the secured broker of :mod:`bridgedev.kafka.security`
instead, from ``state_dir/secure`` (storage, users, certificates), and writes the client
settings file its admin connects with; ``state.json`` says which of the two runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bridge.config import Settings
from bridge.kafka.probe import _api_versions
from bridgedev.kafka.broker import BrokerInfo, KafkaProviderError, Progress, _stderr_progress
from bridgedev.kafka.files import _abs, _file_size, _write_atomic
from bridgedev.kafka.jars import _java_command, ensure_kafka_jars
from bridgedev.kafka.kraft import (
    _broker_command,
    _format_storage,
    _free_port_pair,
    _heap_bytes,
    _port_free,
    _wait_ready,
    _write_config,
)
from bridgedev.kafka.process import (
    _cmdline,
    _file_lock,
    _pid_alive,
    _spawn_detached,
    _terminate_group,
    _try_lock,
)
from bridgedev.kafka.security import (
    BrokerSecurity,
    load_security,
    new_security,
    write_client_config,
)

#: The secured broker's directory under ``state_dir``: its own storage, users and certificates.
_SECURE_ROOT = "secure"


def start_local_detached(
    settings: Settings,
    progress: Progress | None = None,
    *,
    secure: bool = False,
    client_config: Path | None = None,
) -> BrokerInfo:
    """Start the long-lived local broker in ``state_dir`` (or return the running one's info).

    The broker runs in its own session, not as a child of this process, so it outlives the
    CLI. Its data (``state_dir/kraft``) persists across stop/start.

    ``secure``: the broker of :mod:`bridgedev.kafka.security` instead (SASL_SSL under ACLs),
    with its own data in ``state_dir/secure`` (a plaintext broker's storage has no SCRAM
    users); its info is a :class:`SecureBrokerInfo`, and a client settings file for its admin
    is written to ``client_config`` (default ``state_dir/secure-client.toml``). One local
    broker runs at a time: asking for the other kind while one runs is an error.
    """
    say = progress or _stderr_progress
    _heap_bytes(settings.kafka.local.heap)  # a bad setting fails before any slow step
    state_dir = _abs(settings.kafka.local.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(state_dir / ".lock", say, "another `bridge kafka` command holds the lock"):
        state = _running_state(state_dir, say)
        if state is None:
            state = _start(settings, say, state_dir, secure)
        elif bool(state.get("secure")) != secure:
            raise KafkaProviderError(
                f"a {_kind(state)} local broker is running at {state['bootstrap_servers']}; "
                "stop it with `bridge kafka stop` first"
            )
        if secure:
            state = _with_client_config(state_dir, state, client_config)
        return _state_info(state_dir, state)


def _running_state(state_dir: Path, say: Progress) -> dict[str, Any] | None:
    """The state of the broker that runs and answers; a stale or silent one is cleared."""
    state = _read_state(state_dir)
    if state is None:
        return None
    if _state_process_alive(state_dir, state):
        if _answers(state_dir, state):
            return state
        say(f"local Kafka pid {state['pid']} is running but does not answer; restarting it")
        _terminate_group(int(state["pid"]), 30.0, None)
    (state_dir / "state.json").unlink(missing_ok=True)
    return None


def _start(settings: Settings, say: Progress, state_dir: Path, secure: bool) -> dict[str, Any]:
    libs = ensure_kafka_jars(settings, say)
    java = _java_command()
    started = time.monotonic()
    root = state_dir / _SECURE_ROOT if secure else state_dir
    security = _security_of(root, say) if secure else None
    port, cport = _preferred_ports(root)
    _write_config(root, port, cport, security)
    if not (root / "kraft" / "meta.properties").is_file():
        say(f"formatting Kafka storage in {root / 'kraft'}")
        _format_storage(java, libs, root, security)
    _rotate_log(root / "server.log")
    log_offset = _file_size(root / "server.log")
    say(f"starting local Kafka {settings.kafka.local.version} in the background")
    pid = _spawn_detached(
        _broker_command(java, libs, root, settings.kafka.local.heap), root, root / "server.log"
    )
    state = {
        "pid": pid,
        "bootstrap_servers": f"127.0.0.1:{port}",
        "port": port,
        "controller_port": cport,
        "version": settings.kafka.local.version,
        "log": str(root / "server.log"),
        "data_dir": str(root / "kraft"),
        "config": str(root / "server.properties"),
        "secure": secure,
        "started_at": time.time(),
    }
    _write_atomic(state_dir / "state.json", json.dumps(state, indent=1))
    _write_atomic(root / "ports.json", json.dumps({"port": port, "controller_port": cport}))
    try:
        tls = security.ssl_context() if security else None
        _wait_ready(pid, root, port, settings.kafka.local.start_timeout_s, log_offset, tls)
    except KafkaProviderError:
        _terminate_group(pid, 0.0, None)
        (state_dir / "state.json").unlink(missing_ok=True)
        raise
    say(f"local Kafka ready at 127.0.0.1:{port} in {time.monotonic() - started:.1f} s")
    return state


def _security_of(root: Path, say: Progress) -> BrokerSecurity:
    """The users and certificates of the secured broker's directory, made on its first start.

    Its SCRAM users live in the formatted storage: storage without the passwords that made it
    is of no use, so it is formatted anew.
    """
    security = load_security(root)
    if security is not None:
        return security
    if (root / "kraft").exists():
        say(f"no users file for the secured broker's storage; formatting {root / 'kraft'} anew")
        shutil.rmtree(root / "kraft")
    return new_security(root)


def _with_client_config(
    state_dir: Path, state: dict[str, Any], path: Path | None
) -> dict[str, Any]:
    """Write the admin's client settings file; the state remembers where (for the status)."""
    target = _abs(path) if path is not None else state_dir / "secure-client.toml"
    security = load_security(state_dir / _SECURE_ROOT)
    if security is None:
        raise KafkaProviderError(f"the secured broker's users file in {state_dir} is gone")
    write_client_config(security.info(str(state["bootstrap_servers"]), ""), target)
    state = {**state, "client_config": str(target)}
    _write_atomic(state_dir / "state.json", json.dumps(state, indent=1))
    return state


def _kind(state: dict[str, Any]) -> str:
    return "secured (SASL_SSL)" if state.get("secure") else "plaintext"


def stop_local_detached(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop the detached broker: SIGTERM, then SIGKILL after ``timeout_s``. False if none ran."""
    state_dir = _abs(settings.kafka.local.state_dir)
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
    state_dir = _abs(settings.kafka.local.state_dir)
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
    return _state_info(state_dir, state) if _answers(state_dir, state) else None


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
    config = str(state.get("config") or state_dir / "server.properties")
    return _pid_alive(pid) and config in _cmdline(pid)


def _answers(state_dir: Path, state: dict[str, Any]) -> bool:
    security = load_security(state_dir / _SECURE_ROOT) if state.get("secure") else None
    try:
        _api_versions(
            "127.0.0.1", int(state["port"]), 2.0, security.ssl_context() if security else None
        )
    except (OSError, ValueError):
        return False
    return True


def _state_info(state_dir: Path, state: dict[str, Any]) -> BrokerInfo:
    bootstrap = str(state["bootstrap_servers"])
    detail = (
        f"Kafka {state.get('version', '?')} from Maven jars, pid {state['pid']}, "
        f"log {state.get('log', '?')}, data {state.get('data_dir', '?')}"
    )
    security = load_security(state_dir / _SECURE_ROOT) if state.get("secure") else None
    if security is None:
        return BrokerInfo(bootstrap, "local", detail)
    client_config = state.get("client_config")
    return security.info(
        bootstrap, detail + ", SASL_SSL under ACLs", Path(client_config) if client_config else None
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


def _rotate_log(log: Path, limit: int = 32 * 2**20) -> None:
    with contextlib.suppress(OSError):
        if log.stat().st_size > limit:
            os.replace(log, log.with_name(log.name + ".1"))

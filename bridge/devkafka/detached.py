"""The long-lived local broker of ``bridge kafka start|status|stop``.

Same jars and configuration as the throwaway broker (:mod:`bridge.devkafka.kraft`), but its
data, config, log and ``state.json`` live in ``settings.local_kafka.state_dir``, it runs in a
session of its own and outlives the CLI; its data persists across stop/start. A lock file in
the state directory serialises the commands. Nothing here is used by the test fixtures'
throwaway broker (:mod:`bridge.devkafka.local`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from bridge.config import Settings
from bridge.devkafka.broker import BrokerInfo, KafkaProviderError, Progress, _stderr_progress
from bridge.devkafka.files import _abs, _file_size, _write_atomic
from bridge.devkafka.jars import _java_command, ensure_kafka_jars
from bridge.devkafka.kraft import (
    _broker_command,
    _format_storage,
    _free_port_pair,
    _heap_bytes,
    _port_free,
    _wait_ready,
    _write_config,
)
from bridge.devkafka.probe import _api_versions
from bridge.devkafka.process import (
    _cmdline,
    _file_lock,
    _pid_alive,
    _spawn_detached,
    _terminate_group,
    _try_lock,
)


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


def _rotate_log(log: Path, limit: int = 32 * 2**20) -> None:
    with contextlib.suppress(OSError):
        if log.stat().st_size > limit:
            os.replace(log, log.with_name(log.name + ".1"))

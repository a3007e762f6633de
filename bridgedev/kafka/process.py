"""Processes and locks for the local brokers: pid checks, process-group termination, a child
that dies with its parent (``PR_SET_PDEATHSIG``), a detached launch, ``fcntl`` file locks.

Knows nothing of Kafka: :mod:`bridgedev.kafka.local` and :mod:`bridgedev.kafka.detached` say
what to run; this module only starts, watches and stops it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bridgedev.kafka.broker import KafkaProviderError, Progress
from bridgedev.kafka.files import _tail_text


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs; a zombie counts as gone (a Popen child is reaped by its wait)."""
    try:
        state = _process_state(pid)
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
    return state != "Z"


def _process_state(pid: int) -> str:
    """The one-letter state of ``pid`` in ``/proc`` ("T": stopped, "Z": zombie); raises
    OSError (FileNotFoundError: no such process) when it cannot be read."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # the state follows the parenthesised command name, which may itself contain ')'
    return (stat.rpartition(")")[2].split() or [""])[0]


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

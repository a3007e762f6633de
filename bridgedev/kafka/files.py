"""Small file helpers of the local brokers and the jar cache: absolute paths, atomic writes,
log tails for error messages.

Knows nothing of Kafka, processes or sockets.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def _abs(path: Path) -> Path:
    """``~`` expanded and made absolute: the JVM runs elsewhere, and pids are matched by path."""
    return path.expanduser().absolute()


def _write_atomic(path: Path, text: str, *, private: bool = False) -> None:
    """Replace ``path`` by ``text`` at once; ``private``: readable by its owner only (0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover would keep its mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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

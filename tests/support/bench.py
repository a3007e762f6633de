"""Run a benchmark script of bench/ at ``--small`` size as a subprocess on the tests' broker,
and read the results it wrote as JSON (tests check that a bench completes and what its
numbers say, never its timing targets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["REPO", "run_small"]

REPO = Path(__file__).resolve().parent.parent.parent


def run_small(
    script: str, kafka_bootstrap: str | None, out: Path, bound_s: float
) -> dict[str, Any]:
    """``bench/<script> --small --json out``; the JSON, or an assertion with the bench's end.
    ``kafka_bootstrap`` None: a bench that needs no Kafka."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    if kafka_bootstrap is not None:
        env["BRIDGE_KAFKA__BOOTSTRAP_SERVERS"] = kafka_bootstrap
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--small", "--json", str(out)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=bound_s,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    data: dict[str, Any] = json.loads(out.read_text())
    env = data["environment"]  # every report says how fast the host ran Python meanwhile
    assert env["calibration_ms_start"] > 0 and env["calibration_ms_end"] > 0, env
    assert env["cpu_steal"].endswith("%") or env["cpu_steal"] == "?", env
    return data

"""The soak (bench/soak.py) in short: mixed load with random faults, then a clean check.

It runs the script as a subprocess, as a user would; the script starts its own three-broker
cluster (its faults kill and freeze brokers, which the session's ``kafka_cluster`` must not
suffer), so this test needs the Kafka jars that fixture uses, not a broker of its own. When
no cluster can be started the script exits with NO_CLUSTER: a skip, except under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.unavailable import unavailable

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
#: The short soak: a cluster's start on a loaded 2-core machine (85-145 s seen on a busy one;
#: about 30 s on a quiet one), the load's 120 s, the drain and the check.
SOAK_BOUND_S = 540
#: The script's exit code when it could not start a cluster.
NO_CLUSTER = 3
#: The kinds of fault; a short run gets through most of one round (each visits every kind once,
#: in the seed's order), however slow the machine.
KINDS = {
    "broker_kill",
    "broker_freeze",
    "net_cut",
    "net_slow",
    "replica_kill",
    "worker_kill",
    "client_pause",
}


@pytest.mark.timeout(SOAK_BOUND_S + 60)
def test_a_short_soak_injects_every_kind_of_fault_and_the_checker_finds_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    command = [
        sys.executable,
        str(REPO / "bench" / "soak.py"),
        "--seconds",
        "120",
        "--seed",
        "16",
        "--gap-s",
        "1",
        "3",
        "--hold-scale",
        "0.3",
        "--json",
        str(out),
        "--logs",
        str(tmp_path / "logs"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=SOAK_BOUND_S, check=False
    )
    shown = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    if done.returncode == NO_CLUSTER:
        unavailable(f"no three-broker Kafka cluster could be started:\n{done.stderr[-2000:]}")
    assert out.exists(), shown
    soak = json.loads(out.read_text())
    assert soak["checker"]["ok"], shown
    counts = soak["checker"]["counts"]
    assert counts["lost"] == counts["duplicated"] == counts["silently_skipped"] == 0, shown
    assert counts["wrong_seq"] == 0, shown
    assert soak["checker"]["deliveries"] > 0 and soak["checker"]["finished_streams"] > 0
    injected = {fault["kind"] for fault in soak["faults"]}
    assert len(injected & KINDS) >= 5, f"only {sorted(injected)} injected\n{shown}"
    assert all(f["recovery_s"] is not None for f in soak["faults"]), shown
    assert done.returncode == 0, shown

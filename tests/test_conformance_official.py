"""The official MCP conformance suite against a real bridge, real Kafka and real workers.

Runs ``@modelcontextprotocol/conformance`` (installed by ``make test`` into the cache, with the
Node 22 it needs) scenario by scenario against ``bridge serve`` with a ``bridge workers``
process, and fails on any check that is not SUCCESS, INFO or SKIPPED. Scenarios we do not run
are listed with their reason in the README ("Conformance").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bridge.config import running_in_ci

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SUITE_VERSION = "0.2.0-alpha.12"
SUITE_DIR = Path(
    os.environ.get(
        "MCP_CONFORMANCE_DIR",
        Path.home() / ".cache" / "mcp-kafka-bridge" / f"conformance-{SUITE_VERSION}",
    )
)
NODE = SUITE_DIR / "node_modules" / ".bin" / "node"
CLI = SUITE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

TASKS = [
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
]
STATELESS_ONLY = [
    "server-stateless",
    "http-header-validation",
    "http-custom-header-server-validation",
    "caching",
]
BOTH_ERAS = [
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "json-schema-2020-12",
    "dns-rebinding-protection",
]
LEGACY_ONLY = ["server-initialize", "ping"]

# (scenario, extra arguments): without --spec-version the suite picks each scenario's own era
# (2025-11-25 for the tools-* ones); the second run of those forces the stateless 2026 wire.
RUNS = [(s, ()) for s in TASKS + STATELESS_ONLY + BOTH_ERAS + LEGACY_ONLY] + [
    (s, ("--spec-version", "2026-07-28")) for s in BOTH_ERAS
]


@pytest.fixture(scope="module")
def suite() -> Path:
    if not (NODE.exists() and CLI.exists()):
        reason = f"the conformance suite is not installed in {SUITE_DIR} (`make test` installs it)"
        if running_in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return CLI


@pytest.mark.parametrize(
    ("scenario", "extra"), RUNS, ids=[f"{s}{'-2026' if e else ''}" for s, e in RUNS]
)
def test_official_conformance_scenario_passes(bridge, suite, tmp_path, scenario, extra):
    url = f"http://localhost:{bridge.port}/mcp"
    run = subprocess.run(
        [
            str(NODE),
            str(suite),
            "server",
            "--url",
            url,
            "--scenario",
            scenario,
            "-o",
            str(tmp_path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    checks = [
        c for path in sorted(tmp_path.rglob("checks.json")) for c in json.loads(path.read_text())
    ]
    failed = [c for c in checks if c.get("status") not in ("SUCCESS", "INFO", "SKIPPED")]
    detail = "\n".join(
        f"{c.get('status')} {c.get('id')}: {c.get('errorMessage') or ''}" for c in failed
    )
    assert checks, (
        f"the suite produced no checks (exit {run.returncode}):\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    )
    assert not failed, (
        f"{detail}\n--- bridge log ---\n{bridge.server.tail() if bridge.server else ''}"
    )
    assert run.returncode == 0, run.stdout[-2000:]

"""The official MCP conformance suite against the whole bridge and its worker.

Runs ``@modelcontextprotocol/conformance`` (installed by ``make test`` into the cache, with the
Node 22 it needs) scenario by scenario against the bridge in the test process over the in-memory
log (every component of ``bridge serve`` and the conformance pack's worker, on a loopback port),
and fails on any check that is not SUCCESS, INFO or SKIPPED; an end-to-end smoke runs two
scenarios against ``bridge serve`` and a ``bridge workers`` process on real Kafka. Scenarios we do not run
are listed with their reason in the README ("Conformance").
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge
from support.layout import fresh_prefix, make_settings
from support.unavailable import unavailable

pytestmark = pytest.mark.slow

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
        unavailable(
            f"the conformance suite is not installed in {SUITE_DIR} (`make test` installs it)"
        )
    return CLI


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryBridge]:
    """The whole bridge in process over the in-memory log, its log lines kept for failures."""
    logs = tmp_path_factory.mktemp("official") / "bridge.log"
    with memory_bridge(make_settings(NO_BROKER, fresh_prefix("o")), log_path=logs) as running:
        yield running


@pytest.mark.parametrize(
    ("scenario", "extra"), RUNS, ids=[f"{s}{'-2026' if e else ''}" for s, e in RUNS]
)
def test_official_conformance_scenario_passes(bridge, suite, tmp_path, scenario, extra):
    def log_tail() -> str:
        assert bridge.log_path is not None
        return "\n".join(bridge.log_path.read_text(errors="replace").splitlines()[-40:])

    run_scenario(bridge.port, suite, tmp_path, scenario, extra, log_tail)


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", ["tasks-lifecycle", "tools-call-with-progress"])
def test_on_the_broker_official_scenarios_pass(kafka_bridge_module, suite, tmp_path, scenario):
    """End-to-end smoke: `bridge serve` and `bridge workers` on Kafka."""
    server = kafka_bridge_module.server
    run_scenario(
        kafka_bridge_module.port,
        suite,
        tmp_path,
        scenario,
        (),
        lambda: server.tail() if server else "",
    )


def run_scenario(
    port: int,
    suite: Path,
    out: Path,
    scenario: str,
    extra: tuple[str, ...],
    log_tail: Callable[[], str],
) -> None:
    """One scenario of the suite against the bridge on ``port``; every check must pass."""
    url = f"http://localhost:{port}/mcp"
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
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    checks = [c for path in sorted(out.rglob("checks.json")) for c in json.loads(path.read_text())]
    failed = [c for c in checks if c.get("status") not in ("SUCCESS", "INFO", "SKIPPED")]
    detail = "\n".join(
        f"{c.get('status')} {c.get('id')}: {c.get('errorMessage') or ''}" for c in failed
    )
    assert checks, (
        f"the suite produced no checks (exit {run.returncode}):\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    )
    assert not failed, f"{detail}\n--- bridge log ---\n{log_tail()}"
    assert run.returncode == 0, run.stdout[-2000:]

"""The SEP-2694 conformance suite: options, the server under test, hooks, and the clause report.

Options (give them with ``pytest tests/conformance …``, where this conftest is loaded first)::

    --server-url URL        the MCP endpoint to test; absent: start our bridge (in process)
    --on-kafka              start our bridge as `bridge serve` + `bridge workers` on the test Kafka
    --hooks MODULE          hooks module (see hooks.py); default: conformance.bridge_hooks
    --auth-token TOKEN      bearer token of the principal the suite acts as
    --other-auth-token T    bearer token of a second principal (authorization tests)

Without ``--server-url`` the suite starts our bridge with bearer auth, two principals and small
limits it then checks (:data:`SUITE_LIMITS`): the whole app in process over the in-memory log,
served on a loopback port (tests/support/inmemory.py), so the suite needs no broker; with
``--on-kafka``, ``bridge workers`` + ``bridge serve`` on topics of their own on the test Kafka,
and every test is marked ``kafka`` (under CI=1 a missing broker fails the run rather than
skipping it). tests/test_conformance_official.py keeps the end-to-end run on the broker.

The clause report: a clause PASSES only when every one of its tests passed; one skipped, failed
or deselected test is enough for it not to (the worst outcome is shown, see :data:`_RANK`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from .clauses import CLAUSES
from .hooks import DEFAULT_HOOKS, Hooks, ServerUnderTest, known_failures, load_hooks
from .support import TaskPool
from .wire import McpClient

BOUND = 30.0
_HERE = Path(__file__).parent


# --- outcomes, per test, for the clause report ------------------------------------------------


@dataclass
class _Outcome:
    name: str
    keys: list[str]
    status: str = "NOT RUN"
    reason: str = ""


#: nodeid -> outcome, for every conformance test collected in this session.
_OUTCOMES: dict[str, _Outcome] = {}
#: A clause shows the worst outcome of its tests, so it PASSes only when all of them passed:
#: a skipped decisive test must not hide behind a weaker one that passed. XFAIL (a known bug)
#: is worse than XPASS (a fixed one whose KNOWN_FAILURES entry should go).
_RANK = {
    "FAIL": 7,
    "ERROR": 7,
    "XFAIL": 6,
    "XPASS": 5,
    "SKIP": 4,
    "NOT RUN": 3,
    "PASS": 2,
    "N/A": 1,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "SEP-2694 tasks/stream conformance suite")
    group.addoption(
        "--server-url",
        dest="conformance_server_url",
        default=None,
        help="MCP endpoint to test (default: start our bridge on the test Kafka)",
    )
    group.addoption(
        "--on-kafka",
        dest="conformance_on_kafka",
        action="store_true",
        default=False,
        help="start our bridge as subprocesses on the test Kafka (default: in process, in memory)",
    )
    group.addoption(
        "--hooks",
        dest="conformance_hooks",
        default=None,
        help=f"hooks module implementing conformance.hooks.Hooks (default: {DEFAULT_HOOKS})",
    )
    group.addoption(
        "--auth-token",
        dest="conformance_auth_token",
        default=None,
        help="bearer token of the principal the suite acts as",
    )
    group.addoption(
        "--other-auth-token",
        dest="conformance_other_auth_token",
        default=None,
        help="bearer token of a second principal (authorization tests)",
    )


def _option(config: pytest.Config, name: str) -> Any:
    # The options exist only when this conftest was loaded at start-up (pytest tests/conformance
    # …); in a plain `pytest` run of the whole tree they fall back to their defaults.
    return config.getoption(name, None)


def _hooks_module(config: pytest.Config) -> str:
    return str(_option(config, "conformance_hooks") or DEFAULT_HOOKS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "clause(text, key=...): the SEP-2694 clause a conformance test checks"
    )
    _OUTCOMES.clear()


def _in_suite(item: pytest.Item) -> bool:
    return item.path.is_relative_to(_HERE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if _in_suite(item)]
    if not ours:
        return
    on_kafka = _option(config, "conformance_server_url") is None and _on_kafka(config)
    failures = known_failures(_hooks_module(config))
    for item in ours:
        if on_kafka:
            item.add_marker(pytest.mark.kafka)
        reason = failures.get(item.originalname if isinstance(item, pytest.Function) else "")
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))


def _on_kafka(config: pytest.Config) -> bool:
    return bool(_option(config, "conformance_on_kafka"))


# --- the server under test ------------------------------------------------------------------

_TOKENS = {"conformance-token-a": "conformance-alice", "conformance-token-b": "conformance-bob"}

#: Settings of the bridge the suite starts, small enough to be reached by its tests: streams per
#: client (limits), the per-stream buffer (a slow consumer overflows it quickly), and a record
#: size that lets 5000-level nesting and 5000-digit integers reach the decoder.
SUITE_LIMITS: dict[str, int] = {
    "streams": {"max_per_principal": 8, "queue_size": 16},
    "tasks": {"max_event_bytes": 32 * 1024},
}


@pytest.fixture(scope="package")
def server_under_test(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerUnderTest]:
    config = request.config
    url = _option(config, "conformance_server_url")
    if url is not None:
        yield ServerUnderTest(
            url=url,
            auth_token=_option(config, "conformance_auth_token"),
            other_auth_token=_option(config, "conformance_other_auth_token"),
        )
        return
    # Our bridge, with bearer auth and two principals: in process, or on the test Kafka.
    from support.layout import fresh_prefix, make_settings  # tests/support

    root = tmp_path_factory.mktemp("conformance")
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps(_TOKENS))
    token_a, token_b = list(_TOKENS)

    def under_test(url: str, details: dict[str, Any]) -> ServerUnderTest:
        return ServerUnderTest(
            url=url,
            auth_token=_option(config, "conformance_auth_token") or token_a,
            other_auth_token=_option(config, "conformance_other_auth_token") or token_b,
            started_by_suite=True,
            details=details,
        )

    if not _on_kafka(config):
        from support.inmemory import NO_BROKER, memory_bridge

        auth = {"mode": "bearer", "tokens_file": str(tokens)}
        settings = make_settings(NO_BROKER, fresh_prefix("c"), auth=auth, **SUITE_LIMITS)
        with memory_bridge(settings) as running:
            yield under_test(running.url, {"settings": settings, "log": running.log})
        return
    from support.procs import running_bridge

    bootstrap = request.getfixturevalue("kafka_bootstrap")
    settings = make_settings(bootstrap, fresh_prefix("c"), **SUITE_LIMITS)
    env = {"BRIDGE_AUTH__MODE": "bearer", "BRIDGE_AUTH__TOKENS_FILE": str(tokens)}
    env.update({f"BRIDGE_{name.upper()}": str(value) for name, value in SUITE_LIMITS.items()})
    with running_bridge(settings, root, workers=1, **env) as bridge:
        yield under_test(bridge.url, {"settings": settings, "bridge": bridge})


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def hooks(
    request: pytest.FixtureRequest, server_under_test: ServerUnderTest
) -> AsyncIterator[Hooks]:
    loaded = load_hooks(_hooks_module(request.config), server_under_test)
    await loaded.start()
    try:
        yield loaded
    finally:
        await loaded.close()


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def client(server_under_test: ServerUnderTest) -> AsyncIterator[McpClient]:
    async with McpClient(server_under_test.url, server_under_test.auth_token, bound=BOUND) as mcp:
        yield mcp


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def other_client(server_under_test: ServerUnderTest) -> AsyncIterator[McpClient]:
    if server_under_test.other_auth_token is None:
        server_under_test.not_applicable("no --other-auth-token: a second principal is needed")
    token = server_under_test.other_auth_token
    async with McpClient(server_under_test.url, token, bound=BOUND) as mcp:
        yield mcp


@pytest_asyncio.fixture(loop_scope="package")
async def tasks(hooks: Hooks) -> AsyncIterator[TaskPool]:
    """The test's own tasks, finished at teardown if the test did not."""
    pool = TaskPool(hooks)
    try:
        yield pool
    finally:
        await pool.finish_all()


def pytest_itemcollected(item: pytest.Item) -> None:
    if _in_suite(item):
        keys = [str(m.kwargs.get("key")) for m in item.iter_markers("clause")]
        name = item.originalname if isinstance(item, pytest.Function) else item.name
        _OUTCOMES[item.nodeid] = _Outcome(name, keys)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = _OUTCOMES.get(report.nodeid)
    if outcome is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            outcome.status = "XFAIL" if report.skipped else "XPASS"
            outcome.reason = str(report.wasxfail)
        elif report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
            outcome.status = "XPASS"
            outcome.reason = str(report.longrepr)
        elif report.passed:
            outcome.status = "PASS"
        elif report.skipped:
            outcome.status = "SKIP"
            outcome.reason = _skip_reason(report)
        else:
            outcome.status = "FAIL" if report.when == "call" else "ERROR"
    elif report.when == "teardown" and report.failed and outcome.status not in ("FAIL", "ERROR"):
        outcome.status, outcome.reason = "ERROR", "teardown failed"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _OUTCOMES:
        return
    config = terminalreporter.config
    write = terminalreporter.write_line
    terminalreporter.section("SEP-2694 tasks/stream conformance: clause report")
    server = _option(config, "conformance_server_url") or "our bridge (started by the suite)"
    write(f"server: {server}   hooks: {_hooks_module(config)}")
    counts: dict[str, int] = {}
    width = max(len(k) for k in CLAUSES)
    pad = " " * (8 + width + 2)
    for key, entry in CLAUSES.items():
        mine = [o for o in _OUTCOMES.values() if key in o.keys]
        status = max((o.status for o in mine), key=_RANK.__getitem__, default="NOT RUN")
        if entry.not_checkable and all(o.status == "SKIP" for o in mine):
            status = "N/A"  # no test, or tests that run only against our own bridge
        counts[status] = counts.get(status, 0) + 1
        write(f"{status:<7} {key:<{width}}  {entry.text}")
        names: dict[str, int] = {}
        for o in mine:
            names[o.name] = names.get(o.name, 0) + 1
        tests = ", ".join(f"{n}[{c} cases]" if c > 1 else n for n, c in sorted(names.items()))
        write(f"{pad}tests: {tests or '-'}")
        for reason in sorted({o.reason for o in mine if o.status == status and o.reason}):
            write(f"{pad}reason: {reason}")
        if status == "N/A":
            write(f"{pad}not checkable against a server: {entry.not_checkable}")
    order = sorted(counts.items(), key=lambda item: -_RANK[item[0]])
    write(f"{len(CLAUSES)} clauses: " + ", ".join(f"{n} {status}" for status, n in order))

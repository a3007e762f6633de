"""The reviewer demo (`bridge demo --exit`) and `bridge replay` of the shipped data set.

The data set checks and the demo's way of running the server (bridge.server.runner, in this
event loop on a socket bound up front) need nothing; the rest run real `bridge` subprocesses
on the test broker, each on topics of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bridge.client import StreamEvent, TaskStreamClient
from bridge.server.runner import AppServer
from bridge.tasks.messages import owner_digest
from bridgedev.demo import DEFAULT_SESSION
from bridgedev.replay import REPLAY_TOOL, ReplayError, load_session

BOUND = 120
DATA = Path(__file__).resolve().parent.parent / "data" / "agent-session.jsonl"


# --- the data set ------------------------------------------------------------------------------


def test_the_shipped_data_set_is_one_long_realistic_agent_session():
    assert DEFAULT_SESSION == DATA
    events = load_session(DATA)
    assert 200 <= len(events) <= 1000
    span_s = (events[-1].offset_ms - events[0].offset_ms) / 1000
    assert 60 <= span_s <= 120
    kinds = {e.type.removeprefix("com.example.agent.") for e in events}
    for kind in (
        "session.started",
        "message.delta",
        "tool.call",
        "tool.result",
        "subtask.started",
        "subtask.progress",
        "subtask.finished",
        "artifact",
        "status.paused",
        "status.resumed",
        "input.requested",
        "input.received",
        "usage",
        "session.finished",
    ):
        assert kind in kinds, kind
    assert all(e.type.startswith("com.example.agent.") for e in events)
    # every tool call has its result, every subtask finishes, deltas reassemble in order
    calls = {e.payload["callId"] for e in events if e.type.endswith(".tool.call")}
    results = {e.payload["callId"] for e in events if e.type.endswith(".tool.result")}
    assert calls == results
    started = {e.payload["subtaskId"] for e in events if e.type.endswith(".subtask.started")}
    finished = {e.payload["subtaskId"] for e in events if e.type.endswith(".subtask.finished")}
    assert started == finished and len(started) >= 2
    by_message: dict[str, list[int]] = {}
    for e in events:
        if e.type.endswith(".message.delta"):
            by_message.setdefault(e.payload["messageId"], []).append(e.payload["index"])
    assert all(indexes == list(range(len(indexes))) for indexes in by_message.values())
    for e in events:
        if e.type.endswith(".artifact"):
            assert {"uri", "mimeType", "sizeBytes"} <= set(e.payload)
    # small enough for the test settings' 4 KiB event limit
    assert max(len(json.dumps(e.payload)) for e in events) < 3000


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"offset_ms": 5, "type": "content.partial", "payload": {}}', "vendor-prefixed"),
        ('{"offset_ms": 5, "type": "com.example.a.b", "payload": []}', "payload must be"),
        ('{"offset_ms": -1, "type": "com.example.a.b", "payload": {}}', "non-negative"),
        ('{"offset_ms": 1, "type": "com.example.a.b", "payload": {}}', "goes backwards"),
        ('{"offset_ms": 9, "type": "com.example.a.b", "payload": {}, "x": 1}', "unknown keys"),
    ],
)
def test_a_bad_session_line_is_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = '{"offset_ms": 2, "type": "com.example.a.b", "payload": {}}'
    path.write_text(f"{good}\n\n{line}\n", encoding="utf-8")
    with pytest.raises(ReplayError, match=re.escape(message)) as info:
        load_session(path)
    assert f"{path}:3" in str(info.value)


def test_an_empty_session_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(ReplayError, match="no events"):
        load_session(path)


# --- the server, run in this event loop (bridge.server.runner) ---------------------------------


def streaming_app(release: asyncio.Event) -> Starlette:
    """An app whose one response stays open until ``release`` is set, as a live tasks/stream."""

    async def body() -> AsyncIterator[bytes]:
        yield b"open\n"
        await release.wait()
        yield b"drained\n"

    async def endpoint(request: Request) -> StreamingResponse:
        return StreamingResponse(body())

    return Starlette(routes=[Route("/stream", endpoint)])


async def test_the_server_runs_in_this_loop_on_a_bound_socket_and_on_stop_ends_open_responses_first():
    release = asyncio.Event()
    calls: list[str] = []

    def on_stop() -> None:  # what the bridge does here: drain its open streams
        calls.append("on_stop")
        release.set()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/stream"
    graceful_s = 5
    server = AppServer(
        streaming_app(release),
        sock=sock,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=graceful_s,
        on_stop=on_stop,
        handle_signals=False,
    )
    async with asyncio.timeout(BOUND):
        await server.start()
        async with httpx.AsyncClient() as http, http.stream("GET", url) as response:
            chunks = response.aiter_raw()
            assert await anext(chunks) == b"open\n"
            began = time.monotonic()
            server.stop()
            server.stop()  # asked twice (a second signal): on_stop runs once
            rest = b"".join([chunk async for chunk in chunks])
        await server.close()
        took = time.monotonic() - began
    assert rest == b"drained\n"  # the open response ended by itself, not cut off at the bound
    assert calls == ["on_stop"]
    assert took < graceful_s
    assert server.task is not None and server.task.done()


# --- bridge replay -----------------------------------------------------------------------------


def run_cli(
    env: dict[str, str], *args: str, bound: float = BOUND
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=bound,
        check=False,
    )


async def read_all(url: str, task_id: str, until_seq: int | None = None) -> list[StreamEvent]:
    """The task's stream from seq 0: to its end, or until ``until_seq`` arrived (open tasks)."""
    events: list[StreamEvent] = []
    async with asyncio.timeout(BOUND):
        async for event in TaskStreamClient(url).stream(task_id):
            events.append(event)
            if until_seq is not None and event.seq >= until_seq:
                break
    return events


@pytest.fixture(scope="module")
def rbridge(kafka_bootstrap, tmp_path_factory):
    from conftest import make_settings, running_bridge

    settings = make_settings(kafka_bootstrap, f"r-{secrets.token_hex(5)}")
    with running_bridge(settings, tmp_path_factory.mktemp("rbridge"), workers=0) as running:
        yield running


@pytest.mark.kafka
async def test_replay_at_speed_0_streams_exactly_the_files_events_in_order(rbridge):
    done = run_cli(rbridge.env, "replay", str(DATA), "--speed", "0", "--url", rbridge.url)
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", task_id), done.stdout
    assert "100%" in done.stderr

    events = await read_all(rbridge.url, task_id)  # ends by itself: the task is completed
    session = load_session(DATA)
    prefix = rbridge.settings.tasks.event_type_prefix
    assert [e.seq for e in events] == list(range(len(session) + 2))
    assert events[0].type == f"{prefix}.task.created"
    created = events[0].payload
    assert created == {  # the task service's task.created (bridge.tasks.create), tool "replay"
        "tool": "replay",
        "owner": owner_digest("anonymous"),
        "createdMs": created["createdMs"],
        "ttlMs": REPLAY_TOOL.ttl_ms,
        "pollIntervalMs": REPLAY_TOOL.poll_interval_ms,
    }
    assert [(e.type, e.payload) for e in events[1:-1]] == [(s.type, s.payload) for s in session]
    final = events[-1]
    assert final.type == f"{prefix}.task.status"
    assert final.payload["status"] == "completed"
    assert final.payload["result"]["content"][0]["type"] == "text"
    view = await TaskStreamClient(rbridge.url).call("tasks/get", {"taskId": task_id}, task_id)
    assert view["status"] == "completed"
    assert view["result"] == final.payload["result"]
    assert (view["ttlMs"], view["pollIntervalMs"]) == (24 * 3600 * 1000, 500)


@pytest.mark.kafka
async def test_replay_keep_open_then_append_with_task_id(rbridge, tmp_path):
    def session(name: str, n: int) -> Path:
        path = tmp_path / f"{name}.jsonl"
        lines = [
            json.dumps(
                {"offset_ms": 10 * i, "type": f"com.example.{name}.step", "payload": {"i": i}}
            )
            for i in range(n)
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    first = run_cli(
        rbridge.env, "replay", str(session("one", 3)), "--keep-open", "--url", rbridge.url
    )
    assert first.returncode == 0, first.stderr
    task_id = first.stdout.strip()
    so_far = await read_all(rbridge.url, task_id, until_seq=3)  # open: the stream stays live
    assert [e.seq for e in so_far] == [0, 1, 2, 3]
    view = await TaskStreamClient(rbridge.url).call("tasks/get", {"taskId": task_id}, task_id)
    assert view["status"] == "working"

    second = run_cli(
        rbridge.env, "replay", str(session("two", 2)), "--task-id", task_id, "--url", rbridge.url
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == task_id
    events = await read_all(rbridge.url, task_id)
    kinds: list[Any] = [(e.type, e.payload.get("i")) for e in events[1:-1]]
    assert kinds == [
        ("com.example.one.step", 0),
        ("com.example.one.step", 1),
        ("com.example.one.step", 2),
        ("com.example.two.step", 0),
        ("com.example.two.step", 1),
    ]
    assert [e.seq for e in events] == list(range(7))
    assert events[-1].payload["status"] == "completed"

    # a finished task, or one the bridge does not know, is refused before anything is written
    again = run_cli(
        rbridge.env, "replay", str(session("three", 1)), "--task-id", task_id, "--url", rbridge.url
    )
    assert again.returncode == 2 and "completed" in again.stderr
    unknown = run_cli(
        rbridge.env, "replay", str(session("four", 1)), "--task-id", "nope", "--url", rbridge.url
    )
    assert unknown.returncode == 2 and "not served" in unknown.stderr


# --- bridge demo --exit ------------------------------------------------------------------------


@pytest.mark.kafka
def test_demo_exit_runs_every_step_and_every_step_passes(kafka_bootstrap, tmp_path):
    from conftest import bridge_env, free_port, make_settings

    settings = make_settings(kafka_bootstrap, f"d-{secrets.token_hex(5)}")
    env = bridge_env(settings, BRIDGE_SERVER__PORT=str(free_port()))
    done = run_cli(env, "demo", "--exit", bound=300)
    (tmp_path / "demo.out").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
    for step in range(1, 7):
        assert re.search(rf"^  PASS  step {step}: ", done.stdout, re.M), done.stdout[-4000:]
    assert "FAIL" not in done.stdout
    assert "All 6 steps passed" in done.stdout
    assert "events_gone" in done.stdout and '"earliestSeq": 100' in done.stdout
    # step 6: the agent slept, a verified webhook woke it, a forged copy was refused
    assert re.search(r"signed webhook verified: task \S+ is completed", done.stdout)
    assert "a forged copy got 401" in done.stdout


def test_the_demo_refuses_an_auth_mode_of_the_environment_as_it_makes_its_own_token():
    from conftest import bridge_env, make_settings

    settings = make_settings("127.0.0.1:9", f"d-{secrets.token_hex(5)}")  # never reached
    env = bridge_env(settings, BRIDGE_AUTH__MODE="bearer")
    done = run_cli(env, "demo", "--exit", bound=60)
    assert done.returncode == 2
    assert "bearer token of its own" in done.stderr and "BRIDGE_AUTH__MODE" in done.stderr

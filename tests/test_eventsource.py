"""The plain SSE endpoint of the browser view (bridge/server/browser.py, docs/browser.md).

Pure parts first (view tokens, cursors, the access-log redaction), then a real `bridge serve`
in auth mode ``bearer`` on the real broker, read over real HTTP: minting, exact resume by
``Last-Event-ID``, events_gone, the end event, authorization, the stream limits, and the
token kept out of the process's logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge
from support.layout import create_served_topics, fresh_prefix, make_settings
from support.mcp import create_task, result
from support.procs import (
    Bridge,
    Proc,
    bridge_env,
    free_peer_port,
    free_port,
    peer_env,
    running_bearer_bridge,
)
from support.sse import SseEvent, sse_events
from support.waits import BOUND, wait_until

from bridge.config import load_settings
from bridge.kafka.port import Log, TopicPart
from bridge.log.publisher import TaskEventPublisher
from bridge.server.browser import (
    BadViewToken,
    BrowserView,
    ViewTokens,
    _cursor,
    install_log_redaction,
    redact_tokens,
)

# --- pure: tokens, cursors, redaction -------------------------------------------------------

KEY = b"k" * 32


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_token_grants_its_principal_and_task_until_it_expires():
    clock = Clock()
    tokens = ViewTokens(KEY, 60, clock)
    token, expires = tokens.mint("alice", "task-1")
    grant = tokens.verify(token)
    assert (grant.principal, grant.task_id, grant.expires) == ("alice", "task-1", expires)
    assert expires == 1_000_060
    clock.now = expires - 1
    assert tokens.verify(token).task_id == "task-1"
    clock.now = expires
    with pytest.raises(BadViewToken, match="expired"):
        tokens.verify(token)


def test_forged_tampered_and_malformed_tokens_are_refused():
    tokens = ViewTokens(KEY, 60, Clock())
    token, _ = tokens.mint("alice", "task-1")
    version, claims, mac = token.split(".")
    bob_claims = ViewTokens(KEY, 60, Clock()).mint("bob", "task-1")[0].split(".")[1]
    for bad in (
        None,
        "",
        "garbage",
        f"{version}.{claims}",
        f"vt2.{claims}.{mac}",
        f"{version}.{bob_claims}.{mac}",  # another principal under alice's MAC
        f"{version}.{claims}.{mac[:-2]}AA",
        ViewTokens(b"x" * 32, 60, Clock()).mint("alice", "task-1")[0],  # another key
    ):
        with pytest.raises(BadViewToken) as info:
            tokens.verify(bad)
        assert token not in str(info.value)


def test_a_view_token_is_no_peer_hop_signature_and_no_other_mac():
    """The same secret keys the peer hop: the view key is derived apart from it."""
    from bridge.server.hops import PeerAuth, PeerIdentity

    secret = "s" * 32
    tokens = ViewTokens(secret.encode(), 60, Clock())
    who = PeerIdentity("alice", "alice")
    hop = PeerAuth(secret).sign("http://a:8081", "GET", "/view/tasks/t", {}, b"", who)
    version, claims, _ = tokens.mint("alice", "t")[0].split(".")
    with pytest.raises(BadViewToken):
        tokens.verify(f"{version}.{claims}.{hop['x-bridge-peer-signature']}")


@pytest.mark.parametrize(
    ("last_event_id", "after", "expected"),
    [
        (None, None, None),
        ("", None, None),  # the browser's "no event yet"
        ("7", None, 7),
        (None, "3", 3),
        ("7", "3", 7),  # Last-Event-ID is the browser's latest: it wins
        (" 12 ", None, 12),
    ],
)
def test_the_cursor_is_last_event_id_else_after(last_event_id, after, expected):
    assert _cursor(last_event_id, after) == expected


@pytest.mark.parametrize(
    ("last_event_id", "after"),
    [("-1", None), ("x", None), (None, "1.5"), (None, str(2**63)), ("١٢", None), (None, "")],
)
def test_a_cursor_that_is_not_a_seq_is_refused_with_a_message(last_event_id, after):
    assert isinstance(_cursor(last_event_id, after), str)


def test_the_access_log_line_of_a_view_request_never_holds_the_token(caplog):
    install_log_redaction()
    path = "/view/tasks/t1/events?token=vt1.abc.def&after=3"
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        # uvicorn's own access log call: the path (with its query) is an argument
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", path, "1.1", 200
        )
    line = caplog.records[-1].getMessage()
    assert "vt1.abc.def" not in line
    assert "/view/tasks/t1/events?token=[redacted]&after=3" in line
    assert redact_tokens("/x?a=1&token=s3cret") == "/x?a=1&token=[redacted]"
    assert redact_tokens("/x?mytoken=keep") == "/x?mytoken=keep"


def test_the_view_can_be_turned_off():
    on = BrowserView(load_settings(), lambda request: None)  # type: ignore[arg-type,return-value]
    off = BrowserView(load_settings(view={"enabled": False}), lambda request: None)  # type: ignore[arg-type,return-value]
    assert {r.path for r in on.routes()} >= {"/view/", "/view/tasks/{task_id}/events"}
    assert off.routes() == []


def test_a_short_view_key_is_refused_without_echoing_it():
    with pytest.raises(ValueError, match="at least 32 characters") as info:
        load_settings(view={"token_secret": "short-secret"})
    assert "short-secret" not in str(info.value)
    assert load_settings(view={"token_secret": "x" * 32}).view.token_secret_value == "x" * 32


# --- over real HTTP: a bridge in auth mode bearer -------------------------------------------

VIEW_SECRET = "view-secret-" + "v" * 32
ALICE, BOB, CAROL = "tok-alice", "tok-bob", "tok-carol"
#: CAROL's concurrent streams (the limits test fills them; the others stay well below).
LIMIT = 3
TOKENS = {ALICE: "alice", BOB: "bob", CAROL: "carol"}


@pytest.fixture(scope="module")
def vbridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryBridge]:
    """The whole bridge in process over the in-memory log, in auth mode ``bearer``."""
    root = tmp_path_factory.mktemp("vbridge")
    tokens_file = root / "tokens.json"
    tokens_file.write_text(json.dumps(TOKENS))
    settings = make_settings(
        NO_BROKER,
        fresh_prefix("v"),
        auth={"mode": "bearer", "tokens_file": str(tokens_file)},
        view={"token_secret": VIEW_SECRET},
        streams={"keepalive_s": 0.5, "max_per_principal": LIMIT},
    )
    with memory_bridge(settings) as running:
        yield running


@pytest.fixture(scope="module")
def kafka_vbridge(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bridge]:
    """`bridge serve` and `bridge workers` on the broker (the smoke: the production server's
    access log)."""
    settings = make_settings(kafka_bootstrap, fresh_prefix("v"))
    env = {
        "BRIDGE_VIEW__TOKEN_SECRET": VIEW_SECRET,
        "BRIDGE_STREAMS__KEEPALIVE_S": "0.5",
        "BRIDGE_STREAMS__MAX_PER_PRINCIPAL": str(LIMIT),
    }
    root = tmp_path_factory.mktemp("vbridge-kafka")
    with running_bearer_bridge(settings, root, TOKENS, **env) as running:
        yield running


def log_of(bridge: Bridge | MemoryBridge) -> Log | None:
    """Where a test writes the bridge's events: its memory log, else (None) the broker."""
    return bridge.log if isinstance(bridge, MemoryBridge) else None


def base(bridge: Bridge) -> str:
    return f"http://127.0.0.1:{bridge.port}"


def as_(bearer: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer {bearer}"})


async def long_task(bridge: Bridge, bearer: str = ALICE) -> str:
    async with as_(bearer) as http:
        return await create_task(http, bridge.url, "slow_compute", {"seconds": 120, "label": "v"})


async def cancel(bridge: Bridge, task: str, bearer: str = ALICE) -> None:
    async with as_(bearer) as http:
        await result(http, bridge.url, "tasks/cancel", {"taskId": task})


async def steps(bridge: Bridge, task: str, n: int, start: int = 0) -> None:
    async with TaskEventPublisher(bridge.settings, log=log_of(bridge)) as pub:
        for i in range(start, start + n):
            await pub.publish(task, "com.example.step", {"i": i})


async def mint(bridge: Bridge, task: str, bearer: str = ALICE) -> str:
    async with as_(bearer) as http:
        reply = await http.post(f"{base(bridge)}/view/token", json={"taskId": task})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["token"])


@dataclass
class ViewRead:
    """What one GET of the events endpoint delivered."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    events: list[SseEvent] = field(default_factory=list)
    body: str = ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(e.data) for e in self.events if e.event == "message"]

    @property
    def seqs(self) -> list[int]:
        return [m["seq"] for m in self.messages]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(e.data) for e in self.events if e.event == name]


@asynccontextmanager
async def opened(
    bridge: Bridge,
    task: str,
    token: str | None,
    *,
    last_event_id: str | None = None,
    after: int | None = None,
) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[SseEvent]]]:
    params = {} if token is None else {"token": token}
    if after is not None:
        params["after"] = str(after)
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    async with (
        httpx.AsyncClient(timeout=BOUND) as http,
        http.stream(
            "GET", f"{base(bridge)}/view/tasks/{task}/events", params=params, headers=headers
        ) as reply,
    ):
        yield reply, sse_events(reply)


async def read_view(
    bridge: Bridge,
    task: str,
    token: str | None,
    *,
    last_event_id: str | None = None,
    after: int | None = None,
    stop_after: int | None = None,
    into: ViewRead | None = None,
) -> ViewRead:
    """One GET read to its end (or ``stop_after`` task events)."""
    out = ViewRead() if into is None else into
    async with (
        asyncio.timeout(BOUND),
        opened(bridge, task, token, last_event_id=last_event_id, after=after) as (reply, events),
    ):
        out.status, out.headers = reply.status_code, dict(reply.headers)
        if "text/event-stream" not in reply.headers.get("content-type", ""):
            out.body = (await reply.aread()).decode()
            return out
        async for event in events:
            out.events.append(event)
            if stop_after is not None and len(out.messages) >= stop_after:
                break
    return out


async def test_the_page_and_its_files_come_with_a_strict_policy_and_no_inline_script(vbridge):
    async with httpx.AsyncClient(timeout=BOUND, base_url=base(vbridge)) as http:
        page = await http.get("/view/")
        script = await http.get("/view/static/view.js")
        style = await http.get("/view/static/view.css")
        missing = await http.get("/view/static/../config.py")
        other = await http.get("/view/static/view.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for reply in (page, script, style):
        assert reply.headers["cache-control"] == "no-store"
        assert reply.headers["referrer-policy"] == "no-referrer"
        assert reply.headers["x-content-type-options"] == "nosniff"
        policy = reply.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy
        assert "unsafe-inline" not in policy
    scripts = re.findall(r"<script[^>]*>", page.text)
    assert scripts and all("src=" in tag for tag in scripts)  # every script is a file
    assert "on" + "error=" not in page.text and "innerHTML" not in script.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert style.headers["content-type"].startswith("text/css")
    assert missing.status_code == other.status_code == 404


async def test_a_finished_task_streams_every_event_with_seq_ids_then_its_end(vbridge):
    task = await long_task(vbridge)
    await steps(vbridge, task, 4)
    await cancel(vbridge, task)
    out = await read_view(vbridge, task, await mint(vbridge, task))
    assert out.status == 200
    assert out.headers["content-type"].startswith("text/event-stream")
    assert out.headers["cache-control"] == "no-store"
    assert out.headers["referrer-policy"] == "no-referrer"
    assert out.seqs == list(range(len(out.seqs))) and len(out.seqs) >= 6
    assert [e.id for e in out.events if e.event == "message"] == [str(s) for s in out.seqs]
    first, last = out.messages[0], out.messages[-1]
    assert first["type"] == "io.mcpbridge.task.created"
    assert set(first) == {"seq", "type", "payload", "time"} and first["time"].endswith("Z")
    assert [m["payload"]["i"] for m in out.messages if m["type"] == "com.example.step"] == [
        0,
        1,
        2,
        3,
    ]
    assert last["type"] == "io.mcpbridge.task.status"
    assert last["payload"]["status"] == "cancelled"
    [end] = out.named("end")
    assert end["taskId"] == task and end["status"] == "cancelled"
    assert out.events[-1].event == "end"  # nothing after the end


async def test_last_event_id_resumes_exactly_after_every_cursor(vbridge):
    task = await long_task(vbridge)
    await steps(vbridge, task, 5)
    await cancel(vbridge, task)
    token = await mint(vbridge, task)
    full = await read_view(vbridge, task, token)
    total = len(full.seqs)
    assert full.seqs == list(range(total))
    for cursor in range(total):
        resumed = await read_view(vbridge, task, token, last_event_id=str(cursor))
        assert resumed.seqs == list(range(cursor + 1, total)), cursor
        assert resumed.messages == full.messages[cursor + 1 :]
        assert [e["status"] for e in resumed.named("end")] == ["cancelled"]
    by_query = await read_view(vbridge, task, token, after=2)
    assert by_query.seqs == list(range(3, total))
    # the browser's header wins over the page's first ``after``
    both = await read_view(vbridge, task, token, last_event_id="4", after=1)
    assert both.seqs == list(range(5, total))


async def test_live_events_arrive_while_the_task_runs_and_the_end_closes_the_stream(vbridge):
    task = await long_task(vbridge)
    token = await mint(vbridge, task)
    seen = ViewRead()
    reader = asyncio.create_task(read_view(vbridge, task, token, into=seen))
    await wait_until(lambda: seen.seqs, what="the stream delivers task.created")
    await steps(vbridge, task, 3, start=100)
    await wait_until(
        lambda: [m for m in seen.messages if m["payload"].get("i") == 102],
        what="the live steps arrive",
    )
    assert not seen.named("end")  # still running: no end yet
    await cancel(vbridge, task)
    async with asyncio.timeout(BOUND):
        out = await reader
    assert out.seqs == list(range(len(out.seqs)))
    assert [e["status"] for e in out.named("end")] == ["cancelled"]


async def test_a_cursor_past_retention_gets_the_gone_event_with_earliest_seq(vbridge):
    task = await long_task(vbridge)
    offsets = []
    async with TaskEventPublisher(vbridge.settings, log=vbridge.log) as pub:
        for i in range(8):
            offsets.append(await pub.publish(task, "com.example.step", {"i": i}))
    token = await mint(vbridge, task)
    full = await read_view(vbridge, task, token, stop_after=9)
    seq_of = {m["payload"]["i"]: m["seq"] for m in full.messages if "i" in m["payload"]}
    cut = offsets[5]
    part = TopicPart(vbridge.settings.topics.events, cut.partition)
    await vbridge.log.delete_records_before(part, cut.offset)
    gone = await read_view(vbridge, task, token, last_event_id="2")
    assert gone.status == 200  # an answer an EventSource can read, unlike a bare 410
    assert gone.messages == []
    assert [g["earliestSeq"] for g in gone.named("gone")] == [seq_of[5]]
    resumed = await read_view(vbridge, task, token, after=seq_of[5] - 1, stop_after=3)
    assert resumed.seqs == [seq_of[5], seq_of[5] + 1, seq_of[5] + 2]
    await cancel(vbridge, task)


async def test_the_state_endpoint_answers_like_tasks_get(vbridge):
    task = await long_task(vbridge)
    token = await mint(vbridge, task)
    url = f"{base(vbridge)}/view/tasks/{task}"
    async with httpx.AsyncClient(timeout=BOUND) as http:
        running = await http.get(url, params={"token": token})
        await cancel(vbridge, task)

        async def cancelled() -> httpx.Response | None:
            # tasks/cancel asks the worker; the status is the worker's cancelled event, indexed
            # a moment later (the CI run that read "working" here raced it).
            reply = await http.get(url, params={"token": token})
            return reply if reply.json().get("status") == "cancelled" else None

        done = await wait_until(cancelled, what="the view's state reads cancelled")
    assert running.status_code == 200 and running.json()["status"] == "working"
    assert done.json()["status"] == "cancelled" and done.json()["taskId"] == task
    assert done.headers["cache-control"] == "no-store"


async def test_minting_needs_the_mcp_credential_and_a_task_the_caller_may_see(vbridge):
    task = await long_task(vbridge)
    url = f"{base(vbridge)}/view/token"
    async with httpx.AsyncClient(timeout=BOUND) as anonymous:
        assert (await anonymous.post(url, json={"taskId": task})).status_code == 401
    async with as_(BOB) as bob:
        foreign = await bob.post(url, json={"taskId": task})
        unknown = await bob.post(url, json={"taskId": "no-such-task"})
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json() == unknown.json()  # a foreign task is indistinguishable from none
    async with as_(ALICE) as alice:
        assert (await alice.post(url, content=b"not json")).status_code == 400
        assert (await alice.post(url, json={"taskId": 7})).status_code == 400
        minted = await alice.post(url, json={"taskId": task})
    body = minted.json()
    assert body["taskId"] == task and body["viewPath"].startswith("/view/#task=")
    assert body["token"] in body["viewPath"]  # in the fragment, which no request carries
    await cancel(vbridge, task)


async def test_missing_bad_expired_and_foreign_tokens_are_refused(vbridge):
    task = await long_task(vbridge)
    other = await long_task(vbridge)
    good = await mint(vbridge, task)
    expired, _ = ViewTokens(VIEW_SECRET.encode(), 10, Clock(0.0)).mint("alice", task)
    bobs, _ = ViewTokens(VIEW_SECRET.encode(), 60).mint("bob", task)  # valid, but not bob's task
    nobody, _ = ViewTokens(VIEW_SECRET.encode(), 60).mint("alice", "no-such-task")
    forged, _ = ViewTokens(b"not the bridge's key" * 2, 60).mint("alice", task)
    cases = {
        None: 401,
        "vt1.garbage": 401,
        forged: 401,
        expired: 401,
        bobs: 404,
    }
    for token, status in cases.items():
        out = await read_view(vbridge, task, token)
        assert out.status == status, (token, out.body)
        assert "error" in json.loads(out.body)
    wrong_task = await read_view(vbridge, other, good)  # a token names one task only
    unknown = await read_view(vbridge, "no-such-task", nobody)
    foreign = await read_view(vbridge, task, bobs)
    assert wrong_task.status == unknown.status == foreign.status == 404
    assert wrong_task.body == unknown.body == foreign.body
    assert (await read_view(vbridge, task, good, last_event_id="x")).status == 400
    ahead = await read_view(vbridge, task, good, after=10**6)
    assert ahead.status == 400 and json.loads(ahead.body)["reason"] == "cursor_ahead"
    await cancel(vbridge, task)
    await cancel(vbridge, other)


async def test_view_streams_count_against_the_same_limits_as_tasks_stream(vbridge):
    task = await long_task(vbridge, CAROL)
    token = await mint(vbridge, task, CAROL)
    reads = [ViewRead() for _ in range(LIMIT)]
    holders = [asyncio.create_task(read_view(vbridge, task, token, into=r)) for r in reads]
    try:
        await wait_until(lambda: all(r.seqs for r in reads), what="carol's streams are all open")
        refused = await read_view(vbridge, task, token)
        assert refused.status == 429, refused.body
        assert json.loads(refused.body)["reason"] == "too_many_streams"
    finally:
        await cancel(vbridge, task, CAROL)
        async with asyncio.timeout(BOUND):
            outs = await asyncio.gather(*holders)
    assert all(out.named("end") for out in outs)
    # the slots came back when those streams ended
    again = await read_view(vbridge, task, token)
    assert again.status == 200 and again.named("end")


@pytest.mark.kafka
async def test_the_token_never_reaches_the_bridge_log(kafka_vbridge):
    """The view requests here write access log lines in `bridge serve`'s log (its runner
    redacts them); none may hold a token."""
    task = await long_task(kafka_vbridge)
    token = await mint(kafka_vbridge, task)
    await read_view(kafka_vbridge, task, token, stop_after=1)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        await http.get(f"{base(kafka_vbridge)}/view/tasks/{task}", params={"token": token})
    await cancel(kafka_vbridge, task)
    assert kafka_vbridge.server is not None
    log_text = kafka_vbridge.server.log_path.read_text(errors="replace")

    def logged() -> bool:
        text = (
            kafka_vbridge.server.log_path.read_text(errors="replace")
            if kafka_vbridge.server
            else ""
        )
        return f"/view/tasks/{task}?token=[redacted]" in text

    await wait_until(logged, what="the access log line of the state request")
    log_text = kafka_vbridge.server.log_path.read_text(errors="replace")
    assert f"/view/tasks/{task}/events?token=[redacted]" in log_text
    assert token not in log_text
    assert token.split(".")[2] not in log_text  # not even the MAC part
    assert VIEW_SECRET not in log_text


# --- replicas: a view GET reaches the task's owner --------------------------------------------


def forwarded_views(port: int) -> float:
    """The view requests this replica forwarded to an owner (method label ``other``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.search(
        r'^bridge_forwarded_requests_total\{method="other",outcome="ok"\} ([0-9.e+]+)$',
        text,
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0


def owned_partitions(port: int) -> int:
    """The partitions the replica owns; 0 while it does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return 0
    found = re.search(r"^bridge_owned_partitions ([0-9.e+]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


@pytest.mark.kafka
@pytest.mark.slow
async def test_with_replicas_any_replica_serves_any_tasks_view(kafka_bootstrap, tmp_path):
    """Two replicas divide the partitions; every task is viewed through both, so one of the
    two reads of each task is forwarded to its owner (token minted at either replica)."""
    settings = make_settings(kafka_bootstrap, fresh_prefix("vr"))
    create_served_topics(settings)
    secret, peer_port = secrets.token_hex(32), free_peer_port()
    replicas = []
    try:
        for i in range(2):
            port = free_port()
            env = bridge_env(
                settings,
                **peer_env(i, peer_port),
                BRIDGE_REPLICAS__OWNERSHIP="group",
                BRIDGE_REPLICAS__INSTANCE_ID=f"view-replica-{i}",
                BRIDGE_PEERS__SECRET=secret,
                BRIDGE_REPLICAS__OWNER_WAIT_S="20",
            )
            args = ["serve", "--port", str(port)]
            replicas.append((port, Proc(f"r{i}", args, env, tmp_path / f"r{i}.log").start()))
        ports = [port for port, _ in replicas]
        await wait_until(
            lambda: (
                all(p.alive() for _, p in replicas)
                and [owned_partitions(port) > 0 for port in ports] == [True, True]
                and sum(owned_partitions(port) for port in ports) == settings.topics.partitions
            ),
            what="the two replicas divide the partitions",
        )
        views = [SimpleNamespace(port=port) for port in ports]
        tasks = []
        async with httpx.AsyncClient(timeout=BOUND) as http:
            for _ in range(4):
                url = f"http://127.0.0.1:{ports[0]}/mcp"
                tasks.append(await create_task(http, url, "slow_compute", {"seconds": 120}))
        # No worker runs them: their end is written as a worker would write it.
        done = {"status": "completed", "result": {"content": [{"type": "text", "text": "ok"}]}}
        async with TaskEventPublisher(settings) as pub:
            for task in tasks:
                await pub.publish(task, settings.own_types.status, done)
        async with httpx.AsyncClient(timeout=BOUND) as http:
            for task in tasks:
                reads = []
                for minter, reader in ((0, 1), (1, 0)):
                    reply = await http.post(
                        f"http://127.0.0.1:{ports[minter]}/view/token", json={"taskId": task}
                    )
                    assert reply.status_code == 200, reply.text
                    token = reply.json()["token"]
                    out = await read_view(views[reader], task, token)
                    assert out.status == 200, out.body
                    reads.append(out)
                    state = await http.get(
                        f"http://127.0.0.1:{ports[reader]}/view/tasks/{task}",
                        params={"token": token},
                    )
                    assert state.json()["status"] == "completed"
                assert reads[0].messages == reads[1].messages
                assert reads[0].seqs == list(range(len(reads[0].seqs))) and reads[0].seqs
                assert [e["result"] for r in reads for e in r.named("end")] == [done["result"]] * 2
                resumed = await read_view(views[1], task, token, last_event_id="0")
                assert resumed.messages == reads[0].messages[1:]
        # One of each task's two reads was a hop (events and state: two requests per read),
        # plus the resume when replica 1 is not the owner.
        assert sum(forwarded_views(port) for port in ports) >= 2 * len(tasks)
    finally:
        for _, proc in replicas:
            proc.stop()

"""Webhook subscriptions (events/subscribe, events/unsubscribe) end to end, and their pure rules.

End to end: a real `bridge serve` (auth mode bearer) on real Kafka delivers a task's events to
real HTTPS receivers on 127.0.0.1 (a trustme certificate for ``localhost``; the bridge trusts the
CA through ``webhook_ca_file`` and reaches loopback through ``webhook_allowlist``). Signatures are
checked with the ``standardwebhooks`` library. Each test uses a principal of its own, so the
per-principal limit and the verification cache never cross tests. In-process: the subscription
records, their merge, TTL grants, and the refusal of unauthenticated callers.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from support.https import serving
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge, memory_log
from support.layout import changed, create_served_topics, fresh_prefix, make_settings, merged
from support.mcp import call, create_task, result
from support.procs import Bridge, running_bearer_bridge, webhook_keys_env
from support.subscriptions import NAME, SECRET, subscription
from support.topics import TopicRecord, replay_records, topic_records
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.events_extension.cursor import decode_task
from bridge.events_extension.registry import SubscriptionRegistry, clear_record
from bridge.events_extension.subscriptions import (
    BadRecord,
    DeliveryStatus,
    Subscription,
    SubscriptionTable,
    TtlPolicy,
    merge,
    parse_record,
    secrets_context,
    secrets_of,
    subscription_id,
)
from bridge.kafka.port import Log
from bridge.log.publisher import TaskEventPublisher
from bridge.sealing import KeyRing, Sealer, SealError
from bridge.server.admission import Caller
from bridge.server.events import EventsMethods, webhook_methods
from bridge.server.handlers import Call
from bridge.server.wire import JsonRpcRequest, RpcError
from bridge.vocabulary import UNSUPPORTED

ROTATED = "whsec_" + base64.b64encode(b"r" * 32).decode()
PRINCIPALS = ("ann", "ben", "cat", "dan", "eve", "fay", "gus", "hal", "ida", "jo", "kim", "lee")
TOKENS = {f"tok-{name}": name for name in PRINCIPALS}
#: The bridge's retry policy here: three attempts within three seconds.
ATTEMPTS = 3
RETRY_S = 3.0
LIMIT = 3
#: Verification challenges per (principal, callback host): three at once, then one per 10 min.
BURST = 3

kafka = pytest.mark.kafka


# --- the receivers ----------------------------------------------------------------------------


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def message(self) -> dict[str, Any]:
        return dict(json.loads(self.body))

    @property
    def step(self) -> int | None:
        """The ``i`` of a ``com.example.step`` event body (None for anything else)."""
        data = self.message.get("data") or {}
        return data["payload"]["i"] if data.get("type") == "com.example.step" else None


@dataclass
class Receiver:
    """An HTTPS listener on 127.0.0.1 that records every POST and answers as told: challenges
    are echoed while ``echo`` is set, events get ``answer(post)`` (200 by default)."""

    port: int = 0
    posts: list[Post] = field(default_factory=list)
    echo: bool = True
    answer: Callable[[Post], int] = lambda post: 200
    location: str | None = None

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}/hooks/{path}"

    def to(self, path: str) -> list[Post]:
        return [p for p in self.posts if p.path == f"/hooks/{path}"]

    def events(self, path: str) -> list[Post]:
        return [p for p in self.to(path) if "type" not in p.message]

    def steps(self, path: str) -> list[int]:
        return [s for p in self.events(path) if (s := p.step) is not None]

    def respond(self, post: Post) -> tuple[int, bytes]:
        if self.location:
            return 307, b""
        message = post.message
        if message.get("type") == "verification":
            if not self.echo:
                return 200, b"{}"
            return 200, json.dumps({"challenge": message["challenge"]}).encode()
        return self.answer(post), b""


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            post = Post(self.path, dict(self.headers.items()), body)
            receiver.posts.append(post)
            status, answer = receiver.respond(post)
            self.send_response(status)
            if receiver.location:
                self.send_header("Location", receiver.location)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def receiver(ca: trustme.CA) -> Iterator[Receiver]:
    receiver = Receiver()
    with serving(_handler(receiver), ca) as receiver.port:
        yield receiver


# --- the bridge --------------------------------------------------------------------------------


#: The bridge's webhook settings here, as environment variables (the broker's bridge runs as a
#: process) and as settings (the in-memory one runs in this one).
WEBHOOK_ENV = {
    "BRIDGE_WEBHOOKS__ALLOWLIST": '["127.0.0.1/32"]',
    "BRIDGE_WEBHOOKS__POLL_INTERVAL_S": "0.2",
    "BRIDGE_WEBHOOKS__TIMEOUT_S": "2",
    "BRIDGE_WEBHOOKS__MAX_ATTEMPTS": str(ATTEMPTS),
    "BRIDGE_WEBHOOKS__MAX_RETRY_S": str(RETRY_S),
    "BRIDGE_WEBHOOKS__BACKOFF_BASE_S": "0.2",
    "BRIDGE_WEBHOOKS__BACKOFF_MAX_S": "1",
    "BRIDGE_WEBHOOKS__MAX_SUBSCRIPTIONS_PER_PRINCIPAL": str(LIMIT),
    "BRIDGE_WEBHOOKS__VERIFY_BURST": str(BURST),
    "BRIDGE_WEBHOOKS__VERIFY_PER_MINUTE": "0.1",
}


@pytest.fixture(scope="module")
def wbridge(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA
) -> Iterator[Bridge]:
    """`bridge serve` on the broker, for the end-to-end cases that restart it."""
    root: Path = tmp_path_factory.mktemp("webhooks")
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    settings = make_settings(kafka_bootstrap, fresh_prefix("w"))
    env = {**WEBHOOK_ENV, "BRIDGE_WEBHOOKS__CA_FILE": str(ca_file)}
    with running_bearer_bridge(settings, root, TOKENS, **env) as running:
        yield running


@pytest.fixture(scope="module")
def mbridge(tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA) -> Iterator[MemoryBridge]:
    """The same bridge in this process over the in-memory log: webhook subscriptions are
    stored, restored, divided and delivered through the log port, so no broker is needed."""
    settings = memory_settings(tmp_path_factory.mktemp("mwebhooks"), ca, TOKENS)
    with memory_bridge(settings) as running:
        yield running


def memory_settings(root: Path, ca: trustme.CA, tokens: dict[str, str], **env: str) -> Settings:
    """The settings of :data:`WEBHOOK_ENV` (and ``env``) for a bridge in this process, in auth
    mode bearer with ``tokens``, its key file and CA file under ``root``."""
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    tokens_file = root / "tokens.json"
    tokens_file.write_text(json.dumps(tokens))
    env = {**WEBHOOK_ENV, **webhook_keys_env(root), "BRIDGE_WEBHOOKS__CA_FILE": str(ca_file), **env}
    values: dict[str, Any] = {}
    for name, value in env.items():
        *groups, field = name.removeprefix("BRIDGE_").lower().split("__")
        nested: dict[str, Any] = {field: value}
        for group in reversed(groups):
            nested = {group: nested}
        values = merged(values, nested)
    values["webhooks"]["allowlist"] = json.loads(values["webhooks"]["allowlist"])
    return make_settings(
        NO_BROKER,
        fresh_prefix("mw"),
        auth={"mode": "bearer", "tokens_file": str(tokens_file)},
        **values,
    )


#: Either bridge: tests written against one run on the other.
Served = Bridge | MemoryBridge


def log_of(bridge: Served) -> Log | None:
    """Where a test writes the bridge's events: its memory log, else (None) the broker."""
    return bridge.log if isinstance(bridge, MemoryBridge) else None


def client(principal: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer tok-{principal}"})


async def started_task(bridge: Served, principal: str) -> str:
    async with client(principal) as http:
        return await create_task(
            http, bridge.url, "slow_compute", {"seconds": 120, "label": "webhooks"}
        )


async def publish(bridge: Served, task: str, steps: range) -> None:
    async with TaskEventPublisher(bridge.settings, log=log_of(bridge)) as pub:
        for i in steps:
            await pub.publish(task, "com.example.step", {"i": i})


def hook(task: str, url: str, **more: Any) -> dict[str, Any]:
    delivery = {"mode": "webhook", "url": url, "secret": more.pop("secret", SECRET)}
    return {"name": NAME, "arguments": {"taskId": task}, "delivery": delivery, **more}


async def subscribe(bridge: Served, principal: str, params: dict[str, Any]) -> dict[str, Any]:
    async with client(principal) as http:
        return await call(http, bridge.url, "events/subscribe", params)


async def subscribed(bridge: Served, principal: str, params: dict[str, Any]) -> dict[str, Any]:
    async with client(principal) as http:
        return await result(http, bridge.url, "events/subscribe", params)


async def steps_reach(receiver: Receiver, path: str, n: int) -> list[int]:
    return await wait_until(
        lambda: len(receiver.steps(path)) >= n and receiver.steps(path),
        what=f"{n} steps delivered to /hooks/{path}",
    )


# --- end to end --------------------------------------------------------------------------------


async def test_list_offers_webhook_delivery_to_authenticated_callers(mbridge: MemoryBridge) -> None:
    async with client("ann") as http:
        listed = await result(http, mbridge.url, "events/list")
    assert listed["events"][0]["delivery"] == ["poll", "push", "webhook"]


async def test_a_verified_subscription_gets_the_tasks_events_signed_with_its_secret(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "ann")
    url = receiver.url("a")
    got = await subscribed(mbridge, "ann", hook(task, url, ttlMs=120_000))
    [challenge] = receiver.to("a")  # the handshake came first, within the subscribe
    assert challenge.message["type"] == "verification"
    assert got["id"].startswith("sub_") and got["truncated"] is False
    assert got["cursor"] and got["refreshBefore"].endswith("Z") and got["resultType"] == "complete"
    await publish(mbridge, task, range(3))
    assert await steps_reach(receiver, "a", 3) == [0, 1, 2]
    for post in receiver.events("a"):
        assert Webhook(SECRET).verify(post.body, post.headers) == post.message
        assert post.headers["X-MCP-Subscription-Id"] == got["id"]
        assert post.headers["webhook-id"] == post.message["eventId"]
        assert post.message["name"] == NAME and post.message["cursor"]
    post = receiver.events("a")[-1]
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(post.body.replace(b'"i":2', b'"i":3'), post.headers)
    with pytest.raises(WebhookVerificationError):
        stale = int(post.headers["webhook-timestamp"]) - 1
        Webhook(SECRET).verify(post.body, {**post.headers, "webhook-timestamp": str(stale)})
    with pytest.raises(WebhookVerificationError):
        Webhook(ROTATED).verify(post.body, post.headers)


async def test_a_refresh_keeps_the_id_skips_the_challenge_and_reports_delivery_status(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "ben")
    first = await subscribed(mbridge, "ben", hook(task, receiver.url("b")))
    await publish(mbridge, task, range(1))
    await steps_reach(receiver, "b", 1)

    async def refreshed_after_the_delivery() -> dict[str, Any] | None:
        # The receiver has the event before the bridge has its answer and records the
        # delivery: refresh (idempotent: same id, no challenge) until the status shows it.
        again = await subscribed(mbridge, "ben", hook(task, receiver.url("b"), secret=ROTATED))
        return again if again["deliveryStatus"]["lastDeliveryAt"] is not None else None

    again = await wait_until(refreshed_after_the_delivery, what="the delivery in the status")
    assert again["id"] == first["id"] and again["refreshBefore"] >= first["refreshBefore"]
    assert again["deliveryStatus"]["active"] is True
    assert again["deliveryStatus"]["lastError"] is None
    assert again["deliveryStatus"]["lastDeliveryAt"].endswith("Z")
    assert len([p for p in receiver.to("b") if p.message.get("type")]) == 1  # one challenge
    await publish(mbridge, task, range(1, 2))
    await steps_reach(receiver, "b", 2)
    rotated = receiver.events("b")[-1]  # signed with the new secret and, for a while, the old
    assert Webhook(ROTATED).verify(rotated.body, rotated.headers)
    assert Webhook(SECRET).verify(rotated.body, rotated.headers)
    # the same URL for another of ben's tasks: verification is cached per principal and URL
    other = await started_task(mbridge, "ben")
    await subscribed(mbridge, "ben", hook(other, receiver.url("b")))
    assert len([p for p in receiver.to("b") if p.message.get("type")]) == 1


@kafka
async def test_delivery_resumes_after_a_restart_from_the_stored_cursor_with_nothing_lost(
    wbridge: Bridge, receiver: Receiver
) -> None:
    task = await started_task(wbridge, "cat")
    params = hook(task, receiver.url("c"))
    await subscribed(wbridge, "cat", params)
    await publish(wbridge, task, range(2))
    await steps_reach(receiver, "c", 2)
    last = receiver.events("c")[-1].message["cursor"]

    async def stored() -> bool:  # the write-back after the delivery reached Kafka
        # At or past it: the task's worker keeps writing progress events, delivered meanwhile.
        cursor = (await subscribed(wbridge, "cat", params))["cursor"]
        return decode_task(cursor) >= decode_task(last)

    await wait_until(stored, what="the delivered cursor is stored")
    assert wbridge.server is not None
    wbridge.server.stop()
    await publish(wbridge, task, range(2, 5))  # while no bridge runs
    wbridge.start_server()
    await steps_reach(receiver, "c", 5)
    assert receiver.steps("c") == [0, 1, 2, 3, 4]  # resumed after 1: nothing lost, no repeat


async def test_a_410_or_413_abandons_that_delivery_without_retrying_and_delivery_goes_on(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    receiver.answer = lambda post: {0: 410, 1: 413}.get(post.step, 200)  # type: ignore[arg-type]
    task = await started_task(mbridge, "dan")
    await subscribed(mbridge, "dan", hook(task, receiver.url("d")))
    await publish(mbridge, task, range(3))
    await steps_reach(receiver, "d", 3)
    assert receiver.steps("d") == [0, 1, 2]  # each POSTed once


async def test_a_failing_endpoint_is_retried_with_bounded_backoff_then_given_up(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    receiver.answer = lambda post: 503 if post.step == 0 else 200
    task = await started_task(mbridge, "eve")
    params = hook(task, receiver.url("e"))
    await subscribed(mbridge, "eve", params)
    await publish(mbridge, task, range(1))
    await steps_reach(receiver, "e", ATTEMPTS)

    async def given_up() -> dict[str, Any] | None:
        # The task's worker keeps writing progress events, whose deliveries succeed: the
        # failure streak ends with the next one, the last error stays.
        status = (await subscribed(mbridge, "eve", params))["deliveryStatus"]
        return status if status["lastError"] else None

    status = await wait_until(given_up, what="the failed delivery is recorded")
    assert status["lastError"] == "http_5xx"
    assert status.get("failedSince") is None or status["failedSince"].endswith("Z")
    # Only step 0's POSTs: the worker's progress events are delivered too, meanwhile.
    attempts = [p for p in receiver.events("e") if p.step == 0]
    assert len(attempts) == ATTEMPTS  # never more than the bound
    stamps = [int(p.headers["webhook-timestamp"]) for p in attempts]
    assert stamps[-1] - stamps[0] <= RETRY_S + 1  # within the total-time bound
    assert len({p.headers["webhook-signature"] for p in attempts}) >= 1
    await publish(mbridge, task, range(1, 2))  # the next event is delivered
    await steps_reach(receiver, "e", ATTEMPTS + 1)
    assert receiver.steps("e")[-1] == 1


@pytest.mark.parametrize(
    ("url", "code", "reason"),
    [
        ("http://localhost:{port}/hooks/f", -32602, None),
        ("https://10.1.2.3/hooks/f", -32027, "connection_refused"),
        ("https://169.254.169.254/latest/meta-data", -32027, "connection_refused"),
        ("https://[fe80::1]/hooks/f", -32027, "connection_refused"),
        ("https://[::1]:{port}/hooks/f", -32027, "connection_refused"),
        ("https://user:pw@localhost:{port}/hooks/f", -32602, None),
    ],
    ids=["http", "private", "metadata", "link-local", "loopback-v6", "credentials"],
)
async def test_a_callback_that_fails_the_ssrf_rules_is_refused_at_subscribe(
    mbridge: MemoryBridge, receiver: Receiver, url: str, code: int, reason: str | None
) -> None:
    task = await started_task(mbridge, "fay")
    refused = await subscribe(mbridge, "fay", hook(task, url.format(port=receiver.port)))
    assert refused["error"]["code"] == code, refused
    assert refused["error"].get("data", {}).get("reason") == reason
    assert receiver.posts == []  # nothing reached the listener


async def test_a_redirect_or_a_missing_echo_fails_verification_and_stores_nothing(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "fay")
    receiver.echo = False
    silent = await subscribe(mbridge, "fay", hook(task, receiver.url("g")))
    assert silent["error"]["code"] == -32027
    assert silent["error"]["data"] == {"reason": "challenge_failed"}
    receiver.echo, receiver.location = True, "https://10.0.0.1/x"
    moved = await subscribe(mbridge, "fay", hook(task, receiver.url("h")))
    assert moved["error"]["data"] == {"reason": "http_4xx"}
    assert [p.path for p in receiver.posts] == ["/hooks/g", "/hooks/h"]  # no redirect followed
    async with client("fay") as http:
        gone = await call(http, mbridge.url, "events/unsubscribe", hook(task, receiver.url("g")))
    assert gone["error"]["code"] == -32023 and gone["error"]["data"] == {"kind": "subscription"}


async def test_bad_params_a_foreign_task_and_too_many_subscriptions_get_the_drafts_errors(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "gus")
    bad_secret = await subscribe(mbridge, "gus", hook(task, receiver.url("i"), secret="whsec_x"))
    assert bad_secret["error"]["code"] == -32602
    assert "whsec_x" not in json.dumps(bad_secret)
    foreign = await subscribe(mbridge, "hal", hook(task, receiver.url("i")))
    assert foreign["error"]["code"] == -32023 and foreign["error"]["data"] == {"kind": "task"}
    for n in range(LIMIT):
        await subscribed(mbridge, "gus", hook(task, receiver.url(f"i{n}")))
    over = await subscribe(mbridge, "gus", hook(task, receiver.url("i-over")))
    assert over["error"]["code"] == -32025
    assert over["error"]["data"] == {"limit": "subscriptions", "max": LIMIT}


async def test_unsubscribe_stops_delivery_at_once(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "ida")
    gone = hook(task, receiver.url("gone"))
    await subscribed(mbridge, "ida", gone)
    await subscribed(mbridge, "ida", hook(task, receiver.url("witness")))
    await publish(mbridge, task, range(1))
    await steps_reach(receiver, "gone", 1)
    async with client("ida") as http:
        done = await result(http, mbridge.url, "events/unsubscribe", gone)
        again = await call(http, mbridge.url, "events/unsubscribe", gone)
    assert done == {"resultType": "complete"}
    assert again["error"]["data"] == {"kind": "subscription"}
    # Two rounds through the other subscription: a loop still running would have delivered
    # the first round to /hooks/gone by the end of the second.
    await publish(mbridge, task, range(1, 3))
    await steps_reach(receiver, "witness", 3)
    await publish(mbridge, task, range(3, 5))
    await steps_reach(receiver, "witness", 5)
    assert receiver.steps("gone") == [0]


async def test_a_callback_refused_at_delivery_time_suspends_delivery_until_a_refresh(
    tmp_path: Path, ca: trustme.CA, receiver: Receiver
) -> None:
    """The allowlist is checked at every delivery, not only at subscribe: restarted without
    it, the bridge refuses the stored loopback callback, sends nothing and keeps the events;
    allowed again, a refresh resumes delivery with nothing lost. (Each restart is a bridge of
    its own on the same memory log, as a restarted process is on the same topics.)"""
    settings = memory_settings(tmp_path, ca, TOKENS)
    memory = memory_log(settings)
    with memory_bridge(settings, memory=memory) as first:
        task = await started_task(first, "hal")
        params = hook(task, receiver.url("k"))
        await subscribed(first, "hal", params)
    refusing = changed(settings, webhooks={"allowlist": []})
    with memory_bridge(refusing, memory=memory) as second:
        await publish(second, task, range(2))

        async def suspended() -> dict[str, Any] | None:
            status = (await subscribed(second, "hal", params))["deliveryStatus"]
            return status if not status["active"] else None

        status = await wait_until(suspended, what="delivery is suspended")
        assert status["lastError"] == "connection_refused"
        assert receiver.steps("k") == []
    with memory_bridge(settings, memory=memory) as third:
        await subscribed(third, "hal", params)  # the refresh that resumes delivery
        assert await steps_reach(receiver, "k", 2) == [0, 1]


def challenges(receiver: Receiver) -> list[Post]:
    return [p for p in receiver.posts if p.message.get("type") == "verification"]


async def throttled_total(bridge: Served) -> float:
    async with httpx.AsyncClient(timeout=BOUND) as http:
        text = (await http.get(bridge.url.removesuffix("/mcp") + "/metrics")).text
    lines = [x for x in text.splitlines() if x.startswith(THROTTLED_METRIC + " ")]
    return float(lines[0].split()[1]) if lines else 0.0


THROTTLED_METRIC = "bridge_webhook_verifications_throttled_total"


async def test_verifications_are_throttled_per_principal_and_host_and_a_refresh_sends_none(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "jo")
    before = await throttled_total(mbridge)
    await subscribed(mbridge, "jo", hook(task, receiver.url("t0")))  # verified: one token
    receiver.echo = False  # the rest of the burst goes on failed challenges, each a POST
    for n in range(1, BURST):
        failed = await subscribe(mbridge, "jo", hook(task, receiver.url(f"t{n}")))
        assert failed["error"]["data"] == {"reason": "challenge_failed"}
    assert len(challenges(receiver)) == BURST
    over = await subscribe(mbridge, "jo", hook(task, receiver.url("t-over")))
    assert over["error"]["code"] == -32025, over
    assert over["error"]["data"]["limit"] == "verifications"
    assert over["error"]["data"]["retryAfterMs"] > 0
    assert len(challenges(receiver)) == BURST  # throttled: nothing sent
    assert await throttled_total(mbridge) == before + 1
    # A refresh of the verified subscription sends no challenge and needs no token.
    receiver.echo = True
    for secret in (SECRET, ROTATED):
        await subscribed(mbridge, "jo", hook(task, receiver.url("t0"), secret=secret))
    assert len(challenges(receiver)) == BURST
    # Another principal on the same host has a budget of its own.
    other = await started_task(mbridge, "kim")
    await subscribed(mbridge, "kim", hook(other, receiver.url("t-kim")))
    assert len(challenges(receiver)) == BURST + 1


async def test_the_subscriptions_topic_holds_no_signing_secret_in_clear(
    mbridge: MemoryBridge, receiver: Receiver
) -> None:
    task = await started_task(mbridge, "lee")
    got = await subscribed(mbridge, "lee", hook(task, receiver.url("sealed")))
    await subscribed(mbridge, "lee", hook(task, receiver.url("sealed"), secret=ROTATED))
    await publish(mbridge, task, range(1))
    await steps_reach(receiver, "sealed", 1)

    async def written_back() -> list[TopicRecord] | None:
        # The receiver has the event before the bridge has its answer and writes it back.
        stored = await mbridge.acall(topic_records(mbridge.settings, log=mbridge.memory))
        records = [r for r in stored if r.key == got["id"].encode()]
        return records if len(records) >= 3 else None

    records = await wait_until(written_back, what="the subscription, its refresh, a write-back")
    for record in records:
        assert record.value is not None
        for secret in (SECRET, ROTATED):
            key = secret.removeprefix("whsec_")
            assert key.encode() not in record.value and key[:16].encode() not in record.value
        sealed = json.loads(record.value)["secrets"]
        assert sealed["alg"] == "A256GCM" and sealed["kid"] and sealed["ct"]
    signed = receiver.events("sealed")[-1]  # and delivery signs with the opened secrets
    assert Webhook(ROTATED).verify(signed.body, signed.headers)


async def test_without_a_key_webhook_delivery_is_off_and_nothing_is_stored() -> None:
    settings = make_settings("unused:9092", fresh_prefix(), auth={"mode": "bearer"})

    class Source:
        name = NAME

        def descriptor(self) -> dict[str, Any]:
            return {"name": NAME, "delivery": ["poll", "push"]}

    source: Any = Source()
    methods = EventsMethods([source], streams=None, webhooks=webhook_methods(settings, [source]))
    listed = await methods.list(request("events/list", {}, "ann"))
    assert listed["events"][0]["delivery"] == ["poll", "push"]  # type: ignore[index]
    params = hook("t", "https://example.com/h")
    with pytest.raises(RpcError) as refused:
        await methods.methods()["events/subscribe"](request("events/subscribe", params, "ann"))
    assert refused.value.code == UNSUPPORTED
    assert refused.value.data == {"feature": "deliveryMode", "value": "webhook"}


def request(method: str, params: dict[str, Any], principal: str = "anonymous") -> Call:
    rpc = JsonRpcRequest(jsonrpc="2.0", id=1, method=method, params=params)
    return Call(rpc, Caller(principal, "conn"), legacy=False, params=params)


def restart(bridge: Bridge, **env: str) -> None:
    assert bridge.server is not None
    bridge.server.stop()
    bridge.env.update(env)
    bridge.start_server()


# --- upgrade: subscriptions stored by 8fd441c ---------------------------------------------------

UPGRADE = Path(__file__).parent / "fixtures" / "upgrade-8fd441c-subscriptions"


@kafka
async def test_subscriptions_stored_by_8fd441c_keep_their_deliveries_and_are_sealed(
    kafka_bootstrap: str, tmp_path: Path, ca: trustme.CA
) -> None:
    """The fixture's records (secrets in clear) replayed into a fresh topic: the upgraded bridge
    delivers to both callbacks, signed with the secrets stored then (no new challenge, no
    refresh), and the owner rewrites both records sealed."""
    meta = json.loads((UPGRADE / "meta.json").read_text())
    stored = [TopicRecord.from_json(r) for r in json.loads((UPGRADE / "records.json").read_text())]
    settings = make_settings(kafka_bootstrap, fresh_prefix("u"))
    assert settings.topics.partitions == meta["partitions"]
    create_served_topics(settings)
    await replay_records(settings, settings.topics.subscriptions, stored)
    receiver = Receiver()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    with (
        serving(_handler(receiver), ca, port=meta["receiver_port"]) as receiver.port,
        running_bearer_bridge(
            settings,
            tmp_path,
            {"tok-upgrader": meta["principal"]},
            BRIDGE_WEBHOOKS__ALLOWLIST='["127.0.0.1/32"]',
            BRIDGE_WEBHOOKS__CA_FILE=str(tmp_path / "ca.pem"),
            BRIDGE_WEBHOOKS__POLL_INTERVAL_S="0.2",
            BRIDGE_UPGRADE__CLEAR_SUBSCRIPTIONS="true",  # step 2 of the upgrade from 0.1
        ) as running,
    ):
        headers = {"Authorization": "Bearer tok-upgrader"}
        async with httpx.AsyncClient(timeout=BOUND, headers=headers) as http:
            task = await create_task(http, running.url, "slow_compute", {"seconds": 120})
        for path in ("a", "b"):  # the task's first status change, at each callback
            await wait_until(lambda p=path: receiver.events(p), what=f"a delivery to /hooks/{path}")
        assert challenges(receiver) == []
        secrets = meta["secrets"]
        for path, secret in (("a", secrets["a"]), ("b", secrets["b"])):
            post = receiver.events(path)[0]
            assert Webhook(secret).verify(post.body, post.headers)["data"]["taskId"] == task

        async def sealed() -> list[TopicRecord] | None:
            latest = {r.key: r for r in await topic_records(settings)}
            ok = all(r.value and json.loads(r.value)["v"] == 2 for r in latest.values())
            return list(latest.values()) if ok else None

        latest = await wait_until(sealed, what="both subscriptions rewritten sealed")
    assert len(latest) == 2
    for record in latest:
        assert record.value is not None
        for secret in secrets.values():
            assert secret.removeprefix("whsec_").encode() not in record.value


# --- in-process: the rules ---------------------------------------------------------------------


def test_the_subscription_id_is_deterministic_over_principal_url_name_and_arguments() -> None:
    one = subscription_id("ann", "https://x/h", NAME, {"taskId": "t", "a": 1})
    assert one == subscription_id("ann", "https://x/h", NAME, {"a": 1, "taskId": "t"})
    assert one.startswith("sub_") and len(one) == 36
    others = [
        subscription_id("ben", "https://x/h", NAME, {"taskId": "t", "a": 1}),
        subscription_id("ann", "https://x/i", NAME, {"taskId": "t", "a": 1}),
        subscription_id("ann", "https://x/h", NAME + "2", {"taskId": "t", "a": 1}),
        subscription_id("ann", "https://x/h", NAME, {"taskId": "t", "a": 2}),
    ]
    assert one not in others and len(set(others)) == 4


async def test_a_record_round_trips_with_its_secrets_sealed_and_no_repr_shows_them() -> None:
    sub = subscription(status=DeliveryStatus(last_delivery_ms=5, consecutive_failures=2))
    sealer = Sealer(KeyRing("k1", {"k1": b"k" * 32}))
    sealed = await sealer.seal(sub.secrets_plaintext(), secrets_context(sub.id))
    value = sub.to_record(sealed)
    assert SECRET.encode() not in value and SECRET.removeprefix("whsec_").encode() not in value
    stored = parse_record(value)
    assert stored.sealed == sealed
    opened = await sealer.open(stored.sealed, secrets_context(sub.id))
    assert stored.subscription(secrets_of(opened)) == sub
    shown = repr(sub) + str(sub) + repr(stored)
    assert SECRET not in shown and "example.com" not in shown and "ann" not in shown


def test_a_record_of_8fd441c_with_its_secrets_in_clear_is_still_read() -> None:
    sub = subscription()
    body = json.loads(sub.to_record({}))
    value = json.dumps({**body, "v": 1, "secrets": [SECRET]}).encode()
    stored = parse_record(value)
    assert stored.sealed is None and stored.subscription(stored.clear) == sub


def _registry(**upgrade: Any) -> SubscriptionRegistry:
    settings = make_settings("unused:9092", fresh_prefix())
    settings = settings.model_copy(update={"upgrade": settings.upgrade.model_copy(update=upgrade)})
    return SubscriptionRegistry(settings, Sealer(KeyRing("k1", {"k1": b"k" * 32})))


def _bound_sub(**changes: Any) -> Subscription:
    """A subscription whose id is the one its fields make."""
    sub = subscription(**changes)
    return dataclasses.replace(
        sub, id=subscription_id(sub.principal, sub.url, sub.name, sub.arguments)
    )


async def test_a_subscription_record_in_clear_is_read_only_during_an_upgrade_from_0_1() -> None:
    sub = _bound_sub()
    value = clear_record(sub)
    with pytest.raises(BadRecord, match="in clear"):
        await _registry()._opened(sub.id, value)
    for upgrading in ({"from_": "0.1"}, {"clear_subscriptions": True}):  # step 1, step 2
        registry = _registry(**upgrading)
        assert await registry._opened(sub.id, value) == sub
        assert registry.unsealed == {sub.id}


async def test_a_subscription_record_whose_fields_do_not_make_its_id_is_skipped() -> None:
    sub = _bound_sub()
    registry = _registry()
    sealed = await registry.sealer.seal(sub.secrets_plaintext(), secrets_context(sub.id))
    assert await registry._opened(sub.id, sub.to_record(sealed)) == sub
    # Another principal's subscription re-targeted at a writer's URL, under the same id ...
    moved = dataclasses.replace(sub, url="https://attacker.example/h")
    with pytest.raises(BadRecord, match="do not make its id"):
        await registry._opened(sub.id, moved.to_record(sealed))
    # ... or under the id its new fields make: the secrets were sealed for the other id.
    renamed = _bound_sub(url="https://attacker.example/h")
    with pytest.raises(SealError):
        await registry._opened(renamed.id, renamed.to_record(sealed))
    # In clear during an upgrade, the id is checked all the same.
    with pytest.raises(BadRecord, match="do not make its id"):
        await _registry(from_="0.1")._opened(sub.id, clear_record(moved))


def test_ttl_grants_clamp_the_suggestion_and_never_grant_no_expiry() -> None:
    policy = TtlPolicy(default_ms=3_600_000, min_ms=60_000, max_ms=86_400_000)
    assert policy.grant(None, given=False) == 3_600_000
    assert policy.grant(None, given=True) == 86_400_000
    assert policy.grant(1000, given=True) == 60_000
    assert policy.grant(10**12, given=True) == 86_400_000
    assert policy.grant(120_000, given=True) == 120_000


def test_a_refresh_and_a_write_back_merge_the_same_way_in_either_order() -> None:
    stored = subscription()
    refresh = stored.refreshed(ROTATED, 20_000, now_ms=200, grace_ms=50)
    written = stored.delivered("c1", DeliveryStatus(last_delivery_ms=150))
    for first, second in ((refresh, written), (written, refresh)):
        both = merge(merge(stored, first), second)
        assert both.secrets == (ROTATED, SECRET) and both.expires_ms == 20_000
        assert both.cursor == "c1" and both.delivery_rev == 1


def test_a_write_back_after_the_tombstone_does_not_bring_the_subscription_back() -> None:
    table = SubscriptionTable()
    stored = subscription()
    table.apply(0, "sub_1", stored)
    table.apply(0, "sub_1", None)
    late = stored.delivered("c9", DeliveryStatus())
    assert table.apply(0, "sub_1", late) is False and table.get("sub_1") is None
    again = subscription(refreshed_ms=table.deleted_rev("sub_1") + 1)
    assert table.apply(0, "sub_1", again) and table.get("sub_1") == again


def test_the_old_secret_signs_only_during_the_rotation_grace_window() -> None:
    rotated = subscription().refreshed(ROTATED, 20_000, now_ms=200, grace_ms=50)
    assert rotated.signing_secrets(249) == [ROTATED, SECRET]
    assert rotated.signing_secrets(250) == [ROTATED]


def test_a_suspended_subscription_is_active_again_after_a_refresh() -> None:
    suspended = subscription(status=DeliveryStatus().suspended(150))
    assert not suspended.active
    assert suspended.refreshed(SECRET, 20_000, now_ms=200, grace_ms=0).active


async def test_an_unauthenticated_caller_is_forbidden_and_webhook_is_not_listed() -> None:
    settings = make_settings("unused:9092", fresh_prefix())
    assert settings.auth.mode == "none"

    class Source:
        name = NAME

        def descriptor(self) -> dict[str, Any]:
            return {"name": NAME, "delivery": ["poll", "push"]}

    source: Any = Source()
    methods = EventsMethods([source], streams=None, webhooks=webhook_methods(settings, [source]))
    params = hook("t", "https://example.com/h")
    for method in ("events/subscribe", "events/unsubscribe"):
        with pytest.raises(RpcError) as refused:
            await methods.methods()[method](request(method, params))
        assert refused.value.code == -32024
        assert refused.value.data == {"reason": "unauthenticated"}
    listed = await methods.list(request("events/list", {}))
    assert listed["events"][0]["delivery"] == ["poll", "push"]  # type: ignore[index]


def test_a_success_ends_the_failure_streak_but_keeps_the_last_error() -> None:
    from bridge.events_extension.subscriptions import DeliveryStatus

    failed = DeliveryStatus().failed("http_5xx", 1_000, suspend_after=10)
    assert failed.failed_since_ms == 1_000 and failed.consecutive_failures == 1
    ok = failed.succeeded(2_000)
    assert ok.last_error == "http_5xx" and ok.last_delivery_ms == 2_000
    assert ok.failed_since_ms is None and ok.consecutive_failures == 0
    assert ok.failed("timeout", 3_000, suspend_after=10).failed_since_ms == 3_000


class CountedName(str):
    """A principal that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_verified_and_count_live_look_at_the_principal_s_own_subscriptions_only() -> None:
    # Review F13: each subscribe scanned every subscription of the replica.
    table = SubscriptionTable()
    for i in range(1000):
        table.apply(
            0, f"sub_o{i}", subscription(id=f"sub_o{i}", principal=CountedName(f"other{i}"))
        )
    table.apply(0, "sub_1", subscription())
    CountedName.compared = 0
    assert table.verified("ann", "https://example.com/hooks/1", now_ms=0)
    assert table.count_live("ann", now_ms=0) == 1
    assert CountedName.compared < 10


def test_the_indexes_follow_every_add_refresh_expiry_and_tombstone() -> None:
    table = SubscriptionTable()
    url = "https://example.com/hooks/1"
    assert not table.verified("ann", url, 0) and table.count_live("ann", 0) == 0
    table.apply(0, "sub_1", subscription())
    table.apply(1, "sub_2", subscription(id="sub_2", url="https://example.com/hooks/2"))
    assert table.verified("ann", url, 0) and table.count_live("ann", 0) == 2
    assert not table.verified("ben", url, 0)
    assert not table.verified("ann", url, 10_000) and table.count_live("ann", 10_000) == 0
    table.apply(0, "sub_1", subscription(expires_ms=20_000, refreshed_ms=200))  # a refresh
    assert table.verified("ann", url, 10_000) and table.count_live("ann", 10_000) == 1
    table.apply(0, "sub_1", None)
    assert not table.verified("ann", url, 0) and table.count_live("ann", 0) == 1
    table.apply(1, "sub_2", None)
    assert table.count_live("ann", 0) == 0
    assert not table._by_principal and not table._by_target  # no empty sets left behind

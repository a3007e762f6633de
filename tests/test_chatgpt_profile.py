"""The ``chatgpt`` Events profile: ChatGPT's wire beside SEP-3415's, one setting per deployment.

End to end: a real ``bridge serve`` (auth mode bearer, ``BRIDGE_EVENTS__PROFILE=chatgpt``) on the
real broker, and a client that behaves as ChatGPT does (:mod:`support.chatgpt`: it subscribes
as ChatGPT does, refreshes at ~73% of the grant, deduplicates on ``webhook-id``, receives on a
real HTTPS listener). It receives a task's status changes (with the result inline) and a
pipeline's records, through a bridge restart, and loses none. In-process: the profile and its
setting, the capabilities on both wire eras, the delivery loop without control envelopes, and the
256 KiB bodies.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import trustme
from pydantic import ValidationError
from support.chatgpt import MAX_BODY, ChatGpt, Receiver, chatgpt_receiver, new_secret, refresh_at
from support.layout import fresh_prefix, make_settings
from support.mcp import call, create_task, result
from support.procs import Bridge, running_bearer_bridge
from support.waits import BOUND, wait_until

from bridge.config import EventsSettings, Settings
from bridge.events_extension.delivery import DeliveryPolicy, Revoked, SubscriptionDelivery
from bridge.events_extension.occurrences import Occurrence, PollBatch
from bridge.events_extension.subscriptions import Subscription, SubscriptionTable
from bridge.events_extension.webhooks import Outcome, RetryPolicy, Verdict
from bridge.kafka.admin import kafka_admin
from bridge.kafka.clients import plain_producer
from bridge.log.publisher import TaskEventPublisher
from bridge.server.admission import Caller
from bridge.server.events import (
    EVENT_ID_META,
    EVENTS_EXTENSION,
    FittedBodies,
    WebhookMethods,
    task_outcomes,
)
from bridge.server.handlers import Call, MethodHandlers
from bridge.server.profile import CHATGPT, CHATGPT_TIMEOUT_S, SEP_3415, EventsProfile, check_profile
from bridge.server.wire import JsonRpcRequest, RpcError

kafka = pytest.mark.kafka

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
#: The grant ChatGPT gets (it sends no ttlMs): long enough that a restart never outlives it,
#: short enough that a test sees a refresh (at ~73%: about 29 s after subscribing).
TTL_MS = 40_000


def updated(settings: Settings) -> str:
    return f"{settings.tasks.event_type_prefix}.task.updated"


def orders(settings: Settings) -> str:
    return f"com.example.{settings.topics.prefix}.orders.shipped"


def pipeline_topic(settings: Settings) -> str:
    return f"pipe-{settings.topics.prefix}.orders"


def orders_source(settings: Settings) -> dict[str, Any]:
    return {
        "name": orders(settings),
        "topic": pipeline_topic(settings),
        "description": "An order of the customer was shipped",
        "key_argument": "customerId",
        "headers": {"type": "shipped"},
        "payload_schema": {"type": "object", "required": ["orderId"]},
        "principals": ["alice"],
    }


# --- the profile -----------------------------------------------------------------------------


def test_the_profile_is_one_setting_and_sep_3415_is_the_default() -> None:
    base = make_settings("unused:9092", fresh_prefix())
    assert EventsProfile.of(base) is SEP_3415
    chosen = base.model_copy(
        update={"events": base.events.model_copy(update={"profile": "chatgpt"})}
    )
    assert EventsProfile.of(chosen) is CHATGPT
    with pytest.raises(ValidationError):
        Settings.model_validate({"events": {"profile": "claude"}})


#: What the chatgpt profile needs besides itself: webhooks offered (a principal, a key).
WEBHOOKS_ON: dict[str, Any] = {
    "auth": {"mode": "bearer"},
    "webhooks": {"keys": {"file": "/keys/webhooks.json"}},
}


def test_the_chatgpt_profile_refuses_a_challenge_deadline_that_leaves_no_time_to_answer() -> None:
    def chatgpt(timeout_s: float) -> Settings:
        webhooks = {**WEBHOOKS_ON["webhooks"], "timeout_s": timeout_s}
        values = {"events": {"profile": "chatgpt"}, **WEBHOOKS_ON, "webhooks": webhooks}
        return Settings.model_validate(values)

    bound = CHATGPT.answer_within_s
    assert bound is not None and bound < CHATGPT_TIMEOUT_S  # the profile's own figure
    check_profile(chatgpt(5))
    with pytest.raises(ValueError, match=re.escape(f"webhooks.timeout_s below {bound:g} s")):
        check_profile(chatgpt(bound))
    # No such bound by default.
    check_profile(Settings.model_validate({"webhooks": {"timeout_s": 9}}))


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"auth": {"mode": "none"}}, "BRIDGE_AUTH__MODE"),
        ({"webhooks": {"keys": {}}}, "BRIDGE_WEBHOOKS__KEYS__FILE"),
    ],
    ids=["auth-none", "no-webhook-key"],
)
def test_the_chatgpt_profile_refuses_to_start_without_webhooks(
    changed: dict[str, Any], named: str
) -> None:
    settings = {"events": {"profile": "chatgpt"}, **WEBHOOKS_ON, **changed}
    with pytest.raises(ValueError, match=f"BRIDGE_EVENTS__PROFILE=chatgpt needs .*{named}"):
        check_profile(Settings.model_validate(settings))
    check_profile(Settings.model_validate({**settings, "events": {"profile": "sep-3415"}}))


class _Events:
    identifier = EVENTS_EXTENSION

    def methods(self) -> dict[str, Any]:
        async def listed(call: Call) -> dict[str, Any]:
            return {"events": []}

        return {"events/list": listed, "events/subscribe": listed, "events/unsubscribe": listed}

    def settings(self) -> dict[str, Any]:
        return {}


def _handlers(profile: str, extensions: list[Any]) -> MethodHandlers:
    settings = make_settings("unused:9092", fresh_prefix())
    settings = settings.model_copy(
        update={"events": settings.events.model_copy(update={"profile": profile})}
    )
    streams: Any = None
    service: Any = None
    return MethodHandlers(settings, service, [], streams, extensions)


def _call(method: str, params: dict[str, Any], *, legacy: bool = False) -> Call:
    rpc = JsonRpcRequest(jsonrpc="2.0", id=1, method=method, params=params)
    return Call(rpc, Caller("alice", "conn"), legacy=legacy, params=params)


async def _capabilities(handlers: MethodHandlers) -> tuple[dict[str, Any], dict[str, Any]]:
    discovered: Any = await handlers.dispatch(_call("server/discover", {}))
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    initialized: Any = await handlers.dispatch(_call("initialize", hello, legacy=True))
    return discovered["capabilities"], initialized["capabilities"]


async def test_chatgpt_sees_a_top_level_events_capability_on_discover_and_initialize() -> None:
    discovered, initialized = await _capabilities(_handlers("chatgpt", [_Events()]))
    assert discovered["events"] == {} and initialized["events"] == {}
    assert discovered["extensions"][EVENTS_EXTENSION] == {}  # the SEP's key stays
    legacy = _handlers("chatgpt", [_Events()]).legacy
    assert {"events/list", "events/subscribe", "events/unsubscribe"} <= set(legacy)
    assert "events/poll" not in legacy and "events/stream" not in legacy


async def test_the_default_profile_advertises_the_extension_key_only() -> None:
    discovered, initialized = await _capabilities(_handlers("sep-3415", [_Events()]))
    assert "events" not in discovered and "events" not in initialized
    assert discovered["extensions"][EVENTS_EXTENSION] == {}
    assert "events/list" not in _handlers("sep-3415", [_Events()]).legacy


async def test_no_events_capability_is_advertised_without_the_events_extension() -> None:
    discovered, initialized = await _capabilities(_handlers("chatgpt", []))
    assert "events" not in discovered and "events" not in initialized


def _webhooks(profile: EventsProfile) -> WebhookMethods:
    settings = make_settings("unused:9092", fresh_prefix())
    restored = asyncio.Event()
    restored.set()
    service: Any = SimpleNamespace(
        registry=SimpleNamespace(restored=restored, table=SubscriptionTable())
    )

    class Source:
        name = "com.example.x"

    source: Any = Source()
    return WebhookMethods(settings, {source.name: source}, service, profile=profile)


async def test_unsubscribing_an_unknown_subscription_answers_empty_for_chatgpt_not_found_else() -> (
    None
):
    params = {"name": "com.example.x", "arguments": {}, "delivery": {"url": "https://e.com/h"}}
    assert await _webhooks(CHATGPT).unsubscribe(_call("events/unsubscribe", params)) == {}
    with pytest.raises(RpcError) as refused:
        await _webhooks(SEP_3415).unsubscribe(_call("events/unsubscribe", params))
    assert refused.value.code == -32023 and refused.value.data == {"kind": "subscription"}


NOW_MS = 1_800_000_000_000


class _Subscribing:
    """A webhook service as events/subscribe needs it; ``during_verify`` runs in the challenge."""

    def __init__(self, during_verify: Any = None) -> None:
        restored = asyncio.Event()
        restored.set()
        self.registry = SimpleNamespace(restored=restored, table=SubscriptionTable())
        self.during_verify = during_verify or (lambda: None)

    async def verify(self, principal: str, url: str, sub_id: str, secret: str) -> Outcome:
        self.during_verify()
        return Outcome(Verdict.DELIVERED)

    async def put(self, sub: Subscription) -> None:
        self.registry.table.apply(0, sub.id, sub)


class _Polled:
    name = "com.example.x"

    async def poll(self, *args: Any) -> PollBatch:
        return PollBatch([], "c0", truncated=False, has_more=False, next_poll_ms=1000)


def _subscriber(
    profile: EventsProfile, service: _Subscribing, clock: Any = lambda: 0.0
) -> WebhookMethods:
    settings = make_settings("unused:9092", fresh_prefix())
    source: Any = _Polled()
    return WebhookMethods(
        settings,
        {source.name: source},
        cast(Any, service),
        now_ms=lambda: NOW_MS,
        profile=profile,
        clock=clock,
    )


def _subscribe_call(expires: float | None = None) -> Call:
    params = {
        "name": "com.example.x",
        "arguments": {},
        "delivery": {"mode": "webhook", "url": "https://example.com/h", "secret": SECRET},
    }
    rpc = JsonRpcRequest(jsonrpc="2.0", id=1, method="events/subscribe", params=params)
    return Call(rpc, Caller("alice", "conn", expires=expires), legacy=False, params=params)


@pytest.mark.parametrize("profile", [CHATGPT, SEP_3415], ids=lambda p: p.name)
async def test_a_subscription_never_outlives_the_credential_it_was_made_with(
    profile: EventsProfile,
) -> None:
    from bridge.tasks.messages import iso_ms

    service = _Subscribing()
    methods = _subscriber(profile, service)
    credential_ms = NOW_MS + 60_000  # a JWT's exp, or auth.bearer_ttl_s after it was shown
    got: Any = await methods.subscribe(_subscribe_call(expires=credential_ms / 1000))
    assert got["refreshBefore"] == iso_ms(credential_ms)
    (sub_id,) = service.registry.table.in_partitions([0])
    assert service.registry.table.get(sub_id).expires_ms == credential_ms
    # A refresh with a credential that lasts longer gets the TTL again, never past it.
    again: Any = await methods.subscribe(_subscribe_call())
    assert again["refreshBefore"] == iso_ms(NOW_MS + methods.ttl.default_ms)


async def test_chatgpt_s_subscribe_past_its_deadline_is_refused_retriable_and_stores_nothing() -> (
    None
):
    now = [0.0]

    def slow_challenge() -> None:
        now[0] += CHATGPT_TIMEOUT_S  # the receiver answered the challenge late

    service = _Subscribing(slow_challenge)
    with pytest.raises(RpcError) as late:
        await _subscriber(CHATGPT, service, clock=lambda: now[0]).subscribe(_subscribe_call())
    assert late.value.http_status == 503 and late.value.data["reason"] == "deadline"
    assert "retryAfterMs" in late.value.data
    assert service.registry.table.in_partitions([0]) == []  # nothing stored
    restoring = _Subscribing()
    restoring.registry.restored.clear()  # a replica just started: its view is not restored
    ticks = iter([0.0])  # the request began at 0; by the restore wait its 8 s had passed

    def later() -> float:
        return next(ticks, CHATGPT_TIMEOUT_S)

    with pytest.raises(RpcError) as unrestored:
        async with asyncio.timeout(BOUND):
            await _subscriber(CHATGPT, restoring, clock=later).subscribe(_subscribe_call())
    assert unrestored.value.http_status == 503 and unrestored.value.data["reason"] == "deadline"
    other = _Subscribing(slow_challenge)
    await _subscriber(SEP_3415, other, clock=lambda: now[0]).subscribe(_subscribe_call())
    assert len(other.registry.table.in_partitions([0])) == 1  # no deadline under the SEP


# --- the delivery loop without control envelopes ---------------------------------------------


def _sub() -> Subscription:
    return Subscription(
        id="sub_1",
        name="com.example.x",
        principal="alice",
        arguments={},
        url="https://example.com/hooks/1",
        secrets=(SECRET,),
        previous_until_ms=0,
        expires_ms=2**62,
        refreshed_ms=100,
        cursor="c0",
        floor_ms=None,
        delivery_rev=0,
    )


class _Store:
    def __init__(self) -> None:
        self.subs = {"sub_1": _sub()}

    def current(self, sub_id: str) -> Subscription | None:
        return self.subs.get(sub_id)

    async def put(self, sub: Subscription) -> None:
        self.subs[sub.id] = sub

    async def delete(self, sub_id: str) -> None:
        self.subs.pop(sub_id, None)


class _Sender:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def post(
        self, url: str, body: bytes, *, msg_id: str, subscription_id: str, secrets: list[str]
    ) -> Outcome:
        self.bodies.append(json.loads(body))
        return Outcome(Verdict.DELIVERED)


def _loop(
    profile: EventsProfile, poll: Any, **kw: Any
) -> tuple[SubscriptionDelivery, _Store, _Sender]:
    policy = DeliveryPolicy(
        RetryPolicy(max_attempts=1, max_elapsed_seconds=1, base_delay_seconds=0.1),
        poll_interval_s=0.1,
        suspend_after=10,
        control_envelopes=profile.control_envelopes,
        max_body_bytes=profile.max_body_bytes,
    )
    store, sender = _Store(), _Sender()
    return SubscriptionDelivery("sub_1", store, poll, sender, policy, **kw), store, sender


@pytest.mark.parametrize("profile", [CHATGPT, SEP_3415], ids=lambda p: p.name)
async def test_a_gap_is_passed_over_without_an_envelope_under_chatgpt(
    profile: EventsProfile,
) -> None:
    async def poll(*args: Any) -> PollBatch:
        return PollBatch([], "c9", truncated=True, has_more=False, next_poll_ms=1000)

    loop, store, sender = _loop(profile, poll)
    await loop._step(_sub())
    assert store.subs["sub_1"].cursor == "c9"  # the read went on either way
    envelopes = [body["type"] for body in sender.bodies]
    assert envelopes == ([] if profile is CHATGPT else ["gap"])


@pytest.mark.parametrize("profile", [CHATGPT, SEP_3415], ids=lambda p: p.name)
async def test_a_revoked_subscription_ends_without_an_envelope_under_chatgpt(
    profile: EventsProfile,
) -> None:
    async def poll(*args: Any) -> PollBatch:
        raise Revoked({"code": -32023, "message": "gone", "data": {"kind": "task"}})

    loop, store, sender = _loop(profile, poll)
    await loop.run()
    assert store.subs == {}  # deleted either way
    assert [body["type"] for body in sender.bodies] == (
        [] if profile is CHATGPT else ["terminated"]
    )


# --- 256 KiB bodies ----------------------------------------------------------------------------


UPDATED = "io.mcpbridge.task.updated"


def _occurrence(data: dict[str, Any], name: str = UPDATED) -> Occurrence:
    return Occurrence("T.5.updated", name, 1_700_000_000_000, data, "u1.0.6")


def _size(message: dict[str, Any]) -> int:
    return len(json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode())


COMPLETED = {
    "taskId": "T",
    "seq": 5,
    "status": "completed",
    "resultRequest": {"method": "tasks/get", "params": {"taskId": "T"}},
}


async def test_a_completed_task_s_result_is_inline_when_the_body_fits() -> None:
    outcome = {"result": {"content": [{"type": "text", "text": "42"}]}}
    asked: list[tuple[str, str]] = []

    async def outcomes(principal: str, task_id: str) -> dict[str, Any] | None:
        asked.append((principal, task_id))
        return outcome

    body = await FittedBodies(MAX_BODY, UPDATED, outcomes)(_sub(), _occurrence(COMPLETED), "u1.0.5")
    assert asked == [("alice", "T")]  # the subscription's principal: tasks/get's authorization
    assert body["data"] == {"taskId": "T", "seq": 5, "status": "completed", **outcome}
    assert body["eventId"] == "T.5.updated" and body["cursor"] == "u1.0.6"


async def test_a_result_too_large_to_fit_leaves_the_result_request() -> None:
    huge = {"result": {"content": [{"type": "text", "text": "x" * MAX_BODY}]}}

    async def outcomes(principal: str, task_id: str) -> dict[str, Any] | None:
        return huge

    body = await FittedBodies(MAX_BODY, UPDATED, outcomes)(_sub(), _occurrence(COMPLETED), "u1.0.5")
    assert body["data"] == COMPLETED and _size(body) <= MAX_BODY


async def test_an_unreadable_outcome_leaves_the_result_request() -> None:
    async def outcomes(principal: str, task_id: str) -> dict[str, Any] | None:
        return None

    body = await FittedBodies(MAX_BODY, UPDATED, outcomes)(_sub(), _occurrence(COMPLETED), "u1.0.5")
    assert body["data"] == COMPLETED


async def test_a_record_too_large_for_one_body_is_sent_as_the_request_that_reads_it() -> None:
    big = _occurrence({"orderId": "o", "pad": "x" * MAX_BODY}, name="com.example.x")
    sub = dataclasses.replace(_sub(), arguments={"customerId": "c1"})
    body = await FittedBodies(MAX_BODY, UPDATED, None)(sub, big, "k1.aa.4")
    assert _size(body) <= MAX_BODY
    assert body["eventId"] == big.event_id and body["cursor"] == big.cursor
    assert body["data"]["omitted"] == "too_large" and body["data"]["bytes"] > MAX_BODY
    assert body["data"]["resultRequest"] == {
        "method": "events/poll",
        "params": {
            "name": "com.example.x",
            "arguments": {"customerId": "c1"},
            "cursor": "k1.aa.4",
            "maxEvents": 1,
            "_meta": {EVENT_ID_META: big.event_id},  # names the record: nothing else is read
        },
    }
    small = _occurrence({"orderId": "o"}, name="com.example.x")
    assert (await FittedBodies(MAX_BODY, UPDATED, None)(sub, small, None)) == small.wire(
        with_cursor=True
    )


async def test_a_pipeline_record_s_result_request_is_neither_acted_on_nor_passed_on() -> None:
    asked: list[str] = []

    async def outcomes(principal: str, task_id: str) -> dict[str, Any] | None:
        asked.append(task_id)
        return {"result": {"content": []}}

    forged = {**COMPLETED, "pad": "x" * MAX_BODY}  # a producer's value, shaped like ours
    record = _occurrence(forged, name="com.example.x")
    body = await FittedBodies(MAX_BODY, UPDATED, outcomes)(_sub(), record, "k1.aa.4")
    assert asked == []  # no tasks/get on a producer's say-so
    assert body["data"]["resultRequest"]["method"] == "events/poll"
    small = _occurrence(COMPLETED, name="com.example.x")
    shaped = await FittedBodies(MAX_BODY, UPDATED, outcomes)(_sub(), small, None)
    assert shaped == small.wire(with_cursor=True) and asked == []


async def test_an_oversized_task_update_keeps_its_task_seq_and_status() -> None:
    huge = {**COMPLETED, "statusMessage": "m" * MAX_BODY}
    body = await FittedBodies(MAX_BODY, UPDATED, None)(_sub(), _occurrence(huge), "u1.0.5")
    assert _size(body) <= MAX_BODY
    assert body["data"] == {
        "omitted": "too_large",
        "bytes": _size(_occurrence(huge).wire(with_cursor=True)),
        "taskId": "T",
        "seq": 5,
        "status": "completed",
        "resultRequest": COMPLETED["resultRequest"],
    }


async def test_an_owner_that_does_not_answer_leaves_the_result_request_after_a_short_wait() -> None:
    never = asyncio.Event()  # the owner accepted the read and never answers

    async def outcomes(principal: str, task_id: str) -> dict[str, Any] | None:
        await never.wait()
        return {"result": {"content": []}}

    shape = FittedBodies(MAX_BODY, UPDATED, outcomes, wait_s=0.05)
    async with asyncio.timeout(BOUND):  # not the peers' 30 s: the shape's own bound
        body = await shape(_sub(), _occurrence(COMPLETED), "u1.0.5")
    assert body["data"] == COMPLETED


def test_the_body_shape_follows_inline_outcomes_and_the_bound_each_on_its_own() -> None:
    from bridge.events_extension.delivery import as_is
    from bridge.server.events import fitted_bodies

    settings = make_settings("unused:9092", fresh_prefix())

    async def outcomes(principal: str, task_id: str) -> dict[str, Any] | None:
        return None

    assert fitted_bodies(settings, SEP_3415, outcomes) is as_is
    inline_only = fitted_bodies(
        settings, dataclasses.replace(SEP_3415, inline_outcomes=True), outcomes
    )
    assert isinstance(inline_only, FittedBodies)
    assert inline_only.limit is None and inline_only.outcomes is outcomes
    bound_only = fitted_bodies(settings, dataclasses.replace(SEP_3415, max_body_bytes=10), outcomes)
    assert isinstance(bound_only, FittedBodies)
    assert bound_only.limit == 10 and bound_only.outcomes is None
    both = fitted_bodies(settings, CHATGPT, outcomes)
    assert isinstance(both, FittedBodies) and both.limit == MAX_BODY and both.outcomes is outcomes


def test_the_outcome_wait_is_short() -> None:
    assert FittedBodies(MAX_BODY, UPDATED, None).wait_s <= 2


def _task_view(**fields: Any) -> Any:
    from bridge.tasks.service import TaskView

    return TaskView(created_ms=0, last_updated_ms=0, ttl_ms=None, poll_interval_ms=1000, **fields)


class _Tasks:
    def __init__(self, view: Any) -> None:
        self.view = view
        self.asked: list[tuple[str, str]] = []

    async def get(self, task_id: str, principal: str) -> Any:
        self.asked.append((task_id, principal))
        return self.view


async def test_task_outcomes_reads_locally_for_the_principal() -> None:
    done = {"content": [{"type": "text", "text": "42"}]}
    tasks = _Tasks(_task_view(task_id="T", status="completed", result=done))
    outcome = task_outcomes(tasks)
    assert await outcome("alice", "T") == {"result": done}
    assert tasks.asked == [("T", "alice")]
    failed = {"code": -1, "message": "no"}
    tasks.view = _task_view(task_id="T", status="failed", error=failed)
    assert await outcome("alice", "T") == {"error": failed}


async def test_a_result_no_longer_retained_is_not_inlined_as_empty() -> None:
    gone = _task_view(task_id="T", status="completed", result={"content": []}, retained=False)
    gone.status_message = "the result is no longer retained"
    assert await task_outcomes(_Tasks(gone))("alice", "T") is None


class _Routing:
    def __init__(self, owner: str | None) -> None:
        self.owner = owner

    async def where(self, task_id: str) -> str | None:
        return self.owner


class _Peers:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, dict[str, Any], Any]] = []

    async def call(self, owner: str, method: str, params: dict[str, Any], identity: Any) -> Any:
        self.calls.append((owner, method, params, identity))
        return self.answer


async def test_tasks_get_marks_a_result_whose_status_event_is_gone_as_not_retained() -> None:
    from bridge.log.seqindex import owner_key
    from bridge.server.handlers import detailed_task
    from bridge.server.wire import RESULT_RETAINED_META
    from bridge.tasks.messages import owner_digest
    from bridge.tasks.service import TaskService

    alice = owner_key(owner_digest("alice"))
    entry = SimpleNamespace(
        owned_by=lambda key: key == alice,
        ttl_ms=-1,
        created_ms=0,
        status=SimpleNamespace(wire="completed"),
        poll_ms=1000,
        status_offset=5,
        first_offset=0,
    )
    indexer = SimpleNamespace(
        lookup=lambda task_id: (0, entry),
        add_listener=lambda listener: None,
        add_ownership_listener=lambda listener: None,
    )

    class Gone:
        async def event_at(self, partition: int, offset: int) -> None:
            return None  # retention deleted the status event

    settings = make_settings("unused:9092", fresh_prefix())
    service = TaskService(settings, cast(Any, indexer), cast(Any, Gone()), {}, cast(Any, object()))
    view = await service.get("T", "alice")
    assert view.retained is False and view.result == {"content": []}
    assert detailed_task(view)["_meta"] == {RESULT_RETAINED_META: False}
    assert await task_outcomes(service)("alice", "T") is None  # not inlined as an empty result


async def test_task_outcomes_reads_at_the_owner_signed_for_the_principal() -> None:
    from bridge.server.hops import PeerIdentity
    from bridge.server.wire import CLIENT_CAPS_META, RESULT_RETAINED_META, tasks_capability

    done = {"content": [{"type": "text", "text": "there"}]}
    peers = _Peers({"taskId": "T", "status": "completed", "result": done})
    routing: Any = _Routing("http://owner:9000")
    outcome = task_outcomes(None, routing=routing, peers=cast(Any, peers))
    assert await outcome("alice", "T") == {"result": done}
    assert peers.calls == [
        (
            "http://owner:9000",
            "tasks/get",
            {"taskId": "T", "_meta": {CLIENT_CAPS_META: tasks_capability()}},
            PeerIdentity("alice", "alice"),
        )
    ]
    peers.answer = {**peers.answer, "_meta": {RESULT_RETAINED_META: False}}
    assert await outcome("alice", "T") is None  # the owner says the result is a stand-in
    local = _Tasks(_task_view(task_id="T", status="completed", result=done))
    here = task_outcomes(local, routing=cast(Any, _Routing(None)), peers=cast(Any, peers))
    assert await here("bob", "T") == {"result": done} and local.asked == [("T", "bob")]


async def test_a_body_that_cannot_fit_even_reduced_is_not_sent_but_counted_and_passed_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    big = _occurrence({"orderId": "o", "pad": "x" * MAX_BODY}, name="com.example.x")

    async def poll(*args: Any) -> PollBatch:
        return PollBatch([big], "c1", truncated=False, has_more=False, next_poll_ms=1000)

    counted: list[int] = []
    shape = FittedBodies(MAX_BODY, UPDATED, None)
    loop, store, sender = _loop(CHATGPT, poll, shape=shape, on_too_large=lambda: counted.append(1))
    # The stub repeats the subscriber's arguments: 300 KiB of them leave no room for it.
    store.subs["sub_1"] = dataclasses.replace(_sub(), arguments={"customerId": "c" * 300_000})
    await loop._step(store.subs["sub_1"])
    assert sender.bodies == []  # never sent
    after = store.subs["sub_1"]
    assert after.cursor == "c1" and after.status.last_error == "too_large"  # passed over
    assert counted == [1]
    assert any("sub_1" in r.getMessage() and "bytes" in r.getMessage() for r in caplog.records)


def test_refreshes_are_due_at_73_percent_of_the_grant() -> None:
    assert refresh_at(1000.0, "1970-01-01T00:18:20Z") == pytest.approx(1073.0)  # 100 s granted
    assert refresh_at(1000.0, "1970-01-01T00:00:00Z") == pytest.approx(1000.0)  # already due


# --- end to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def receiver(ca: trustme.CA) -> Iterator[Receiver]:
    with chatgpt_receiver(ca) as receiver:
        yield receiver


async def _create_pipeline_topic(settings: Settings) -> None:
    from aiokafka.admin import NewTopic

    async with kafka_admin(settings) as admin:
        await admin.create_topics([NewTopic(pipeline_topic(settings), 3, 1)])


@pytest.fixture(scope="module")
def gbridge(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA
) -> Iterator[Bridge]:
    root: Path = tmp_path_factory.mktemp("chatgpt")
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    # Records up to 512 KiB, as a pipeline may write: some do not fit one 256 KiB body.
    settings = make_settings(
        kafka_bootstrap, fresh_prefix("g"), tasks={"max_event_bytes": 512 * 1024}
    )
    asyncio.run(_create_pipeline_topic(settings))
    with running_bearer_bridge(
        settings,
        root,
        TOKENS,
        BRIDGE_EVENTS__PROFILE="chatgpt",
        BRIDGE_EVENTS__SOURCES=json.dumps([orders_source(settings)]),
        BRIDGE_WEBHOOKS__ALLOWLIST='["127.0.0.1/32"]',
        BRIDGE_WEBHOOKS__CA_FILE=str(ca_file),
        BRIDGE_WEBHOOKS__POLL_INTERVAL_S="0.2",
        BRIDGE_WEBHOOKS__TIMEOUT_S="2",
        BRIDGE_WEBHOOKS__TTL_MIN_MS="1000",
        BRIDGE_WEBHOOKS__TTL_DEFAULT_MS=str(TTL_MS),
    ) as running:
        yield running


async def _produce_orders(settings: Settings, *orders: tuple[str, dict[str, Any]]) -> None:
    async with plain_producer(settings) as producer:
        for customer, value in orders:
            await producer.send_and_wait(
                pipeline_topic(settings),
                json.dumps(value).encode(),
                customer.encode(),
                headers=[("type", b"shipped")],
            )


async def _complete(settings: Settings, task: str, answer: str) -> None:
    async with TaskEventPublisher(settings) as pub:
        await pub.publish(
            task,
            settings.own_types.status,
            {"status": "completed", "result": {"content": [{"type": "text", "text": answer}]}},
        )


def _completed(receiver: Receiver, task: str) -> dict[str, Any] | None:
    for message in receiver.to("updates"):
        if message["data"]["taskId"] == task and message["data"]["status"] == "completed":
            return dict(message)
    return None


def _order_ids(receiver: Receiver) -> list[str]:
    return [m["data"].get("orderId", m["data"].get("omitted")) for m in receiver.to("orders")]


@kafka
async def test_chatgpt_subscribes_gets_task_results_and_pipeline_events_across_a_restart(
    gbridge: Bridge, receiver: Receiver
) -> None:
    settings = gbridge.settings
    async with ChatGpt(gbridge.url, "tok-alice", receiver) as chatgpt:
        capabilities = await chatgpt.discover()
        assert capabilities["events"] == {}
        listed = (await chatgpt.request("events/list"))["result"]["events"]
        offered = {e["name"]: e["delivery"] for e in listed}
        assert "webhook" in offered[updated(settings)] and "webhook" in offered[orders(settings)]

        got = await chatgpt.subscribe("updates", updated(settings), {})
        assert set(got["result"]) - {"resultType"} == {"id", "refreshBefore", "cursor", "truncated"}
        await chatgpt.subscribe("orders", orders(settings), {"customerId": "c1"})
        assert sorted(receiver.challenges) == ["orders", "updates"]  # verified inside subscribe

        async with httpx.AsyncClient(
            timeout=BOUND, headers={"Authorization": "Bearer tok-alice"}
        ) as http:
            first = await create_task(http, gbridge.url, "slow_compute", {"seconds": 600})
            second = await create_task(http, gbridge.url, "slow_compute", {"seconds": 600})
        await _complete(settings, first, "forty-two")
        big = {"orderId": "big", "pad": "x" * MAX_BODY}  # fits the pipeline, not one body
        await _produce_orders(
            settings, ("c1", {"orderId": "o1"}), ("c2", {"orderId": "not-c1"}), ("c1", big)
        )

        done = await wait_until(lambda: _completed(receiver, first), what="the first result")
        assert done["data"]["result"] == {"content": [{"type": "text", "text": "forty-two"}]}
        assert "resultRequest" not in done["data"]  # acted on without a second call
        await wait_until(lambda: len(receiver.to("orders")) >= 2, what="two orders")

        assert gbridge.server is not None
        gbridge.server.stop()
        await _complete(settings, second, "after the restart")  # while no bridge runs
        await _produce_orders(settings, ("c1", {"orderId": "o3"}))
        gbridge.start_server()

        again = await wait_until(lambda: _completed(receiver, second), what="the second result")
        assert again["data"]["result"]["content"][0]["text"] == "after the restart"
        await wait_until(lambda: len(receiver.to("orders")) >= 3, what="the order after restart")
        assert _order_ids(receiver) == ["o1", "too_large", "o3"]  # each once, none lost, in order

        stub = receiver.to("orders")[1]["data"]
        assert stub["bytes"] > MAX_BODY
        async with httpx.AsyncClient(
            timeout=BOUND, headers={"Authorization": "Bearer tok-alice"}
        ) as http:
            request = stub["resultRequest"]
            read = await result(http, gbridge.url, request["method"], request["params"])
        assert [e["data"]["orderId"] for e in read["events"]] == ["big"]  # poll stays offered

        first_updates = [m for m in receiver.to("updates") if m["data"]["taskId"] == first]
        assert first_updates[0]["data"]["status"] == "working"
        assert receiver.refused == []  # signatures, sizes, no control envelope
        assert all(d.size <= MAX_BODY for d in receiver.events)

        await wait_until(lambda: chatgpt.refreshes("updates") >= 1, what="a refresh at ~73%")
        refreshed = chatgpt.subscriptions["updates"].answer
        assert refreshed["id"] == got["result"]["id"] and "deliveryStatus" not in refreshed
        assert sorted(receiver.challenges) == ["orders", "updates"]  # a refresh sends none

        gone = await chatgpt.unsubscribe("never", updated(settings), {})
        assert gone["result"] == {"resultType": "complete"}  # unknown: {} (the SEP: NotFound)
        left = await chatgpt.unsubscribe("updates", updated(settings), {})
        assert left["result"] == {"resultType": "complete"}


@kafka
async def test_a_failed_verification_is_minus_32015_with_its_reason(
    gbridge: Bridge, receiver: Receiver
) -> None:
    receiver.silent.add("mute")
    async with ChatGpt(gbridge.url, "tok-bob", receiver) as chatgpt:
        refused = await chatgpt.subscribe("mute", updated(gbridge.settings), {})
    assert refused["error"]["code"] == -32015
    assert refused["error"]["data"] == {"reason": "challenge_failed"}
    async with httpx.AsyncClient(
        timeout=BOUND, headers={"Authorization": "Bearer tok-bob"}
    ) as http:
        listed = await call(http, gbridge.url, "events/list", {})
    assert "result" in listed  # nothing else changed for this client


async def _legacy(http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any]) -> Any:
    """A request on the legacy (``initialize``) path: no ``MCP-Protocol-Version`` header."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {"accept": "application/json, text/event-stream"}
    reply = await http.post(url, json=body, headers=headers)
    return reply.json()


@kafka
async def test_chatgpt_on_the_initialize_path_sees_the_capability_and_the_events_methods(
    gbridge: Bridge, receiver: Receiver
) -> None:
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c"}}
    async with httpx.AsyncClient(
        timeout=BOUND, headers={"Authorization": "Bearer tok-bob"}
    ) as http:
        initialized = await _legacy(http, gbridge.url, "initialize", hello)
        listed = await _legacy(http, gbridge.url, "events/list", {})
        target = {"url": "https://example.com/never"}
        gone = {"name": updated(gbridge.settings), "arguments": {}, "delivery": target}
        unsubscribed = await _legacy(http, gbridge.url, "events/unsubscribe", gone)
        polled = await _legacy(http, gbridge.url, "events/poll", {"name": "x"})
        secret = receiver.secrets.setdefault("legacy", new_secret())
        hook = {"mode": "webhook", "url": receiver.url("legacy"), "secret": secret}
        wanted = {"name": updated(gbridge.settings), "arguments": {}, "delivery": hook}
        subscribed = await _legacy(http, gbridge.url, "events/subscribe", wanted)
        left = await _legacy(http, gbridge.url, "events/unsubscribe", wanted)
    assert set(subscribed["result"]) - {"resultType"} == {
        "id",
        "refreshBefore",
        "cursor",
        "truncated",
    }
    assert receiver.challenges == ["legacy"] and left["result"] == {}
    assert initialized["result"]["capabilities"]["events"] == {}
    assert updated(gbridge.settings) in {e["name"] for e in listed["result"]["events"]}
    assert unsubscribed["result"] == {}
    assert polled["error"]["code"] == -32601  # ChatGPT neither polls nor streams: not offered here


def test_the_app_refuses_to_be_built_with_a_profile_that_cannot_work() -> None:
    from bridge.server.app import create_app

    settings = make_settings("unused:9092", fresh_prefix()).model_copy(
        update={"events": EventsSettings(profile="chatgpt")}
    )
    with pytest.raises(ValueError, match="BRIDGE_EVENTS__PROFILE=chatgpt needs"):
        create_app(settings)

"""The demo's sleeping agent (bridgedev/demo/sleeper.py, agent.py, receiver.py).

In-process: the receiver's judgement of a POST (signature, challenge, wake-up once per
``webhook-id``), with bodies signed by the bridge's own signer. End to end: a real `bridge serve`
(auth mode bearer, tools in process, the demo pack) on the test broker, the agent as real
processes, the receiver over real HTTPS on loopback with the demo's throwaway CA.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.layout import fresh_prefix, make_settings
from support.procs import Bridge, running_bridge, webhook_keys_env

from bridge.client import StreamError, TaskStreamClient
from bridge.events_extension.webhooks import signature_headers
from bridge.vocabulary import NOT_FOUND
from bridgedev.demo.agenthome import AgentConfig, AgentHome
from bridgedev.demo.receiver import Answer, Wake, WebhookReceiver, throwaway_tls
from bridgedev.demo.sleeper import SleepingAgent, SleepOutcome, new_webhook_secret
from bridgedev.demo.walkthrough import (
    AGENT_ARGUMENTS,
    AGENT_READS_BEFORE_SLEEP,
    AGENT_TOOL,
    AGENT_WAKE_BOUND_S,
)

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"o" * 32).decode()
TOKEN = "sleeping-agent-test-token"


# --- the receiver, in process ------------------------------------------------------------------


def update(status: str, seq: int = 7, task_id: str = "T1") -> bytes:
    """A task.updated delivery body, as the bridge's delivery loop writes it."""
    message = {
        "eventId": f"{task_id}.{seq}.updated",
        "name": "io.mcpbridge.task.updated",
        "timestamp": "2026-01-01T00:00:00.000Z",
        "data": {"taskId": task_id, "seq": seq, "status": status},
        "cursor": "dTEuMC41",
    }
    return json.dumps(message, separators=(",", ":")).encode()


def signed(body: bytes, msg_id: str, secret: str = SECRET) -> dict[str, str]:
    return signature_headers(msg_id, body, [secret], datetime.now(UTC))


def receiver() -> tuple[WebhookReceiver, list[Wake]]:
    woken: list[Wake] = []
    return WebhookReceiver(SECRET, woken.append), woken


def test_a_signed_update_of_an_ended_task_wakes_the_agent_once_per_webhook_id() -> None:
    hook, woken = receiver()
    body = update("completed")
    headers = signed(body, "T1.7")
    assert hook.handle(headers, body) == Answer(204)
    assert hook.handle(signed(body, "T1.7"), body) == Answer(204)  # at least once: sent again
    assert woken == [Wake("T1", 7, "completed")]
    assert [d.verified for d in hook.deliveries] == [True, True]


def test_a_tampered_body_with_its_signature_headers_is_refused_and_wakes_nobody() -> None:
    hook, woken = receiver()
    body = update("working")
    headers = signed(body, "T1.7")
    forged = body.replace(b'"working"', b'"completed"')
    assert hook.handle(headers, forged) == Answer(401)
    assert woken == []
    [refused] = hook.deliveries
    assert (refused.verified, refused.kind) == (False, "refused")


def test_a_body_signed_with_another_secret_or_unsigned_is_refused() -> None:
    hook, woken = receiver()
    body = update("completed")
    assert hook.handle(signed(body, "T1.7", OTHER), body).status == 401
    assert hook.handle({"webhook-id": "T1.7"}, body).status == 401
    assert woken == []


def test_the_verification_challenge_is_echoed_only_when_signed() -> None:
    hook, _ = receiver()
    body = b'{"type":"verification","challenge":"n0nce"}'
    answer = hook.handle(signed(body, "msg_verification"), body)
    assert answer.status == 200 and json.loads(answer.body) == {"challenge": "n0nce"}
    assert hook.handle(signed(body, "msg_verification", OTHER), body).status == 401


def test_an_update_the_agent_has_nothing_to_do_for_is_acknowledged_without_waking_it() -> None:
    hook, woken = receiver()
    for status in ("working", "input_required"):
        body = update(status)
        assert hook.handle(signed(body, f"T1.{status}"), body) == Answer(204)
    assert woken == []


def test_header_names_are_matched_whatever_their_case() -> None:
    hook, woken = receiver()
    for task_id in ("T1", "T2"):  # two deliveries: two webhook-ids, whatever the names' case
        body = update("failed", task_id=task_id)
        headers = {k.title(): v for k, v in signed(body, f"{task_id}.7").items()}
        assert hook.handle(headers, body) == Answer(204)
    assert woken == [Wake("T1", 7, "failed"), Wake("T2", 7, "failed")]
    assert [d.webhook_id for d in hook.deliveries] == ["T1.7", "T2.7"]


def test_a_new_webhook_secret_is_a_standard_webhooks_secret_of_32_random_bytes() -> None:
    secret = new_webhook_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert new_webhook_secret() != secret


# --- end to end on the broker ------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sleeper")


@pytest.fixture(scope="module")
def agent_bridge(kafka_bootstrap: str, root: Path) -> Iterator[tuple[Bridge, Any]]:
    """`bridge serve --with-workers` with the demo pack, bearer auth, and the demo receiver's
    CA trusted and loopback allowed, as `bridge demo` configures its bridge."""
    tls = throwaway_tls(root)
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps({TOKEN: "agent"}))
    settings = make_settings(kafka_bootstrap, fresh_prefix("s"), tool_packs=["demo"])
    with running_bridge(
        settings,
        root,
        workers=0,
        with_workers=True,
        BRIDGE_AUTH__MODE="bearer",
        BRIDGE_AUTH__TOKENS_FILE=str(tokens),
        BRIDGE_WEBHOOKS__ALLOWLIST='["127.0.0.1/32"]',
        BRIDGE_WEBHOOKS__CA_FILE=str(tls.ca_file),
        **webhook_keys_env(root),
    ) as running:
        yield running, tls


@pytest.fixture(scope="module")
def story(agent_bridge: tuple[Bridge, Any], root: Path) -> tuple[SleepOutcome, list[str]]:
    """The whole story, once for the module (it takes about 15 s): what happened, and every
    line the agent processes printed (shown when a check fails)."""
    bridge, tls = agent_bridge
    lines: list[str] = []

    def config(callback: str, secret: str) -> AgentConfig:
        return AgentConfig(
            url=bridge.url,
            token=TOKEN,
            callback=callback,
            secret=secret,
            event=f"{bridge.settings.tasks.event_type_prefix}.task.updated",
            tool=AGENT_TOOL,
            arguments=AGENT_ARGUMENTS,
            read_before_sleep=AGENT_READS_BEFORE_SLEEP,
        )

    agent = SleepingAgent(
        root / "agent", tls, config, note=lambda who, text: lines.append(f"{who}: {text}")
    )
    return asyncio.run(agent.run(wake_bound_s=AGENT_WAKE_BOUND_S)), lines


@pytest.mark.kafka
async def test_the_agent_process_had_exited_before_the_webhook_reached_the_receiver(
    story: tuple[SleepOutcome, list[str]],
) -> None:
    outcome, lines = story
    start, woken, waking = outcome.run("start"), outcome.run("wake"), outcome.waking
    assert start is not None and woken is not None and waking is not None, lines
    assert start.ended is not None and start.returncode == 0
    assert start.ended < waking.at <= woken.started  # asleep: no agent process in between
    assert start.pid != woken.pid and woken.returncode == 0
    assert [run.kind for run in outcome.runs] == ["start", "wake"]


@pytest.mark.kafka
async def test_the_receiver_verified_the_waking_signature_and_refused_a_forged_copy(
    story: tuple[SleepOutcome, list[str]],
) -> None:
    outcome, _ = story
    waking = outcome.waking
    assert waking is not None and waking.verified and waking.kind == "event"
    assert waking.wake == Wake(outcome.task_id, waking.wake.seq if waking.wake else -1, "completed")
    kinds = [(d.kind, d.verified, d.status) for d in outcome.deliveries]
    assert kinds[0] == ("verification", True, 200)  # the challenge, within events/subscribe
    assert ("refused", False, 401) in kinds  # the forged copy
    assert outcome.forged_status == 401
    assert len(outcome.wakes) == 1  # the forged copy woke nobody


@pytest.mark.kafka
async def test_the_woken_agent_resumed_after_its_saved_cursor_with_every_seq_exactly_once(
    story: tuple[SleepOutcome, list[str]], agent_bridge: tuple[Bridge, Any]
) -> None:
    outcome, lines = story
    bridge, _ = agent_bridge
    first, later = outcome.journal_of("start"), outcome.journal_of("wake")
    assert first["seqs"] == list(range(AGENT_READS_BEFORE_SLEEP)), lines
    assert later["after"] == first["seqs"][-1]  # the cursor it saved before it slept
    assert outcome.waking is not None and outcome.waking.wake is not None
    last = outcome.waking.wake.seq
    assert later["seqs"] == list(range(later["after"] + 1, last + 1))
    client = TaskStreamClient(bridge.url, token=TOKEN)
    everything = [event.seq async for event in client.stream(outcome.task_id)]
    assert first["seqs"] + later["seqs"] == everything  # nothing lost, nothing repeated


@pytest.mark.kafka
async def test_the_task_finished_and_the_woken_agent_read_its_result_and_unsubscribed(
    story: tuple[SleepOutcome, list[str]], agent_bridge: tuple[Bridge, Any], root: Path
) -> None:
    outcome, _ = story
    bridge, _ = agent_bridge
    client = TaskStreamClient(bridge.url, token=TOKEN)
    view = await client.call("tasks/get", {"taskId": outcome.task_id}, outcome.task_id)
    assert view["status"] == "completed"
    later = outcome.journal_of("wake")
    assert later["status"] == "completed"
    assert later["result"] == view["result"]["content"][0]["text"]
    assert later["result"].startswith("Agent finished")
    config = AgentHome(root / "agent").config()
    key = {"name": config.event, "arguments": {"taskId": outcome.task_id}}
    with pytest.raises(StreamError) as gone:
        await client.call("events/unsubscribe", {**key, "delivery": {"url": config.callback}})
    assert gone.value.code == NOT_FOUND and gone.value.data == {"kind": "subscription"}

"""The shipped client's reconnects: jittered, growing, bounded, and never sooner than asked.

In-process: a scripted server behind httpx's ASGI transport (each answer is whole, so buffering
hides nothing here) and a ``sleep`` that records the waits instead of waiting.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from bridge.cli import _reach
from bridge.client import Backoff, EventsGone, StreamError, TaskStreamClient

URL = "http://bridge.test/mcp"


def retriable(reason: str, retry_after_ms: int = 1000) -> tuple[int, dict[str, Any]]:
    data = {"reason": reason, "retryAfterMs": retry_after_ms, "taskId": "t1"}
    return 503, {"code": -32603, "message": "retry shortly", "data": data}


def final(reason: str) -> tuple[int, dict[str, Any]]:
    return 200, {"code": -32602, "message": "no", "data": {"reason": reason}}


@dataclass
class Raw:
    """An answer as it is: a status, headers and a body (no JSON-RPC needed)."""

    status: int
    headers: dict[str, str]
    body: bytes = b""


class Script:
    """Answers each tasks/stream with the next scripted step: an error, a drop (an SSE body
    that ends without the result), or the events from ``after`` and the result."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.afters: list[int | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        self.afters.append(request["params"].get("after"))
        step = self.steps.pop(0)
        if isinstance(step, Raw):  # what a proxy in front of the bridge answers
            head = [(k.encode(), v.encode()) for k, v in step.headers.items()]
            await send({"type": "http.response.start", "status": step.status, "headers": head})
            await send({"type": "http.response.body", "body": step.body})
            return
        if isinstance(step, tuple):
            status, error = step
            answer = {"jsonrpc": "2.0", "id": request["id"], "error": error}
            await _send(send, status, "application/json", json.dumps(answer).encode())
            return
        after = request["params"].get("after")
        first = 0 if after is None else after + 1
        lines = [_event(seq) for seq in range(first, step if step != "drop" else first + 1)]
        if step != "drop":
            lines.append({"jsonrpc": "2.0", "id": request["id"], "result": {}})
        sse = b"".join(b"data: " + json.dumps(m).encode() + b"\n\n" for m in lines)
        await _send(send, 200, "text/event-stream", sse)


def _event(seq: int) -> dict[str, Any]:
    params = {"taskId": "t1", "seq": seq, "type": "x.tick", "payload": {}}
    return {"jsonrpc": "2.0", "method": "notifications/tasks/event", "params": params}


async def _send(send: Any, status: int, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def run(script: Script, **options: Any) -> tuple[list[int], list[float]]:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=script)) as http:
        client = TaskStreamClient(URL, http=http, sleep=sleep, **options)
        seqs = [event.seq async for event in client.stream("t1")]
    return seqs, waits


@pytest.mark.parametrize("reason", ["owner_unavailable", "partition_moving", "draining"])
async def test_a_retriable_answer_is_retried_no_sooner_than_the_server_asked(reason: str) -> None:
    script = Script(retriable(reason), retriable(reason, 250), 3)
    seqs, waits = await run(script, backoff=Backoff(rng=random.Random(7)))
    assert seqs == [0, 1, 2]
    assert 1.0 <= waits[0] <= 1.5 and 0.25 <= waits[1] <= 0.375
    assert len(set(waits)) == 2


async def test_a_drop_resumes_from_the_cursor_after_a_jittered_growing_bounded_wait() -> None:
    script = Script("drop", "drop", "drop", "drop", "drop", "drop", "drop", "drop", 10)
    seqs, waits = await run(script, backoff=Backoff(base_s=0.2, cap_s=1.0, rng=random.Random(3)))
    assert seqs == list(range(10)), "nothing lost or repeated across the drops"
    assert script.afters == [None, 0, 1, 2, 3, 4, 5, 6, 7]
    # Each drop delivered one event, so each wait is the first of its run: within [0, base].
    assert all(0 <= w <= 0.2 for w in waits) and len(set(waits)) == len(waits)


def test_the_waits_of_consecutive_failures_grow_to_the_cap_and_are_spread() -> None:
    backoff = Backoff(base_s=0.2, cap_s=5.0, rng=random.Random(11))
    for attempt, ceiling in ((1, 0.2), (2, 0.4), (3, 0.8), (6, 5.0), (60, 5.0)):
        draws = [backoff.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in draws)
        assert max(draws) > 0.8 * ceiling and min(draws) < 0.2 * ceiling, "spread, not one value"
    assert backoff.delay(1, retry_after_s=3600.0) <= 3600.0 + 5.0


async def test_consecutive_refusals_give_up_after_max_reconnects_with_the_server_s_error() -> None:
    script = Script(*[retriable("owner_unavailable")] * 4)
    with pytest.raises(StreamError) as raised:
        await run(script, max_reconnects=3)
    assert raised.value.data["reason"] == "owner_unavailable"
    assert len(script.afters) == 4


@pytest.mark.parametrize("reason", ["not_found", "seq_untrusted", "cursor_ahead"])
async def test_a_final_error_is_raised_at_once_without_a_retry(reason: str) -> None:
    script = Script(final(reason), 3)
    with pytest.raises(StreamError) as raised:
        await run(script)
    assert raised.value.data["reason"] == reason and len(script.afters) == 1


async def test_events_gone_is_raised_at_once() -> None:
    gone = {"code": -32010, "message": "gone", "data": {"reason": "events_gone", "earliestSeq": 4}}
    script = Script((200, gone), 3)
    with pytest.raises(EventsGone) as raised:
        await run(script)
    assert raised.value.earliest_seq == 4 and len(script.afters) == 1


def test_a_retry_after_that_is_not_a_number_or_negative_is_no_hint() -> None:
    for value in ("1000", -5, True, None, float("nan")):
        error = StreamError(-32603, "x", {"reason": "owner_unavailable", "retryAfterMs": value})
        assert error.retry_after_s is None and not error.retriable
    assert StreamError(-32602, "x", {"reason": "stream_active"}).retriable
    assert StreamError(-32600, "x", {"retryAfterSeconds": 2}).retry_after_s == 2.0


async def test_a_wait_the_server_asks_for_is_honoured_up_to_a_cap() -> None:
    script = Script(retriable("owner_unavailable", 3_600_000), 2)
    seqs, waits = await run(script, backoff=Backoff(max_retry_after_s=60.0, rng=random.Random(5)))
    assert seqs == [0, 1]
    assert 60.0 <= waits[0] <= 65.0, "an hour asked for is not believed; the cap is"


@pytest.mark.parametrize(
    ("answer", "low", "high"),
    [
        (Raw(503, {"retry-after": "7", "content-type": "text/html"}, b"<h1>503</h1>"), 7.0, 10.5),
        (Raw(502, {"content-type": "text/plain"}, b"bad gateway"), 0.0, 0.2),
        (Raw(504, {}, b""), 0.0, 0.2),
    ],
    ids=["503-retry-after", "502-no-hint", "504-empty"],
)
async def test_a_proxy_s_answer_without_json_rpc_is_retried_with_its_retry_after_or_backoff(
    answer: Raw, low: float, high: float
) -> None:
    script = Script(answer, 3)
    seqs, waits = await run(script, backoff=Backoff(base_s=0.2, rng=random.Random(2)))
    assert seqs == [0, 1, 2] and len(waits) == 1
    assert low <= waits[0] <= high


async def test_the_retry_after_header_counts_when_the_error_names_no_wait() -> None:
    error = {"code": -32603, "message": "busy", "data": {"reason": "draining"}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "error": error}).encode()
    headers = {"content-type": "application/json", "retry-after": "4"}
    seqs, waits = await run(
        Script(Raw(503, headers, body), 1), backoff=Backoff(rng=random.Random(1))
    )
    assert seqs == [0] and 4.0 <= waits[0] <= 6.0


@pytest.mark.parametrize("value", ["Wed, 21 Oct 2026 07:28:00 GMT", "-1", "1e9", "99999999", ""])
async def test_a_retry_after_that_is_no_number_of_seconds_leaves_the_backoff(value: str) -> None:
    headers = {"retry-after": value} if value else {}
    seqs, waits = await run(Script(Raw(503, headers), 1), backoff=Backoff(rng=random.Random(4)))
    assert seqs == [0] and 0.0 <= waits[0] <= 0.2


async def test_bridge_tail_s_first_request_retries_a_retriable_answer_with_the_backoff() -> None:
    """``bridge tail`` asks tasks/get first (a wrong URL fails at once): a replica being
    replaced answers it 503, which is retried, no sooner than asked, not given up on."""
    task = {"taskId": "t1", "status": "working"}
    ok = json.dumps({"jsonrpc": "2.0", "id": 3, "result": task}).encode()
    script = Script(
        retriable("owner_unavailable", 2000),
        Raw(502, {}),
        Raw(200, {"content-type": "application/json"}, ok),
    )
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=script)) as http:
        client = TaskStreamClient(
            URL, http=http, sleep=sleep, backoff=Backoff(rng=random.Random(9))
        )
        await _reach(client, URL, "t1")
    assert len(script.afters) == 3 and len(waits) == 2
    assert 2.0 <= waits[0] <= 3.0 and 0.0 <= waits[1] <= 0.4

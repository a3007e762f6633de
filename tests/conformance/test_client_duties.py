"""SEP-2694's client duties, checked against the shipped client (``bridge.client``).

No black-box test of a server can check what a client must do (persist the latest seq only after
processing it, pass it as ``after``, tolerate and de-duplicate repeated events), so these run
only when the suite runs our own bridge: :class:`bridge.client.TaskStreamClient` against it,
through :class:`Faults`, an HTTP transport that drops a connection mid-stream and re-delivers
events as a proxy or another server could. For a foreign server they are skipped and their
clauses reported N/A.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bridge.client import MemoryCursorStore, StreamEvent, TaskStreamClient

from .clauses import clause
from .hooks import Hooks, ServerUnderTest
from .support import BOUND, TaskPool, assert_contiguous, is_int, our_bridge_only

pytestmark = pytest.mark.asyncio(loop_scope="package")


class RecordingStore(MemoryCursorStore):
    """A cursor store that remembers every save."""

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[str, int]] = []

    def save(self, task_id: str, seq: int) -> None:
        self.saves.append((task_id, seq))
        super().save(task_id, seq)


class _Frames(httpx.AsyncByteStream):
    """An SSE body passed on frame by frame, noting each event's seq; optionally cut short."""

    def __init__(self, inner: httpx.AsyncByteStream, seqs: list[int], cut: int | None) -> None:
        self.inner = inner
        self.seqs = seqs
        self.cut = cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending, events = b"", 0
        async for chunk in self.inner:
            pending += chunk
            while b"\n\n" in pending:
                frame, pending = pending.split(b"\n\n", 1)
                yield frame + b"\n\n"
                seq = _event_seq(frame)
                if seq is not None:
                    self.seqs.append(seq)
                    events += 1
                    if events == self.cut:
                        return  # the connection drops: no more bytes, no result
        if pending:
            yield pending

    async def aclose(self) -> None:
        await self.inner.aclose()


def _event_seq(frame: bytes) -> int | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            message = json.loads(line[5:])
            if message.get("method") == "notifications/tasks/event":
                seq = message["params"]["seq"]
                return seq if is_int(seq) else None
    return None


class Faults(httpx.AsyncBaseTransport):
    """Between the client and the server: notes the ``after`` of every tasks/stream request and
    the seqs sent back; cuts the first stream after ``cut`` events (a dropped connection); and
    sends every later stream's ``after`` ``rewind`` events back, so events the client already
    had come again (the duplicates SEP-2694 says clients must tolerate after a reconnect)."""

    def __init__(self, *, cut: int | None = None, rewind: int = 0) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.cut = cut
        self.rewind = rewind
        self.afters: list[Any] = []
        self.delivered: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        if body.get("method") != "tasks/stream":
            return await self.inner.handle_async_request(request)
        params = body["params"]
        self.afters.append(params.get("after"))
        first = len(self.afters) == 1
        if not first and self.rewind and is_int(params.get("after")):
            moved = params["after"] - self.rewind
            if moved >= 0:
                params["after"] = moved
            else:
                del params["after"]
            request = _with_body(request, body)
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        cut = self.cut if first else None
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Frames(response.stream, self.delivered, cut),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def _with_body(request: httpx.Request, body: dict[str, Any]) -> httpx.Request:
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
    return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body))


@contextlib.asynccontextmanager
async def shipped_client_stream(
    server: ServerUnderTest, task_id: str, store: RecordingStore, faults: Faults
) -> AsyncIterator[AsyncIterator[StreamEvent]]:
    """``TaskStreamClient.stream(task_id)`` through ``faults``, closed at the end, bounded."""
    async with httpx.AsyncClient(transport=faults, timeout=BOUND) as http, asyncio.timeout(BOUND):
        client = TaskStreamClient(
            server.url, token=server.auth_token, store=store, http=http, backoff_s=0.01
        )
        events = client.stream(task_id)
        try:
            yield events
        finally:
            await events.aclose()  # type: ignore[attr-defined]  # an async generator


def as_params(event: StreamEvent) -> dict[str, Any]:
    """What ``hooks.emitted_index`` reads: the event as notification params."""
    return {"seq": event.seq, "taskId": event.task_id, "type": event.type, "payload": event.payload}


@clause("client-persist")
@clause("after-client-valid")
async def test_the_client_saves_a_seq_only_after_its_event_was_processed(
    hooks: Hooks, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    our_bridge_only(server_under_test, "the shipped client's duties")
    task_id = await tasks.new()
    await hooks.emit(task_id, 4)
    store, faults = RecordingStore(), Faults(cut=3)  # the first connection drops after 3 events
    processed: list[int] = []
    async with shipped_client_stream(server_under_test, task_id, store, faults) as events:
        async for event in events:
            # Handed over, not yet processed: only the event before it may be saved.
            assert store.load(task_id) == (processed[-1] if processed else None), store.saves
            if hooks.emitted_index(as_params(event)) == 3:
                break  # the client stops while processing this event
            processed.append(event.seq)
    assert_contiguous(processed, 0, "the events processed")
    assert store.load(task_id) == processed[-1], f"saved {store.saves}, processed {processed}"
    assert faults.afters[:2] == [None, processed[2]], (
        f"the reconnect after the drop must resume after the last processed event: {faults.afters}"
    )
    # A new client with the same store resumes after the last processed event: the event that
    # was handed over but not processed comes again.
    again = Faults()
    async with shipped_client_stream(server_under_test, task_id, store, again) as events:
        first = await anext(events)
    assert again.afters == [processed[-1]], again.afters
    assert first.seq == processed[-1] + 1, first
    for after in [*faults.afters, *again.afters]:
        assert after is None or (is_int(after) and after >= 0), f"after={after!r} sent"


@clause("client-duplicates")
async def test_the_client_hands_over_each_seq_once_when_a_reconnect_repeats_events(
    hooks: Hooks, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    our_bridge_only(server_under_test, "the shipped client's duties")
    task_id = await tasks.new()
    await hooks.emit(task_id, 6)
    store, faults = RecordingStore(), Faults(cut=4, rewind=3)  # the reconnect repeats 3 events
    received: list[StreamEvent] = []
    async with shipped_client_stream(server_under_test, task_id, store, faults) as events:
        async for event in events:
            received.append(event)
            if hooks.emitted_index(as_params(event)) == 5:
                break
    assert len(faults.delivered) > len(set(faults.delivered)), (
        f"no event was delivered twice: the test did not exercise duplicates: {faults.delivered}"
    )
    assert_contiguous([e.seq for e in received], 0, "the events handed over")
    assert {e.task_id for e in received} == {task_id}
    assert [hooks.emitted_index(as_params(e)) for e in received].count(5) == 1

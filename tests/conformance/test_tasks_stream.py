"""SEP-2694 ``tasks/stream`` conformance, black-box over real HTTP.

One test per checkable clause (``@clause(key)``, see clauses.py); the session report prints
every clause with its outcome. Tests never assume that the events they emitted are the only
events of a task (servers emit their own): they check seq contiguity over everything received
and the order and presence of their own events (recognised by ``hooks.emitted_index``).

Layout: the ``story`` (one task, events emitted before and while a stream is open, then
finished) serves the read-only checks; tests that need a live task make their own; the
retention tests come last in this module because forcing retention (Kafka DeleteRecords on our
bridge) also drops earlier records of other tasks sharing the partition, and among them the
package fixture ``retained`` is used first, before tests that delete under live tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio

from .clauses import clause
from .hooks import Hooks, NotSupported, ServerUnderTest
from .support import (
    BOUND,
    EVENTS_GONE,
    INVALID_PARAMS,
    INVALID_REQUEST,
    QUICK,
    TERMINAL,
    TaskPool,
    assert_contiguous,
    assert_empty_result,
    assert_gone_or_intact,
    first_reply,
    has_own,
    is_int,
    is_vendor_prefixed,
    our_bridge_only,
    own,
    task_status,
    wait_terminal,
)
from .wire import OMIT, RELATED_TASK, McpClient, RawHttpConnection, RawJson, Reply, TaskStream

pytestmark = pytest.mark.asyncio(loop_scope="package")

#: ``delete_before`` past any task's last event: every event so far is gone.
ALL = 2**62
RAW_TYPE = b"org.example.conformance.raw"
BULK_TYPE = b"org.example.conformance.bulk"


def requires_retention(server: ServerUnderTest, exc: NotSupported) -> None:
    server.not_applicable(f"forced retention: {exc}")


async def delete_before(hooks: Hooks, task_id: str, seq: int) -> None:
    try:
        await hooks.delete_before(task_id, seq)
    except NotSupported as exc:
        requires_retention(hooks.server, exc)


async def emit_raw(hooks: Hooks, task_id: str, values: list[bytes]) -> None:
    try:
        await hooks.emit_raw(task_id, values)
    except NotSupported as exc:
        hooks.server.not_applicable(str(exc))


async def quiet_task(tasks: TaskPool) -> str:
    try:
        return await tasks.quiet()
    except NotSupported as exc:
        tasks.hooks.server.not_applicable(str(exc))


def envelope(payload: bytes, event_type: bytes = RAW_TYPE) -> bytes:
    """A raw record: the JSON envelope ``{"type", "payload"}`` with ``payload`` as written."""
    return b'{"type": "' + event_type + b'", "payload": ' + payload + b"}"


def bulk(n: int, pad: int) -> list[bytes]:
    """``n`` valid records of about ``pad`` bytes each, to fill buffers quickly."""
    return [envelope(b'{"i": %d, "pad": "%s"}' % (i, b"x" * pad), BULK_TYPE) for i in range(n)]


def contents(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What must not change between two deliveries of the same events."""
    return [(e.get("seq"), e.get("type"), e.get("payload")) for e in events]


@contextlib.asynccontextmanager
async def connections(server: ServerUnderTest, n: int) -> AsyncIterator[list[McpClient]]:
    """``n`` clients with the suite's credentials, each on transport connections of its own."""
    clients = [McpClient(server.url, server.auth_token, bound=BOUND) for _ in range(n)]
    try:
        yield clients
    finally:
        for mcp in clients:
            await mcp.aclose()


# --- the story: one task, 3 events before a stream opens, 3 while it is open, then finished ----


@dataclass
class Story:
    task_id: str
    stream: TaskStream
    ended: bool
    end_error: str = ""

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.stream.events

    @property
    def last(self) -> int:
        return int(self.events[-1]["seq"])


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def story(hooks: Hooks, client: McpClient) -> AsyncIterator[Story]:
    task_id = await hooks.create_task()
    finished = False
    try:
        await hooks.emit(task_id, 3)
        async with client.stream(task_id) as stream:
            await stream.until(has_own(hooks, 2), "emitted event 2 (replayed or live)")
            await hooks.emit(task_id, 3)
            await stream.until(has_own(hooks, 5), "emitted event 5 (live)")
            await hooks.finish(task_id)
            finished = True
            ended, end_error = True, ""
            try:
                await stream.to_end(what="the end of the stream once the task finished")
            except AssertionError as exc:
                ended, end_error = False, str(exc)
        await wait_terminal(client, task_id)
        yield Story(task_id, stream, ended and stream.result is not None, end_error)
    finally:
        if not finished:
            with contextlib.suppress(Exception):
                await hooks.finish(task_id)


async def replay(client: McpClient, task_id: str, after: Any = OMIT) -> TaskStream:
    async with client.stream(task_id, after) as stream:
        await stream.to_end()
    return stream


# --- Specification ---------------------------------------------------------------------------


@clause("method-supported")
async def test_tasks_stream_is_a_method_of_the_server(client: McpClient, story: Story) -> None:
    # A valid request (a finished task, after its last event) that a supporting server answers
    # with its result: -32601 (not supported) fails, and so does any other error.
    reply = await client.call("tasks/stream", {"taskId": story.task_id, "after": story.last})
    assert reply.error is None, f"tasks/stream is not served: {reply}"
    assert_empty_result(reply.result, "tasks/stream of a finished task after its last event")


# --- Task Event --------------------------------------------------------------------------------


@clause("seq-first-zero")
async def test_the_first_event_has_seq_zero(story: Story) -> None:
    assert story.events, "no events"
    first = story.events[0]["seq"]
    assert is_int(first) and first == 0, f"first event: {story.events[0]}"


@clause("seq-plus-one")
async def test_each_event_increments_seq_by_exactly_one(story: Story) -> None:
    assert_contiguous(story.stream.seqs, 0)


@clause("seq-order")
async def test_events_are_delivered_in_sequence_order(hooks: Hooks, story: Story) -> None:
    seqs = story.stream.seqs
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"arrival order: {seqs}"
    mine = own(hooks, story.events)
    assert [k for k, _ in mine] == list(range(6)), f"emitted events in arrival order: {mine}"
    assert [s for _, s in mine] == sorted(s for _, s in mine), f"their seqs: {mine}"


@clause("seq-per-task")
async def test_sequence_numbers_are_scoped_to_one_task(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    a, b = await tasks.new(), await tasks.new()
    for _ in range(3):  # interleaved: a's and b's events alternate
        await hooks.emit(a, 1)
        await hooks.emit(b, 1)
    async with client.stream(a) as sa, client.stream(b) as sb:
        await asyncio.gather(
            sa.until(has_own(hooks, 2), "task a's event 2"),
            sb.until(has_own(hooks, 2), "task b's event 2"),
        )
    for name, stream in (("a", sa), ("b", sb)):
        assert_contiguous(stream.seqs, 0, f"task {name}")
        assert [k for k, _ in own(hooks, stream.events)] == [0, 1, 2], name
        assert {e["taskId"] for e in stream.events} == {stream.task_id}, name


@clause("payload-object")
async def test_event_payloads_are_json_objects(story: Story) -> None:
    bad = [e for e in story.events if not isinstance(e.get("payload"), dict)]
    assert not bad, f"payloads that are not objects: {bad[:3]}"


@clause("no-unprefixed-types")
async def test_no_unprefixed_event_types_are_emitted(story: Story) -> None:
    types = sorted({str(e.get("type")) for e in story.events})
    unprefixed = [t for t in types if not is_vendor_prefixed(t)]
    assert not unprefixed, f"reserved or unprefixed types: {unprefixed}; all: {types}"


@clause("vendor-prefix")
async def test_event_types_carry_a_vendor_prefix(story: Story) -> None:
    types = sorted({str(e.get("type")) for e in story.events})
    bad = [t for t in types if not is_vendor_prefixed(t)]
    assert not bad, (
        f"not <vendor prefix>.<name> (reverse-DNS style, >= 3 labels): {bad}; all: {types}"
    )


def assert_prefixed_objects(events: list[dict[str, Any]]) -> None:
    for event in events:
        assert is_vendor_prefixed(event.get("type")), f"an unprefixed type: {event}"
        assert isinstance(event.get("payload"), dict), f"a payload that is not an object: {event}"


@clause("no-unprefixed-types")
@clause("vendor-prefix")
@clause("payload-object")
async def test_careless_producers_records_are_still_prefixed_objects(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    try:
        await hooks.emit_careless(task_id)
    except NotSupported as exc:
        hooks.server.not_applicable(str(exc))
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as stream:
        await stream.until(has_own(hooks, 1), "the event emitted after the careless ones")
    assert_contiguous(stream.seqs, 0)
    mine = dict(own(hooks, stream.events))
    between = [e for e in stream.events if mine[0] < e["seq"] < mine[1]]
    assert between, f"nothing between the emitted events: {stream.describe()}"
    assert_prefixed_objects(stream.events)


#: Records whose JSON parses (in a lenient parser at least) but cannot be written back as JSON,
#: and bytes that are no record at all: what JavaScript producers cutting strings by UTF-16 code
#: unit, or a pipeline writing Python floats, really emit.
UNWRITABLE: dict[str, bytes] = {
    "1e999": envelope(b'{"x": 1e999}'),
    "-1e999": envelope(b'{"x": -1e999}'),
    "NaN": envelope(b'{"x": NaN}'),
    "lone surrogate": envelope(b'{"s": "partial \\ud800"}'),
    "lone surrogate in the type": envelope(b"{}", b"org.example.conformance.\\udc00"),
    "5000 nested arrays": envelope(b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    "5000-digit integer": envelope(b'{"n": ' + b"9" * 5000 + b"}"),
    "invalid UTF-8": envelope(b'{"s": "\xff\xfe"}'),
    "arbitrary bytes": bytes(range(256)),
    "empty": b"",
}


@clause("records-keep-seq")
@clause("payload-object")
@clause("vendor-prefix")
async def test_records_the_server_cannot_write_back_keep_their_seq(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    await emit_raw(hooks, task_id, list(UNWRITABLE.values()))
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as live:
        await live.until(has_own(hooks, 1), "the event emitted after the raw records")
        view = await client.call("tasks/get", {"taskId": task_id})
        assert view.result is not None, f"tasks/get of a task with such records: {view}"
        await tasks.finish(task_id)
        await live.to_end(what="the end of the stream once the task finished")
    again = await replay(client, task_id)
    for name, stream in (("live", live), ("replay", again)):
        assert_contiguous(stream.seqs, 0, f"the {name} stream")
        assert_empty_result(stream.result, f"the {name} stream")
        mine = dict(own(hooks, stream.events))
        assert mine[1] - mine[0] > len(UNWRITABLE), (
            f"the {name} stream has fewer events than records between the emitted ones: "
            f"{stream.describe()}"
        )
        assert_prefixed_objects(stream.events)
    assert contents(live.events) == contents(again.events)
    assert await task_status(client, task_id) in TERMINAL


@clause("related-task-meta")
async def test_every_event_names_its_task_in_related_task_meta(story: Story) -> None:
    for event in story.events:
        meta = event.get("_meta")
        related = meta.get(RELATED_TASK) if isinstance(meta, dict) else None
        assert isinstance(related, dict) and related.get("taskId") == story.task_id, event


@clause("event-task-id")
async def test_every_event_carries_the_streamed_task_id(story: Story) -> None:
    bad = [e for e in story.events if e.get("taskId") != story.task_id]
    assert not bad, f"events of another taskId on the stream of {story.task_id}: {bad[:3]}"


@clause("immutable")
async def test_a_replay_gives_the_same_events(client: McpClient, story: Story) -> None:
    again = await replay(client, story.task_id)
    assert contents(again.events) == contents(story.events)


# --- tasks/stream -----------------------------------------------------------------------------


@clause("empty-result")
async def test_a_normal_close_returns_an_empty_result(story: Story) -> None:
    assert story.ended, story.end_error or story.stream.describe()
    assert_empty_result(story.stream.result, "the story's stream")
    assert story.stream.response is not None
    assert story.stream.response.get("id") == story.stream.request_id


@clause("terminal-stream-ends")
async def test_the_stream_of_a_task_that_finished_ends_with_its_result(story: Story) -> None:
    assert story.ended, story.end_error or story.stream.describe()


@clause("terminal-stream-ends")
@clause("empty-result")
@pytest.mark.parametrize("outcome", ["completed", "failed"])
async def test_the_stream_of_a_task_that_completes_or_fails_ends_with_its_result(
    hooks: Hooks, client: McpClient, tasks: TaskPool, outcome: str
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as stream:
        await stream.until(has_own(hooks, 0), "emitted event 0")
        try:
            await tasks.finish(task_id, outcome)
        except NotSupported as exc:
            hooks.server.not_applicable(str(exc))
        await stream.to_end(what=f"the end of the stream once the task {outcome}")
    assert_empty_result(stream.result, f"the stream of a task that {outcome}")
    assert_contiguous(stream.seqs, 0)
    view = await wait_terminal(client, task_id)
    assert view.get("status") == outcome, view
    if hooks.server.started_by_suite:  # our bridge: its status event is the last one
        last = stream.events[-1]
        assert str(last.get("type")).endswith(".task.status"), stream.describe()
        assert (last.get("payload") or {}).get("status") == outcome, stream.describe()
    again = await replay(client, task_id)
    assert contents(again.events) == contents(stream.events)
    assert_empty_result(again.result, f"the replay of a task that {outcome}")


@clause("per-connection")
async def test_two_connections_with_the_same_credentials_stream_one_task_at_once(
    hooks: Hooks, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 2)
    async with (
        connections(server_under_test, 2) as (one, two),
        one.stream(task_id) as a,
        two.stream(task_id) as b,
    ):
        streams = [a, b]
        await asyncio.gather(*(first_reply(s, BOUND) for s in streams))
        for s in streams:
            assert s.is_sse and s.error is None, f"a second connection refused: {s.describe()}"
        await asyncio.gather(*(s.until(has_own(hooks, 1), "emitted event 1") for s in streams))
        await hooks.emit(task_id, 2)
        await asyncio.gather(*(s.until(has_own(hooks, 3), "emitted event 3") for s in streams))
        await tasks.finish(task_id)
        await asyncio.gather(*(s.to_end(what="the end once the task finished") for s in streams))
    for s in streams:
        assert_contiguous(s.seqs, 0)
        assert [k for k, _ in own(hooks, s.events)] == [0, 1, 2, 3], s.describe()
        assert_empty_result(s.result, "each connection's stream")
    assert contents(a.events) == contents(b.events)


@clause("per-connection")
@clause("omit-earliest-then-live")
async def test_a_client_joining_late_gets_the_history_then_the_live_events(
    hooks: Hooks, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with connections(server_under_test, 3) as clients, contextlib.AsyncExitStack() as stack:
        early = [await stack.enter_async_context(c.stream(task_id)) for c in clients[:2]]
        await asyncio.gather(*(s.until(has_own(hooks, 0), "emitted event 0") for s in early))
        await hooks.emit(task_id, 2)
        await asyncio.gather(*(s.until(has_own(hooks, 2), "emitted event 2") for s in early))
        late = await stack.enter_async_context(clients[2].stream(task_id))
        await late.until(has_own(hooks, 2), "the history (emitted events 0 to 2), late")
        streams = [*early, late]
        await hooks.emit(task_id, 2)
        await asyncio.gather(*(s.until(has_own(hooks, 4), "live event 4") for s in streams))
        await tasks.finish(task_id)
        await asyncio.gather(*(s.to_end(what="the end once the task finished") for s in streams))
    for s in streams:
        assert_contiguous(s.seqs, 0)
        assert [k for k, _ in own(hooks, s.events)] == list(range(5)), s.describe()
        assert_empty_result(s.result, "each client's stream")
    assert contents(early[0].events) == contents(early[1].events) == contents(late.events)


@clause("one-active-stream")
@clause("second-stream-32602")
async def test_a_second_stream_pipelined_on_one_connection_waits_for_the_first(
    hooks: Hooks, client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    first_request, second_request = client.stream_request(task_id), client.stream_request(task_id)
    connection = await RawHttpConnection.open(server_under_test.url)
    try:
        await connection.send(first_request, second_request)  # HTTP/1.1 pipelining
        first = await connection.stream(first_request, BOUND)
        await first.until(has_own(hooks, 0), "emitted event 0 on the first stream")
        await hooks.emit(task_id, 2)
        await first.until(has_own(hooks, 2), "live events on the first stream")
        await tasks.finish(task_id)
        await first.to_end(what="the end of the first stream once the task finished")
        # Only now may the second request be answered: as a second stream of its own, or -32602.
        second = await connection.stream(second_request, BOUND)
        await second.to_end(what="the answer to the pipelined second request")
    finally:
        await connection.aclose()
    assert_empty_result(first.result, "the first stream")
    assert_contiguous(first.seqs, 0, "the first stream")
    assert [k for k, _ in own(hooks, first.events)] == [0, 1, 2], first.describe()
    if second.error is not None:
        assert second.error.get("code") == INVALID_PARAMS, second.describe()
        assert not second.events, second.describe()
    else:
        assert contents(second.events) == contents(first.events), second.describe()
        assert_empty_result(second.result, "the second stream, once the first had ended")


@clause("cancel-then-reopen")
async def test_a_new_stream_is_accepted_once_the_active_one_is_cancelled(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 2)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 1), "emitted event 1")
    cursor = dict(own(hooks, first.events))[0]
    async with client.stream(task_id, cursor) as second:  # at once: no reconnect race
        assert second.error is None, second.describe()
        await second.until(has_own(hooks, 1), "emitted event 1 on the new stream")
    assert second.seqs[0] == cursor + 1, second.describe()
    assert_contiguous(second.seqs, cursor + 1, "the new stream")


@clause("cancel-keeps-task")
async def test_closing_the_stream_does_not_cancel_the_task(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 0), "emitted event 0")
    last = first.seqs[-1]
    assert await task_status(client, task_id) not in TERMINAL
    await hooks.emit(task_id, 2)
    async with client.stream(task_id, last) as resumed:
        await resumed.until(has_own(hooks, 2), "events emitted after the stream was closed")
    assert_contiguous(resumed.seqs, last + 1, "the resumed stream")
    assert await task_status(client, task_id) not in TERMINAL


@clause("cancel-notification")
@clause("cancel-keeps-task")
async def test_notifications_cancelled_ends_the_stream_and_not_the_task(
    hooks: Hooks, client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with connections(server_under_test, 1) as (other,), client.stream(task_id) as stream:
        await stream.until(has_own(hooks, 0), "emitted event 0")
        cancel = {"requestId": stream.request_id, "reason": "conformance: stop this stream"}
        note = await other.notify("notifications/cancelled", cancel)
        assert note.http_status in (200, 202) and note.response is None, str(note)
        await stream.to_end(QUICK, "the end of the stream after notifications/cancelled")
    assert stream.response is None, f"a cancelled request was answered: {stream.describe()}"
    assert await task_status(client, task_id) not in TERMINAL
    last = stream.seqs[-1]
    await hooks.emit(task_id, 1)
    async with client.stream(task_id, last) as resumed:
        await resumed.until(has_own(hooks, 1), "the task's next event, after the cancellation")
    assert_contiguous(resumed.seqs, last + 1, "the resumed stream")


# --- notifications/tasks/event ------------------------------------------------------------------


@clause("meta-on-notifications")
async def test_every_notification_has_related_task_meta(story: Story) -> None:
    missing = [
        e
        for e in story.events
        if not isinstance(e.get("_meta"), dict)
        or not isinstance(e["_meta"].get(RELATED_TASK), dict)
    ]
    assert not missing, f"notifications without {RELATED_TASK}: {missing[:3]}"


@clause("meta-matches-task-id")
async def test_related_task_meta_matches_params_task_id(story: Story) -> None:
    for event in story.events:
        related = (event.get("_meta") or {}).get(RELATED_TASK) or {}
        assert related.get("taskId") == event.get("taskId"), event


@clause("events-on-stream")
async def test_events_are_sent_on_the_tasks_stream_response(
    client: McpClient, story: Story
) -> None:
    assert story.stream.is_sse and story.events, story.stream.describe()
    assert story.stream.response is not None, story.stream.describe()
    assert story.stream.response.get("id") == story.stream.request_id
    reply = await client.call("tasks/get", {"taskId": story.task_id})
    assert not reply.events, f"tasks/get carried task events: {reply}"


# --- Resume and Replay ---------------------------------------------------------------------------


def short_id(value: Any) -> str:
    text = value.text if isinstance(value, RawJson) else repr(value)
    return f"after={text}" if len(text) <= 24 else f"after={text[:8]}…({len(text)} chars)"


@clause("after-invalid-32602")
@pytest.mark.parametrize(
    "after",
    [
        *(-1, -100, 1.5, 0.5, RawJson("1e-1"), "3", "1", "abc", True, False, None),
        *([1], {"seq": 1}),
        # Past any sequence number: a seq counts events, it never reaches 2**63.
        *(2**63, 10**30, 10**399),
    ],
    ids=short_id,
)
async def test_an_invalid_after_is_invalid_params(
    client: McpClient, story: Story, after: Any
) -> None:
    async with client.stream(story.task_id, after) as stream:
        await first_reply(stream)
    assert not stream.events, f"{short_id(after)} was accepted: {stream.describe()}"
    error = stream.error
    assert error is not None and error.get("code") == INVALID_PARAMS, stream.describe()


@clause("after-invalid-32602")
@pytest.mark.parametrize("after", [RawJson("1.0"), RawJson("1e0"), RawJson("10E-1")], ids=short_id)
async def test_an_integral_number_as_after_is_that_integer_or_invalid_params(
    client: McpClient, story: Story, server_under_test: ServerUnderTest, after: RawJson
) -> None:
    # JSON Schema's "integer" (the SEP's `after`) admits 1.0: our bridge reads it as 1; another
    # server may refuse it as not an integer. Anything else (say, treating it as 0) fails.
    async with client.stream(story.task_id, after) as stream:
        await stream.to_end(QUICK, "an immediate answer (the task is finished)")
    if stream.error is not None and not server_under_test.started_by_suite:
        assert stream.error.get("code") == INVALID_PARAMS, stream.describe()
        assert not stream.events, stream.describe()
        return
    assert stream.error is None, f"{short_id(after)} is the integer 1: {stream.describe()}"
    assert stream.seqs == list(range(2, story.last + 1)), stream.describe()
    assert_empty_result(stream.result, short_id(after))


@clause("after-replay-then-live")
async def test_after_gives_exactly_the_events_with_a_greater_seq(
    client: McpClient, story: Story
) -> None:
    last = story.last
    for after in sorted({0, 1, last // 2, last - 1}):
        stream = await replay(client, story.task_id, after)
        assert stream.seqs == list(range(after + 1, last + 1)), (
            f"after={after}: {stream.describe()}"
        )
        assert_empty_result(stream.result, f"after={after}")


@clause("after-replay-then-live")
async def test_after_replays_then_continues_with_live_events(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 3)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 2), "emitted event 2")
    cursor = dict(own(hooks, first.events))[0]
    async with client.stream(task_id, cursor) as resumed:
        await resumed.until(has_own(hooks, 2), "the replayed events")
        await hooks.emit(task_id, 2)
        await resumed.until(has_own(hooks, 4), "live events after the replay")
    assert_contiguous(resumed.seqs, cursor + 1, "the resumed stream")
    assert [k for k, _ in own(hooks, resumed.events)] == [1, 2, 3, 4]


async def head_of_quiet_task(hooks: Hooks, client: McpClient, tasks: TaskPool) -> tuple[str, int]:
    """A live task that emits nothing by itself, with two emitted events; and its next seq."""
    task_id = await quiet_task(tasks)
    await hooks.emit(task_id, 2)
    async with client.stream(task_id) as seen:
        await seen.until(has_own(hooks, 1), "emitted event 1")
    return task_id, int(seen.seqs[-1]) + 1


@clause("cursor-ahead")
@pytest.mark.parametrize("ahead", [0, 1, 1000], ids=lambda n: f"after=next_seq+{n}")
async def test_a_cursor_ahead_of_a_live_task_is_refused_or_ends_with_the_task(
    hooks: Hooks,
    client: McpClient,
    tasks: TaskPool,
    server_under_test: ServerUnderTest,
    ahead: int,
) -> None:
    task_id, next_seq = await head_of_quiet_task(hooks, client, tasks)
    after = next_seq + ahead
    async with client.stream(task_id, after) as stream:
        with contextlib.suppress(AssertionError):  # a refusal comes at once; a stream waits
            await stream.until(lambda s: s.response is not None, "an immediate answer", QUICK)
        if stream.error is None:
            assert not server_under_test.started_by_suite, (
                f"our bridge refuses a cursor ahead of the head (-32602 cursor_ahead): "
                f"{stream.describe()}"
            )
            await tasks.finish(task_id)
            await stream.to_end(what="the end of a stream ahead of the head, the task finished")
            assert stream.result is not None, stream.describe()
            assert all(seq > after for seq in stream.seqs), stream.describe()
            return
    assert stream.error.get("code") == INVALID_PARAMS and not stream.events, stream.describe()
    if server_under_test.started_by_suite:
        data = stream.error.get("data") or {}
        expected = {"reason": "cursor_ahead", "taskId": task_id, "nextSeq": next_seq}
        assert {k: data.get(k) for k in expected} == expected, stream.describe()


@clause("cursor-ahead")
@clause("after-replay-then-live")
async def test_a_cursor_at_the_last_event_of_a_live_task_waits_for_the_next_one(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id, next_seq = await head_of_quiet_task(hooks, client, tasks)
    async with client.stream(task_id, next_seq - 1) as stream:
        assert stream.error is None, f"after = the last event was refused: {stream.describe()}"
        await hooks.emit(task_id, 1)
        await stream.until(has_own(hooks, 2), "the task's next event, live")
        await tasks.finish(task_id)
        await stream.to_end(what="the end of the stream once the task finished")
    assert_contiguous(stream.seqs, next_seq, "the stream after the last event")
    assert_empty_result(stream.result, "the stream after the last event")


@clause("after-terminal-immediate")
async def test_a_terminal_task_with_nothing_after_the_cursor_returns_at_once(
    client: McpClient, story: Story
) -> None:
    async with client.stream(story.task_id, story.last, bound=QUICK) as stream:
        await stream.to_end(QUICK, "an immediate result")
    assert not stream.events, stream.describe()
    assert_empty_result(stream.result, f"after={story.last} on a terminal task")


@clause("omit-earliest-then-live")
async def test_no_cursor_starts_at_the_earliest_event_then_continues_live(
    hooks: Hooks, story: Story
) -> None:
    # The story's stream opened without `after` once 3 events had been emitted; 3 more were
    # emitted while it was open. Nothing was dropped, so the earliest retained event is seq 0.
    assert story.events and story.events[0]["seq"] == 0, story.stream.describe()
    assert [k for k, _ in own(hooks, story.events)] == list(range(6))
    assert_contiguous(story.stream.seqs, 0)


# --- Event Retention ----------------------------------------------------------------------------


@clause("retain-while-retrievable")
async def test_events_are_retained_while_the_task_is_retrievable(
    hooks: Hooks, client: McpClient, story: Story
) -> None:
    view = await client.result("tasks/get", {"taskId": story.task_id})
    assert view.get("status") in TERMINAL, view
    again = await replay(client, story.task_id)
    assert again.events and again.events[0]["seq"] == 0, again.describe()
    assert [k for k, _ in own(hooks, again.events)] == list(range(6))


# --- Relationships ----------------------------------------------------------------------------


@clause("progress-not-events")
async def test_a_progress_token_changes_no_task_event(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    # Progress notifications a server MAY send for the request are not task events: the events
    # of a stream opened with a progressToken are exactly those of a replay without one.
    token = f"sep2694-{secrets.token_hex(4)}"
    task_id = await tasks.new()
    await hooks.emit(task_id, 2)
    async with client.stream(task_id, meta={"progressToken": token}) as stream:
        assert stream.error is None, stream.describe()
        await stream.until(has_own(hooks, 1), "emitted event 1")
        await hooks.emit(task_id, 2)
        await stream.until(has_own(hooks, 3), "emitted event 3")
        await tasks.finish(task_id)
        await stream.to_end(what="the end of the stream once the task finished")
    assert_contiguous(stream.seqs, 0)
    assert [k for k, _ in own(hooks, stream.events)] == [0, 1, 2, 3]
    plain = await replay(client, task_id)
    assert contents(stream.events) == contents(plain.events), (
        f"with a progressToken: {stream.describe()}; without: {plain.describe()}"
    )
    progress = [n for n in stream.notifications if n.get("method") == "notifications/progress"]
    for note in progress:
        params = note.get("params") or {}
        assert params.get("progressToken") == token, note
        assert "seq" not in params, f"a progress notification with a seq: {note}"


# --- Security: limits (known only for our bridge, which the suite configured) ---------------


@contextlib.asynccontextmanager
async def open_streams() -> AsyncIterator[list[contextlib.AsyncExitStack]]:
    """A list to which each opened stream adds its exit stack; all are closed at the end."""
    opened: list[contextlib.AsyncExitStack] = []
    try:
        yield opened
    finally:
        for stack in opened:
            await stack.aclose()


def too_many(stream: TaskStream) -> bool:
    return (
        stream.error is not None
        and (stream.error.get("data") or {}).get("reason") == "too_many_streams"
    )


async def admitted(
    client: McpClient, task_id: str, opened: list[contextlib.AsyncExitStack]
) -> TaskStream:
    """Open a stream; while refused as one too many, retry with a short bounded backoff (the
    server reaps streams closed a moment ago asynchronously: HTTP gives no acknowledgement)."""
    delay, deadline = 0.02, time.monotonic() + QUICK
    while True:
        stack = contextlib.AsyncExitStack()
        opened.append(stack)
        stream = await stack.enter_async_context(client.stream(task_id))
        if not too_many(stream) or time.monotonic() + delay > deadline:
            assert stream.is_sse and stream.error is None, stream.describe()
            return stream
        await stack.aclose()
        opened.remove(stack)
        await asyncio.sleep(delay)  # backoff of a bounded retry, not a synchronisation
        delay = min(delay * 2, 0.5)


@clause("limits")
async def test_concurrent_streams_per_client_stop_at_the_configured_limit(
    client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    settings = our_bridge_only(server_under_test, "the concurrent streams limit")["settings"]
    limit = int(settings.streams.max_per_principal)
    task_ids = [await tasks.new() for _ in range(limit + 1)]
    async with open_streams() as opened:
        for task_id in task_ids[:limit]:
            await admitted(client, task_id, opened)
        async with client.stream(task_ids[limit]) as refused:
            assert too_many(refused) and not refused.events, refused.describe()
        assert refused.http_status == 429, refused.describe()
        assert refused.error is not None and refused.error.get("code") == INVALID_REQUEST
        assert (refused.error.get("data") or {}).get("limit") == limit, refused.describe()
        await opened.pop(0).aclose()  # one stream fewer: there is room again
        await admitted(client, task_ids[limit], opened)


@clause("limits")
async def test_a_record_over_the_size_limit_is_not_delivered_but_keeps_its_seq(
    hooks: Hooks, client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    settings = our_bridge_only(server_under_test, "the event size limit")["settings"]
    limit = int(settings.tasks.max_event_bytes)
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    await emit_raw(hooks, task_id, [envelope(b'{"pad": "%s"}' % (b"x" * limit))])
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as stream:
        await stream.until(has_own(hooks, 1), "the event emitted after the oversized record")
    assert_contiguous(stream.seqs, 0)
    mine = dict(own(hooks, stream.events))
    between = [e for e in stream.events if mine[0] < e["seq"] < mine[1]]
    assert between, f"the oversized record took no seq: {stream.describe()}"
    sizes = [len(json.dumps(e)) for e in stream.events]
    assert max(sizes) <= limit, f"an event of {max(sizes)} bytes got through: {stream.describe()}"


# --- Security ----------------------------------------------------------------------------------


@dataclass
class Intrusion:
    """What another principal got for the task of the suite's principal."""

    task_id: str
    owner_get: Reply
    get: Reply
    stream: Reply
    resume: Reply
    transport_resume: Reply | None  # GET Last-Event-ID with the owner's SSE id (if it had one)


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def intrusion(
    hooks: Hooks, client: McpClient, other_client: McpClient
) -> AsyncIterator[Intrusion]:
    task_id = await hooks.create_task()
    try:
        await hooks.emit(task_id, 2)
        async with client.stream(task_id) as owner:  # the events exist and are served
            await owner.until(has_own(hooks, 1), "the owner's view of emitted event 1")
        owner_id = owner.event_ids[0]
        owner_get, get, stream, resume, *transport = await asyncio.gather(
            client.call("tasks/get", {"taskId": task_id}),
            other_client.call("tasks/get", {"taskId": task_id}),
            other_client.call("tasks/stream", {"taskId": task_id}),
            other_client.call("tasks/stream", {"taskId": task_id, "after": 0}),
            *([other_client.resume_get(owner_id)] if owner_id else []),
        )
        yield Intrusion(
            task_id, owner_get, get, stream, resume, transport[0] if transport else None
        )
    finally:
        with contextlib.suppress(Exception):
            await hooks.finish(task_id)


@clause("authz-as-tasks-get")
async def test_tasks_stream_is_authorized_like_tasks_get(intrusion: Intrusion) -> None:
    assert intrusion.owner_get.result is not None, f"the owner's tasks/get: {intrusion.owner_get}"
    assert intrusion.get.error is not None, f"another principal's tasks/get: {intrusion.get}"
    assert intrusion.stream.error is not None, (
        f"another principal's tasks/stream: {intrusion.stream}"
    )
    assert intrusion.stream.error.get("code") == intrusion.get.error.get("code"), (
        f"tasks/get said {intrusion.get.error}, tasks/stream said {intrusion.stream.error}"
    )


@clause("authz-no-stream")
async def test_a_principal_without_access_gets_no_events(intrusion: Intrusion) -> None:
    for reply in (intrusion.stream, intrusion.resume):
        assert not reply.events and reply.result is None, str(reply)


@clause("authz-no-stream")
async def test_another_principal_cannot_resume_the_owners_sse_stream(
    intrusion: Intrusion, server_under_test: ServerUnderTest
) -> None:
    reply = intrusion.transport_resume
    if reply is None:
        server_under_test.not_applicable(
            "the server's SSE events carry no id: no transport-level resume"
        )
    assert not reply.events, f"GET Last-Event-ID by another principal delivered events: {reply}"
    assert reply.result is None, str(reply)


@clause("authz-bind-context")
async def test_a_stream_cannot_be_resumed_by_another_principal(intrusion: Intrusion) -> None:
    assert intrusion.resume.error is not None, str(intrusion.resume)
    assert intrusion.get.error is not None
    assert intrusion.resume.error.get("code") == intrusion.get.error.get("code"), (
        f"tasks/get said {intrusion.get.error}, tasks/stream after=0 said {intrusion.resume.error}"
    )
    assert not intrusion.resume.events


@clause("unknown-task")
async def test_an_unknown_task_is_an_error_as_for_tasks_get(client: McpClient) -> None:
    task_id = f"conformance-no-such-task-{secrets.token_hex(8)}"
    get, stream = await asyncio.gather(
        client.call("tasks/get", {"taskId": task_id}),
        client.call("tasks/stream", {"taskId": task_id}),
    )
    assert get.error is not None, str(get)
    assert stream.error is not None and not stream.events, str(stream)
    assert stream.error.get("code") == get.error.get("code"), f"{get.error} vs {stream.error}"


# --- forced retention (last: deleting records can drop other tasks' older records too) ---------


@dataclass
class Retained:
    task_id: str
    earliest: int  # the seq of the first event kept
    last: int
    seq_of: dict[int, int]  # emitted index -> seq
    event_ids: dict[int, str | None]  # seq -> the SSE id it was sent with


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def retained(
    hooks: Hooks, client: McpClient, server_under_test: ServerUnderTest
) -> AsyncIterator[Retained]:
    task_id = await hooks.create_task()
    finished = False
    try:
        await hooks.emit(task_id, 8)
        async with client.stream(task_id) as stream:
            await stream.until(has_own(hooks, 7), "emitted event 7")
            await hooks.finish(task_id)
            finished = True
            await stream.to_end(what="the end of the stream once the task finished")
        await wait_terminal(client, task_id)
        seq_of = dict(own(hooks, stream.events))
        earliest = seq_of[4]
        try:
            await hooks.delete_before(task_id, earliest)
        except NotSupported as exc:
            requires_retention(server_under_test, exc)
        ids = dict(zip(stream.seqs, stream.event_ids, strict=True))
        yield Retained(task_id, earliest, int(stream.seqs[-1]), seq_of, ids)
    finally:
        if not finished:
            with contextlib.suppress(Exception):
                await hooks.finish(task_id)


@clause("gone-shape")
async def test_events_gone_has_the_specified_shape(client: McpClient, retained: Retained) -> None:
    reply = await client.call("tasks/stream", {"taskId": retained.task_id, "after": 0})
    assert not reply.events, str(reply)
    error = reply.error
    assert error is not None, str(reply)
    assert error.get("code") == EVENTS_GONE, error
    assert isinstance(error.get("message"), str) and error["message"], error
    data = error.get("data")
    assert isinstance(data, dict), error
    assert data.get("reason") == "events_gone", error
    assert data.get("taskId") == retained.task_id, error
    assert is_int(data.get("earliestSeq")), error


@clause("after-gone")
async def test_a_cursor_before_the_retained_events_gets_events_gone(
    client: McpClient, retained: Retained
) -> None:
    reply = await client.call("tasks/stream", {"taskId": retained.task_id, "after": 1})
    assert reply.error is not None and not reply.events, str(reply)
    assert reply.error.get("code") == EVENTS_GONE, reply.error
    assert (reply.error.get("data") or {}).get("reason") == "events_gone", reply.error


@clause("gone-earliest")
async def test_earliest_seq_names_the_oldest_retained_event(
    client: McpClient, retained: Retained
) -> None:
    gone = await client.call("tasks/stream", {"taskId": retained.task_id, "after": 0})
    assert gone.error is not None, str(gone)
    assert (gone.error.get("data") or {}).get("earliestSeq") == retained.earliest, (
        f"expected earliestSeq {retained.earliest}: {gone.error}"
    )
    stream = await replay(client, retained.task_id, retained.earliest - 1)
    assert stream.seqs == list(range(retained.earliest, retained.last + 1)), stream.describe()


@clause("no-silent-skip")
async def test_no_cursor_before_the_retained_range_skips_silently(
    client: McpClient, retained: Retained
) -> None:
    for after in range(retained.earliest - 1):
        reply = await client.call("tasks/stream", {"taskId": retained.task_id, "after": after})
        assert not reply.events, f"after={after}: events past a gap: {reply}"
        assert reply.error is not None and reply.error.get("code") == EVENTS_GONE, (
            f"after={after}: {reply}"
        )


@clause("dropped-gone")
async def test_the_newest_cursor_before_the_retained_range_gets_events_gone(
    client: McpClient, retained: Retained
) -> None:
    after = retained.earliest - 2  # seq earliest - 1, needed to resume from here, was dropped
    reply = await client.call("tasks/stream", {"taskId": retained.task_id, "after": after})
    assert not reply.events, str(reply)
    assert reply.error is not None and reply.error.get("code") == EVENTS_GONE, str(reply)


@clause("gone-transport")
async def test_a_transport_resume_before_retention_still_says_events_gone(
    client: McpClient, retained: Retained, server_under_test: ServerUnderTest
) -> None:
    old = retained.event_ids.get(retained.earliest - 2)
    if old is None:
        server_under_test.not_applicable(
            "the server's SSE events carry no id: no transport-level resume"
        )
    reply = await client.resume_get(old)
    if reply.http_status in (404, 405) and reply.response is None:
        server_under_test.not_applicable(
            f"no transport-level resume (GET: HTTP {reply.http_status})"
        )
    assert not reply.events, str(reply)
    assert reply.http_status in (200, 410), str(reply)
    assert reply.error is not None, str(reply)
    assert (reply.error.get("data") or {}).get("reason") == "events_gone", str(reply)
    assert reply.error.get("code") == EVENTS_GONE, str(reply)
    post = await client.call("tasks/stream", {"taskId": retained.task_id, "after": 0})
    assert post.http_status in (200, 410), str(post)


@clause("omit-earliest-then-live")
async def test_no_cursor_after_retention_starts_at_the_earliest_retained_event(
    client: McpClient, retained: Retained
) -> None:
    stream = await replay(client, retained.task_id)
    assert stream.seqs == list(range(retained.earliest, retained.last + 1)), stream.describe()
    assert_empty_result(stream.result, "the replay without after")


@clause("omit-none-retained-terminal")
async def test_a_terminal_task_without_retained_events_returns_at_once(
    hooks: Hooks, client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 2)
    async with client.stream(task_id) as stream:
        await stream.until(has_own(hooks, 1), "emitted event 1")
        await tasks.finish(task_id)
        await stream.to_end(what="the end of the stream once the task finished")
    await wait_terminal(client, task_id)
    await delete_before(hooks, task_id, stream.seqs[-1] + 1)  # every event
    still = await client.call("tasks/get", {"taskId": task_id})
    if still.error is not None:
        server_under_test.not_applicable(
            f"the server forgets a task whose events are all gone (tasks/get: {still.error})"
        )
    async with client.stream(task_id, bound=QUICK) as empty:
        await empty.to_end(QUICK, "an immediate result")
    assert not empty.events, empty.describe()
    assert_empty_result(empty.result, "a terminal task without retained events")


@clause("omit-none-retained-live")
async def test_a_live_task_without_retained_events_streams_future_events(
    hooks: Hooks, client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    task_id = await quiet_task(tasks)
    await hooks.emit(task_id, 2)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 1), "emitted event 1")
    head = first.seqs[-1] + 1
    await delete_before(hooks, task_id, head)  # every event so far
    still = await client.call("tasks/get", {"taskId": task_id})
    if still.error is not None:
        server_under_test.not_applicable(
            f"the server forgets a task whose events are all gone (tasks/get: {still.error})"
        )
    assert still.result is not None and still.result.get("status") not in TERMINAL, str(still)
    async with client.stream(task_id) as stream:
        assert stream.error is None, stream.describe()
        await hooks.emit(task_id, 2)
        await stream.until(has_own(hooks, 3), "live events emitted after the stream opened")
    assert stream.seqs[0] == head, f"expected the first live event, seq {head}: {stream.describe()}"
    assert_contiguous(stream.seqs, head)
    assert [k for k, _ in own(hooks, stream.events)] == [2, 3]


# --- retention under live tasks and open streams (after every test of `retained`) ---------------


@clause("after-gone")
@clause("gone-earliest")
@clause("dropped-gone")
async def test_a_live_task_whose_old_events_are_gone_answers_events_gone(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 6)
    async with client.stream(task_id) as seen:
        await seen.until(has_own(hooks, 5), "emitted event 5")
    seq_of = dict(own(hooks, seen.events))
    earliest = seq_of[3]
    await delete_before(hooks, task_id, earliest)
    assert await task_status(client, task_id) not in TERMINAL
    gone = await client.call("tasks/stream", {"taskId": task_id, "after": seq_of[0]})
    assert gone.error is not None and not gone.events, str(gone)
    assert gone.error.get("code") == EVENTS_GONE, str(gone)
    data = gone.error.get("data") or {}
    expected = {"reason": "events_gone", "taskId": task_id, "earliestSeq": earliest}
    assert {k: data.get(k) for k in expected} == expected, str(gone)
    async with client.stream(task_id, earliest - 1) as resumed:
        await resumed.until(has_own(hooks, 5), "the retained events")
        await hooks.emit(task_id, 1)
        await resumed.until(has_own(hooks, 6), "the live event after them")
    assert resumed.seqs[0] == earliest, resumed.describe()
    assert_contiguous(resumed.seqs, earliest, "the stream from the earliest retained event")
    async with client.stream(task_id) as fresh:
        await fresh.until(has_own(hooks, 6), "the retained and the live events")
    assert fresh.seqs[0] == earliest, f"no cursor starts at earliestSeq: {fresh.describe()}"


async def slow_fallbacks(server: ServerUnderTest) -> float:
    """Our bridge's count of streams that overflowed their buffer (its Prometheus metrics)."""
    url = urlsplit(server.url)
    async with httpx.AsyncClient(timeout=QUICK) as http:
        text = (await http.get(f"{url.scheme}://{url.netloc}/metrics")).text
    name = "bridge_stream_slow_consumer_fallbacks_total "
    lines = [line for line in text.splitlines() if line.startswith(name)]
    assert lines, f"no {name.strip()} in the bridge's metrics"
    return float(lines[0].removeprefix(name))


@clause("no-silent-skip")
@clause("dropped-gone")
async def test_retention_under_an_open_stream_gives_every_event_or_events_gone(
    hooks: Hooks, client: McpClient, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    ours = server_under_test.started_by_suite
    before = await slow_fallbacks(server_under_test) if ours else 0.0
    task_id = await quiet_task(tasks)
    emitted = 2
    await hooks.emit(task_id, emitted)
    async with client.stream(task_id) as stream:
        await stream.until(has_own(hooks, 1), "emitted event 1")
        if ours:  # the read back below must not start at a checkpoint: from one that is gone
            interval = int(server_under_test.details["settings"].tasks.checkpoint_interval)
            while (stream.seqs[-1] + 1) % interval == 0:
                await hooks.emit(task_id, 1)
                emitted += 1
                await stream.until(has_own(hooks, emitted - 1), "one more emitted event")
        await delete_before(hooks, task_id, ALL)  # everything so far, under the open stream
        # Then a burst, more than a stream buffers at once (our bridge: stream_queue_size), so
        # the stream reads it back from the log whose start retention just moved.
        await emit_raw(hooks, task_id, bulk(64, 100))
        await hooks.emit(task_id, 1)
        await tasks.finish(task_id)
        await stream.to_end(what="the end of the stream (result or events_gone)")
    assert_gone_or_intact(stream, 0, "the stream retention ran under")
    if stream.error is None:
        assert [k for k, _ in own(hooks, stream.events)] == list(range(emitted + 1)), (
            stream.describe()
        )
        bulk_events = [e for e in stream.events if e.get("type") == BULK_TYPE.decode()]
        assert len(bulk_events) == 64, stream.describe()
        assert_empty_result(stream.result, "the stream retention ran under")
    if ours:  # the burst did make our bridge read back from the log (a catch-up read)
        assert await slow_fallbacks(server_under_test) > before, "the stream never fell behind"


@clause("no-silent-skip")
@clause("dropped-gone")
async def test_a_slow_consumer_overtaken_by_retention_gets_every_event_or_events_gone(
    hooks: Hooks, tasks: TaskPool, server_under_test: ServerUnderTest
) -> None:
    ours = server_under_test.started_by_suite
    before = await slow_fallbacks(server_under_test) if ours else 0.0
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    # A client that stops reading holds up the server once the socket buffers are full: its
    # own (128 KiB here; smaller than a loopback segment stalls TCP itself) and the server's,
    # which Linux grows up to 4 MiB. 200 events of 30 kB are more than both hold.
    server, token = server_under_test.url, server_under_test.auth_token
    async with (
        McpClient(server, token, receive_buffer=1 << 17) as slow,
        slow.stream(task_id) as stream,
    ):
        await stream.until(has_own(hooks, 0), "emitted event 0")
        # The client reads nothing while the task produces far more than the buffers hold,
        # then retention deletes all of it, read or not.
        await emit_raw(hooks, task_id, bulk(200, 30_000))
        await delete_before(hooks, task_id, ALL)
        await hooks.emit(task_id, 1)
        await tasks.finish(task_id)
        await stream.to_end(what="the end of the stream (result or events_gone)")
    assert_gone_or_intact(stream, 0, "the slow consumer's stream")
    if stream.error is None:
        assert [k for k, _ in own(hooks, stream.events)] == [0, 1], stream.describe()
        assert_empty_result(stream.result, "the slow consumer's stream")
    if ours:  # the test did overflow our bridge's per-stream buffer (stream_queue_size)
        assert await slow_fallbacks(server_under_test) > before, "the stream never fell behind"

"""SEP-2694 ``tasks/stream`` conformance, black-box over real HTTP.

One test per checkable clause (``@clause(key)``, see clauses.py); the session report prints
every clause with its outcome. Tests never assume that the events they emitted are the only
events of a task (servers emit their own): they check seq contiguity over everything received
and the order and presence of their own events (recognised by ``hooks.emitted_index``).

Layout: the ``story`` (one task, events emitted before and while a stream is open, then
finished) serves the read-only checks; tests that need a live task make their own; the
retention tests come last in this module because forcing retention (Kafka DeleteRecords on our
bridge) also drops earlier records of other tasks sharing the partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from .clauses import clause
from .hooks import Hooks, NotSupported, ServerUnderTest
from .wire import OMIT, RELATED_TASK, McpClient, Reply, TaskStream

pytestmark = pytest.mark.asyncio(loop_scope="package")

BOUND = 30.0  # any one wait
QUICK = 5.0  # "immediately": a reply that must not wait for anything
TERMINAL = frozenset({"completed", "failed", "cancelled"})
RESERVED_EXAMPLES = frozenset({"content.partial", "task.status", "tool.started"})
LABEL = re.compile(r"^[A-Za-z0-9_-]+$")
INVALID_PARAMS = -32602
EVENTS_GONE = -32010


# --- helpers ----------------------------------------------------------------------------------


def own(hooks: Hooks, events: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(k, seq)`` of the emitted events among ``events``, in arrival order."""
    out = []
    for event in events:
        k = hooks.emitted_index(event)
        if k is not None:
            out.append((k, event["seq"]))
    return out


def has_own(hooks: Hooks, k: int) -> Callable[[TaskStream], bool]:
    return lambda stream: any(hooks.emitted_index(e) == k for e in stream.events)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def assert_contiguous(seqs: list[Any], first: int | None = None, what: str = "seqs") -> None:
    assert all(is_int(s) for s in seqs), f"{what}: not all integers: {seqs}"
    if seqs:
        start = seqs[0] if first is None else first
        assert seqs == list(range(start, start + len(seqs))), f"{what}: not contiguous: {seqs}"


def assert_empty_result(result: dict[str, Any] | None, where: str) -> None:
    assert result is not None, f"{where}: no result"
    extra = set(result) - {"resultType", "_meta"}
    assert not extra, f"{where}: the result is not empty: {result}"
    assert result.get("resultType", "complete") == "complete", f"{where}: {result}"


async def task_status(client: McpClient, task_id: str) -> str:
    view = await client.result("tasks/get", {"taskId": task_id})
    return str(view.get("status"))


async def wait_terminal(client: McpClient, task_id: str, bound: float = BOUND) -> dict[str, Any]:
    """Poll tasks/get (at the task's pollIntervalMs, at most 0.2 s) until the task is terminal."""
    try:
        async with asyncio.timeout(bound):
            while True:
                view = await client.result("tasks/get", {"taskId": task_id})
                if view.get("status") in TERMINAL:
                    return view
                interval = view.get("pollIntervalMs")
                interval = interval if is_int(interval) else 100
                await asyncio.sleep(min(max(interval, 20), 200) / 1000)  # the tasks poll
    except TimeoutError:
        raise AssertionError(f"task {task_id} not terminal within {bound:g} s") from None


async def first_reply(stream: TaskStream, bound: float = QUICK) -> None:
    """Read until the stream answered: its response, its first event, or its end."""
    with contextlib.suppress(AssertionError):
        await stream.until(lambda s: bool(s.events), "a first event", bound)


@dataclass
class TaskPool:
    """Tasks made by one test; those not finished by it are finished at teardown."""

    hooks: Hooks
    live: list[str] = field(default_factory=list)

    async def new(self) -> str:
        task_id = await self.hooks.create_task()
        self.live.append(task_id)
        return task_id

    async def quiet(self) -> str:
        task_id = await self.hooks.create_quiet_task()
        self.live.append(task_id)
        return task_id

    async def finish(self, task_id: str) -> None:
        await self.hooks.finish(task_id)
        self.live.remove(task_id)

    async def finish_all(self) -> None:
        for task_id in list(self.live):
            with contextlib.suppress(Exception):
                await self.hooks.finish(task_id)
        self.live.clear()


@pytest_asyncio.fixture(loop_scope="package")
async def tasks(hooks: Hooks) -> AsyncIterator[TaskPool]:
    pool = TaskPool(hooks)
    try:
        yield pool
    finally:
        await pool.finish_all()


def requires_retention(server: ServerUnderTest, exc: NotSupported) -> None:
    server.not_applicable(f"forced retention: {exc}")


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
    reply = await client.call("tasks/stream", {"taskId": story.task_id, "after": story.last})
    assert reply.error is None or reply.error.get("code") != -32601, str(reply)


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
    types = {e.get("type") for e in story.events}
    reserved = sorted(str(t) for t in types if t in RESERVED_EXAMPLES)
    assert not reserved, f"reserved unprefixed types: {reserved}"
    unprefixed = sorted(str(t) for t in types if not isinstance(t, str) or t.count(".") < 2)
    assert not unprefixed, f"types without a vendor prefix (fewer than 3 labels): {unprefixed}"


@clause("vendor-prefix")
async def test_event_types_carry_a_vendor_prefix(story: Story) -> None:
    def prefixed(event_type: Any) -> bool:
        if not isinstance(event_type, str):
            return False
        labels = event_type.split(".")
        return len(labels) >= 3 and all(LABEL.match(label) for label in labels)

    types = sorted({str(e.get("type")) for e in story.events})
    bad = [t for t in types if not prefixed(t)]
    assert not bad, (
        f"not <vendor prefix>.<name> (reverse-DNS style, >= 3 labels): {bad}; all: {types}"
    )


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
    for event in stream.events:
        event_type, payload = event.get("type"), event.get("payload")
        assert isinstance(event_type, str) and event_type not in RESERVED_EXAMPLES, event
        assert len(event_type.split(".")) >= 3, f"an unprefixed type: {event}"
        assert all(LABEL.match(label) for label in event_type.split(".")), event
        assert isinstance(payload, dict), f"a payload that is not an object: {event}"


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

    def view(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e.get("seq"), e.get("type"), e.get("payload")) for e in events]

    assert view(again.events) == view(story.events)


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


def one_stream_rule(hooks: Hooks) -> None:
    if hooks.connection_scope != "principal":
        hooks.server.not_applicable(
            f"the server's connection scope is {hooks.connection_scope!r}: the suite can only "
            "check a server that treats requests with the same credentials as one connection"
        )


@clause("second-stream-32602")
async def test_a_second_stream_for_the_same_task_is_invalid_params(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    one_stream_rule(hooks)
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as first:
        await first.until(lambda s: bool(s.events), "the first stream's first event")
        async with client.stream(task_id) as second:
            await first_reply(second)
        assert not second.events, f"the second stream delivered events: {second.describe()}"
        error = second.error
        assert error is not None and error.get("code") == INVALID_PARAMS, second.describe()


@clause("one-active-stream")
async def test_the_first_stream_stays_the_one_active_stream(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    one_stream_rule(hooks)
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 0), "emitted event 0 on the first stream")
        for _ in range(2):
            async with client.stream(task_id) as extra:
                await first_reply(extra)
            assert extra.error is not None and not extra.events, extra.describe()
        await hooks.emit(task_id, 1)
        await first.until(has_own(hooks, 1), "a later event on the first stream")
        assert_contiguous(first.seqs, 0, "the first stream")


@clause("one-active-stream")
async def test_concurrent_opens_for_one_task_admit_exactly_one_stream(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    one_stream_rule(hooks)
    task_id = await tasks.new()
    await hooks.emit(task_id, 1)
    async with contextlib.AsyncExitStack() as stack:
        streams = await asyncio.gather(
            *(stack.enter_async_context(client.stream(task_id)) for _ in range(4))
        )
        await asyncio.gather(*(first_reply(stream, BOUND) for stream in streams))
        active = [s for s in streams if s.events]
        refused = [s for s in streams if s.error is not None and not s.events]
        assert len(active) == 1, [s.describe() for s in streams]
        assert len(refused) == 3, [s.describe() for s in streams]
        assert {s.error.get("code") for s in refused if s.error} == {INVALID_PARAMS}


@clause("cancel-then-reopen")
async def test_a_new_stream_is_accepted_once_the_active_one_is_cancelled(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    task_id = await tasks.new()
    await hooks.emit(task_id, 2)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 1), "emitted event 1")
    cursor = dict(own(hooks, first.events))[0]
    async with client.stream_when_free(task_id, cursor) as second:
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
    async with client.stream_when_free(task_id, last) as resumed:
        await resumed.until(has_own(hooks, 2), "events emitted after the stream was closed")
    assert_contiguous(resumed.seqs, last + 1, "the resumed stream")
    assert await task_status(client, task_id) not in TERMINAL


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


@clause("after-invalid-32602")
@pytest.mark.parametrize(
    "after",
    [-1, -100, 1.5, 0.5, "3", "abc", True, False, None, [1], {"seq": 1}],
    ids=lambda v: f"after={v!r}",
)
async def test_an_invalid_after_is_invalid_params(
    client: McpClient, story: Story, after: Any
) -> None:
    async with client.stream(story.task_id, after) as stream:
        await first_reply(stream)
    assert not stream.events, f"after={after!r} was accepted: {stream.describe()}"
    error = stream.error
    assert error is not None and error.get("code") == INVALID_PARAMS, stream.describe()


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
    async with client.stream_when_free(task_id, cursor) as resumed:
        await resumed.until(has_own(hooks, 2), "the replayed events")
        await hooks.emit(task_id, 2)
        await resumed.until(has_own(hooks, 4), "live events after the replay")
    assert_contiguous(resumed.seqs, cursor + 1, "the resumed stream")
    assert [k for k, _ in own(hooks, resumed.events)] == [1, 2, 3, 4]


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
async def test_progress_notifications_do_not_take_seq(
    hooks: Hooks, client: McpClient, tasks: TaskPool
) -> None:
    token = f"sep2694-{secrets.token_hex(4)}"
    task_id = await tasks.new()
    await hooks.emit(task_id, 2)
    async with client.stream(task_id, meta={"progressToken": token}) as stream:
        assert stream.error is None, stream.describe()
        await stream.until(has_own(hooks, 1), "emitted event 1")
        await hooks.emit(task_id, 2)
        await stream.until(has_own(hooks, 3), "emitted event 3")
    assert_contiguous(stream.seqs, 0)
    progress = [n for n in stream.notifications if n.get("method") == "notifications/progress"]
    for note in progress:
        params = note.get("params") or {}
        assert params.get("progressToken") == token, note
        assert "seq" not in params, f"a progress notification with a seq: {note}"
    assert [k for k, _ in own(hooks, stream.events)] == [0, 1, 2, 3]


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
        yield Intrusion(task_id, owner_get, get, stream, resume, (transport or [None])[0])
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
    try:
        await hooks.delete_before(task_id, stream.seqs[-1] + 1)  # every event
    except NotSupported as exc:
        requires_retention(server_under_test, exc)
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
    try:
        task_id = await tasks.quiet()
    except NotSupported as exc:
        server_under_test.not_applicable(str(exc))
    await hooks.emit(task_id, 2)
    async with client.stream(task_id) as first:
        await first.until(has_own(hooks, 1), "emitted event 1")
    head = first.seqs[-1] + 1
    try:
        await hooks.delete_before(task_id, head)  # every event so far
    except NotSupported as exc:
        requires_retention(server_under_test, exc)
    still = await client.call("tasks/get", {"taskId": task_id})
    if still.error is not None:
        server_under_test.not_applicable(
            f"the server forgets a task whose events are all gone (tasks/get: {still.error})"
        )
    assert still.result is not None and still.result.get("status") not in TERMINAL, str(still)
    async with client.stream_when_free(task_id) as stream:
        assert stream.error is None, stream.describe()
        await hooks.emit(task_id, 2)
        await stream.until(has_own(hooks, 3), "live events emitted after the stream opened")
    assert stream.seqs[0] == head, f"expected the first live event, seq {head}: {stream.describe()}"
    assert_contiguous(stream.seqs, head)
    assert [k for k, _ in own(hooks, stream.events)] == [2, 3]

"""The Events wire against SEP-3415 (issue 27, items 5 and 6), in-process over fakes of the log,
of the Kafka reader and of the webhook service: heartbeats from inside every replay loop (a
driven clock: a fetch takes one tick), a ``maxAgeMs`` skip said before a stream ends, task
cursors bound to their task and to its head, access checked again at each heartbeat, and
``events/subscribe``'s fresh cursor, TTL clamp, delivery mode and canonical key."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.config import Settings, task_cursor_version
from bridge.envelope import TaskEvent
from bridge.events_extension import TaskEvents
from bridge.events_extension.configured import NotPermitted
from bridge.events_extension.cursor import decode_partition, decode_task, encode_partition
from bridge.events_extension.kafkalog import Chunk, TopicFeed
from bridge.events_extension.occurrences import Active, Heartbeat, Occurrence, PollBatch, StreamItem
from bridge.events_extension.subscriptions import subscription_id
from bridge.events_extension.taskupdates import TaskUpdates, owner_record_key
from bridge.events_extension.webhooks import Verdict
from bridge.kafka.port import OffsetOutOfRange
from bridge.log.fanout import FeedClosed
from bridge.log.reader import NotRetained, SeqUntrusted
from bridge.server.admission import Caller
from bridge.server.events import EventsMethods, WebhookMethods
from bridge.server.handlers import Call, Streamed
from bridge.server.wire import JsonRpcRequest, RpcError
from bridge.tasks.messages import iso_ms
from bridge.tasks.service import TaskNotFound

NOW_MS = 50_000_000
OLD_MS = NOW_MS - 60_000
TASK_EVENT = "io.mcpbridge.task.event"
UPDATES = "io.mcpbridge.task.updated"
STATUS = "io.mcpbridge.task.status"
#: The heartbeat period of every stream here, in ticks of the driven clock.
PERIOD = 2.0
SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkw"


class Clock:
    """A monotonic clock the fakes move: one tick per fetch (a slow reader)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class View:
    status: str = "working"
    poll_interval_ms: int = 1000


class Tasks:
    """alice sees the tasks in ``visible`` (each with its status); nobody else sees any."""

    def __init__(self, **visible: str) -> None:
        self.visible = dict(visible)

    async def get(self, task_id: str, principal: str) -> View:
        if principal != "alice" or task_id not in self.visible:
            raise TaskNotFound()
        return View(self.visible[task_id])


# --- a task's log ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    seq: int
    event: TaskEvent


def step(i: int, *, old: bool = False) -> TaskEvent:
    return TaskEvent("com.example.step", {"i": i}, timestamp_ms=OLD_MS if old else NOW_MS)


def status(value: str, *, old: bool = False) -> TaskEvent:
    return TaskEvent(STATUS, {"status": value}, timestamp_ms=OLD_MS if old else NOW_MS)


class TaskLog:
    """Each task's events (one per fetch, each fetch a tick of ``clock``); seqs below
    ``earliest`` are no longer retained; ``indexed`` is the head this replica has indexed."""

    def __init__(self, clock: Clock, **tasks: list[TaskEvent]) -> None:
        self.clock = clock
        self.tasks = tasks
        self.earliest = 0
        self.indexed = {task: len(events) for task, events in tasks.items()}

    async def head(self, task_id: str) -> int:
        return self.indexed[task_id]

    async def read_batches(
        self, task_id: str, after: int | None = None
    ) -> AsyncIterator[list[Read]]:
        if after is not None and after + 1 < self.earliest:
            raise NotRetained(task_id, self.earliest)
        start = self.earliest if after is None else after + 1
        for seq in range(start, self.indexed[task_id]):
            self.clock.now += 1.0
            yield [Read(seq, self.tasks[task_id][seq])]


class QuietFeed:
    """The fan-out subscription of a task nobody writes to any more."""

    overflowed = False
    closed = False

    async def wait(self, idle_s: float | None = None) -> bool:
        await asyncio.sleep(idle_s or 0)  # the stream's own idle wait, not synchronisation
        return False

    def take(self) -> list[Read]:
        return []

    def reset(self) -> None:
        pass


class QuietFanout:
    @contextlib.contextmanager
    def subscribe(self, task_id: str, limit: int) -> Iterator[QuietFeed]:
        yield QuietFeed()


def task_events(log: TaskLog, tasks: Tasks, clock: Clock, **kw: Any) -> TaskEvents:
    source = TaskEvents(
        TASK_EVENT,
        tasks,
        log,
        QuietFanout(),
        status_type=STATUS,
        queue_size=8,
        heartbeat_s=PERIOD,
        now_ms=lambda: NOW_MS,
        **kw,
    )
    source.clock = clock
    return source


# --- a topic read by offset ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = NOW_MS
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class SlowTopic:
    """One partition in memory, two records per fetch, each fetch a tick of ``clock``."""

    clock: Clock
    records: list[Rec] = field(default_factory=list)

    def add(self, principal: str, task: str, seq: int, state: str, *, old: bool = False) -> None:
        body = {"v": 1, "taskId": task, "seq": seq, "status": state, "partition": 0}
        value = json.dumps({**body, "offset": seq, "ts": NOW_MS}).encode()
        at = OLD_MS if old else NOW_MS
        self.records.append(Rec(0, len(self.records), owner_record_key(principal), value, at))

    async def partitions(self, topic: str) -> list[int]:
        return [0]

    async def bounds(
        self, topic: str, partitions: Sequence[int]
    ) -> tuple[dict[int, int], dict[int, int]]:
        return {0: 0}, {0: len(self.records)}

    async def offsets_at(
        self, topic: str, partitions: Sequence[int], timestamp_ms: int
    ) -> dict[int, int | None]:
        return {0: None if not self.records else 0}  # a producer's clock: no seek by time

    async def fetch(self, topic: str, partition: int, offset: int) -> Chunk:
        if offset < 0:
            raise OffsetOutOfRange(())
        self.clock.now += 1.0
        got = self.records[offset : offset + 2]
        return Chunk(partition, offset, offset + len(got), got)

    async def close(self) -> None:
        pass


class QuietTail:
    """The live tail of a topic nobody writes to any more."""

    @contextlib.asynccontextmanager
    async def subscribe(self, topic: str, limit: int) -> AsyncIterator[TopicFeed]:
        yield TopicFeed(topic, limit)

    async def close(self) -> None:
        pass


def task_updates(topic: SlowTopic, tasks: Tasks) -> TaskUpdates:
    source = TaskUpdates(
        UPDATES,
        "p.task-updates",
        topic,  # type: ignore[arg-type]  # the reader's surface, in memory
        QuietTail(),  # type: ignore[arg-type]
        tasks=tasks,
        next_poll_ms=1000,
        queue_size=8,
        heartbeat_s=PERIOD,
        now_ms=lambda: NOW_MS,
    )
    source.clock = topic.clock
    return source


async def until(stream: AsyncIterator[StreamItem], clock: Clock, last: type) -> list[Any]:
    """``(tick, item)`` of each item up to the first of type ``last`` (bounded)."""
    got: list[Any] = []
    async with asyncio.timeout(10):
        async for item in stream:
            got.append((clock.now, item))
            if isinstance(item, last):
                return got
    return got


def widest_silence(timed: list[Any], start: float = 0.0) -> float:
    """The most ticks between two items sent (from ``start``, the stream's open)."""
    ticks = [start] + [tick for tick, _ in timed]
    return max(b - a for a, b in itertools.pairwise(ticks))


# --- item 5: heartbeats in the replay ------------------------------------------------------------


async def test_a_replay_over_a_busy_topic_heartbeats_every_period_and_a_reconnect_goes_on() -> None:
    clock = Clock()
    topic = SlowTopic(clock)
    for seq in range(40):  # another principal's updates: checked, never sent
        topic.add("bob", "tb", seq, "working")
    topic.add("alice", "t1", 0, "working")
    source = task_updates(topic, Tasks(t1="working"))
    stream = await source.open_stream("alice", {}, encode_partition(0, 0), None)
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        timed = await until(stream, clock, Occurrence)
    beats = [item for _, item in timed if isinstance(item, Heartbeat)]
    # 21 fetches of one tick each: a heartbeat at least every period (plus the fetch under way)
    assert widest_silence(timed) <= PERIOD + 1
    assert len(beats) >= 21 // int(PERIOD + 1)
    offsets = [decode_partition(beat.cursor)[1] for beat in beats]  # type: ignore[arg-type]
    assert offsets == sorted(offsets) and offsets[0] > 0  # the position moves on
    # A client that reconnects with the last heartbeat's cursor resumes from there.
    clock.now = 0.0
    again = await source.open_stream("alice", {}, beats[-1].cursor, None)
    async with contextlib.aclosing(again):  # type: ignore[type-var]
        resumed = await until(again, clock, Occurrence)
    first = resumed[0][1]
    assert isinstance(first, Active) and first.cursor == beats[-1].cursor and not first.truncated
    assert resumed[-1][1].event_id == "t1.0.updated"
    assert resumed[-1][0] < timed[-1][0]  # fewer fetches: it did not start over


class StuckTopic(SlowTopic):
    """A topic whose fetches past ``stuck_at`` wait until the test lets them through (a reader
    whose consumers are all busy)."""

    def __init__(self, clock: Clock, stuck_at: int) -> None:
        super().__init__(clock)
        self.stuck_at = stuck_at
        self.through = asyncio.Event()
        self.waiting = asyncio.Event()

    async def fetch(self, topic: str, partition: int, offset: int) -> Chunk:
        if offset >= self.stuck_at:
            self.waiting.set()
            await self.through.wait()
        return await super().fetch(topic, partition, offset)


async def test_a_fetch_that_keeps_the_replay_waiting_does_not_silence_the_stream() -> None:
    topic = StuckTopic(Clock(), stuck_at=4)
    for seq in range(4):
        topic.add("bob", "tb", seq, "working")
    topic.add("alice", "t1", 0, "working")
    source = task_updates(topic, Tasks(t1="working"))
    source.clock = time.monotonic  # the wait for the fetch is real: a short period
    source.heartbeat_s = 0.01
    stream = await source.open_stream("alice", {}, encode_partition(0, 0), None)
    async with asyncio.timeout(10), contextlib.aclosing(stream):  # type: ignore[type-var]
        assert isinstance(await anext(stream), Active)
        beat = await anext(stream)
        while not topic.waiting.is_set():
            beat = await anext(stream)  # heartbeats of the records before, if any were due
        beat = await anext(stream)  # the fetch is stuck: the stream still speaks
        assert isinstance(beat, Heartbeat) and beat.cursor == encode_partition(0, 4)
        topic.through.set()
        while not isinstance(item := await anext(stream), Occurrence):
            assert isinstance(item, Heartbeat)
    assert item.event_id == "t1.0.updated"


class StuckLog(TaskLog):
    """A task log whose read of seqs from ``stuck_at`` on waits until the test lets it through
    (a reader whose consumers are all busy)."""

    def __init__(self, clock: Clock, stuck_at: int, **tasks: list[TaskEvent]) -> None:
        super().__init__(clock, **tasks)
        self.stuck_at = stuck_at
        self.through = asyncio.Event()
        self.waiting = asyncio.Event()

    async def read_batches(
        self, task_id: str, after: int | None = None
    ) -> AsyncIterator[list[Read]]:
        async for batch in super().read_batches(task_id, after):
            if batch[0].seq >= self.stuck_at:
                self.waiting.set()
                await self.through.wait()
            yield batch


async def test_a_task_read_that_keeps_the_replay_waiting_does_not_silence_the_stream() -> None:
    clock = Clock()
    log = StuckLog(clock, 3, t=[step(0, old=True), step(1, old=True), step(2, old=True), step(3)])
    source = task_events(log, Tasks(t="working"), clock)
    source.clock = time.monotonic  # the wait for the read is real: a short period
    source.heartbeat_s = 0.01
    stream = await source.open_stream("alice", {"taskId": "t"}, _before_first(source), 5_000)
    async with asyncio.timeout(10), contextlib.aclosing(stream):  # type: ignore[type-var]
        assert isinstance(await anext(stream), Active)
        while not log.waiting.is_set():
            await anext(stream)  # heartbeats while old events are skipped, if any were due
        beat = await anext(stream)  # the read is stuck: the stream still speaks
        assert isinstance(beat, Heartbeat) and decode_task(beat.cursor, "t") == 2  # type: ignore[arg-type]
        log.through.set()
        while not isinstance(item := await anext(stream), Occurrence):
            assert isinstance(item, Heartbeat | Active)
    assert item.data["payload"]["i"] == 3


async def test_a_task_replay_skipping_old_events_heartbeats_and_a_reconnect_goes_on() -> None:
    clock = Clock()
    events = [step(i, old=True) for i in range(20)] + [step(20)]
    source = task_events(TaskLog(clock, t=events), Tasks(t="working"), clock)
    stream = await source.open_stream("alice", {"taskId": "t"}, _before_first(source), 5_000)
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        timed = await until(stream, clock, Occurrence)
    beats = [item for _, item in timed if isinstance(item, Heartbeat)]
    assert widest_silence(timed) <= PERIOD + 1 and len(beats) >= 20 // int(PERIOD + 1)
    seqs = [decode_task(beat.cursor, "t") for beat in beats]  # type: ignore[arg-type]
    assert seqs == sorted(seqs) and seqs[0] >= 0
    assert timed[-1][1].data["payload"]["i"] == 20
    clock.now = 0.0
    again = await source.open_stream("alice", {"taskId": "t"}, beats[-1].cursor, 5_000)
    async with contextlib.aclosing(again):  # type: ignore[type-var]
        resumed = await until(again, clock, Occurrence)
    assert resumed[-1][1].data["payload"]["i"] == 20 and resumed[-1][0] < timed[-1][0]


def _before_first(source: TaskEvents) -> str:
    """A cursor before the task's first event, as this server mints it."""
    return source.occurrence("t", -1, step(0)).cursor  # type: ignore[return-value]


# --- item 6 (a): a maxAgeMs skip is said before the stream ends --------------------------------


async def test_a_task_stream_ending_on_a_skipped_final_event_says_it_skipped() -> None:
    clock = Clock()
    log = TaskLog(clock, t=[step(0, old=True), status("completed", old=True)])
    source = task_events(log, Tasks(t="completed"), clock)
    stream = await source.open_stream("alice", {"taskId": "t"}, _before_first(source), 5_000)
    async with asyncio.timeout(10):
        got = [item async for item in stream]
    assert [type(i).__name__ for i in got] == ["Active", "Active"]
    assert isinstance(got[-1], Active) and got[-1].truncated is True
    assert decode_task(got[-1].cursor, "t") == 1  # type: ignore[arg-type]


async def test_a_task_updated_stream_whose_final_status_is_skipped_says_so_and_ends() -> None:
    topic = SlowTopic(Clock())
    topic.add("alice", "t1", 0, "working", old=True)
    topic.add("alice", "t1", 1, "completed", old=True)
    source = task_updates(topic, Tasks(t1="completed"))
    stream = await source.open_stream("alice", {"taskId": "t1"}, encode_partition(0, 0), 5_000)
    async with asyncio.timeout(10):
        got = [item async for item in stream]  # ends: nothing can follow the final status
    assert all(isinstance(i, Active) for i in got) and got[-1].truncated is True  # type: ignore[union-attr]


# --- item 6 (c): a task cursor names its task and a seq the task had ----------------------------


def methods(source: Any, webhooks: WebhookMethods | None = None) -> EventsMethods:
    return EventsMethods([source], streams=None, webhooks=webhooks)


def call(method: str, params: dict[str, Any], principal: str = "alice") -> Call:
    rpc = JsonRpcRequest(jsonrpc="2.0", id=9, method=method, params=params)
    return Call(rpc, Caller(principal, "conn"), legacy=False, params=params)


async def poll_task(source: TaskEvents, task: str, cursor: str | None) -> dict[str, Any]:
    body = {"name": TASK_EVENT, "arguments": {"taskId": task}, "cursor": cursor}
    return dict(await methods(source).poll(call("events/poll", body)))  # type: ignore[arg-type]


async def test_a_task_cursor_of_another_task_or_past_the_head_is_invalid_params() -> None:
    clock = Clock()
    log = TaskLog(clock, t=[step(0), step(1), step(2)], u=[step(0), step(1), step(2)])
    source = task_events(log, Tasks(t="working", u="working"), clock)
    at_t = (await poll_task(source, "t", None))["cursor"]
    assert (await poll_task(source, "t", at_t))["events"] == []
    with pytest.raises(RpcError) as foreign:
        await poll_task(source, "u", at_t)
    assert foreign.value.code == -32602
    with pytest.raises(RpcError) as ahead:
        await methods(source).stream(
            call(
                "events/stream",
                {"name": TASK_EVENT, "arguments": {"taskId": "u"}, "cursor": _ahead("u", 3)},
            )
        )
    assert ahead.value.code == -32602
    assert ahead.value.data == {"reason": "cursor_ahead", "taskId": "u", "nextSeq": 3}


async def test_a_cursor_at_the_head_of_a_replica_further_along_is_taken_after_a_catch_up() -> None:
    clock = Clock()
    log = TaskLog(clock, t=[step(0), step(1), step(2), step(3)])
    log.indexed["t"] = 2  # this replica's view lags the log

    async def catch_up() -> None:
        log.indexed["t"] = 4

    source = task_events(log, Tasks(t="working"), clock, catch_up=catch_up)
    out = await poll_task(source, "t", _ahead("t", 2))
    assert [e["data"]["payload"]["i"] for e in out["events"]] == [3]


def _ahead(task: str, seq: int) -> str:
    """This server's cursor after seq ``seq`` of ``task`` (minted the way the server mints it,
    so that the test reads the same on a version whose cursors name no task)."""
    clock = Clock()
    source = task_events(TaskLog(clock, **{task: []}), Tasks(), clock)
    return source.occurrence(task, seq, step(seq)).cursor  # type: ignore[return-value]


async def test_during_a_rolling_upgrade_cursors_can_be_minted_in_the_old_form() -> None:
    clock = Clock()
    log = TaskLog(clock, t=[step(0), step(1)])
    bound = task_events(log, Tasks(t="working"), clock)
    legacy = task_events(log, Tasks(t="working"), clock, bind_cursors=False)
    old_form = (await poll_task(legacy, "t", None))["cursor"]
    assert old_form == "dDEuMQ"  # t1.1: what replicas of 8fd441c read
    new_form = (await poll_task(bound, "t", None))["cursor"]
    for source in (bound, legacy):  # either reads both forms
        assert (await poll_task(source, "t", old_form))["events"] == []
        assert (await poll_task(source, "t", new_form))["events"] == []
    assert task_cursor_version(Settings()) == 2
    assert task_cursor_version(Settings(events={"cursors": {"task_version": 1}})) == 1


# --- item 6 (g): access is checked again at each heartbeat ---------------------------------------


class Revocable:
    """An event type whose stream only heartbeats; access goes after ``allowed`` checks."""

    name = "com.example.revocable"

    def __init__(self, allowed: int, error: Exception) -> None:
        self.allowed = allowed
        self.error = error
        self.checks = 0

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name, "delivery": ["poll", "push"]}

    async def authorize(self, principal: str, arguments: dict[str, Any]) -> None:
        self.checks += 1
        if self.checks > self.allowed:
            raise self.error

    async def poll(self, *args: Any) -> PollBatch:
        raise AssertionError("not polled")

    async def open_stream(self, *args: Any) -> AsyncIterator[StreamItem]:
        return self._items()

    async def _items(self) -> AsyncIterator[StreamItem]:
        yield Active("c0", False)
        for n in range(1, 100):
            yield Heartbeat(f"c{n}")


class Busy(Revocable):
    """An event type whose stream only delivers events (it never needs a heartbeat); each
    event takes a tick of ``clock``."""

    def __init__(self, allowed: int, error: Exception, clock: Clock) -> None:
        super().__init__(allowed, error)
        self.clock = clock

    async def _items(self) -> AsyncIterator[StreamItem]:
        yield Active("c0", False)
        for n in range(1, 100):
            self.clock.now += 1.0
            yield Occurrence(f"e{n}", self.name, NOW_MS, {"n": n}, f"c{n}")


async def frames(outcome: Any) -> list[dict[str, Any]]:
    assert isinstance(outcome, Streamed)
    async with asyncio.timeout(10):
        return [message async for message in outcome.messages]  # type: ignore[misc]


@pytest.mark.parametrize(
    ("error", "code"), [(NotPermitted("no longer listed"), -32024), (TaskNotFound(), -32023)]
)
async def test_a_push_stream_ends_with_terminated_when_access_is_gone(
    error: Exception, code: int
) -> None:
    source = Revocable(allowed=2, error=error)
    outcome = await methods(source).stream(call("events/stream", {"name": source.name}))
    got = await frames(outcome)
    kinds = [m.get("method", "result").rsplit("/", 1)[-1] for m in got]
    assert kinds == ["active", "heartbeat", "heartbeat", "terminated"]
    assert got[-1]["params"]["error"]["code"] == code
    assert got[-1]["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 9}


async def test_a_busy_push_stream_checks_access_every_period_too() -> None:
    clock = Clock()
    source = Busy(allowed=1, error=NotPermitted("no longer listed"), clock=clock)
    events = EventsMethods([source], streams=None, recheck_s=PERIOD, clock=clock)
    got = await frames(await events.stream(call("events/stream", {"name": source.name})))
    kinds = [m.get("method", "result").rsplit("/", 1)[-1] for m in got]
    # checked at the 2nd tick (allowed) and the 4th (gone): three events, then terminated
    assert kinds == ["active", "event", "event", "event", "terminated"]
    assert got[-1]["params"]["error"]["code"] == -32024


# --- item 6 (b), (d), (e), (f): events/subscribe -------------------------------------------------


class FakeTable:
    """The view of the subscriptions events/subscribe reads, in memory."""

    def __init__(self) -> None:
        self.subs: dict[str, Any] = {}

    def get(self, sub_id: str) -> Any:
        return self.subs.get(sub_id)

    def live(self, sub_id: str, now_ms: int) -> Any:
        sub = self.subs.get(sub_id)
        return sub if sub is not None and not sub.expired(now_ms) else None

    def deleted_rev(self, sub_id: str) -> int:
        return 0

    def count_live(self, principal: str, now_ms: int) -> int:
        return len(self.subs)

    def verified(self, principal: str, url: str, now_ms: int) -> bool:
        return False


class FakeService:
    """The webhook service's surface events/subscribe uses, in memory; every challenge echoes."""

    def __init__(self) -> None:
        self.registry = SimpleNamespace(table=FakeTable(), restored=asyncio.Event())
        self.registry.restored.set()
        self.put_ids: list[str] = []
        # The challenge as the sender answers it (what 8fd441c's subscribe called directly).
        self.sender = SimpleNamespace(verify_endpoint=self._echoed)

    async def verify(self, principal: str, url: str, sub_id: str, secret: str) -> Any:
        return await self._echoed(url)

    async def _echoed(self, url: str, **_: Any) -> Any:
        return SimpleNamespace(verdict=Verdict.DELIVERED, error=None)

    async def put(self, sub: Any) -> None:
        self.put_ids.append(sub.id)
        self.registry.table.subs[sub.id] = sub


def webhooks(source: Any, now_ms: int = NOW_MS) -> tuple[EventsMethods, FakeService]:
    service = FakeService()
    hooks = WebhookMethods(
        Settings(),
        {source.name: source},
        service,  # type: ignore[arg-type]
        now_ms=lambda: now_ms,
    )
    return methods(source, hooks), service


def subscribe_params(name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    delivery = {"mode": "webhook", "url": "https://hooks.example.com/in", "secret": SECRET}
    return {"name": name, "arguments": arguments, "delivery": delivery, **extra}


async def test_a_new_subscription_with_a_stale_cursor_starts_at_and_returns_the_fresh_one() -> None:
    clock = Clock()
    log = TaskLog(clock, t=[step(i) for i in range(5)])
    log.earliest = 3  # seqs 0..2 are gone
    source = task_events(log, Tasks(t="working"), clock)
    events, service = webhooks(source)
    stale = _ahead("t", 0)
    out = await events.webhooks.subscribe(  # type: ignore[union-attr]
        call("events/subscribe", subscribe_params(TASK_EVENT, {"taskId": "t"}, cursor=stale))
    )
    assert out["truncated"] is True  # type: ignore[index]
    assert out["cursor"] == _ahead("t", 2)  # type: ignore[index]  # after the gap
    stored = service.registry.table.get(out["id"])  # type: ignore[index]
    assert stored is not None and stored.cursor == out["cursor"]  # type: ignore[index]


@pytest.mark.parametrize("ttl", [0, -5])
async def test_a_ttl_of_zero_or_less_is_clamped_to_the_minimum_grant(ttl: int) -> None:
    clock = Clock()
    source = task_events(TaskLog(clock, t=[step(0)]), Tasks(t="working"), clock)
    events, _ = webhooks(source)
    out = await events.webhooks.subscribe(  # type: ignore[union-attr]
        call("events/subscribe", subscribe_params(TASK_EVENT, {"taskId": "t"}, ttlMs=ttl))
    )
    assert out["refreshBefore"] == iso_ms(NOW_MS + Settings().webhooks.ttl_min_ms)  # type: ignore[index]


@pytest.mark.parametrize("method", ["events/subscribe", "events/unsubscribe"])
async def test_a_delivery_mode_other_than_webhook_is_unsupported(method: str) -> None:
    clock = Clock()
    source = task_events(TaskLog(clock, t=[step(0)]), Tasks(t="working"), clock)
    events, service = webhooks(source)
    params = {"name": TASK_EVENT, "arguments": {"taskId": "t"}, "delivery": {"mode": "push"}}
    handler = events.methods()[method]
    with pytest.raises(RpcError) as refused:
        await handler(call(method, params))
    assert refused.value.code == -32026
    assert refused.value.data == {"feature": "deliveryMode", "value": "push"}
    assert service.put_ids == []


def test_subscription_keys_compare_arguments_as_rfc_8785_canonical_json() -> None:
    def key(arguments: dict[str, Any]) -> str:
        return subscription_id("alice", "https://h.example/x", "n", arguments)

    assert key({"a": 1, "b": [1e2, "x"]}) == key({"b": [100, "x"], "a": 1.0})
    assert key({"a": 1}) != key({"a": "1"})
    assert key({"\U0001f600": 1, "\uffff": 2}) == key({"\uffff": 2, "\U0001f600": 1})


async def test_arguments_without_a_canonical_form_are_invalid_params() -> None:
    clock = Clock()
    source = task_events(TaskLog(clock, t=[step(0)]), Tasks(t="working"), clock)
    events, service = webhooks(source)
    params = subscribe_params(TASK_EVENT, {"taskId": "t", "n": 2**60})
    with pytest.raises(RpcError) as refused:
        await events.webhooks.subscribe(call("events/subscribe", params))  # type: ignore[union-attr]
    assert refused.value.code == -32602 and "2**53" in refused.value.message
    assert service.put_ids == []


# --- a task made untrusted while its push stream waits live ----------------------------------


class DistrustedLog(TaskLog):
    """A task log whose task retention makes untrusted (the reader's answer from then on)."""

    untrusted = False

    async def head(self, task_id: str) -> int:
        if self.untrusted:
            raise SeqUntrusted(task_id)
        return await super().head(task_id)


class DistrustingFeed:
    """The fan-out subscription of task "t": at the stream's first live wait retention makes
    the task untrusted and the tail fans out its next event (a seq counted past the gap); the
    wait after that is the subscription's closure (a stream that goes on ends there)."""

    overflowed = False
    closed = False

    def __init__(self, log: DistrustedLog) -> None:
        self.log = log
        self.waits = 0

    async def wait(self, idle_s: float | None = None) -> bool:
        self.waits += 1
        if self.waits > 1:
            self.closed = True
            raise FeedClosed("t", "moved")
        self.log.untrusted = True
        return True

    def take(self) -> list[Read]:
        return [Read(2, step(2))]

    def reset(self) -> None:
        pass


async def test_a_live_task_stream_whose_task_became_untrusted_ends_with_seq_untrusted() -> None:
    clock = Clock()
    log = DistrustedLog(clock, t=[step(0), step(1)])
    feed = DistrustingFeed(log)

    class Fanout:
        @contextlib.contextmanager
        def subscribe(self, task_id: str, limit: int) -> Iterator[DistrustingFeed]:
            yield feed

    source = task_events(log, Tasks(t="working"), clock)
    source.live = Fanout()
    body = {"name": TASK_EVENT, "arguments": {"taskId": "t"}}
    got = await frames(await methods(source).stream(call("events/stream", body)))
    kinds = [m.get("method", "result").rsplit("/", 1)[-1] for m in got]
    assert kinds == ["active", "terminated"]  # seq 2 is not handed under an untrusted count
    error = got[-1]["params"]["error"]
    assert error["code"] == -32602 and error["data"] == {"reason": "seq_untrusted", "taskId": "t"}

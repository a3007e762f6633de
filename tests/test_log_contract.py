"""The log port's contract: the same tests on the in-memory log and on the aiokafka adapter.

The in-memory run is in the fast tier; the adapter's is marked ``kafka`` and runs against the
real broker, so the model cannot drift from Kafka. What the port cannot show (a partition's
high watermark, the members a group's coordinator lists) each log's environment reads itself:
the model's state, or the broker (a read_uncommitted consumer, DescribeGroups). Only the
model's own machinery (its clock, waking a closed tail) is tested on the model alone, at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic
from support.waits import wait_until

from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.admin import kafka_admin
from bridge.kafka.clients import committed_consumer
from bridge.kafka.memory import ManualClock, MemoryLog
from bridge.kafka.port import (
    GroupTail,
    Log,
    LogError,
    LogRecord,
    OffsetOutOfRange,
    Reset,
    Share,
    Tail,
    TopicPart,
    WriterFenced,
)

#: Every wait of these tests is bounded by this (a broker's group round takes a few seconds).
BOUND_S = 60.0
#: The shortest session a broker accepts by default (group.min.session.timeout.ms).
SESSION_MS = 6000
#: The longest a group round waits for its members to rejoin.
REBALANCE_MS = 15_000


@dataclass
class Env:
    """A log, how to make topics on it, and how time passes for it."""

    log: Log
    make_topic: Callable[[str, int], object]
    clock: ManualClock | None = None
    #: A partition's high watermark: what was written, committed or not (the port shows
    #: read_committed ends only).
    high_watermark: Callable[[TopicPart], Awaitable[int]] | None = None
    #: How many members the group's coordinator lists now.
    group_size: Callable[[str], Awaitable[int]] | None = None

    async def topic(self, partitions: int = 1) -> str:
        name = f"contract-{secrets.token_hex(5)}"
        made = self.make_topic(name, partitions)
        if asyncio.iscoroutine(made):
            await made
        return name

    async def written(self, part: TopicPart, end: int) -> None:
        """Wait (bounded) until ``part`` holds ``end`` offsets, committed or not: a record sent
        in a transaction reaches the broker in the background."""
        watermark = self.high_watermark
        assert watermark is not None

        async def reached() -> bool:
            return await watermark(part) >= end

        await wait_until(reached, BOUND_S, what=f"{part} written up to {end}")

    async def members_listed(self, group: str) -> int:
        """How many members the coordinator of ``group`` lists now."""
        assert self.group_size is not None
        return await self.group_size(group)

    def elapse(self, seconds: float) -> None:
        """Let ``seconds`` pass: the model's clock moves; the broker's time passes by itself
        while the test waits (bounded) for what it expects."""
        if self.clock is not None:
            self.clock.advance(seconds)


async def _kafka_topic(settings: Settings, name: str, partitions: int) -> None:
    """Create the topic and wait until the broker's metadata lists it: a group member that
    subscribes before then gets no partitions until its next metadata refresh (minutes)."""
    async with kafka_admin(settings) as admin:
        await admin.create_topics([NewTopic(name, partitions, 1)])

        async def listed() -> bool:
            return name in await admin.list_topics()

        await wait_until(listed, BOUND_S, what=f"topic {name} in the broker's metadata")


async def _kafka_group_size(settings: Settings, group: str) -> int:
    """The members the broker lists in ``group`` (DescribeGroups): exact, since a member's
    LeaveGroup is answered only once the coordinator has removed it."""
    async with kafka_admin(settings) as admin:
        [response] = await admin.describe_consumer_groups([group])
    [described] = response.groups
    error_code, members = described[0], described[5]
    assert error_code == 0, f"describing group {group}: error {error_code}"
    return len(members)


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    if request.param == "memory":
        clock = ManualClock()
        memory = MemoryLog(clock)

        async def memory_watermark(part: TopicPart) -> int:
            return memory._partition(part).end

        async def memory_group_size(group: str) -> int:
            return len(memory.group(group).members)

        yield Env(memory, memory.create_topic, clock, memory_watermark, memory_group_size)
        return
    settings: Settings = request.getfixturevalue("settings")
    kafka = KafkaLog(settings)
    # read_uncommitted: its end offsets are the high watermarks
    uncommitted = committed_consumer(settings, "contract", isolation_level="read_uncommitted")
    await uncommitted.start()

    async def kafka_watermark(part: TopicPart) -> int:
        tp = TopicPartition(part.topic, part.partition)
        return int((await uncommitted.end_offsets([tp]))[tp])

    async def kafka_group_size(group: str) -> int:
        return await _kafka_group_size(settings, group)

    try:
        yield Env(
            kafka,
            lambda name, n: _kafka_topic(settings, name, n),
            None,
            kafka_watermark,
            kafka_group_size,
        )
    finally:
        await uncommitted.stop()
        await kafka.close()


async def read_all(log: Log, part: TopicPart, start: int = 0) -> list[LogRecord]:
    """Every committed record of ``part`` from ``start`` to its current end."""
    end = (await log.log_ends([part]))[part]
    records: list[LogRecord] = []
    async with asyncio.timeout(BOUND_S):
        while start < end:
            fetched = await log.fetch(part, start)
            records += fetched.records
            start = fetched.next_offset
    return records


async def poll_until(
    tail: Tail, done: Callable[[dict[TopicPart, list[LogRecord]]], bool]
) -> tuple[dict[TopicPart, list[LogRecord]], dict[TopicPart, int]]:
    """Poll ``tail``, gathering records, until ``done`` says they are enough (bounded); the
    records and the positions the last poll reported."""
    got: dict[TopicPart, list[LogRecord]] = {}
    positions: dict[TopicPart, int] = {}
    async with asyncio.timeout(BOUND_S):
        while not done(got):
            polled = await tail.poll(0.2)
            positions = polled.positions
            for part, records in polled.records.items():
                got.setdefault(part, []).extend(records)
    return got, positions


# --- reads --------------------------------------------------------------------------------


async def test_a_fetch_returns_what_was_written_with_its_offsets_keys_values_and_headers(
    env: Env,
) -> None:
    topic = await env.topic(2)
    part = TopicPart(topic, 1)
    assert await env.log.partitions(topic) == [0, 1]
    async with env.log.producer() as producer:
        first = await producer.send(topic, b"v0", key=b"k", partition=1, headers=[("h", b"1")])
        await producer.send(topic, None, key=b"k", partition=1)
    assert (first.partition, first.offset) == (1, 0)
    records = await read_all(env.log, part)
    assert [(r.offset, r.key, r.value) for r in records] == [(0, b"k", b"v0"), (1, b"k", None)]
    assert tuple(records[0].headers) == (("h", b"1"),)
    assert await env.log.log_starts([part]) == {part: 0}
    assert await env.log.log_ends([part]) == {part: 2}


async def test_a_marker_takes_an_offset_and_an_aborted_transaction_is_never_read(
    env: Env,
) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    async with env.log.transactional_writer(f"{topic}.w") as writer:
        async with writer.transaction():
            await writer.send(topic, b"c0", partition=0)
            await writer.send(topic, b"c1", partition=0)
        with contextlib.suppress(RuntimeError):
            async with writer.transaction():
                await writer.send(topic, b"aborted", partition=0)
                raise RuntimeError("abort it")
    async with env.log.producer() as producer:
        after = await producer.send(topic, b"plain", partition=0)
    # c0, c1, their commit marker, the aborted record, its abort marker, then the plain one.
    assert after.offset == 5
    records = await read_all(env.log, part)
    assert [(r.offset, r.value) for r in records] == [(0, b"c0"), (1, b"c1"), (5, b"plain")]
    assert await env.log.log_ends([part]) == {part: 6}


async def test_a_fetch_from_a_marker_moves_on_without_a_record(env: Env) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    async with env.log.transactional_writer(f"{topic}.w") as writer, writer.transaction():
        await writer.send(topic, b"c0", partition=0)
    fetched = await env.log.fetch(part, 1)
    assert (fetched.records, fetched.next_offset) == ([], 2)


async def test_delete_records_moves_the_log_start_and_a_read_below_it_is_out_of_range(
    env: Env,
) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    async with env.log.producer() as producer:
        for i in range(5):
            await producer.send(topic, b"%d" % i, partition=0)
    await env.log.delete_records_before(part, 3)
    assert await env.log.log_starts([part]) == {part: 3}
    with pytest.raises(OffsetOutOfRange) as below:
        await env.log.fetch(part, 0)
    assert below.value.parts == {part}
    with pytest.raises(OffsetOutOfRange):
        await env.log.fetch(part, 6)
    assert [r.offset for r in await read_all(env.log, part, 3)] == [3, 4]


async def test_offsets_for_times_finds_the_first_record_at_or_after_each_time(
    env: Env,
) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    # Recent times: on a broker, records stamped decades ago roll a segment each and are
    # deleted by the next retention check (the CI run that met it saw [None, None, None]).
    base = int(time.time() * 1000) - 60_000
    async with env.log.producer() as producer:
        for ms in (1_000, 2_000, 3_000):
            await producer.send(topic, b"x", partition=0, timestamp_ms=base + ms)
    found = [(await env.log.offsets_for_times({part: base + ms}))[part] for ms in (0, 2_000, 2_500)]
    assert found == [0, 1, 2]
    assert await env.log.offsets_for_times({part: base + 4_000}) == {part: None}
    stamps = [r.timestamp - base for r in await read_all(env.log, part)]
    assert stamps == [1_000, 2_000, 3_000]


# --- tails --------------------------------------------------------------------------------


async def test_a_tail_reads_records_as_they_arrive_and_reports_its_positions(env: Env) -> None:
    topic = await env.topic(2)
    parts = [TopicPart(topic, 0), TopicPart(topic, 1)]
    async with env.log.tail() as tail, env.log.producer() as producer:
        tail.assign({p: 0 for p in parts})
        assert tail.assignment() == frozenset(parts)
        for p in (0, 1, 1):
            await producer.send(topic, b"%d" % p, partition=p)
        got, _ = await poll_until(tail, lambda got: sum(map(len, got.values())) == 3)
        assert {p: [r.offset for r in rs] for p, rs in got.items()} == {
            parts[0]: [0],
            parts[1]: [0, 1],
        }
        tail.reposition(parts[1], 1)
        again, positions = await poll_until(tail, lambda got: parts[1] in got)
        assert [r.offset for r in again[parts[1]]] == [1]
        assert positions == {parts[0]: 1, parts[1]: 2}


async def test_a_paused_partition_is_not_read_until_it_is_resumed(env: Env) -> None:
    topic = await env.topic(2)
    parts = [TopicPart(topic, 0), TopicPart(topic, 1)]
    async with env.log.tail() as tail, env.log.producer() as producer:
        tail.assign({p: 0 for p in parts})
        tail.pause(parts[1])
        await producer.send(topic, b"held", partition=1)
        await producer.send(topic, b"read", partition=0)
        got, _ = await poll_until(tail, lambda got: parts[0] in got)
        assert parts[1] not in got
        tail.resume(parts[1])
        got, _ = await poll_until(tail, lambda got: parts[1] in got)
        assert [r.value for r in got[parts[1]]] == [b"held"]


async def test_a_tail_behind_a_moved_log_start_is_told_and_goes_on_after_a_seek(env: Env) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    async with env.log.producer() as producer:
        for i in range(5):
            await producer.send(topic, b"%d" % i, partition=0)
    await env.log.delete_records_before(part, 3)
    async with env.log.tail() as tail:
        tail.assign({part: 0})
        with pytest.raises(OffsetOutOfRange) as gone:
            async with asyncio.timeout(BOUND_S):
                while True:
                    await tail.poll(0.2)
        assert gone.value.parts == {part}
        tail.reposition(part, 3)
        got, _ = await poll_until(tail, lambda got: len(got.get(part, [])) == 2)
        assert [r.offset for r in got[part]] == [3, 4]


async def test_a_tail_skips_aborted_records_and_markers(env: Env) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    async with env.log.tail() as tail:
        tail.assign({part: 0})
        async with env.log.transactional_writer(f"{topic}.w") as writer:
            with contextlib.suppress(RuntimeError):
                async with writer.transaction():
                    await writer.send(topic, b"aborted", partition=0)
                    raise RuntimeError("abort it")
            async with writer.transaction():
                await writer.send(topic, b"kept", partition=0)
        got, _ = await poll_until(tail, lambda got: part in got)
        assert [(r.offset, r.value) for r in got[part]] == [(2, b"kept")]


async def test_an_open_transaction_holds_readers_at_its_first_offset(env: Env) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    writer = env.log.transactional_writer(f"{topic}.w")
    async with writer, env.log.producer() as producer:
        async with writer.transaction():
            await writer.send(topic, b"open", partition=0)
            await env.written(part, 1)
            after = await producer.send(topic, b"after", partition=0)
            assert after.offset == 1
            assert await env.log.log_ends([part]) == {part: 0}  # the last stable offset
            assert (await env.log.fetch(part, 0)).records == []

        # The broker writes the commit marker after it answers the commit: bounded wait.
        async def stable() -> bool:
            return await env.log.log_ends([part]) == {part: 3}

        await wait_until(stable, BOUND_S, what="the commit marker written")
        assert [r.value for r in await read_all(env.log, part)] == [b"open", b"after"]


# --- the fenced writer --------------------------------------------------------------------


async def test_a_newer_writer_fences_the_older_one_and_aborts_its_open_transaction(
    env: Env,
) -> None:
    topic = await env.topic()
    part = TopicPart(topic, 0)
    old = env.log.transactional_writer(f"{topic}.w")
    new = env.log.transactional_writer(f"{topic}.w")
    await old.start()
    try:
        with pytest.raises(WriterFenced):
            async with old.transaction():
                await old.send(topic, b"zombie", partition=0)
                await new.start()
        async with new.transaction():
            await new.send(topic, b"fresh", partition=0)
        with pytest.raises(WriterFenced):
            async with old.transaction():
                await old.send(topic, b"zombie again", partition=0)
    finally:
        await old.close()
        await new.close()
    assert [r.value for r in await read_all(env.log, part)] == [b"fresh"]


# --- consumer groups ----------------------------------------------------------------------


class Changes:
    """Wakes every waiter of a group's members when any member's callbacks ran: a condition
    may name several members (a wait on one member's own changes missed the other's)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def notify(self) -> None:
        self.event.set()
        self.event = asyncio.Event()


@dataclass
class Member:
    """A group member polling in the background, recording its callbacks."""

    tail: GroupTail
    changes: Changes = field(default_factory=Changes)
    events: list[tuple[str, frozenset[TopicPart], bytes]] = field(default_factory=list)
    owned: frozenset[TopicPart] = frozenset()
    task: asyncio.Task[None] | None = None
    errors: list[LogError] = field(default_factory=list)
    #: What its polls read, and the positions the last one reported.
    records: list[LogRecord] = field(default_factory=list)
    positions: dict[TopicPart, int] = field(default_factory=dict)
    #: Stop polling at the first error (else only at one that is not retriable).
    stop_on_error: bool = False
    #: Offsets to commit from the revoke callback (the worker SDK commits its finished jobs
    #: there): Kafka accepts a commit of the current generation while a rebalance prepares.
    commit_on_revoke: dict[TopicPart, int] = field(default_factory=dict)

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        self.events.append(("revoked", parts, b""))
        if parts and self.commit_on_revoke:  # what an eager consumer does before it rejoins
            try:
                await self.tail.commit(self.commit_on_revoke)
            except LogError as exc:
                self.errors.append(exc)
        self.owned = frozenset()
        self._changed()

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        self.events.append(("assigned", parts, user_data))
        self.owned = parts
        self._changed()

    def _changed(self) -> None:
        self.changes.notify()

    def last_data(self) -> bytes | None:
        """The user data of the last assignment, if any."""
        data = [e[2] for e in self.events if e[0] == "assigned"]
        return data[-1] if data else None

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e[0] == kind)

    async def until(self, done: Callable[[], bool]) -> None:
        try:
            async with asyncio.timeout(BOUND_S):
                while not done():
                    await self.changes.event.wait()
        except TimeoutError:
            raise AssertionError(
                f"not reached; events {self.events}, errors {self.errors}"
            ) from None

    async def run(self) -> None:
        while True:
            try:
                polled = await self.tail.poll(0.2)
            except LogError as exc:
                self.errors.append(exc)
                self._changed()
                if self.stop_on_error or not exc.retriable:
                    return  # asking again would fail again (and never wait)
                continue  # a retriable failure: polling goes on, as a client's
            if polled.records or polled.positions != self.positions:
                for records in polled.records.values():
                    self.records.extend(records)
                self.positions = dict(polled.positions)
                self._changed()


class Members:
    """Start and stop group members of one group on one log."""

    def __init__(self, env: Env, topic: str) -> None:
        self.env = env
        self.topic = topic
        self.group = f"{topic}.g"
        self.all: list[Member] = []
        self.changes = Changes()

    async def join(
        self, instance_id: str | None = None, assignor: object = None, reset: Reset = "earliest"
    ) -> Member:
        member = Member(tail=None, changes=self.changes)  # type: ignore[arg-type]
        member.tail = self.env.log.group_tail(
            self.group,
            [self.topic],
            member,
            assignor=assignor,  # type: ignore[arg-type]
            instance_id=instance_id,
            reset=reset,
            session_timeout_ms=SESSION_MS,
            # The rebalance timeout: a round waits this long at most for a member that is slow
            # to rejoin (aiokafka's default, 5 minutes, is longer than any wait here).
            max_poll_interval_ms=REBALANCE_MS,
        )
        await member.tail.start()
        member.task = asyncio.create_task(member.run())
        self.all.append(member)
        return member

    async def close(self, member: Member) -> None:
        if member.task is not None:
            member.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, LogError):
                await member.task
        await member.tail.close()

    async def close_all(self) -> None:
        for member in self.all:
            await self.close(member)


@contextlib.asynccontextmanager
async def members(env: Env, partitions: int = 2) -> AsyncIterator[Members]:
    group = Members(env, await env.topic(partitions))
    try:
        yield group
    finally:
        await group.close_all()


def parts_of(topic: str, *ps: int) -> frozenset[TopicPart]:
    return frozenset(TopicPart(topic, p) for p in ps)


async def test_every_rebalance_revokes_every_members_partitions_first(
    env: Env,
) -> None:
    async with members(env) as group:
        a = await group.join()
        await a.until(lambda: a.owned == parts_of(group.topic, 0, 1))
        b = await group.join()
        await b.until(lambda: len(b.owned) == 1)
        await a.until(lambda: len(a.owned) == 1)
        assert ("revoked", parts_of(group.topic, 0, 1), b"") in a.events  # eager: everything
        assert a.owned | b.owned == parts_of(group.topic, 0, 1)


async def test_a_dynamic_member_leaves_on_close_and_the_others_take_its_partitions(
    env: Env,
) -> None:
    async with members(env) as group:
        a = await group.join()
        b = await group.join()
        await a.until(lambda: len(a.owned) == 1 and len(b.owned) == 1)
        await group.close(b)
        assert await env.members_listed(group.group) == 1  # b's LeaveGroup was answered
        await a.until(lambda: a.owned == parts_of(group.topic, 0, 1))


async def test_a_static_member_keeps_its_partitions_after_close_until_its_session_expires(
    env: Env,
) -> None:
    async with members(env) as group:
        a = await group.join("a")
        b = await group.join("b")
        await a.until(lambda: len(a.owned) == 1 and len(b.owned) == 1)
        revoked_before = a.count("revoked")
        await group.close(b)  # no LeaveGroup: b's partition stays assigned, unserved
        assert await env.members_listed(group.group) == 2  # b is still a member
        assert len(a.owned) == 1 and a.count("revoked") == revoked_before
        env.elapse(SESSION_MS / 1000 + 1)
        await a.until(lambda: a.owned == parts_of(group.topic, 0, 1))


async def test_a_static_member_removed_by_instance_id_leaves_at_once_without_its_session(
    env: Env,
) -> None:
    """Issue 30: a survivor that saw a static member's process die has the group drop it now
    (LeaveGroup v3 by instance id) instead of after the session timeout; removing it again,
    or an instance id the group never knew, is no error."""
    async with members(env) as group:
        a = await group.join("a")
        b = await group.join("b")
        await a.until(lambda: len(a.owned) == 1 and len(b.owned) == 1)
        await group.close(b)  # a static member's process gone: no LeaveGroup of its own
        assert await env.members_listed(group.group) == 2
        await env.log.remove_members(group.group, ["b"])
        assert await env.members_listed(group.group) == 1
        await a.until(lambda: a.owned == parts_of(group.topic, 0, 1))  # no time elapsed
        await env.log.remove_members(group.group, ["b", "never-a-member"])


async def test_a_static_member_rejoining_gets_its_share_back_without_a_rebalance(
    env: Env,
) -> None:
    async with members(env) as group:
        a = await group.join("a")
        b = await group.join("b")
        await a.until(lambda: len(a.owned) == 1 and len(b.owned) == 1)
        share, revoked_before = b.owned, a.count("revoked")
        await group.close(b)
        again = await group.join("b")
        await again.until(lambda: again.owned == share)
        assert a.count("revoked") == revoked_before


@dataclass
class Tagged:
    """An assignor whose members' metadata is a tag, and whose user data lists every tag."""

    tag: bytes
    name: str = "contract-tags"

    def metadata(self) -> bytes:
        return self.tag

    def assign(self, parts: Sequence[TopicPart], members: Mapping[str, bytes]) -> dict[str, Share]:
        ids = sorted(members)
        tags = b",".join(sorted(members.values()))
        return {
            m: Share(tuple(p for p in parts if p.partition % len(ids) == i), tags)
            for i, m in enumerate(ids)
        }


async def test_the_assignor_sees_each_members_metadata_and_every_member_its_user_data(
    env: Env,
) -> None:
    async with members(env) as group:
        a = await group.join(assignor=Tagged(b"url-a"))
        b = await group.join(assignor=Tagged(b"url-b"))
        await a.until(lambda: a.last_data() == b"url-a,url-b")
        await b.until(lambda: b.last_data() == b"url-a,url-b")


async def test_a_member_rejoining_with_changed_metadata_starts_a_rebalance(
    env: Env,
) -> None:
    async with members(env) as group:
        tag = Tagged(b"url-a")
        a = await group.join(assignor=tag)
        b = await group.join(assignor=Tagged(b"url-b"))
        await b.until(lambda: b.last_data() == b"url-a,url-b")
        revoked_before = b.count("revoked")
        tag.tag = b"url-a2"
        a.tail.rejoin()
        await b.until(lambda: b.last_data() == b"url-a2,url-b")
        assert b.count("revoked") == revoked_before + 1


async def test_a_member_commits_offsets_the_group_keeps(
    env: Env,
) -> None:
    async with members(env, partitions=1) as group:
        a = await group.join()
        part = TopicPart(group.topic, 0)
        await a.until(lambda: a.owned == {part})
        async with env.log.producer() as producer:
            await producer.send(group.topic, b"x", partition=0)
        await a.tail.commit({part: 1})
        assert await a.tail.committed(part) == 1


async def test_a_commit_made_while_the_partitions_are_revoked_is_kept(
    env: Env,
) -> None:
    async with members(env, partitions=1) as group:
        a = await group.join()
        part = TopicPart(group.topic, 0)
        await a.until(lambda: a.owned == {part})
        async with env.log.producer() as producer:
            await producer.send(group.topic, b"x", partition=0)
            await producer.send(group.topic, b"y", partition=0)
        a.commit_on_revoke = {part: 2}
        b = await group.join()  # a round: a's partition is revoked first (eager)
        await a.until(lambda: a.count("revoked") >= 2 or bool(a.errors))
        await b.until(lambda: b.count("assigned") >= 1)
        assert a.errors == []
        assert await b.tail.committed(part) == 2


async def commit_then_retention_passes_it(env: Env, group: Members) -> TopicPart:
    """Ten records in the group's one partition, a member that commits offset 3 and leaves,
    then retention moving the log start to 8: past the commit."""
    part = TopicPart(group.topic, 0)
    async with env.log.producer() as producer:
        for i in range(10):
            await producer.send(group.topic, b"%d" % i, partition=0)
    first = await group.join()
    await first.until(lambda: first.owned == {part})
    await first.tail.commit({part: 3})
    await group.close(first)
    await env.log.delete_records_before(part, 8)
    return part


@pytest.mark.parametrize("reset", ["earliest", "latest"])
async def test_a_member_whose_committed_offset_retention_passed_is_reset_without_an_error(
    env: Env, reset: Reset
) -> None:
    async with members(env, partitions=1) as group:
        part = await commit_then_retention_passes_it(env, group)
        async with env.log.producer() as producer:
            later = await group.join(reset=reset)
            await later.until(lambda: later.owned == {part})
            assert await later.tail.committed(part) == 3
            if reset == "latest":
                await later.until(lambda: later.positions.get(part) == 10)
                await producer.send(group.topic, b"new", partition=0)
        expected = [8, 9] if reset == "earliest" else [10]
        await later.until(lambda: len(later.records) >= len(expected) or bool(later.errors))
        assert ([r.offset for r in later.records], later.errors) == (expected, [])


async def test_a_member_without_a_reset_policy_is_told_which_positions_retention_passed(
    env: Env,
) -> None:
    # The indexer's way: it must know what retention deleted before it counted it.
    async with members(env, partitions=1) as group:
        part = await commit_then_retention_passes_it(env, group)
        later = await group.join(reset="none")
        await later.until(lambda: bool(later.errors))
        gone = later.errors[0]
        assert isinstance(gone, OffsetOutOfRange) and gone.parts == {part}, later.errors
        assert later.records == []
        later.tail.reposition(part, 8)  # the owner repositions, and reads on from there
        later.errors.clear()
        later.task = asyncio.create_task(later.run())
        await later.until(lambda: len(later.records) >= 2 or bool(later.errors))
        assert ([r.offset for r in later.records], later.errors) == ([8, 9], [])


async def test_a_static_member_replaced_while_it_runs_is_fenced_or_made_to_rejoin(
    env: Env,
) -> None:
    async with members(env) as group:
        first = await group.join("a")
        await first.until(lambda: len(first.owned) == 2)
        first.stop_on_error = True
        revoked_before = first.count("revoked")
        second = await group.join("a")  # the same instance id while the first still runs
        await second.until(lambda: len(second.owned) == 2)
        # aiokafka 0.14 does not know FENCED_INSTANCE_ID: the first holder gets it as a bare
        # KafkaError ("UnknownError") from every poll while it fails to join again; or, when a
        # heartbeat of its is answered UNKNOWN_MEMBER_ID instead, it joins again and takes the
        # id back (the two then fence each other in turn). Either way it is not left quietly
        # holding partitions. The model takes the first way.
        await first.until(lambda: bool(first.errors) or first.count("revoked") > revoked_before)
        if env.clock is not None:
            assert first.errors, "the model fences the first holder"
        if first.errors:
            fenced = first.errors[0]
            assert (type(fenced), fenced.retriable, fenced.kind) == (LogError, True, "KafkaError")


# --- the model only: its own machinery ------------------------------------------------------


async def test_the_model_waits_on_its_clock_not_on_real_time() -> None:
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_topic("t", 1)
    async with log.tail() as tail:
        tail.assign({TopicPart("t", 0): 0})
        armed = asyncio.create_task(clock.armed())
        polling = asyncio.create_task(tail.poll(5.0))
        await armed  # the poll set its timeout and is suspended, not spinning
        assert not polling.done()
        clock.advance(5.0)
        async with asyncio.timeout(BOUND_S):
            polled = await polling
        assert polled.records == {}


async def test_the_model_wakes_a_closed_tail() -> None:
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_topic("t", 1)
    tail = log.tail()
    tail.assign({TopicPart("t", 0): 0})
    armed = asyncio.create_task(clock.armed())
    polling = asyncio.create_task(tail.poll(5.0))
    await armed
    await tail.close()
    with pytest.raises(LogError):
        async with asyncio.timeout(BOUND_S):
            await polling

"""An in-memory Kafka that honours the log port (:mod:`bridge.kafka.port`), for tests and the
simulation: no broker, no socket, and time only moves when its clock does.

It models what makes Kafka hard, as the contract suite checks against the real broker:

* transaction markers take an offset each; aborted records keep theirs and are never read;
  an open transaction holds every read_committed reader at its first offset (the LSO);
* the log start moves under readers (:meth:`MemoryLog.delete_records_before`), and a read
  below it, or past the end, raises :class:`~bridge.kafka.port.OffsetOutOfRange`, except a
  group member's, which is reset by its ``reset`` policy (aiokafka's ``auto_offset_reset``);
* a transactional writer is fenced when a newer one of its id starts (its open transaction
  aborted, its next send or commit refused);
* consumer groups as aiokafka 0.14 runs them: eager (every member revokes everything before
  each round); static members never leave on close, are replaced without a rebalance when
  their instance id rejoins, and expire at the session timeout; a member rejoining with changed
  metadata starts a round; a member whose instance id was taken over gets a plain
  :class:`~bridge.kafka.port.LogError` (aiokafka's "unexpected error" for FENCED_INSTANCE_ID).

Time comes from a :class:`Clock`: :class:`ManualClock` for deterministic runs (the caller
advances it), :class:`LoopClock` for the event loop's own time. Every wait suspends on a
future that a change of the log, the clock's timers or ``close`` resolve; a tail's poll wakes
for writes to its own topics only (with several replicas in one process, every write woke
every tail and re-read all its partitions: the simulation's largest cost).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from bridge.kafka.clients import partition_for_key
from bridge.kafka.port import (
    Assignor,
    Closable,
    Fetched,
    GroupListener,
    Header,
    LogError,
    LogRecord,
    OffsetOutOfRange,
    Polled,
    Record,
    Reset,
    Sent,
    Share,
    TopicPart,
    UnknownTopic,
    WriterFenced,
)

__all__ = ["Clock", "LoopClock", "ManualClock", "MemoryLog", "RoundRobin"]


# --- time ---------------------------------------------------------------------------------


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Seconds, and callbacks at a time: all the memory log knows of time."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer: ...


@dataclass(order=True)
class _Timer:
    when: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Virtual time: it moves only by :meth:`advance`, which runs the timers due, in order."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        self._armed = _Signal()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = _Timer(when, next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        self._armed.fire()
        return timer

    async def armed(self) -> None:
        """Return at the next timer set: a waiter is then suspended until its time."""
        await self._armed.wait()

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, running each timer due at its own time."""
        until = self._now + seconds
        while self._timers and self._timers[0].when <= until:
            timer = heapq.heappop(self._timers)
            self._now = max(self._now, timer.when)
            if not timer.cancelled:
                timer.callback()
        self._now = until

    def next_timer(self) -> float | None:
        """When the next live timer is due (a simulation jumps there), or None."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None


class LoopClock:
    """The running event loop's time and timers."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_at(when, callback)


class _Signal:
    """Wakes every waiter once per change; never left set, so no waiter spins. Waiters are
    futures, so one waiter can wait on several signals (:func:`_wait_any`)."""

    def __init__(self) -> None:
        # A dict as an ordered set: waiters wake in the order they began to wait.
        self._waiters: dict[asyncio.Future[None], None] = {}

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            _wake(waiter)

    async def wait(self) -> None:
        await _wait_any([self])


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _wait_any(
    signals: Sequence[_Signal], until: float | None = None, clock: Clock | None = None
) -> None:
    """Return at the next firing of any of ``signals`` (or at ``until`` on ``clock``)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for signal in signals:
        signal._waiters[waiter] = None
    timer = None
    if until is not None and clock is not None:
        timer = clock.call_at(until, lambda: _wake(waiter))
    try:
        await waiter
    finally:
        for signal in signals:
            signal._waiters.pop(waiter, None)
        if timer is not None:
            timer.cancel()


# --- the log ------------------------------------------------------------------------------


@dataclass
class _Txn:
    """A transaction: its state and the first offset it took in each partition."""

    state: str = "open"  # "open" | "committed" | "aborted"
    first: dict[TopicPart, int] = field(default_factory=dict)


@dataclass
class _Entry:
    record: Record | None  # None: a transaction marker
    txn: _Txn | None = None


@dataclass
class _Partition:
    start: int = 0
    entries: list[_Entry] = field(default_factory=list)
    open: list[_Txn] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The high watermark: the next offset written."""
        return self.start + len(self.entries)

    @property
    def stable(self) -> int:
        """The last stable offset: where the first open transaction began, else the end."""
        firsts = [min(t.first.values()) for t in self.open]
        return min([self.end, *firsts])

    def entry(self, offset: int) -> _Entry:
        return self.entries[offset - self.start]


def _visible(entry: _Entry) -> bool:
    return entry.record is not None and (entry.txn is None or entry.txn.state == "committed")


class MemoryLog:
    """The log port over dictionaries (see the module docstring)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else LoopClock()
        self._topics: dict[str, list[_Partition]] = {}
        self._changed = _Signal()
        #: Per topic: fired by writes to it (a tail wakes for its own topics' records only).
        self._written: dict[str, _Signal] = {}
        self._epochs: dict[str, int] = {}
        self._open_txn: dict[str, _Txn] = {}
        self._groups: dict[str, _Group] = {}
        self._round_robin = itertools.count()

    # --- topics and records -----------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` empty partitions (no-op if it exists)."""
        self._topics.setdefault(topic, [_Partition() for _ in range(partitions)])

    def _partition(self, part: TopicPart) -> _Partition:
        parts = self._topics.get(part.topic)
        if parts is None or not 0 <= part.partition < len(parts):
            raise UnknownTopic(f"no partition {part.partition} of topic {part.topic!r}")
        return parts[part.partition]

    def changed(self) -> None:
        """Wake every reader (something was written, a clock timer fired, a member moved)."""
        self._changed.fire()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def _wrote(self, topic: str) -> None:
        signal = self._written.get(topic)
        if signal is not None:
            signal.fire()

    async def _wait_for(self, topics: Iterable[str], until: float) -> None:
        """Until a change of the log as a whole, a write to one of ``topics``, or ``until``."""
        signals = [self._changed] + [self._written.setdefault(t, _Signal()) for t in topics]
        await _wait_any(signals, until, self.clock)

    def _append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: Sequence[Header],
        txn: _Txn | None,
        timestamp_ms: int | None = None,
    ) -> Sent:
        count = len(self._topics.get(topic) or [])
        if count == 0:
            raise UnknownTopic(f"no topic {topic!r}")
        if partition is None:
            partition = (
                partition_for_key(key, count)
                if key is not None
                else next(self._round_robin) % count
            )
        part = TopicPart(topic, partition)
        stored = self._partition(part)
        offset = stored.end
        ts = timestamp_ms if timestamp_ms is not None else int(self.clock.now() * 1000)
        record = Record(topic, partition, offset, key, value, ts, tuple(headers))
        stored.entries.append(_Entry(record, txn))
        if txn is not None and part not in txn.first:
            txn.first[part] = offset
            stored.open.append(txn)
        self._wrote(topic)
        return Sent(partition, offset)

    def _end_txn(self, txn: _Txn, state: str) -> None:
        """Write the commit or abort marker in every partition the transaction touched."""
        txn.state = state
        for part in txn.first:
            stored = self._partition(part)
            stored.entries.append(_Entry(None, txn))
            stored.open.remove(txn)
        for topic in sorted({part.topic for part in txn.first}):
            self._wrote(topic)

    def read(self, part: TopicPart, offset: int, max_records: int | None) -> Fetched:
        """What read_committed returns from ``offset`` (no wait)."""
        stored = self._partition(part)
        if offset < stored.start or offset > stored.end:
            raise OffsetOutOfRange([part])
        records: list[Record] = []
        at, stop = offset, stored.stable
        while at < stop and (max_records is None or len(records) < max_records):
            entry = stored.entry(at)
            if _visible(entry):
                assert entry.record is not None
                records.append(entry.record)
            at += 1
        return Fetched(records, at)

    # --- the port: reads ----------------------------------------------------------------

    async def partitions(self, topic: str) -> list[int]:
        if topic not in self._topics:
            raise UnknownTopic(f"no topic {topic!r}")
        return list(range(len(self._topics[topic])))

    async def fetch(self, part: TopicPart, offset: int, max_records: int = 500) -> Fetched:
        return self.read(part, offset, max_records)

    async def log_starts(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        return {p: self._partition(p).start for p in parts}

    async def log_ends(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        return {p: self._partition(p).stable for p in parts}

    async def offsets_for_times(
        self, times: Mapping[TopicPart, int]
    ) -> dict[TopicPart, int | None]:
        return {p: self._offset_for_time(p, ms) for p, ms in times.items()}

    def _offset_for_time(self, part: TopicPart, ms: int) -> int | None:
        stored = self._partition(part)
        for at in range(stored.start, stored.stable):
            record = stored.entry(at).record
            if record is not None and record.timestamp >= ms:
                return at
        return None

    async def delete_records_before(self, part: TopicPart, offset: int) -> None:
        stored = self._partition(part)
        if not stored.start <= offset <= stored.end:
            raise OffsetOutOfRange([part])
        del stored.entries[: offset - stored.start]
        stored.start = offset
        self.changed()

    # --- the port: clients --------------------------------------------------------------

    async def remove_members(self, group: str, instance_ids: Sequence[str]) -> None:
        coordinator = self._groups.get(group)
        if coordinator is not None:
            coordinator.remove(instance_ids)

    def tail(self, role: str = "tail") -> MemoryTail:
        return MemoryTail(self)

    def group_tail(
        self,
        group: str,
        topics: Sequence[str],
        listener: GroupListener,
        *,
        assignor: Assignor | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int | None = None,
        max_poll_interval_ms: int | None = None,
        reset: Reset = "earliest",
        role: str = "group",
    ) -> MemoryGroupTail:
        coordinator = self._groups.setdefault(group, _Group(self, group))
        return MemoryGroupTail(
            self,
            coordinator,
            list(topics),
            listener,
            assignor or RoundRobin(),
            instance_id,
            session_timeout_ms / 1000,
            reset,
        )

    def producer(self, role: str = "producer") -> MemoryProducer:
        return MemoryProducer(self)

    def transactional_writer(self, transactional_id: str) -> MemoryWriter:
        return MemoryWriter(self, transactional_id)

    # --- transactional ids --------------------------------------------------------------

    def _fence(self, transactional_id: str) -> int:
        """A new epoch for the id; the previous epoch's open transaction is aborted."""
        previous = self._open_txn.pop(transactional_id, None)
        if previous is not None and previous.state == "open":
            self._end_txn(previous, "aborted")
        epoch = self._epochs.get(transactional_id, -1) + 1
        self._epochs[transactional_id] = epoch
        return epoch

    def _check_epoch(self, transactional_id: str, epoch: int) -> None:
        if self._epochs.get(transactional_id) != epoch:
            raise WriterFenced(f"transactional id {transactional_id!r} has a newer writer")

    # --- test hooks ---------------------------------------------------------------------

    def group(self, name: str) -> _Group:
        """The coordinator of group ``name`` (for tests and the simulation to inspect)."""
        return self._groups[name]


class MemoryProducer(Closable):
    """An idempotent producer: each send lands once, at once."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
        timestamp_ms: int | None = None,
    ) -> Sent:
        return self._log._append(topic, value, key, partition, headers, None, timestamp_ms)


class MemoryWriter(Closable):
    """A fenced transactional writer."""

    def __init__(self, log: MemoryLog, transactional_id: str) -> None:
        self._log = log
        self.transactional_id = transactional_id
        self._epoch: int | None = None
        self._txn: _Txn | None = None

    async def start(self) -> None:
        self._epoch = self._log._fence(self.transactional_id)

    def _checked(self) -> int:
        if self._epoch is None:
            raise LogError("the transactional writer was not started")
        self._log._check_epoch(self.transactional_id, self._epoch)
        return self._epoch

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    def _begin(self) -> None:
        self._checked()
        if self._txn is not None:
            raise LogError("a transaction is already open")
        self._txn = _Txn()
        self._log._open_txn[self.transactional_id] = self._txn

    def _end(self, commit: bool) -> None:
        txn, self._txn = self._txn, None
        if txn is None or txn.state != "open":
            if commit:  # aborted under us by a newer writer
                raise WriterFenced(f"transactional id {self.transactional_id!r} was fenced")
            return
        if commit:
            self._checked()
        self._log._open_txn.pop(self.transactional_id, None)
        self._log._end_txn(txn, "committed" if commit else "aborted")

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
    ) -> None:
        self._checked()
        if self._txn is None:
            raise LogError("send outside a transaction")
        if self._txn.state != "open":
            raise WriterFenced(f"transactional id {self.transactional_id!r} was fenced")
        self._log._append(topic, value, key, partition, headers, self._txn)


class _Transaction:
    def __init__(self, writer: MemoryWriter) -> None:
        self._writer = writer

    async def __aenter__(self) -> None:
        self._writer._begin()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._writer._end(commit=exc is None)


# --- tails ----------------------------------------------------------------------------------


class MemoryTail(Closable):
    """A live read_committed reader of assigned partitions."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log
        self._positions: dict[TopicPart, int] = {}
        self._paused: set[TopicPart] = set()
        self._closed = False

    def assign(self, positions: Mapping[TopicPart, int]) -> None:
        self._positions = dict(positions)
        self._paused &= set(self._positions)
        self._log.changed()

    def reposition(self, part: TopicPart, offset: int) -> None:
        if part not in self._positions:
            raise LogError(f"{part} is not assigned")
        self._positions[part] = offset
        self._log.changed()

    def assignment(self) -> frozenset[TopicPart]:
        return frozenset(self._positions)

    def pause(self, *parts: TopicPart) -> None:
        self._paused.update(p for p in parts if p in self._positions)

    def resume(self, *parts: TopicPart) -> None:
        self._paused.difference_update(parts)
        self._log.changed()

    async def close(self) -> None:
        self._closed = True
        self._log.changed()

    def _check_open(self) -> None:
        if self._closed:
            raise LogError("the tail is closed")

    def _take(self, max_records: int | None) -> Polled | None:
        """What can be read now without waiting, or None if nothing moved."""
        live = sorted(p for p in self._positions if p not in self._paused)
        moved = self._check_ranges(live)
        records: dict[TopicPart, Sequence[LogRecord]] = {}
        for part in live:
            room = None if max_records is None else max_records - sum(map(len, records.values()))
            if room == 0:
                break
            fetched = self._log.read(part, self._positions[part], room)
            moved = moved or fetched.next_offset != self._positions[part]
            self._positions[part] = fetched.next_offset
            if fetched.records:
                records[part] = fetched.records
        if not moved:
            return None
        return Polled(records, {p: self._positions[p] for p in live})

    def _check_ranges(self, live: Sequence[TopicPart]) -> bool:
        """Raise :class:`OffsetOutOfRange` naming the partitions of ``live`` to seek (True
        would say that a position moved)."""
        out_of_range = [p for p in live if self._out_of_range(p)]
        if out_of_range:
            raise OffsetOutOfRange(out_of_range)
        return False

    def _out_of_range(self, part: TopicPart) -> bool:
        stored = self._log._partition(part)
        return not stored.start <= self._positions[part] <= stored.end

    async def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        deadline = self._log.clock.now() + timeout_s
        while True:
            self._check_open()
            taken = await self._step(max_records)
            if taken is not None:
                return taken
            if self._log.clock.now() >= deadline:
                live = sorted(p for p in self._positions if p not in self._paused)
                return Polled({}, {p: self._positions[p] for p in live})
            # Woken by its own topics' writes, any other change of the log, or its deadline.
            await self._log._wait_for(sorted({p.topic for p in self._positions}), deadline)

    async def _step(self, max_records: int | None) -> Polled | None:
        return self._take(max_records)


# --- consumer groups ------------------------------------------------------------------------


class RoundRobin:
    """The default assignor: the partitions dealt over the members in id order."""

    name = "roundrobin"

    def metadata(self) -> bytes:
        return b""

    def assign(self, parts: Sequence[TopicPart], members: Mapping[str, bytes]) -> dict[str, Share]:
        ids = sorted(members)
        shares: dict[str, list[TopicPart]] = {m: [] for m in ids}
        for i, part in enumerate(sorted(parts)):
            shares[ids[i % len(ids)]].append(part)
        return {m: Share(tuple(ps)) for m, ps in shares.items()}


@dataclass
class _Member:
    member_id: str
    tail: MemoryGroupTail | None  # None once its process is gone (closed static, crashed)
    instance_id: str | None
    metadata: bytes
    joined_round: int = -1
    share: Share = field(default_factory=lambda: Share(()))
    expiry: Timer | None = None


class _Group:
    """One group's coordinator: members, rounds (eager), the generation and the leader."""

    def __init__(self, log: MemoryLog, name: str) -> None:
        self._log = log
        self.name = name
        self.members: dict[str, _Member] = {}
        self.generation = 0
        #: The round being prepared (a rebalance under way), or None when stable.
        self.round: int | None = None
        self._rounds = itertools.count(1)
        self._ids = itertools.count()
        self.committed: dict[TopicPart, int] = {}
        self.topics: list[str] = []
        self.rebalances = 0

    # joining and leaving

    def join(self, tail: MemoryGroupTail) -> _Member:
        if tail.instance_id is not None:
            for member in self.members.values():
                if member.instance_id == tail.instance_id:
                    return self._replace(member, tail)
        member_id = f"{tail.instance_id or 'member'}-{next(self._ids)}"
        member = _Member(member_id, tail, tail.instance_id, tail.assignor.metadata())
        self.members[member_id] = member
        self.topics = sorted({*self.topics, *tail.topics})
        self.start_round()
        return member

    def _replace(self, old: _Member, tail: MemoryGroupTail) -> _Member:
        """A static member rejoins: a new member id takes the old one's place and, while the
        group is stable, its assignment, with no rebalance (KAFKA-12759). The broker stores the
        new metadata all the same: this member's later rejoin with that metadata is no change
        and does not rebalance either (seen on Kafka 4.1 in bench_rollout: a restarted replica
        whose rejoin claimed nothing new was handed generation N again, for good). The old
        holder, if still running, is fenced."""
        if old.tail is not None:
            old.tail.fenced = True
        if old.expiry is not None:
            old.expiry.cancel()
        del self.members[old.member_id]
        member_id = f"{tail.instance_id}-{next(self._ids)}"
        metadata = tail.assignor.metadata()
        member = _Member(member_id, tail, tail.instance_id, metadata, old.joined_round)
        member.share = old.share
        self.members[member_id] = member
        self._log.changed()
        return member

    def leave(self, member: _Member) -> None:
        """A dynamic member's LeaveGroup: gone now, and a round starts."""
        if self.members.pop(member.member_id, None) is not None:
            self.start_round()

    def remove(self, instance_ids: Iterable[str]) -> None:
        """LeaveGroup by instance id (an admin's, for members whose process is gone): each
        named static member is dropped now and a round starts; one still running finds itself
        unknown and rejoins as a new member (Kafka answers its heartbeat UNKNOWN_MEMBER_ID)."""
        named = set(instance_ids)
        removed = [m for m in self.members.values() if m.instance_id in named]
        for member in removed:
            del self.members[member.member_id]
            if member.expiry is not None:
                member.expiry.cancel()
        if not removed:
            return
        self.start_round()
        for member in removed:
            if member.tail is not None:
                member.tail.member = self.join(member.tail)

    def gone(self, member: _Member, session_timeout_s: float) -> None:
        """A static member's process stopped (or any member crashed): it stays, holding its
        partitions, until its session times out."""
        member.tail = None
        when = self._log.clock.now() + session_timeout_s
        member.expiry = self._log.clock.call_at(when, lambda: self._expire(member))

    def _expire(self, member: _Member) -> None:
        if self.members.get(member.member_id) is member and member.tail is None:
            del self.members[member.member_id]
            self.start_round()

    # rounds

    def start_round(self) -> None:
        """Every member must revoke and rejoin (eager) before anyone gets a new share."""
        if self.round is None:
            self.round = next(self._rounds)
        self._log.changed()
        self.maybe_complete()

    def rejoined(self, member: _Member, metadata: bytes) -> None:
        assert self.round is not None
        member.metadata = metadata
        member.joined_round = self.round
        self.maybe_complete()

    def maybe_complete(self) -> None:
        """Run the leader's assignor once every member has rejoined this round."""
        if self.round is None or not self.members:
            if not self.members:
                self.round = None
            return
        if any(m.joined_round != self.round for m in self.members.values()):
            return
        # The leader is a running member: a static member that rejoined this round and then
        # stopped stays a member (until its session expires) but can assign nothing.
        leader = next((m for m in self.members.values() if m.tail is not None), None)
        if leader is None or leader.tail is None:
            return
        parts = [TopicPart(t, p) for t in self.topics for p in range(self._count(t))]
        metadata = {m.member_id: m.metadata for m in self.members.values()}
        shares = leader.tail.assignor.assign(parts, metadata)
        for member in self.members.values():
            member.share = shares.get(member.member_id, Share(()))
        self.generation += 1
        self.rebalances += 1
        self.round = None
        self._log.changed()

    def _count(self, topic: str) -> int:
        return len(self._log._topics.get(topic) or [])


class MemoryGroupTail(MemoryTail):
    """A consumer group member: its partitions come from the group's rounds."""

    def __init__(
        self,
        log: MemoryLog,
        group: _Group,
        topics: list[str],
        listener: GroupListener,
        assignor: Assignor,
        instance_id: str | None,
        session_timeout_s: float,
        reset: Reset,
    ) -> None:
        super().__init__(log)
        self._group = group
        self.topics = topics
        self.listener = listener
        self.assignor = assignor
        self.instance_id = instance_id
        self.session_timeout_s = session_timeout_s
        self.reset = reset
        self.fenced = False
        self.member: _Member | None = None
        self._generation = -1  # the generation whose share this member applied

    async def start(self) -> None:
        self.member = self._group.join(self)

    def assign(self, positions: Mapping[TopicPart, int]) -> None:
        raise LogError("a group member's partitions are assigned by its group")

    def rejoin(self) -> None:
        member = self._joined()
        if self.assignor.metadata() != member.metadata:
            self._group.start_round()

    async def commit(self, offsets: Mapping[TopicPart, int]) -> None:
        member = self._joined()
        # As Kafka's coordinator: a commit of the current generation is kept while a rebalance
        # prepares (an eager consumer commits from its revoke callback, before it rejoins);
        # one of an older generation is refused. (The model has no "completing" phase: a
        # round completes at once when the last member rejoins.)
        stale = self._generation != self._group.generation
        if stale or any(p not in member.share.parts for p in offsets):
            raise LogError("commit refused: the group has rebalanced since this member's share")
        self._group.committed.update(offsets)

    async def committed(self, part: TopicPart) -> int | None:
        return self._group.committed.get(part)

    def _joined(self) -> _Member:
        self._check_open()
        if self.member is None:
            raise LogError("the group member was not started")
        return self.member

    def _check_open(self) -> None:
        super()._check_open()
        if self.fenced:
            # What aiokafka 0.14 raises for FENCED_INSTANCE_ID, unmapped: a bare KafkaError
            # (which the adapter calls retriable), from every poll while it tries to rejoin.
            raise LogError(
                f"KafkaError: UnknownError() in group {self._group.name!r} (fenced instance id)",
                retriable=True,
                kind="KafkaError",
            )

    async def close(self) -> None:
        if self._closed:
            return
        member = self.member
        if member is not None and not self.fenced and member.tail is self:
            if self.instance_id is None:
                self._group.leave(member)
            else:
                self._group.gone(member, self.session_timeout_s)
        await super().close()

    def crash(self) -> None:
        """The process died: no LeaveGroup, its session runs out (a simulation's fault)."""
        member = self.member
        self._closed = True
        if member is not None and member.tail is self:
            self._group.gone(member, self.session_timeout_s)
        self._log.changed()

    async def _step(self, max_records: int | None) -> Polled | None:
        group = self._group
        while True:
            member = self._joined()
            if group.round is not None and member.joined_round != group.round:
                await self._revoke()
                self._joined()  # fenced or closed while the listener ran
                group.rejoined(member, self.assignor.metadata())
            elif group.round is not None:
                return None  # waiting for the others to rejoin
            elif self._generation != group.generation:
                await self._apply(member)
            else:
                return self._take(max_records)

    async def _revoke(self) -> None:
        """Eager: everything held is revoked, even what the next round gives back."""
        held = frozenset(self._positions)
        self._positions, self._paused = {}, set()
        await self.listener.revoked(held)

    async def _apply(self, member: _Member) -> None:
        self._generation = self._group.generation
        # A committed offset out of range is reset at the first read (_check_ranges).
        self._positions = {
            p: self._group.committed.get(p, self._reset_offset(p)) for p in member.share.parts
        }
        await self.listener.assigned(frozenset(member.share.parts), member.share.user_data)
        self._log.changed()

    def _check_ranges(self, live: Sequence[TopicPart]) -> bool:
        """A member never sees :class:`OffsetOutOfRange`: as aiokafka's fetcher does with an
        ``auto_offset_reset``, a position out of range (a committed offset retention passed,
        a seek, a log start moved under the reader) is reset by the member's policy. True if
        one was (the poll then reports the positions, records or not)."""
        reset = [p for p in live if self._out_of_range(p)]
        if reset and self.reset == "none":
            raise OffsetOutOfRange(reset)  # as aiokafka's getmany with auto_offset_reset none
        for part in reset:
            self._positions[part] = self._reset_offset(part)
        return bool(reset)

    def _reset_offset(self, part: TopicPart) -> int:
        """Where ``reset`` puts a member without a valid position: the log start, or the
        last stable offset (a read_committed ListOffsets for the latest)."""
        stored = self._log._partition(part)
        # ``none`` with nothing committed: aiokafka would refuse to fetch until a seek; every
        # member with that policy seeks on assignment, so the log start stands in.
        return stored.stable if self.reset == "latest" else stored.start

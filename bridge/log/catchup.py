"""Shared catch-up reads: one Kafka scan of a partition range serves every read that needs it.

Where it sits: between the :class:`~bridge.log.reader.Reader`, which turns a task's records into
seq-numbered events (and owns every retention rule), and the reader's pool of Kafka consumers.
The reader asks for "the records of key K with ``start <= offset < end`` of partition P"; this
module answers from shared scans, so a reconnect storm (thousands of streams resuming at once,
after a restart) or a burst of fresh opens costs one read of the partition range instead of one
read per stream, and a fresh stream on a task created long ago no longer scans every
interleaved record of the other tasks on its own.

The design, chosen for being simple to reason about:

* **Scans per partition.** A scan reads forward from the lowest start of its members, one
  fetch at a time, and hands each member only its own records (key match, offset in its
  range), in offset order. A read joins a running scan whose position is at or below its
  start (the records it needs are still ahead), else the scan that has not started yet (which
  starts at its members' lowest start, so reads arriving in the same loop tick, or while the
  partition's scans are busy, share it), else starts one. At most ``scans_per_partition``
  scans of a partition run at once; a further one waits for a slot, gathering members.
  When every member's range starts ahead of the scan, the scan seeks there instead of reading
  what nobody needs, so a scan never reads more than its members would have read alone.
* **Bounded memory.** Each member buffers at most ``member_limit`` records and ``member_bytes``
  of record values (4 MiB; one fetch more at most): by count alone, a reader stalled on 2 KB
  events held 8 MB, and one on events of the 256 KiB limit could have held a gigabyte. A
  member that falls behind (its client reads slowly, or a long replay outruns it) leaves the
  scan at the scan's position and continues with its own reads from there, after its buffered
  records: others are never slowed down by it, and nothing is skipped or repeated.
* **Recent chunks.** The last few fetches (``recent_chunks`` and ``recent_bytes`` of record
  values in all, whatever the partition, for ``recent_s`` seconds) answer a later fetch that falls inside them: in a storm the next scan
  reads the same range again (the ones arriving while a scan runs wait for the next), and
  that costs no second Kafka read or record decode. Committed records never change; the
  reader's reads start at or above the log start it has just looked up, and it drops the
  chunks below every log start it learns (:meth:`Coalescer.forget_before`), so a read never
  gets from memory what retention has deleted before the read began.
* **Errors.** A scan's error (``OffsetOutOfRange`` when retention moved past it, a broker
  error) reaches each member after the records it already has, exactly as if the member had
  read alone: the reader's retention handling stays the one place that deals with it.

The log start offset is the other per-stream Kafka round trip of the open path:
:class:`LogStarts` coalesces the lookups (one request answers every caller waiting for it, and
is always sent after the caller asked, so each sees retention as it was when it asked).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import operator
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeAlias

from bridge.clock import SYSTEM_CLOCK, Clock
from bridge.kafka.port import LogRecord, TopicPart

__all__ = ["Coalescer", "LogStarts", "Read"]

Record: TypeAlias = LogRecord
#: Up to a chunk of committed records of a partition from an offset, and the next position.
Fetch = Callable[[TopicPart, int], Awaitable[tuple[list[Record], int]]]


_KEY = operator.attrgetter("key")
_OFFSET = operator.attrgetter("offset")
_VALUE = operator.attrgetter("value")


def _values_size(records: list[Record]) -> int:
    """The bytes of the records' values (a tombstone's None counts nothing), summed in C."""
    return sum(map(len, filter(None, map(_VALUE, records))))


class _Chunk:
    """A fetch's answer: the committed records from ``start`` up to ``position``."""

    __slots__ = ("at", "keys", "position", "records", "size", "start")

    def __init__(self, start: int, records: list[Record], position: int, at: float) -> None:
        self.start = start
        self.records = records
        self.position = position
        self.at = at
        self.size = _values_size(records)
        #: Each key's (offsets, records), built on first use: a read then picks its own
        #: records without looking at anyone else's.
        self.keys: dict[bytes | None, tuple[list[int], list[Record]]] | None = None

    def by_key(self) -> dict[bytes | None, tuple[list[int], list[Record]]]:
        """Each key's (offsets, records) in this chunk."""
        keys = self.keys
        if keys is None:
            records = self.records
            of_key = list(map(_KEY, records))
            if records and of_key.count(of_key[0]) == len(of_key):
                # One task's records only (a long task's replay): grouped in C, not per record.
                self.keys = {of_key[0]: (list(map(_OFFSET, records)), records)}
                return self.keys
            keys = self.keys = {}
            for record in records:
                entry = keys.get(record.key)
                if entry is None:
                    keys[record.key] = ([record.offset], [record])
                else:
                    entry[0].append(record.offset)
                    entry[1].append(record)
        return keys

    def of(self, key: bytes | None, start: int, end: int) -> list[Record]:
        """The records of ``key`` with ``start <= offset < end``, in offset order."""
        entry = self.by_key().get(key)
        if entry is None:
            return []
        offsets, records = entry
        return records[bisect.bisect_left(offsets, start) : bisect.bisect_left(offsets, end)]


class _Member:
    """One read: the records of ``key`` with ``start <= offset < end``, buffered for its reader."""

    __slots__ = (
        "buffered",
        "buffered_bytes",
        "chunks",
        "done",
        "end",
        "error",
        "key",
        "left_at",
        "scan",
        "start",
    )

    def __init__(self, key: bytes | None, start: int, end: int) -> None:
        self.key = key
        self.start = start
        self.end = end
        #: Each handed-out list of records with the bytes of their values.
        self.chunks: deque[tuple[list[Record], int]] = deque()
        self.buffered = 0
        self.buffered_bytes = 0
        self.done = False
        self.error: BaseException | None = None
        #: Where the member left its scan (its own reads continue from there).
        self.left_at: int | None = None
        self.scan: _Scan | None = None


class _Scan:
    """A forward read of one partition serving its members; ``position`` is None until the
    first fetch (any read may join it until then)."""

    __slots__ = ("by_key", "joined", "members", "position", "tp", "wake")

    def __init__(self, tp: TopicPart) -> None:
        self.tp = tp
        self.joined = 0
        self.position: int | None = None
        self.members: set[_Member] = set()
        self.by_key: dict[bytes | None, list[_Member]] = {}
        #: Set whenever a member gets records or ends: its reader's wake-up.
        self.wake: dict[_Member, asyncio.Event] = {}

    def add(self, member: _Member, wake: asyncio.Event) -> None:
        member.scan = self
        self.joined += 1
        self.members.add(member)
        self.by_key.setdefault(member.key, []).append(member)
        self.wake[member] = wake

    def remove(self, member: _Member) -> None:
        member.scan = None
        self.members.discard(member)
        same = self.by_key.get(member.key)
        if same is not None:
            same.remove(member)
            if not same:
                del self.by_key[member.key]
        event = self.wake.pop(member, None)
        if event is not None:
            event.set()


class Read:
    """One read's records, as :meth:`Coalescer.records` returns them: an async iterator of
    lists that leaves its scan when closed, even if it was never iterated."""

    __slots__ = ("_chunks", "_member")

    def __init__(self, member: _Member, chunks: AsyncGenerator[list[Record], None]) -> None:
        self._member = member
        self._chunks = chunks

    def __aiter__(self) -> Read:
        return self

    async def __anext__(self) -> list[Record]:
        return await anext(self._chunks)

    async def aclose(self) -> None:
        """Stop reading: leave the scan, drop what is buffered."""
        await self._chunks.aclose()
        if self._member.scan is not None:
            self._member.scan.remove(self._member)


class Coalescer:
    """Catch-up reads of many tasks served by shared forward scans of their partitions."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        scans_per_partition: int = 1,
        member_limit: int = 4000,
        member_bytes: int = 4 << 20,
        recent_chunks: int = 16,
        recent_s: float = 2.0,
        recent_bytes: int = 4 << 20,
        on_scan: Callable[[int], None] | None = None,
        on_detach: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``on_scan`` is called with the number of reads a scan served, when it ends, and
        ``on_detach`` when a read leaves its scan to read alone (metrics, given once).
        ``clock``: what ages the recent fetches (a simulation's virtual one replays exactly:
        a cache hit or miss changes the order tasks run in)."""
        self._kafka_fetch = fetch
        self._clock = clock
        #: The last fetches of any partition, oldest first: at most ``recent_chunks`` of them
        #: and ``recent_bytes`` of record values, whatever the partitions (by count alone, 16
        #: fetches of 1 MiB held 16 MB for two seconds after a long replay passed by).
        self._recent: deque[tuple[TopicPart, _Chunk]] = deque()
        self._recent_size = 0
        self.recent_chunks = recent_chunks
        self.recent_s = recent_s
        self.recent_bytes = recent_bytes
        self.scans_per_partition = scans_per_partition
        self.member_limit = member_limit
        self.member_bytes = member_bytes
        self._scans: dict[TopicPart, list[_Scan]] = {}
        self._slots: dict[TopicPart, asyncio.Semaphore] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Scans run, reads served by them, and reads that left a scan to read alone.
        self.scans = 0
        self.reads = 0
        self.detached = 0
        self.reused = 0
        self._on_scan = on_scan
        self._on_detach = on_detach

    async def close(self) -> None:
        """Stop every scan; their members get an error."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def records(self, tp: TopicPart, key: bytes | None, start: int, end: int) -> Read:
        """The records of ``key`` with ``start <= offset < end`` in offset order, one list per
        fetch that had any. The read joins a scan at once (its records are fetched while the
        caller does something else, such as looking up the log start); close it when stopping
        early (``aclosing``): it leaves its scan at once."""
        member = _Member(key, start, end)
        wake = asyncio.Event()
        if start < end:
            self._join(tp, member, wake)
        else:
            member.done = True
        return Read(member, self._deliver(tp, member, wake))

    async def _deliver(
        self, tp: TopicPart, member: _Member, wake: asyncio.Event
    ) -> AsyncGenerator[list[Record], None]:
        key, end = member.key, member.end
        try:
            while True:
                if member.chunks:
                    chunk, size = member.chunks.popleft()
                    member.buffered -= len(chunk)
                    member.buffered_bytes -= size
                    yield chunk
                    continue
                if member.error is not None:
                    raise member.error
                if member.done:
                    return
                if member.left_at is not None:
                    async for chunk in self._alone(tp, key, member.left_at, end):
                        yield chunk
                    return
                wake.clear()
                await wake.wait()
        finally:
            if member.scan is not None:
                member.scan.remove(member)

    async def _alone(
        self, tp: TopicPart, key: bytes | None, start: int, end: int
    ) -> AsyncIterator[list[Record]]:
        """A member's own reads after it left its scan."""
        offset = start
        while offset < end:
            chunk = await self._fetch(tp, offset)
            mine = chunk.of(key, offset, end)
            offset = chunk.position
            if mine:
                yield mine

    async def _fetch(self, tp: TopicPart, offset: int) -> _Chunk:
        """A chunk holding what a fetch from ``offset`` returns (its records from ``offset``
        on, up to its position): one read in the last ``recent_s`` seconds when one covers
        ``offset`` (the next scan of a storm reads the same range again), else a new fetch."""
        recent = self._recent
        now = self._clock.monotonic()
        while recent and now - recent[0][1].at > self.recent_s:
            self._recent_size -= recent.popleft()[1].size
        for at, chunk in recent:
            if at == tp and chunk.start <= offset < chunk.position:
                self.reused += 1
                # Yield as a fetch would: a scan answered from memory must not run through
                # its whole range in one go, starving its readers and everyone else.
                await asyncio.sleep(0)
                return chunk
        records, position = await self._kafka_fetch(tp, offset)
        fetched = _Chunk(offset, records, position, self._clock.monotonic())
        if position > offset:
            recent = self._recent  # forget_before may have replaced it meanwhile
            recent.append((tp, fetched))
            self._recent_size += fetched.size
            # The oldest go when full (a fetch larger than the bound is not kept at all).
            while recent and (
                len(recent) > self.recent_chunks or self._recent_size > self.recent_bytes
            ):
                self._recent_size -= recent.popleft()[1].size
        return fetched

    def forget_before(self, tp: TopicPart, log_start: int) -> None:
        """Retention moved the log start: recent chunks no longer answer for what it deleted
        (a read from below the log start must fail, as it would at the broker)."""
        if any(at == tp and c.start < log_start for at, c in self._recent):
            kept = [(at, c) for at, c in self._recent if at != tp or c.start >= log_start]
            self._recent = deque(kept)
            self._recent_size = sum(c.size for _, c in kept)

    def _join(self, tp: TopicPart, member: _Member, wake: asyncio.Event) -> None:
        scans = self._scans.setdefault(tp, [])
        waiting: _Scan | None = None
        best: _Scan | None = None
        for scan in scans:
            if scan.position is None:
                waiting = scan
            elif scan.position <= member.start and (
                best is None or best.position is None or scan.position > best.position
            ):
                best = scan
        target = best or waiting
        if target is None:
            target = _Scan(tp)
            scans.append(target)
            task = asyncio.create_task(self._run(target))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        target.add(member, wake)
        self.reads += 1

    def _drop(self, scan: _Scan) -> None:
        scans = self._scans.get(scan.tp)
        if scans is not None and scan in scans:
            scans.remove(scan)
            if not scans:
                del self._scans[scan.tp]

    async def _run(self, scan: _Scan) -> None:
        slots = self._slots.get(scan.tp)
        if slots is None:
            slots = self._slots[scan.tp] = asyncio.Semaphore(self.scans_per_partition)
        try:
            async with slots:
                while scan.members:
                    # Seek past what no member needs (every member starts further on).
                    lowest = min(m.start for m in scan.members)
                    if scan.position is None or lowest > scan.position:
                        scan.position = lowest
                    at = scan.position
                    chunk = await self._fetch(scan.tp, at)
                    # From here to the end of the iteration nothing awaits: a read joining
                    # now sees the scan's new position.
                    self._hand_out(scan, chunk, at)
                    scan.position = chunk.position
                    self._settle(scan, chunk.position)
                self._drop(scan)
        except BaseException as exc:
            self._drop(scan)
            error = exc if isinstance(exc, Exception) else RuntimeError("the reader closed")
            for member in list(scan.members):
                member.error = error
                scan.remove(member)
            if error is not exc:
                raise  # cancelled (the reader closes): the members were told
            # Otherwise the members have the error; the scan itself ends quietly.
        finally:
            self.scans += 1
            if self._on_scan is not None:
                self._on_scan(scan.joined)

    @staticmethod
    def _hand_out(scan: _Scan, chunk: _Chunk, at: int) -> None:
        """Each member's own records of this fetch (from ``at``), as one list, in offset order."""
        members_by_key = scan.by_key
        in_chunk = chunk.by_key()
        # Whichever is fewer: the members' keys, or the keys in the chunk (a storm of ten
        # thousand reads, most with no record in a given chunk).
        keys = members_by_key if len(members_by_key) <= len(in_chunk) else in_chunk
        for key in keys:
            members = members_by_key.get(key)
            if not members or key not in in_chunk:
                continue
            for member in members:
                mine = chunk.of(key, max(at, member.start), member.end)
                if mine:
                    size = _values_size(mine)
                    member.chunks.append((mine, size))
                    member.buffered += len(mine)
                    member.buffered_bytes += size
                    scan.wake[member].set()

    def _settle(self, scan: _Scan, position: int) -> None:
        """Members whose range is read are done; members too far behind read on alone."""
        for member in list(scan.members):
            if position >= member.end:
                member.done = True
                scan.remove(member)
            elif member.buffered > self.member_limit or member.buffered_bytes > self.member_bytes:
                member.left_at = position
                self.detached += 1
                scan.remove(member)
                if self._on_detach is not None:
                    self._on_detach()


class LogStarts:
    """The log start offsets of a topic's partitions, looked up in shared requests.

    :meth:`fresh` returns a value looked up after the call began (a request already in flight
    may predate the caller, so a caller arriving during one waits for the next): every caller
    sees retention as it was when it asked, exactly as with a request of its own, and any
    number of callers cost one request per round trip. (A remembered value, refreshed on
    an out-of-range fetch, was tried: a stream opened right after deleteRecords then served
    events the deletion had removed, from a consumer's buffer or a recent chunk.)
    """

    def __init__(
        self,
        lookup: Callable[[list[int]], Awaitable[dict[int, int]]],
        *,
        on_request: Callable[[], None] | None = None,
    ) -> None:
        """``on_request`` is called for each lookup request sent (metrics, given once)."""
        self._lookup = lookup
        self._next: asyncio.Future[dict[int, int]] | None = None
        self._wanted: set[int] = set()
        self._driver: asyncio.Task[None] | None = None
        #: Lookup requests sent (a storm of opens should send few).
        self.requests = 0
        self._on_request = on_request

    async def fresh(self, partition: int) -> int:
        """The log start of ``partition`` as looked up after this call began."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        future = self._next
        self._wanted.add(partition)
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive())
        starts = await asyncio.shield(future)
        return starts[partition]

    async def _drive(self) -> None:
        while self._next is not None:
            future, wanted = self._next, sorted(self._wanted)
            self._next, self._wanted = None, set()
            self.requests += 1
            if self._on_request is not None:
                self._on_request()
            try:
                starts = await self._lookup(wanted)
            except BaseException as exc:
                future.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
                future.add_done_callback(_retrieve)
                if not isinstance(exc, Exception):
                    raise
                continue
            future.set_result(starts)

    async def close(self) -> None:
        """Stop the lookups; callers waiting get an error."""
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(BaseException):
                await self._driver
        if self._next is not None and not self._next.done():
            self._next.set_exception(ConnectionError("the reader closed"))
            self._next.add_done_callback(_retrieve)
        self._next = None


def _retrieve(future: asyncio.Future[dict[int, int]]) -> None:
    """Mark a future's exception retrieved (its callers may all have gone)."""
    if not future.cancelled():
        future.exception()

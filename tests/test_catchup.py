"""Shared catch-up scans and log-start lookups as pure logic, over an in-memory partition.

The Kafka side (real records, retention moving during a scan) is in test_catchup_kafka.py; here a
list of records and a fetch function that counts its calls stand in for the consumer pool, so
the sharing itself (how many fetches, who gets what, in which order) can be asserted exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from support.waits import BOUND, wait_until

from bridge.kafka.port import OffsetOutOfRange, Record, TopicPart
from bridge.log.catchup import Coalescer, LogStarts

TP = TopicPart("events", 0)
Rec = Record


def record(offset: int, key: bytes, pad: int = 0) -> Rec:
    value = b"v%d" % offset + b"x" * pad
    return Record(TP.topic, 0, offset, key, value, 0)


class Log:
    """A partition of ``n`` records whose keys cycle over ``keys``; fetches are counted, and can
    be held (a slow broker) or made to fail below a log start (retention)."""

    def __init__(self, n: int, keys: list[bytes], chunk: int = 10, pad: int = 0) -> None:
        self.records = [record(i, keys[i % len(keys)], pad) for i in range(n)]
        self.chunk = chunk
        self.fetches: list[int] = []
        self.log_start = 0
        #: Fetches from ``hold_from`` on wait for ``gate`` (a scan frozen at a known place).
        self.hold_from = 0
        self.gate: asyncio.Event | None = None

    def hold(self, offset: int) -> asyncio.Event:
        self.hold_from, self.gate = offset, asyncio.Event()
        return self.gate

    async def fetch(self, tp: TopicPart, offset: int) -> tuple[list[Rec], int]:
        self.fetches.append(offset)
        if self.gate is not None and offset >= self.hold_from:
            await self.gate.wait()
        else:
            await asyncio.sleep(0)  # a real fetch always yields to the loop
        if offset < self.log_start:
            raise OffsetOutOfRange([tp])
        got = self.records[offset : offset + self.chunk]
        return got, offset + len(got)

    def mine(self, key: bytes, start: int, end: int) -> list[int]:
        return [r.offset for r in self.records[start:end] if r.key == key]


async def offsets(chunks: AsyncGenerator[list[Rec], None]) -> list[int]:
    async with asyncio.timeout(BOUND):
        return [r.offset async for chunk in chunks for r in chunk]


KEYS = [b"k%d" % i for i in range(20)]


async def test_concurrent_reads_share_one_scan_and_each_gets_exactly_its_records_in_order() -> None:
    log = Log(2000, KEYS)
    coalescer = Coalescer(log.fetch, scans_per_partition=1)
    ranges = [(key, i * 7, 2000 - i * 13) for i, key in enumerate(KEYS)]
    got = await asyncio.gather(*(offsets(coalescer.records(TP, *r)) for r in ranges))
    for (key, start, end), mine in zip(ranges, got, strict=True):
        assert mine == log.mine(key, start, end)
    # One forward read of the union [0, 2000): 200 fetches, not one read per key (~3,400).
    assert len(log.fetches) == 200
    assert log.fetches == sorted(log.fetches)
    assert coalescer.scans == 1


async def test_a_read_arriving_mid_scan_joins_it_when_its_range_is_still_ahead() -> None:
    log = Log(1000, KEYS)
    coalescer = Coalescer(log.fetch, scans_per_partition=1)
    gate = log.hold(100)
    first = asyncio.create_task(offsets(coalescer.records(TP, KEYS[0], 0, 1000)))
    await wait_until(lambda: log.fetches[-1:] == [100], what="the first scan is at 100")
    ahead_task = asyncio.create_task(offsets(coalescer.records(TP, KEYS[1], 500, 1000)))
    await wait_until(lambda: coalescer.reads == 2, what="the second read joined")
    gate.set()
    ahead = await ahead_task
    assert ahead == log.mine(KEYS[1], 500, 1000)
    assert await first == log.mine(KEYS[0], 0, 1000)
    assert coalescer.scans == 1 and len(log.fetches) == 100


async def test_a_read_behind_a_running_scan_gets_its_own_records_from_the_next_scan() -> None:
    log = Log(1000, KEYS)
    coalescer = Coalescer(log.fetch, scans_per_partition=1)
    gate = log.hold(700)
    first = asyncio.create_task(offsets(coalescer.records(TP, KEYS[0], 500, 1000)))
    await wait_until(lambda: log.fetches[-1:] == [700], what="the first scan is at 700")
    behind_task = asyncio.create_task(offsets(coalescer.records(TP, KEYS[1], 0, 600)))
    await wait_until(lambda: coalescer.reads == 2, what="the second read joined")
    gate.set()
    behind = await behind_task
    assert behind == log.mine(KEYS[1], 0, 600)
    assert await first == log.mine(KEYS[0], 500, 1000)
    assert coalescer.scans == 2


async def test_a_scan_seeks_over_what_none_of_its_members_needs() -> None:
    log = Log(10_000, KEYS)
    coalescer = Coalescer(log.fetch)
    low, high = await asyncio.gather(
        offsets(coalescer.records(TP, KEYS[0], 0, 30)),
        offsets(coalescer.records(TP, KEYS[1], 9_000, 9_030)),
    )
    assert low == log.mine(KEYS[0], 0, 30) and high == log.mine(KEYS[1], 9_000, 9_030)
    assert log.fetches == [0, 10, 20, 9_000, 9_010, 9_020]


async def test_a_slow_reader_leaves_the_scan_and_still_gets_everything_once() -> None:
    log = Log(3000, KEYS[:2])
    coalescer = Coalescer(log.fetch, scans_per_partition=1, member_limit=50)
    slow = coalescer.records(TP, KEYS[0], 0, 3000)
    first = await anext(slow)  # then it stops reading while the scan goes on
    fast = await offsets(coalescer.records(TP, KEYS[1], 0, 3000))
    assert fast == log.mine(KEYS[1], 0, 3000)
    assert coalescer.detached == 1  # the slow one left; the fast one was never held up
    rest = await offsets(slow)
    assert [r.offset for r in first] + rest == log.mine(KEYS[0], 0, 3000)


async def test_a_slow_reader_of_large_records_leaves_the_scan_by_their_bytes() -> None:
    # 200 records of ~1 KB waiting: far under the count limit, over the byte limit.
    log = Log(3000, KEYS[:2], pad=1000)
    coalescer = Coalescer(log.fetch, member_limit=10_000, member_bytes=100_000)
    slow = coalescer.records(TP, KEYS[0], 0, 3000)
    first = await anext(slow)
    fast = await offsets(coalescer.records(TP, KEYS[1], 0, 3000))
    assert fast == log.mine(KEYS[1], 0, 3000)
    assert coalescer.detached == 1
    rest = await offsets(slow)
    assert [r.offset for r in first] + rest == log.mine(KEYS[0], 0, 3000)


async def test_a_reader_that_stops_early_leaves_and_the_scan_ends_without_it() -> None:
    log = Log(100_000, KEYS)
    coalescer = Coalescer(log.fetch)
    chunks = coalescer.records(TP, KEYS[0], 0, 100_000)
    await anext(chunks)
    await chunks.aclose()
    await wait_until(lambda: coalescer.scans == 1, what="the abandoned scan ended")
    assert len(log.fetches) < 10


async def test_a_scan_error_reaches_each_member_after_the_records_it_already_has() -> None:
    log = Log(1000, KEYS[:2])
    gate = log.hold(300)
    coalescer = Coalescer(log.fetch)
    got: dict[bytes, list[int]] = {KEYS[0]: [], KEYS[1]: []}

    async def read(key: bytes) -> None:
        async for chunk in coalescer.records(TP, key, 0, 1000):
            got[key] += [r.offset for r in chunk]

    readers = [asyncio.create_task(read(k)) for k in KEYS[:2]]
    await wait_until(lambda: log.fetches[-1:] == [300], what="the scan is at 300")
    log.log_start = 500  # retention moves past the scan
    gate.set()
    for task in readers:
        with pytest.raises(OffsetOutOfRange):
            await task
    for key in KEYS[:2]:  # each got exactly its records before the scan's failed fetch
        assert got[key] == log.mine(key, 0, 300)


async def test_a_later_scan_of_a_recent_range_reads_nothing_from_kafka_again() -> None:
    log = Log(1000, KEYS)
    coalescer = Coalescer(log.fetch, recent_chunks=100)
    assert await offsets(coalescer.records(TP, KEYS[0], 0, 1000)) == log.mine(KEYS[0], 0, 1000)
    assert len(log.fetches) == 100
    # a later read from inside a chunk: the chunk's records from there on
    assert await offsets(coalescer.records(TP, KEYS[3], 5, 1000)) == log.mine(KEYS[3], 5, 1000)
    assert len(log.fetches) == 100 and coalescer.scans == 2
    # retention learnt by the reader: what it deleted is not served from memory either
    log.log_start = 505
    coalescer.forget_before(TP, 505)
    with pytest.raises(OffsetOutOfRange):
        await offsets(coalescer.records(TP, KEYS[3], 0, 1000))
    assert await offsets(coalescer.records(TP, KEYS[5], 505, 1000)) == log.mine(KEYS[5], 505, 1000)


async def test_recent_chunks_hold_at_most_their_bytes_of_record_values() -> None:
    # 100 fetches of ten ~1 KB records (10,040 B each): 51 KB keeps the last five, not 100.
    log = Log(1000, KEYS, pad=1000)
    coalescer = Coalescer(log.fetch, recent_chunks=100, recent_bytes=51_000)
    assert await offsets(coalescer.records(TP, KEYS[0], 0, 1000)) == log.mine(KEYS[0], 0, 1000)
    assert len(log.fetches) == 100
    kept = coalescer._recent
    assert [chunk.start for _, chunk in kept] == [950, 960, 970, 980, 990]
    assert coalescer._recent_size == sum(chunk.size for _, chunk in kept) <= 51_000
    # the last five answer from memory; what went before them is fetched again
    assert await offsets(coalescer.records(TP, KEYS[1], 955, 1000)) == log.mine(KEYS[1], 955, 1000)
    assert len(log.fetches) == 100
    assert await offsets(coalescer.records(TP, KEYS[2], 900, 950)) == log.mine(KEYS[2], 900, 950)
    assert len(log.fetches) == 105


async def test_concurrent_fresh_log_start_lookups_share_requests_and_see_the_present() -> None:
    start = {"value": 10}
    calls: list[list[int]] = []
    release = asyncio.Event()

    async def lookup(partitions: list[int]) -> dict[int, int]:
        calls.append(partitions)
        seen = start["value"]
        await release.wait()
        return dict.fromkeys(partitions, seen)

    starts = LogStarts(lookup)
    early = [asyncio.create_task(starts.fresh(0)) for _ in range(100)]
    await wait_until(lambda: len(calls) == 1, what="the first lookup is in flight")
    start["value"] = 20  # retention moves while the first request is out
    late = [asyncio.create_task(starts.fresh(0)) for _ in range(100)]
    release.set()
    async with asyncio.timeout(BOUND):
        assert set(await asyncio.gather(*early)) == {10}
        # A caller that came after the first request went out never gets its older answer.
        assert set(await asyncio.gather(*late)) == {20}
    assert calls == [[0], [0]]

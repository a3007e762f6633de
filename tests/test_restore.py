"""The one compacted-topic restore (bridge.log.restore), on the in-memory log."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from bridge.kafka.memory import ManualClock, MemoryLog
from bridge.kafka.port import LogRecord, TopicPart
from bridge.log.restore import latest_by_key, read_to_end


async def _log() -> MemoryLog:
    log = MemoryLog(ManualClock())
    log.create_topic("state", 3)
    async with log.producer() as producer:
        await producer.send("state", b"a1", key=b"a", partition=0)
        await producer.send("state", b"b1", key=b"b", partition=0)
        await producer.send("state", None, key=b"a", partition=0)
        await producer.send("state", b"keyless", partition=1)
        await producer.send("state", b"c1", key=b"c", partition=1)
    async with log.transactional_writer("w") as writer:
        with contextlib.suppress(RuntimeError):
            async with writer.transaction():
                await writer.send("state", b"aborted", key=b"c", partition=1)
                raise RuntimeError("abort it")
        async with writer.transaction():
            await writer.send("state", b"b2", key=b"b", partition=0)
    return log


async def test_a_restore_reads_every_committed_record_in_order_and_no_aborted_one() -> None:
    log = await _log()
    seen: list[LogRecord] = []
    parts = [TopicPart("state", p) for p in range(3)]
    await read_to_end(log, parts, seen.append)
    by_part = {p: [(r.offset, r.value) for r in seen if r.partition == p] for p in range(3)}
    assert by_part == {
        0: [(0, b"a1"), (1, b"b1"), (2, None), (3, b"b2")],
        1: [(0, b"keyless"), (1, b"c1")],
        2: [],
    }


async def test_latest_by_key_keeps_what_compaction_keeps_tombstones_included() -> None:
    log = await _log()
    latest = await latest_by_key(log, "state", [0, 1, 2])
    assert latest == {(0, b"a"): None, (0, b"b"): b"b2", (1, b"c"): b"c1"}


async def test_a_restore_starts_at_the_log_start() -> None:
    log = await _log()
    await log.delete_records_before(TopicPart("state", 0), 2)
    latest = await latest_by_key(log, "state", [0])
    assert latest == {(0, b"a"): None, (0, b"b"): b"b2"}


class WrittenAfterTheCut(MemoryLog):
    """A log written to right after a restore took its cut (before it reads a record)."""

    late = 0

    async def log_ends(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        ends = await super().log_ends(parts)
        async with self.producer() as producer:
            await producer.send("state", b"late", key=b"a", partition=0)
        self.late += 1
        return ends


async def test_a_restore_hands_on_nothing_written_after_its_cut() -> None:
    log = WrittenAfterTheCut(ManualClock())
    log.create_topic("state", 1)
    async with log.producer() as producer:
        await producer.send("state", b"a1", key=b"a", partition=0)
    seen: list[LogRecord] = []
    await read_to_end(log, [TopicPart("state", 0)], seen.append)
    assert [(r.offset, r.value) for r in seen] == [(0, b"a1")]
    assert log.late == 1  # a record at offset 1, past the cut (1), was there to be read

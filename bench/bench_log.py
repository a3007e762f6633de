"""Benchmarks of the event log core (bridge.log) on a real Kafka broker.

Run::

    .venv/bin/python bench/bench_log.py            # full size (~1.1M records), a few minutes
    .venv/bin/python bench/bench_log.py --small    # 1/10 size, well under a minute
    .venv/bin/python bench/bench_log.py --scale 0.5 --repeat 3 --json out.json
    .venv/bin/python bench/bench_log.py --only resume --listeners   # the tail with listeners

The broker comes from ``bridgedev.kafka.provide_broker``: the cluster named by
``BRIDGE_KAFKA__BOOTSTRAP_SERVERS`` / ``KAFKA_BOOTSTRAP_SERVERS`` if set, else Docker, else a
throwaway local broker from the Maven jars. Every run uses fresh topic prefixes with one events
partition, so nothing is shared with other runs or with the tests.

What is measured (see docs/benchmarks.md):

1. ``resume``  — time to the first event of ``Reader.read(task, after=N/2)`` for a task of N
   events interleaved among 10·N other records, against a naive read_committed scan from the
   task's first offset; plus the indexer's catch-up throughput over the whole partition.
2. ``memory``  — persisted index record bytes per task / per checkpoint, and in-memory bytes
   per task / per checkpoint of ``PartitionIndex`` (tracemalloc, no Kafka).
3. ``restore`` — ``load_index`` and ``Indexer.start()`` restore time of a persisted index of
   100k tasks.

A MISS is reported, never raised: the run always prints the whole table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import cast

from aiokafka.structs import TopicPartition
from common import (
    Record,
    Results,
    bench_settings,
    end_offset,
    environment,
    produce,
    report,
    say,
    verdict,
    within,
)

from bridge.config import Settings, load_settings
from bridge.kafka.clients import committed_consumer
from bridge.kafka.topics import create_layout
from bridge.log.indexer import IndexedEvent, Indexer, load_index, topic_partitions
from bridge.log.publisher import TaskEventPublisher
from bridge.log.reader import Reader, ReadEvent
from bridge.log.seqindex import PartitionIndex, decode_index_record, task_key
from bridgedev.kafka import provide_broker

# --- targets ------------------------------------------------------------------------------------

TARGET_RESUME_RATIO = 100.0  # naive scan time / indexed resume time
TARGET_BYTES_PER_TASK = 256
TARGET_BYTES_PER_CHECKPOINT = 16
TARGET_RESTORE_S = 5.0

#: Producer batch size: below the events topic's max.message.bytes (tasks.max_event_bytes + overhead).


# --- results ------------------------------------------------------------------------------------


def sized_verdict(ok: bool, args: argparse.Namespace) -> str:
    """Verdict of a target stated for the full size (1.1M records, 100k tasks)."""
    return verdict(ok) if args.scale == 1.0 else f"({verdict(ok)} - target is for --scale 1)"


# --- Kafka helpers -------------------------------------------------------------------------------


async def build_index(indexer: Indexer, bound_s: float) -> float:
    """Start ``indexer`` and wait until it has applied everything; returns seconds."""
    started = time.perf_counter()
    await indexer.start()
    async with within(bound_s, "the indexer applied every record"):
        await indexer.catch_up()
    return time.perf_counter() - started


def encoded_values(settings: Settings, n: int = 16) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """A few small, distinct Avro-encoded events (``encode`` needs no started producer)."""
    pub = TaskEventPublisher(settings)
    return [pub.encode("com.example.bench.step", {"i": i}) for i in range(n)]


# --- 1. resume in the middle of a long task -------------------------------------------------------


async def bench_resume(bootstrap: str, args: argparse.Namespace, res: Results) -> None:
    settings = bench_settings(bootstrap, "resume")
    await create_layout(settings)
    n_target = max(1000, int(100_000 * args.scale))
    per_target = 10  # other records after each record of the target task
    n_other = n_target * per_target
    n_other_tasks = max(100, int(10_000 * args.scale))
    after = n_target // 2
    total = n_target + n_other
    target = uuid.uuid4().hex
    others = [uuid.uuid4().hex.encode() for _ in range(n_other_tasks)]
    values = encoded_values(settings)
    target_key = target.encode()

    def records() -> Iterator[Record]:
        j = 0
        for i in range(n_target):
            value, headers = values[i % len(values)]
            yield target_key, value, headers
            for _ in range(per_target):
                value, headers = values[j % len(values)]
                yield others[j % n_other_tasks], value, headers
                j += 1

    say(
        f"resume: producing {total:,} records ({n_target:,} of the target task, {n_other:,} of "
        f"{n_other_tasks:,} other tasks, interleaved 1:{per_target}) to {settings.topics.events}"
    )
    produce_s = await produce(settings, records(), total)
    res.add("resume", "produce (raw aiokafka, acks=1)", total / produce_s, "records/s")
    end = await end_offset(settings)
    if end != total:
        res.note(f"resume: events partition end offset {end} != {total} records produced")

    indexer = Indexer(settings)
    reader = Reader(settings, indexer)
    naive = committed_consumer(settings, role="bench-naive")
    try:
        say("resume: indexing the partition with an in-process Indexer")
        index_s = await build_index(indexer, bound_s=max(300.0, 900 * args.scale))
        res.add(
            "resume",
            f"indexer catch-up over {total:,} records",
            total / index_s,
            "records/s",
            target="",
        )
        res.add("resume", "indexer catch-up time", index_s, "s")
        if args.listeners:
            await bench_tail_listeners(settings, total, args, res)
        found = indexer.lookup(target)
        assert found is not None, "target task not indexed"
        partition, entry = found
        if entry.next_seq != n_target:
            res.note(f"resume: target next_seq {entry.next_seq} != {n_target}")
        first_offset = entry.first_offset
        cp_seq, cp_offset = entry.checkpoint_at_or_before(after + 1) or (0, first_offset)
        tp = TopicPartition(settings.topics.events, partition)

        async def indexed_resume() -> tuple[float, int, int, int]:
            scanned = reader.records_scanned
            started = time.perf_counter()
            events = cast(AsyncGenerator[ReadEvent, None], reader.read(target, after=after))
            try:
                event = await anext(events)
            finally:
                elapsed = time.perf_counter() - started
                await events.aclose()
            return elapsed, event.seq, event.offset, reader.records_scanned - scanned

        async def naive_scan() -> tuple[float, int, int, int]:
            started = time.perf_counter()
            naive.assign([tp])
            naive.seek(tp, first_offset)
            seq, scanned = -1, 0
            while True:
                batches = await naive.getmany(tp, timeout_ms=1000)
                for record in batches.get(tp, []):
                    scanned += 1
                    if record.key == target_key:
                        seq += 1
                        if seq == after + 1:
                            return time.perf_counter() - started, seq, record.offset, scanned

        # Warm both paths (consumer connection, metadata) so that only the read itself is timed.
        await naive.start()
        warm = cast(AsyncGenerator[ReadEvent, None], reader.read(others[0].decode(), after=0))
        with contextlib.suppress(StopAsyncIteration):
            await anext(warm)
        await warm.aclose()

        bound = max(120.0, 600 * args.scale)
        indexed: list[float] = []
        scans: list[float] = []
        for rep in range(args.repeat):
            async with within(bound, "an indexed resume read to its end"):
                r_s, r_seq, r_off, r_scanned = await indexed_resume()
                n_s, n_seq, n_off, n_scanned = await naive_scan()
            indexed.append(r_s)
            scans.append(n_s)
            say(
                f"  rep {rep + 1}: indexed {r_s * 1000:.1f} ms ({r_scanned:,} records examined), "
                f"naive {n_s:.2f} s ({n_scanned:,} records examined)"
            )
            if (r_seq, r_off) != (n_seq, n_off):
                res.note(
                    f"resume: MISMATCH: reader gave seq {r_seq} at offset {r_off}, naive scan "
                    f"seq {n_seq} at offset {n_off}"
                )
        r_med, n_med = statistics.median(indexed), statistics.median(scans)
        ratio = n_med / r_med
        res.add(
            "resume",
            f"indexed read(after={after:,}) to 1st event, median of {args.repeat} "
            f"(min {min(indexed) * 1000:.1f}, max {max(indexed) * 1000:.1f})",
            r_med * 1000,
            "ms",
        )
        res.add(
            "resume",
            f"  records examined by the reader (checkpoint seq {cp_seq:,} @ offset {cp_offset:,})",
            r_scanned,
            "records",
        )
        res.add(
            "resume",
            f"naive scan to seq {after + 1:,}, median of {args.repeat} "
            f"(min {min(scans):.2f}, max {max(scans):.2f})",
            n_med,
            "s",
        )
        res.add("resume", "  records examined by the naive scan", n_scanned, "records")
        res.add(
            "resume",
            "speed-up naive / indexed",
            ratio,
            "x",
            target=f">= {TARGET_RESUME_RATIO:.0f}x",
            status=sized_verdict(ratio >= TARGET_RESUME_RATIO, args),
        )
        if (r_seq, r_off) == (n_seq, n_off):
            res.note(
                f"resume: reader and naive scan agree: seq {r_seq} is at offset {r_off:,} "
                f"(task's first offset {first_offset:,}, partition end {end:,})"
            )
    finally:
        await reader.close()
        with contextlib.suppress(Exception):
            await naive.stop()
        await indexer.stop()


async def bench_tail_listeners(
    settings: Settings, total: int, args: argparse.Namespace, res: Results
) -> None:
    """Catch-up again with a listener on every event, as a serving replica has.

    The tail decodes only the bridge's own created and status records; a listener that asks
    ``has_type`` for those stays on that path, one that reads ``event.type`` decodes every event.
    """
    own = settings.own_types
    seen: list[object] = []  # a listener's answer goes somewhere, as in a real one

    def asks_own_types(indexed: IndexedEvent) -> None:
        seen.append(indexed.has_type(own.created) or indexed.has_type(own.status))

    def reads_the_type(indexed: IndexedEvent) -> None:
        seen.append(indexed.event.type)

    listeners: dict[str, Callable[[IndexedEvent], None]] = {
        "has_type(created/status)": asks_own_types,
        "event.type (decodes all)": reads_the_type,
    }
    for name, listener in listeners.items():
        indexer = Indexer(settings)
        indexer.add_listener(listener)
        try:
            index_s = await build_index(indexer, bound_s=max(300.0, 900 * args.scale))
        finally:
            await indexer.stop()
        res.add("resume", f"  same, a listener reading {name}", total / index_s, "records/s")
        seen.clear()


# --- 2. index bytes per task and per checkpoint ------------------------------------------------------


def _traced_now() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def bench_memory(args: argparse.Namespace, res: Results) -> None:
    k = load_settings().tasks.checkpoint_interval

    # (a) persisted index record: key + value of TaskEntry.encode
    task_id = uuid.uuid4().hex
    sizes = {}
    for n_cps in (1, 11, 101):
        idx = PartitionIndex(0, k)
        for off in range((n_cps - 1) * k + 1):
            idx.apply(task_id, off, created=off == 0)
        entry = idx.get(task_id)
        assert entry is not None and len(entry.checkpoints) == 2 * n_cps
        sizes[n_cps] = len(task_key(task_id)) + len(entry.encode(0))
    per_task = sizes[1]
    per_cp = (sizes[101] - sizes[1]) / 100
    res.add(
        "memory",
        "persisted record per task (32-hex id, seq-0 checkpoint only)",
        per_task,
        "B",
        target=f"<= {TARGET_BYTES_PER_TASK} B",
        status=verdict(per_task <= TARGET_BYTES_PER_TASK),
    )
    res.add(
        "memory",
        "persisted record, task with 11 / 101 checkpoints",
        f"{sizes[11]} / {sizes[101]}",
        "B",
    )
    res.add(
        "memory",
        "persisted bytes per extra checkpoint",
        per_cp,
        "B",
        target=f"<= {TARGET_BYTES_PER_CHECKPOINT} B",
        status=verdict(per_cp <= TARGET_BYTES_PER_CHECKPOINT),
    )

    # (b) in memory: 100k tasks of 3 events each (task.created first), interleaved in rounds,
    # as a read-only replica holds them (a persisting one also keeps the ids changed since its
    # last flush, which the flush empties).
    n_tasks = max(10_000, int(100_000 * args.scale))
    gc.collect()
    tracemalloc.start()
    try:
        base = _traced_now()
        idx = PartitionIndex(0, k, track_dirty=False)
        ids = [uuid.uuid4().hex for _ in range(n_tasks)]
        offset = 0
        for round_ in range(3):
            for t in ids:
                idx.apply(t, offset, created=round_ == 0)
                offset += 1
        del ids, t
        steady = _traced_now() - base
    finally:
        tracemalloc.stop()
    assert len(idx) == n_tasks
    per_task_mem = steady / n_tasks
    res.add(
        "memory",
        f"in-memory per task, {n_tasks:,} tasks x 3 events (id, dict slot, columns)",
        per_task_mem,
        "B",
        target=f"<= {TARGET_BYTES_PER_TASK} B",
        status=verdict(per_task_mem <= TARGET_BYTES_PER_TASK),
    )
    res.add("memory", "  breakdown (sys.getsizeof, one task)", memory_breakdown(k), "")

    # (b') in memory per checkpoint: one task with many events
    n_cps = max(2_000, int(20_000 * args.scale))
    idx = PartitionIndex(0, k)
    big = uuid.uuid4().hex
    idx.apply(big, 0, created=True)
    gc.collect()
    tracemalloc.start()
    try:
        base = _traced_now()
        for off in range(1, n_cps * k + 1):
            idx.apply(big, off)
        grown = _traced_now() - base
    finally:
        tracemalloc.stop()
    big_entry = idx.get(big)
    assert big_entry is not None
    added = len(big_entry.checkpoints) // 2 - 1
    per_cp_mem = grown / added
    # The same entry as load_index decodes it (array.frombytes also over-allocates by 1/16).
    key, value = task_key(big), big_entry.encode(0)
    small = PartitionIndex(0, k)
    small.apply(big, 0, created=True)
    small_value = small.encode_task(big)
    gc.collect()
    tracemalloc.start()
    try:
        base = _traced_now()
        rec_big = decode_index_record(key, value)
        rec_small = decode_index_record(key, small_value)
        base = _traced_now()
        holder_big = PartitionIndex(0, k, track_dirty=False)
        holder_big.restore_task(big, rec_big.entry)  # type: ignore[union-attr]
        big_bytes = _traced_now() - base
        holder_small = PartitionIndex(0, k, track_dirty=False)
        holder_small.restore_task(big, rec_small.entry)  # type: ignore[union-attr]
        small_bytes = _traced_now() - base - big_bytes
        del holder_big, holder_small, rec_big, rec_small
    finally:
        tracemalloc.stop()
    per_cp_restored = (big_bytes - small_bytes) / added
    res.add(
        "memory",
        f"in-memory per checkpoint while growing ({added:,} checkpoints; array growth slack)",
        per_cp_mem,
        "B",
        target=f"<= {TARGET_BYTES_PER_CHECKPOINT} B",
        status="(info)",  # array growth slack; restored entries are exact
    )
    res.add(
        "memory",
        "in-memory per checkpoint as restored by the indexer (steady state)",
        per_cp_restored,
        "B",
        target=f"<= {TARGET_BYTES_PER_CHECKPOINT} B",
        status=verdict(per_cp_restored <= TARGET_BYTES_PER_CHECKPOINT + 0.05),
    )


def memory_breakdown(k: int) -> str:
    """Where one small task's bytes go (CPython object sizes, before allocator rounding)."""
    t = uuid.uuid4().hex
    parts = {
        "id str": sys.getsizeof(t),
        "row int": sys.getsizeof(100_000),
        # seven array("q") and two array("Q") cells (the 128-bit owner), status and flags bytes
        "columns": 9 * 8 + 2,
    }
    return ", ".join(f"{name} {size}" for name, size in parts.items()) + " B, + dict slot"


# --- 3. restore time of a persisted index of 100k tasks --------------------------------------------------


async def bench_restore(bootstrap: str, args: argparse.Namespace, res: Results) -> None:
    settings = bench_settings(bootstrap, "restore")
    await create_layout(settings)
    n_tasks = max(10_000, int(100_000 * args.scale))
    per_task = 2
    total = n_tasks * per_task
    ids = [uuid.uuid4().hex.encode() for _ in range(n_tasks)]
    values = encoded_values(settings)

    def records() -> Iterator[Record]:
        j = 0
        for _ in range(per_task):
            for key in ids:
                value, headers = values[j % len(values)]
                j += 1
                yield key, value, headers

    say(f"restore: producing {total:,} records ({n_tasks:,} tasks x {per_task} events)")
    await produce(settings, records(), total)

    # A persisting indexer whose periodic flush never fires: one explicit flush writes one index
    # record per task (plus the partition marker) in one transaction.
    writer = Indexer(settings, persist=True, flush_interval_s=3600.0)
    try:
        index_s = await build_index(writer, bound_s=max(300.0, 600 * args.scale))
        res.add(
            "restore",
            f"persisting indexer catch-up over {total:,} records",
            total / index_s,
            "records/s",
        )
        started = time.perf_counter()
        async with within(max(300.0, 600 * args.scale), "the index flushed"):
            written = await writer.flush()
        flush_s = time.perf_counter() - started
        res.add("restore", f"flush of {written:,} index records (one transaction)", flush_s, "s")
    finally:
        await writer.stop()

    partitions = await topic_partitions(settings, settings.topics.events)
    loads: list[float] = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        async with within(max(120.0, 300 * args.scale), "the index restored"):
            index = await load_index(settings, partitions)
        loads.append(time.perf_counter() - started)
        restored = sum(len(p) for p in index.values())
        del index
        if restored != n_tasks:
            res.note(f"restore: load_index restored {restored} tasks, expected {n_tasks}")
    load_med = statistics.median(loads)
    res.add(
        "restore",
        f"load_index, {n_tasks:,} tasks, median of {args.repeat} "
        f"(min {min(loads):.2f}, max {max(loads):.2f})",
        load_med,
        "s",
        target=f"<= {TARGET_RESTORE_S:.0f} s",
        status=sized_verdict(load_med <= TARGET_RESTORE_S, args),
    )

    starts: list[float] = []
    restores: list[float] = []
    for _ in range(args.repeat):
        reader_indexer = Indexer(settings)
        started = time.perf_counter()
        try:
            await reader_indexer.start()
            async with within(120.0, "the reader's indexer caught up"):
                await reader_indexer.catch_up()
            starts.append(time.perf_counter() - started)
            restores.append(reader_indexer.restore_seconds)
            restored = sum(len(p) for p in reader_indexer.partitions.values())
            if restored != n_tasks:
                res.note(f"restore: Indexer.start restored {restored} tasks, expected {n_tasks}")
        finally:
            await reader_indexer.stop()
    res.add(
        "restore",
        f"Indexer.start() restore_seconds, median of {args.repeat}",
        statistics.median(restores),
        "s",
        target=f"<= {TARGET_RESTORE_S:.0f} s",
        status=sized_verdict(statistics.median(restores) <= TARGET_RESTORE_S, args),
    )
    res.add(
        "restore",
        "  Indexer.start() + catch_up() wall time, median",
        statistics.median(starts),
        "s",
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="size factor (1.0 = full size: 1.1M records)"
    )
    parser.add_argument("--small", action="store_true", help="quick run: same as --scale 0.1")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of timed reads")
    parser.add_argument(
        "--only",
        choices=("resume", "memory", "restore"),
        action="append",
        help="run only these benchmarks (repeatable)",
    )
    parser.add_argument(
        "--listeners",
        action="store_true",
        help="resume: also time the catch-up with a listener on every event (as a replica has)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.small:
        args.scale = 0.1
    if args.scale <= 0 or args.repeat < 1:
        parser.error("--scale must be > 0 and --repeat >= 1")
    return args


async def run(bootstrap: str, args: argparse.Namespace, res: Results) -> None:
    only = set(args.only or ("resume", "memory", "restore"))
    if "resume" in only:
        await bench_resume(bootstrap, args, res)
    if "memory" in only:
        bench_memory(args, res)
    if "restore" in only:
        await bench_restore(bootstrap, args, res)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = Results()
    wall = time.perf_counter()
    settings = load_settings()
    with provide_broker(settings, progress=say) as broker:
        res.environment = environment(broker, settings)
        res.environment.update(
            scale=args.scale,
            repeat=args.repeat,
            checkpoint_interval=settings.tasks.checkpoint_interval,
        )
        say(f"broker: {broker.info.provider} at {broker.info.bootstrap_servers}")
        asyncio.run(run(broker.info.bootstrap_servers, args, res))
    env = res.environment
    env["wall_seconds"] = round(time.perf_counter() - wall, 1)
    report(
        res,
        f"bench_log.py  scale={env['scale']}  repeat={env['repeat']}",
        f"checkpoint_interval={env['checkpoint_interval']}  wall time {env['wall_seconds']} s",
        json_path=args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

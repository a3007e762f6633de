"""``bridge verify``: re-derive seq from the retained log and compare with the persisted index.

For every events partition, the retained records below the persisted ``through`` offset are
read again from the log start, and each task's retained offsets are checked against its
persisted entry: the last offset, the count (``next_seq`` minus the records retention already
deleted must equal the records still there), and every checkpoint whose offset is still
retained must sit at exactly that seq. When nothing was deleted this is a full recount,
status fold included.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log, LogRecord, TopicPart
from bridge.log.identity import is_signed, load_keyring
from bridge.log.indexrestore import load_index, topic_partitions
from bridge.log.records import RecordDecoder, task_id_of
from bridge.log.restore import read_to_end
from bridge.log.seqindex import FLAG_OWNER_PREFIX, PartitionIndex, TaskEntry, owner_prefix
from bridge.log.seqtail import out_of_place

__all__ = ["VerifyReport", "verify_index"]


@dataclass
class VerifyReport:
    partitions: int = 0
    tasks_checked: int = 0
    records_read: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


async def verify_index(
    settings: Settings, progress: Callable[[str], None] | None = None
) -> VerifyReport:
    """Compare the persisted index with a recount of the retained log."""
    say = progress or (lambda _msg: None)
    report = VerifyReport()
    kafka = KafkaLog(settings, pool_size=1)
    try:
        parts = await topic_partitions(settings, settings.topics.events)
        persisted = await load_index(settings, parts, log=kafka)
        report.partitions = len(parts)
        for p in parts:
            part = TopicPart(settings.topics.events, p)
            say(f"partition {p}: recounting up to offset {persisted[p].through}")
            await _verify_partition(settings, kafka, part, persisted[p], report, len(parts))
    finally:
        await kafka.close()
    return report


def _as_persisted(recounted: TaskEntry | None, persisted: TaskEntry) -> TaskEntry | None:
    """The recount as an index of 8fd441c holds it: an entry persisted then keeps only the
    first 64 bits of its owner (FLAG_OWNER_PREFIX), the log has all 128."""
    if recounted is not None and persisted.flags & FLAG_OWNER_PREFIX and recounted.owner:
        recounted.owner = owner_prefix(recounted.owner) << 64
        recounted.flags |= FLAG_OWNER_PREFIX
    return recounted


async def _verify_partition(
    settings: Settings,
    log: Log,
    tp: TopicPart,
    persisted: PartitionIndex,
    report: VerifyReport,
    partitions: int,
) -> None:
    log_start = (await log.log_starts([tp]))[tp]
    through = persisted.through
    offsets: dict[str, list[int]] = defaultdict(list)
    recount = PartitionIndex(
        tp.partition,
        settings.tasks.checkpoint_interval,
        track_dirty=False,
        unsigned_below=persisted.unsigned_below,
    )
    # A partition still in 8fd441c's format (its marker, or an upgrade from 0.1 under way)
    # honours unsigned records as 8fd441c does (PartitionIndex.legacy).
    recount.legacy = persisted.marker_version in (1, 2)
    # The tail's own decoder and keyring: the same facts, decoding only the bridge's own types.
    decoder = RecordDecoder(
        settings.tasks.event_type_prefix, settings.tasks.max_event_bytes, settings.type_rule
    )
    keyring = load_keyring(settings)

    def count(record: LogRecord) -> None:
        if record.offset >= through:
            return
        report.records_read += 1
        task_id = task_id_of(record)
        if task_id is None:
            return
        offsets[task_id].append(record.offset)
        (created, status, identity), event = decoder.facts(record)
        if created and out_of_place(task_id, record, partitions, recount, identity):
            identity = None  # a copy defines nothing (as in the indexer)
        signed = created and is_signed(keyring, task_id, event, identity, record.headers)
        recount.apply(
            task_id,
            record.offset,
            created=created,
            status=status,
            identity=identity,
            signed=signed,
        )

    await read_to_end(log, [tp], count, role="verify")
    full = log_start == 0 and persisted.lost_before < 0
    where = f"partition {tp.partition}"
    for task_id in offsets.keys() - persisted.rows.keys():
        report.mismatches.append(f"{where}: task {task_id!r} has records but no index entry")
    for task_id, entry in persisted.items():
        report.tasks_checked += 1
        retained = offsets.get(task_id, [])
        if not retained:
            if entry.last_offset >= log_start:
                report.mismatches.append(
                    f"{where}: task {task_id!r} indexed up to {entry.last_offset}, but none of its records is in the log"
                )
            continue
        first_seq = entry.next_seq - len(retained)
        problems = []
        if entry.last_offset != retained[-1]:
            problems.append(f"last offset {entry.last_offset} != {retained[-1]}")
        if first_seq < 0:
            problems.append(f"next_seq {entry.next_seq} < {len(retained)} retained records")
        position = {off: first_seq + i for i, off in enumerate(retained)}
        for seq, off in entry.checkpoint_pairs():
            if off >= log_start and position.get(off) != seq:
                problems.append(
                    f"checkpoint ({seq}, {off}) but the log says seq {position.get(off)}"
                )
        recounted = _as_persisted(recount.get(task_id), entry)
        if full and not problems and recounted != entry:
            problems.append(f"recount {recounted!r} != persisted {entry!r}")
        report.mismatches.extend(f"{where}: task {task_id!r}: {p}" for p in problems)

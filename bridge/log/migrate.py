"""``bridge index migrate``: rewrite an index written before the co-partitioned layout.

Versions before per-partition ownership wrote every index record wherever its key hashed, with
record version 1, through one writer. This version keeps each events partition's records in
the index partition of the same number (version 2) and refuses to restore from anything else
(:func:`bridge.log.indexrestore.index_layout_error`). The migration, run once with every bridge
process stopped:

1. gives the index topic as many partitions as the events topic, if it has fewer (Kafka only
   ever adds partitions; existing records stay where they are);
2. reads the whole index (the latest record of each key) and, per events partition, in one
   transaction of that partition's own writer (which also fences any writer still running),
   writes each of its records as version 2 into its partition and a tombstone where a record
   sat in another partition.

Counts are copied, never recomputed, so nothing retention deleted is needed. Running it again
finds nothing to move. What it does not do: touch the events topic.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.config import Settings
from bridge.kafka.acls import index_writer_id, indexer_transactional_id
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.admin import add_partitions, kafka_admin
from bridge.kafka.port import Log, LogError
from bridge.log.indexrestore import topic_partitions
from bridge.log.restore import latest_by_key
from bridge.log.seqindex import (
    IndexRecordError,
    decode_index_record,
)

__all__ = ["MigrationReport", "migrate_index"]

log = logging.getLogger(__name__)


@dataclass
class MigrationReport:
    partitions_added: int = 0
    records_read: int = 0
    rewritten: int = 0
    tombstoned: int = 0
    #: Events partitions rewritten, each in its own transaction.
    partitions_written: list[int] = field(default_factory=list)


async def migrate_index(
    settings: Settings, progress: Callable[[str], None] = lambda line: None
) -> MigrationReport:
    """Rewrite the index topic into the co-partitioned layout; idempotent."""
    report = MigrationReport()
    topics = settings.topics
    events = len(await topic_partitions(settings, topics.events))
    index = await topic_partitions(settings, topics.index)
    if len(index) < events:
        async with kafka_admin(settings) as admin:
            await add_partitions(admin, topics.index, events)
        report.partitions_added = events - len(index)
        progress(f"index topic: {len(index)} -> {events} partitions")
        index = await topic_partitions(settings, topics.index)
    kafka = KafkaLog(settings, pool_size=1, role="index-migrate")
    try:
        await _migrate(kafka, settings, index, report, progress)
    finally:
        await kafka.close()
    return report


async def _migrate(
    kafka: Log,
    settings: Settings,
    index: list[int],
    report: MigrationReport,
    progress: Callable[[str], None],
) -> None:
    latest = await latest_by_key(kafka, settings.topics.index, index, role="index-migrate")
    report.records_read = len(latest)
    progress(f"read {len(latest)} index records from {len(index)} partitions")
    writes: dict[int, list[tuple[int, bytes, bytes | None]]] = defaultdict(list)
    for (slice_, key), value in latest.items():
        if value is None:
            continue
        try:
            record = decode_index_record(key, value)
        except IndexRecordError as exc:
            raise IndexRecordError(f"cannot migrate {key[:40]!r}: {exc}") from None
        target = record.partition
        if record.version >= 2 and slice_ == target:
            continue
        writes[target].append((target, key, _reencoded(record, value)))
        report.rewritten += 1
        if slice_ != target:
            writes[target].append((slice_, key, None))
            report.tombstoned += 1
    await _fence_the_single_writer(kafka, settings)
    for target in sorted(writes):
        await _write(kafka, settings, target, writes[target])
        report.partitions_written.append(target)
        progress(f"events partition {target}: {len(writes[target])} index records written")


def _reencoded(record: object, value: bytes) -> bytes:
    # Task and marker records of version 1 differ from version 2 only in the version byte.
    # They stay version 2 (not the current 3): the partition was indexed before task
    # identities were signed, which the indexer's upgrade rule needs to know.
    return bytes([2]) + value[1:]


async def _fence_the_single_writer(kafka: Log, settings: Settings) -> None:
    """Abort any open transaction of the old single writer (best effort: a principal without
    WRITE on its id could never have written with it)."""
    old = kafka.transactional_writer(indexer_transactional_id(settings.topics))
    try:
        await old.start()
    except LogError as exc:
        # Only a refusal of the id is expected; a fence that could not complete (its open
        # transaction cannot end) must stop the migration before anything is written.
        if "Authorization" not in (exc.kind or ""):
            raise
    finally:
        await old.close()


async def _write(
    kafka: Log,
    settings: Settings,
    events_partition: int,
    records: list[tuple[int, bytes, bytes | None]],
) -> None:
    async with (
        kafka.transactional_writer(index_writer_id(settings.topics, events_partition)) as writer,
        writer.transaction(),
    ):
        for partition, key, value in records:
            await writer.send(settings.topics.index, value, key=key, partition=partition)

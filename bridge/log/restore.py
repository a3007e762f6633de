"""Partitions read from their log start to their current end, over the log port: the one
restore of a compacted topic's state.

Where it sits: below the seq index's restore (:func:`bridge.log.indexrestore.load_index`), the index
migration and the offline checkers, above any :class:`~bridge.kafka.port.Log` (the broker's or
the in-memory one). The end is the last stable offset taken before reading, so a restore is a
consistent committed cut of a topic written in transactions. It knows nothing of what the
records mean.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

from bridge.kafka.port import Log, LogRecord, TopicPart

__all__ = ["latest_by_key", "read_to_end"]

#: How long one poll of a restore waits for records (a partition not at its end has some).
POLL_S = 0.5


async def read_to_end(
    log: Log,
    parts: Sequence[TopicPart],
    on_record: Callable[[LogRecord], Awaitable[None] | None],
    *,
    role: str = "restore",
    max_records: int | None = None,
) -> None:
    """Hand every committed record of ``parts``, from the log start to the current end (the
    cut taken first), to ``on_record``, in offset order within each partition; nothing written
    after the cut. An ``on_record`` that returns an awaitable is awaited before the next
    record, so a restore holds at most one poll (``max_records``) beyond what it builds."""
    starts = await log.log_starts(parts)
    ends = await log.log_ends(parts)
    remaining = {p for p in parts if ends[p] > starts[p]}
    if not remaining:
        return
    async with log.tail(role) as tail:
        tail.assign({p: starts[p] for p in sorted(remaining)})
        while remaining:
            polled = await tail.poll(POLL_S, max_records)
            for part, records in polled.records.items():
                for record in records:
                    # A poll may cross the cut: what was written after it is not handed on.
                    if record.offset < ends[part]:
                        applied = on_record(record)
                        if applied is not None:
                            await applied
            done = {p for p, at in polled.positions.items() if p in remaining and at >= ends[p]}
            if done:
                tail.pause(*done)  # read no further than the cut
                remaining -= done


async def latest_by_key(
    log: Log, topic: str, partitions: Iterable[int], *, role: str = "restore"
) -> dict[tuple[int, bytes], bytes | None]:
    """The latest value (None: a tombstone) of each key in each of ``partitions``: what
    compaction keeps. Keyless records are skipped."""
    latest: dict[tuple[int, bytes], bytes | None] = {}

    def keep(record: LogRecord) -> None:
        if record.key is not None:
            latest[record.partition, record.key] = record.value

    parts = [TopicPart(topic, p) for p in sorted(set(partitions))]
    await read_to_end(log, parts, keep, role=role)
    return latest

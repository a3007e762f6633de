"""The indexer's tail: the committed records of the owned partitions, each applied to its
partition's seq rule and handed on as an :class:`IndexedEvent`.

Where it sits: after the port's live :class:`~bridge.kafka.port.Tail` (``read_committed``,
positioned by :mod:`bridge.log.ownership` at each partition's restored ``through``), before the
listeners (the fan-out, the task service) and the index writer (:mod:`bridge.log.indexwriter`,
which it hands a task-update for each status change). The rule itself is pure data in
:class:`~bridge.log.seqindex.PartitionIndex`; this module decides which facts of a record the
rule sees. It takes no partition and writes no log.

A ``task.created`` defines its task only when it is authentic: signed with a key of the
process's keyring (:mod:`bridge.log.identity`), or written before identities were signed (the
upgrade rule, :mod:`bridge.log.reconcile`). Refused records are ordinary events. So is a
``task.created`` in another partition than its task id's: the signature binds no partition, and
a copy there must define nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.kafka.clients import partition_for_key
from bridge.kafka.port import Log, LogError, LogRecord, OffsetOutOfRange, Tail
from bridge.log.identity import Keyring, is_signed
from bridge.log.indexwriter import IndexWriter
from bridge.log.misrouted import MisroutedEvents
from bridge.log.owned import OwnedPartitions
from bridge.log.reconcile import reconcile_with_retention
from bridge.log.records import LazyEvent, RecordDecoder, task_id_of
from bridge.log.seqindex import PartitionIndex, TaskIdentity
from bridge.log.updates import TaskUpdate
from bridge.vocabulary import TaskStatus

__all__ = [
    "CREATED_SKEW_MS",
    "IndexedEvent",
    "Listener",
    "SeqTail",
    "out_of_place",
    "task_partition",
]

log = logging.getLogger(__name__)

#: The back-off before polling again after a retriable failure of a poll.
POLL_RETRY_S = 0.1


@functools.lru_cache(maxsize=16_384)
def task_partition(task_id: str, partitions: int) -> int:
    """:func:`partition_for_key` of a task id, remembered: murmur2 in pure Python costs tens of
    microseconds, and opening one stream asks for its task's partition half a dozen times."""
    return partition_for_key(task_id.encode("utf-8"), partitions)


#: How far a ``task.created`` record's timestamp may be from its ``createdMs`` once its partition
#: lost records: the bridge writes them equal (CreateTime), or a produce's latency apart
#: (LogAppendTime).
CREATED_SKEW_MS = 300_000


def out_of_place(
    task_id: str,
    record: LogRecord,
    partitions: int,
    idx: PartitionIndex,
    identity: TaskIdentity | None,
) -> bool:
    """Whether a ``task.created`` record can only be a copy (its signature binds neither
    partition nor offset): in a partition its task id never maps to; or, in a partition that
    lost records to retention (where a task's first record left may be anything), stamped far
    from its ``createdMs`` (docs/security.md says what a broker setting adds to this)."""
    if record.partition != task_partition(task_id, partitions):
        return True
    return (
        idx.lost_before >= 0
        and identity is not None
        and abs(record.timestamp - identity.created_ms) > CREATED_SKEW_MS
    )


class IndexedEvent:
    """A committed record with its derived seq, as the tail hands it to listeners.

    ``event`` is decoded on first access (a :class:`~bridge.log.records.LazyEvent` until then):
    the tail decodes only the records whose payload the index folds, and a listener that reads
    just the task id (the fan-out, for tasks nobody watches) costs no decode. Ask
    :meth:`has_type` rather than ``event.type`` to test for the bridge's own created or status
    type: it answers those without decoding.
    """

    __slots__ = ("_event", "offset", "partition", "seq", "task_id")

    def __init__(
        self, task_id: str, partition: int, offset: int, seq: int, event: TaskEvent | LazyEvent
    ) -> None:
        self.task_id = task_id
        self.partition = partition
        self.offset = offset
        self.seq = seq
        self._event = event

    @property
    def event(self) -> TaskEvent:
        """The record's event, or the placeholder describing why it does not decode."""
        event = self._event
        if isinstance(event, LazyEvent):
            event = self._event = event.get()
        return event

    def has_type(self, event_type: str) -> bool:
        """``self.event.type == event_type``, without decoding when the tail already knows."""
        lazy = self._event
        if isinstance(lazy, LazyEvent) and lazy.cannot_be(event_type):
            return False
        return self.event.type == event_type

    def __repr__(self) -> str:
        return (
            f"IndexedEvent({self.task_id!r}, partition={self.partition}, "
            f"offset={self.offset}, seq={self.seq}, event={self._event!r})"
        )


Listener = Callable[[IndexedEvent], None]


class SeqTail:
    """Applies every record the tail fetches to its partition's index, and hands each counted
    record to the listeners (and, ``persist``, its status change to the index writer)."""

    def __init__(
        self,
        settings: Settings,
        owned: OwnedPartitions,
        writer: IndexWriter,
        *,
        keyring: Keyring,
        misrouted: MisroutedEvents,
        log_: Log,
        persist: bool,
    ) -> None:
        self.settings = settings
        self.keyring = keyring
        self.misrouted = misrouted
        self.persist = persist
        #: Told of every counted record, in offset order within a partition.
        self.listeners: list[Listener] = []
        self._owned = owned
        self._writer = writer
        self._log = log_
        self._decoder = RecordDecoder(
            settings.tasks.event_type_prefix, settings.tasks.max_event_bytes, settings.type_rule
        )

    async def run(self, tail: Tail) -> None:
        """Poll ``tail`` and apply what it fetches, until cancelled."""
        partitions = self._owned.partitions
        while True:
            try:
                polled = await tail.poll(0.2, max_records=5000)
            except OffsetOutOfRange:
                topic = self.settings.topics.events
                await reconcile_with_retention(self._log, tail, topic, partitions)
                continue
            except LogError as exc:
                if not exc.retriable:
                    raise  # the indexer reports it (not ready) and its owner restarts it
                # e.g. a partition just assigned, not yet sought to its index (its gain seeks
                # it): Kafka answers again in a moment.
                log.debug("the seq tail's poll failed (%s); polling again", exc.kind)
                await asyncio.sleep(POLL_RETRY_S)
                continue
            for part, records in polled.records.items():
                idx = partitions.get(part.partition)
                if idx is None:
                    continue  # assigned a moment ago and not yet restored: re-read after seek
                for record in records:
                    self.apply(idx, record)
            for part, position in polled.positions.items():
                idx = partitions.get(part.partition)
                if idx is not None:
                    # Transaction markers and aborted records move the position without records.
                    idx.advance(position)
            self._owned.notify_progress()

    def apply(self, idx: PartitionIndex, record: LogRecord) -> None:
        """Count ``record`` in ``idx`` (a no-op at or below what is counted already)."""
        if record.offset < idx.through:
            return  # counted already (a re-read after a rebalance)
        task_id = task_id_of(record)
        if task_id is None:
            idx.advance(record.offset + 1)
            return
        # Only the bridge's own created and status records are decoded here (the facts); the
        # rest is decoded when a listener reads the event, if one ever does.
        (created, status, identity), event = self._decoder.facts(record)
        if created and out_of_place(task_id, record, self._owned.count, idx, identity):
            identity = None  # a copy of a task.created: refused, counted
        signed = created and is_signed(self.keyring, task_id, event, identity, record.headers)
        before = idx.folded_status(task_id) if self.persist else None
        seq = idx.apply(
            task_id, record.offset, created=created, status=status, identity=identity, signed=signed
        )
        if seq is None:
            return
        if seq == 0 or self.misrouted.remembered:  # no call for a placed task's later events
            self.misrouted.check(task_id, idx.partition, seq)
        if self.persist:
            self._note_update(idx, task_id, seq, record, before, event)
        if not self.listeners:
            return
        indexed = IndexedEvent(
            task_id,
            idx.partition,
            record.offset,
            seq,
            event if event is not None else LazyEvent(record, self._decoder),
        )
        for listener in self.listeners:
            try:
                listener(indexed)
            except Exception:  # a listener bug must not stop indexing
                log.exception("indexer listener failed")

    def _note_update(
        self,
        idx: PartitionIndex,
        task_id: str,
        seq: int,
        record: LogRecord,
        before: tuple[int, int, int] | None,
        event: TaskEvent | None,
    ) -> None:
        """Queue a task-updates record when this record changed the task's folded status."""
        after = idx.folded_status(task_id)
        if after is None or after[1] != record.offset or after[2] == 0:
            return  # no status folded from this record, or a task without an owner
        if before is not None and before[1] == after[1]:
            return
        message = event.payload.get("statusMessage") if event is not None else None
        self._writer.queue(
            idx.partition,
            TaskUpdate(
                owner=after[2],
                full_owner=not idx.owner_is_prefix(task_id),
                task_id=task_id,
                seq=seq,
                status=TaskStatus(after[0]).wire,
                partition=idx.partition,
                offset=record.offset,
                ts=record.timestamp,
                status_message=message if isinstance(message, str) else None,
            ),
        )

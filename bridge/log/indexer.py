"""The indexer: tails the events partitions this process owns and derives each record's seq.

Every bridge replica runs one :class:`Indexer`. It owns every partition (``ownership = "all"``)
or the share the replicas' consumer group gives it (``"group"``, see
:mod:`bridge.kafka.ownership`). For each partition it gains, it restores that partition's slice
of the compacted index topic (the index partition of the same number; reading committed records
up to the last stable offset is a consistent cut, since the index is only ever written in
transactions), then tails it with ``read_committed`` from the restored ``through`` offset,
applying every record to :class:`~bridge.log.seqindex.PartitionIndex` and handing
``IndexedEvent``\\ s to listeners (the fan-out, the task service).

With ``persist`` (every serving replica) it also writes the index of its partitions: every
``flush_interval_s`` each partition's dirty task entries, its marker and the task-updates its
status changes produced are encoded at one instant and written in one Kafka transaction of that
partition's own writer (transactional id ``<prefix>.index.<partition>``). A crash at any point
leaves either the whole cut or none of it; the partition's next owner starts a writer with the
same id and so fences the previous one, which can never again overwrite newer counts. Replaying
records at or below a task's ``last_offset`` is a no-op, so any owner derives exactly the same
seq for every record.

If retention deletes records before they were counted (``through`` below the log start
offset), the partition is marked lost: tasks known then become untrusted, and later tasks are
trusted only if their first record is the bridge's own ``task.created``.

A ``task.created`` defines its task only when it is authentic: signed with a key of the
process's keyring (:mod:`bridge.log.identity`), or written before identities were signed. That
upgrade rule is per partition: when a partition's restored marker is of a version before
signing (8fd441c), the indexer records the partition's current end as ``unsigned_below``,
once, and persists it with the marker; unsigned records below it keep their meaning, none
written after it does. Refused records are ordinary events (:attr:`Indexer.refused_identities`).
So is a ``task.created`` in another partition than its task id's: the signature binds no
partition, and a copy there must define nothing.

While a rolling upgrade from 0.1 is under way (``upgrade.from``), nothing is decided: a
partition not yet written in version 3 is written in 8fd441c's version 2 and honours unsigned
records, because 8fd441c's replicas may still write them there, or own the partition next.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable

from bridge.component import Component, NotStarted, cancel_and_wait
from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.events import TaskStatus
from bridge.kafka.acls import bridge_group, index_writer_id
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.clients import partition_for_key
from bridge.kafka.ownership import OwnershipAssignor
from bridge.kafka.port import (
    GroupTail,
    Log,
    LogError,
    LogRecord,
    OffsetOutOfRange,
    Tail,
    TopicPart,
    TransactionalWriter,
    UnknownTopic,
    WriterFenced,
)
from bridge.kafka.topics import TopicLayoutError, topic_partition_ids
from bridge.log.identity import Keyring, is_signed, load_keyring
from bridge.log.misrouted import MisroutedEvents
from bridge.log.records import LazyEvent, RecordDecoder, task_id_of
from bridge.log.restore import latest_by_key
from bridge.log.seqindex import (
    UNSIGNED_UNDECIDED,
    IndexRecordError,
    MarkerRecord,
    PartitionIndex,
    TaskEntry,
    TaskIdentity,
    TaskRecord,
    decode_index_record,
    marker_key,
    task_key,
)
from bridge.log.updates import TaskUpdate

__all__ = [
    "CREATED_SKEW_MS",
    "IndexedEvent",
    "Indexer",
    "IndexerError",
    "NotOwner",
    "index_layout_error",
    "load_index",
    "out_of_place",
    "topic_partitions",
]

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=16_384)
def _partition_of(task_id: str, partitions: int) -> int:
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
    if record.partition != _partition_of(task_id, partitions):
        return True
    return (
        idx.lost_before >= 0
        and identity is not None
        and abs(record.timestamp - identity.created_ms) > CREATED_SKEW_MS
    )


class IndexerError(Exception):
    """The indexer cannot start or go on (missing topic, unreadable index, fenced writer)."""


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


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """Partition ids of ``topic``, or :class:`IndexerError` naming the fix."""
    try:
        return await topic_partition_ids(settings, topic)
    except TopicLayoutError as exc:
        raise IndexerError(str(exc)) from None


def index_layout_error(settings: Settings, what: str) -> IndexerError:
    """The refusal for an index this version must not restore from, with the way out."""
    return IndexerError(
        f"the index topic {settings.topics.index!r} {what}. This version keeps each events "
        "partition's index in the index partition of the same number (so a replica restores only "
        "the partitions it owns). Stop every bridge process, then run `bridge index migrate` "
        "once: it rewrites the index in place, without losing a count (docs/deployment.md)"
    )


async def load_index(
    settings: Settings,
    partitions: Iterable[int],
    *,
    strict_layout: bool = True,
    log: Log | None = None,
) -> dict[int, PartitionIndex]:
    """Restore the persisted seq index (a consistent committed cut) of ``partitions``.

    Reads only the index partitions of those numbers, from ``log`` (the cluster of
    ``settings`` when None). With ``strict_layout`` a record written by a version before the
    co-partitioned layout, or found in another partition's slice, is refused
    (:func:`index_layout_error`): restoring around it could miss counts it holds.
    """
    index = {p: PartitionIndex(p, settings.checkpoint_interval) for p in partitions}
    if not index:
        return index
    # By partition and key: a migrated index holds a key's record in its partition and a
    # tombstone in the one it was moved out of; compaction keeps the latest per partition.
    async with _log_of(settings, log) as source:
        latest = await latest_by_key(source, settings.topics.index, index, role="index-restore")
    for (slice_, key), value in latest.items():
        if value is None:  # a tombstone: the entry was deleted on purpose
            continue
        record = _decoded(settings, key, value)
        if strict_layout and (record.version < 2 or record.partition != slice_):
            raise index_layout_error(settings, "was written by an older version of the bridge")
        target = index.get(record.partition)
        if target is None:
            continue  # only with strict_layout off: another slice's record
        if isinstance(record, TaskRecord):
            target.restore_task(record.task_id, record.entry)
        elif record.version < 3:  # indexed before identities were signed: the upgrade rule
            target.restore_marker(
                record.through, record.lost_before, UNSIGNED_UNDECIDED, record.version
            )
        else:
            target.restore_marker(record.through, record.lost_before, record.unsigned_below)
    return index


@contextlib.asynccontextmanager
async def _log_of(settings: Settings, log: Log | None) -> AsyncIterator[Log]:
    """``log``, or the cluster of ``settings`` for this one use (closed after it)."""
    if log is not None:
        yield log
        return
    kafka = KafkaLog(settings, pool_size=1)
    try:
        yield kafka
    finally:
        await kafka.close()


def _decoded(settings: Settings, key: bytes, value: bytes) -> TaskRecord | MarkerRecord:
    try:
        return decode_index_record(key, value)
    except IndexRecordError as exc:
        raise IndexerError(
            f"the index topic {settings.topics.index!r} holds a record this version cannot "
            f"read ({exc}); refusing to guess seq counts"
        ) from None


class NotOwner(Exception):
    """The task's events partition is owned by another replica (or is moving)."""

    def __init__(self, partition: int) -> None:
        super().__init__(f"events partition {partition} is not owned by this replica")
        self.partition = partition


#: Called with the partitions gained and lost at each assignment (both may be empty).
OwnershipListener = Callable[[set[int], set[int]], None]


class Indexer(Component):
    """Derives seq for the committed records of the events partitions this process owns, and
    (``persist``) writes their index, one fenced transactional writer per partition.

    Ownership is every partition (``settings.ownership == "all"``), or what the consumer group
    assigns (``"group"``: see :mod:`bridge.kafka.ownership`). A partition gained is restored
    from its index slice and tailed from there; a partition lost is flushed and dropped, and
    the ownership listeners are told (streams on it end so that clients resume on its owner).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        persist: bool = False,
        flush_interval_s: float = 0.5,
        keyring: Keyring | None = None,
        on_misrouted: Callable[[], None] | None = None,
        log: Log | None = None,
    ) -> None:
        """``log``: the log to index (the cluster of ``settings`` when None)."""
        self.settings = settings
        self.persist = persist
        self.flush_interval_s = flush_interval_s
        self.group = settings.ownership == "group"
        #: The events topic's partition count (murmur2 of the key modulo this is a partition).
        self.partition_count = 0
        #: The derived state of the partitions this process owns now.
        self.partitions: dict[int, PartitionIndex] = {}
        self.assignor: OwnershipAssignor | None = None
        self._decoder = RecordDecoder(
            settings.event_type_prefix, settings.max_event_bytes, settings.type_rule
        )
        #: Events in a partition their task id does not map to (``on_misrouted`` counts each).
        self.misrouted = MisroutedEvents(self.partition_of, on_misrouted)
        #: Verifies the signature of every ``task.created`` record.
        self.keyring = keyring if keyring is not None else load_keyring(settings)
        #: ``task.created`` records refused by partitions no longer owned (see
        #: :attr:`refused_identities`).
        self._refused_before = 0
        #: Partitions whose writer a newer writer fenced (in ``all`` mode they go on unpersisted).
        self.fenced: set[int] = set()
        self.rebalances = 0
        self.moved = {"gained": 0, "lost": 0}
        self._listeners: list[Listener] = []
        self._ownership_listeners: list[OwnershipListener] = []
        #: The log: the events partitions, their index slices and the fenced index writers.
        self._log: Log = log if log is not None else KafkaLog(settings, pool_size=2)
        self._own_log = log is None
        #: The tail of the owned partitions (the group's member in ``group`` mode).
        self._reader: Tail | GroupTail | None = None
        self._writers: dict[int, TransactionalWriter] = {}
        self._updates: dict[int, list[TaskUpdate]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._progress = asyncio.Event()
        self._assigned = asyncio.Event()
        self._rebalanced = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._moving = asyncio.Lock()
        self._persisted_markers: dict[int, bytes] = {}
        self.restore_seconds = 0.0
        self.last_flush_records = 0

    # --- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """Take ownership (every partition, or the group's share), restore, and start tailing."""
        s = self.settings
        if s.upgrade.legacy:
            log.warning(
                "rolling upgrade from %s (BRIDGE_UPGRADE__FROM): writing the index as 0.1.0 does "
                "and honouring unsigned task.created records; remove the setting once no 0.1.0 "
                "process runs (CHANGELOG.md, Upgrade)",
                s.upgrade.from_,
            )
        try:
            parts = await self._partitions(s.topics.events)
            self.partition_count = len(parts)
            index_parts = await self._partitions(s.topics.index)
            if len(index_parts) < len(parts):
                raise index_layout_error(
                    s, f"has {len(index_parts)} partitions and the events topic {len(parts)}"
                )
            if self.group:
                await self._join_group()
            else:
                tail = self._log.tail("indexer")
                self._reader = tail
                await tail.start()
                tail.assign({TopicPart(s.topics.events, p): 0 for p in parts})  # sought in _gain
                await self._gain(set(parts))
                self._assigned.set()
                self._tasks.append(asyncio.create_task(self._tail(), name="indexer-tail"))
        except BaseException:
            await self.stop()
            raise
        if self.persist:
            self._tasks.append(asyncio.create_task(self._persist_loop(), name="indexer-persist"))

    async def _join_group(self) -> None:
        s = self.settings
        if s.advertised_url is None:  # the settings refuse this; a guard for direct use
            raise IndexerError("ownership 'group' needs advertised_url")
        self.assignor = OwnershipAssignor(s.advertised_url, s.topics.events)
        # Positions come from the index (seek on assignment); a committed offset, when there
        # is one, is only ever at or below it, and records below ``through`` are skipped.
        tail = self._log.group_tail(
            bridge_group(s.topics),
            [s.topics.events],
            _Rebalance(self),
            assignor=self.assignor,
            instance_id=s.instance_id,
            session_timeout_ms=s.group_session_timeout_ms,
            reset="earliest",
            role="indexer",
        )
        self._reader = tail
        await tail.start()
        self._tasks.append(asyncio.create_task(self._tail(), name="indexer-tail"))
        async with asyncio.timeout(max(60.0, 3 * s.group_session_timeout_ms / 1000)):
            await self._assigned.wait()

    async def stop(self) -> None:
        """Stop tailing; a persisting indexer flushes what it has first."""
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self._writers:
            with contextlib.suppress(Exception):
                await self.flush()
        await self._close_writers(set(self._writers))
        if self._reader is not None:
            await self._reader.close()  # a dynamic member leaves the group here
            self._reader = None
        if self._own_log and isinstance(self._log, KafkaLog):
            await self._log.close()

    async def _partitions(self, topic: str) -> list[int]:
        """Partition ids of ``topic``, or :class:`IndexerError` naming the fix."""
        try:
            return await self._log.partitions(topic)
        except UnknownTopic as exc:
            raise IndexerError(str(exc)) from None

    # --- ownership -------------------------------------------------------------------------

    async def _gain(self, parts: set[int]) -> None:
        """Own ``parts``: fence their previous writers, restore their slices, seek to them."""
        if not parts:
            return
        tail = self._started_tail()
        topic = self.settings.topics.events
        if self.persist:
            # Fence first: the old owner's open transaction is aborted, so the restore below
            # reads a cut that no zombie can still extend.
            # Every fence runs to its end (each is bounded) before a failure is raised, so no
            # writer opens after the caller has closed the ones it knows.
            opened = await asyncio.gather(
                *(self._open_writer(p) for p in parts), return_exceptions=True
            )
            failed = [exc for exc in opened if isinstance(exc, BaseException)]
            if failed:
                exc = failed[0]
                if not isinstance(exc, LogError):
                    raise exc
                raise IndexerError(
                    f"could not fence the previous index writer of events partitions "
                    f"{sorted(parts)} ({exc}): its open transaction must complete first, which "
                    f"needs every partition it wrote (of the index topic "
                    f"{self.settings.topics.index!r} and the updates topic) to have a leader; "
                    "nothing is served until then"
                ) from exc
        started = time.perf_counter()
        try:
            restored = await load_index(self.settings, parts, log=self._log)
        except LogError as exc:
            # Without its index a partition's seq cannot be known: nothing is served from it.
            raise IndexerError(
                f"could not read the seq index of events partitions {sorted(parts)} from the "
                f"index topic {self.settings.topics.index!r} ({exc!r}): every partition of it "
                "needs a leader that answers; nothing is served until it can be read"
            ) from exc
        self.restore_seconds = time.perf_counter() - started
        tps = [TopicPart(topic, p) for p in sorted(parts)]
        begins = await self._log.log_starts(tps)
        ends = await self._log.log_ends(tps)
        for tp in tps:
            idx = restored[tp.partition]
            idx.track_dirty = self.persist
            if idx.through < begins[tp]:
                self._lost(idx, begins[tp])
            self.partitions[tp.partition] = idx
            self._decide(idx, begins[tp], ends[tp])
            self._updates[tp.partition] = []
            tail.reposition(tp, idx.through)
        log.info(
            "owning events partitions %s: restored %d tasks in %.2fs",
            sorted(parts),
            sum(len(restored[p]) for p in parts),
            self.restore_seconds,
        )

    def _decide(self, idx: PartitionIndex, begin: int, end: int) -> None:
        """Which unsigned ``task.created`` records of a partition just taken define a task.

        * A version 3 marker decided it already.
        * No marker, yet records: 8fd441c (or this version) wrote them and stopped before its
          first flush of the partition; they may predate signing, so it is undecided, and
          provisional: the first signed ``task.created`` lowers the offset to its own.
        * During an upgrade from 0.1 (``upgrade.from``) a partition not yet written in version
          3 stays in 8fd441c's format and honours unsigned records (:attr:`PartitionIndex.legacy`).
        * Otherwise an undecided partition gets its upgrade offset now (:meth:`_upgrade`), and
          a partition without a marker gets one at the next flush, so that records written
          after it are never taken for 8fd441c's.
        """
        if self.persist and idx.marker_version == 0 and end > begin:
            # (A process that never persists never finds a marker: nothing is undecided there.)
            idx.unsigned_below = UNSIGNED_UNDECIDED
            idx.provisional = not self.settings.upgrade.legacy
        idx.legacy = self.settings.upgrade.legacy and idx.marker_version < 3
        if idx.marker_version:
            self._persisted_markers[idx.partition] = idx.marker()
        else:
            self._persisted_markers.pop(idx.partition, None)
        if idx.unsigned_below == UNSIGNED_UNDECIDED and not idx.legacy:
            self._upgrade(idx, end)

    def _upgrade(self, idx: PartitionIndex, end: int) -> None:
        """The upgrade rule: every record the partition held when this version first took it
        was written before identities were signed; a ``task.created`` among them still counts.
        Persisted with the next flush (the marker is written even if nothing else changed)."""
        idx.unsigned_below = end
        self._persisted_markers.pop(idx.partition, None)
        log.warning(
            "events partition %d was indexed by a version that did not sign task identities: "
            "unsigned task.created records below offset %d are honoured, none after it",
            idx.partition,
            end,
        )

    @property
    def refused_identities(self) -> int:
        """``task.created`` records this process refused (unsigned or forged), in all."""
        return self._refused_before + sum(idx.refused for idx in self.partitions.values())

    async def _open_writer(self, partition: int) -> None:
        writer = self._log.transactional_writer(index_writer_id(self.settings.topics, partition))
        await writer.start()
        self._writers[partition] = writer
        self.fenced.discard(partition)

    async def _lose(self, parts: set[int]) -> None:
        """Give up ``parts``: persist what they have (if still allowed) and drop their state."""
        if not parts:
            return
        for p in parts & set(self._writers):
            with contextlib.suppress(Exception):
                await self._flush_partition(p)
        await self._close_writers(parts)
        for p in parts:
            gone = self.partitions.pop(p, None)
            self._refused_before += gone.refused if gone is not None else 0
            self._persisted_markers.pop(p, None)
            self._updates.pop(p, None)
        log.info("no longer owning events partitions %s", sorted(parts))

    async def _close_writers(self, parts: set[int]) -> None:
        for p in parts:
            writer = self._writers.pop(p, None)
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer.close()

    async def _assigned_now(self, assigned: set[int]) -> None:
        """The group's new assignment: lose, gain, and re-seek what is kept."""
        async with self._moving:
            owned = set(self.partitions)
            lost, gained, kept = owned - assigned, assigned - owned, owned & assigned
            await self._lose(lost)
            await self._gain(gained)
            tail = self._started_tail()
            for p in kept:
                tail.reposition(
                    TopicPart(self.settings.topics.events, p), self.partitions[p].through
                )
            self.rebalances += 1
            self.moved["gained"] += len(gained)
            self.moved["lost"] += len(lost)
            self._assigned.set()
        self._notify_progress()  # waiters re-check: their partition may have moved
        self._rebalanced.set()
        self._rebalanced = asyncio.Event()
        for listener in self._ownership_listeners:
            try:
                listener(gained, lost)
            except Exception:
                log.exception("ownership listener failed")

    async def next_rebalance(self) -> None:
        """Return after the next assignment has been applied (bound the wait)."""
        await self._rebalanced.wait()

    def owner_url(self, partition: int) -> str | None:
        """Where the owner of ``partition`` answers (group mode), as the last assignment said."""
        if self.assignor is None:
            return None
        return self.assignor.map.owner(partition)

    def owns(self, partition: int) -> bool:
        return partition in self.partitions

    # --- queries -------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def add_ownership_listener(self, listener: OwnershipListener) -> None:
        self._ownership_listeners.append(listener)

    def partition_of(self, task_id: str) -> int:
        return _partition_of(task_id, self.partition_count)

    def _owned(self, partition: int) -> PartitionIndex:
        idx = self.partitions.get(partition)
        if idx is None:
            raise NotOwner(partition)
        return idx

    def lookup(self, task_id: str) -> tuple[int, TaskEntry] | None:
        """The task's partition and index entry, or None if no record of it was indexed;
        :class:`NotOwner` when another replica owns the task's partition."""
        partition = self.partition_of(task_id)
        entry = self._owned(partition).get(task_id)
        return None if entry is None else (partition, entry)

    def pause(self) -> None:
        """Stop fetching (operations drills); the lag metrics then grow."""
        tail = self._started_tail()
        tail.pause(*tail.assignment())

    def resume(self) -> None:
        tail = self._started_tail()
        tail.resume(*tail.assignment())

    def _started_tail(self) -> Tail:
        if self._reader is None:
            raise NotStarted("the indexer")
        return self._reader

    def head(self, task_id: str) -> int | None:
        """The task's next seq (the number of its events indexed so far), or None."""
        return self._owned(self.partition_of(task_id)).next_seq_of(task_id)

    async def wait_indexed(self, partition: int, offset: int) -> None:
        """Return once the record at ``offset`` (and all before it) has been applied;
        :class:`NotOwner` if the partition is (or becomes) another replica's.

        Callers bound the wait with ``asyncio.timeout``.
        """
        while self._owned(partition).through <= offset:
            await self._progress.wait()

    async def end_offsets(self) -> dict[int, int]:
        """The current end (last stable offset) of every owned events partition."""
        self._started_tail()
        tps = [TopicPart(self.settings.topics.events, p) for p in self.partitions]
        if not tps:
            return {}
        ends = await self._log.log_ends(tps)
        return {tp.partition: off for tp, off in ends.items()}

    async def catch_up(self) -> None:
        """Return once everything committed before this call has been applied in the owned
        partitions (bound it)."""
        await self._assigned.wait()
        ends = await self.end_offsets()
        while any(
            p in self.partitions and self.partitions[p].through < end for p, end in ends.items()
        ):
            await self._progress.wait()

    # --- tailing -------------------------------------------------------------------------

    def _lost(self, idx: PartitionIndex, log_start: int) -> None:
        log.error(
            "events partition %d: retention deleted offsets [%d, %d) before they were indexed; "
            "tasks with records there can no longer be served with a trusted seq",
            idx.partition,
            idx.through,
            log_start,
        )
        idx.mark_lost(log_start)

    def _apply(self, idx: PartitionIndex, record: LogRecord) -> None:
        if record.offset < idx.through:
            return  # counted already (a re-read after a rebalance)
        task_id = task_id_of(record)
        if task_id is None:
            idx.advance(record.offset + 1)
            return
        # Only the bridge's own created and status records are decoded here (the facts); the
        # rest is decoded when a listener reads the event, if one ever does.
        (created, status, identity), event = self._decoder.facts(record)
        if created and out_of_place(task_id, record, self.partition_count, idx, identity):
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
        if not self._listeners:
            return
        indexed = IndexedEvent(
            task_id,
            idx.partition,
            record.offset,
            seq,
            event if event is not None else LazyEvent(record, self._decoder),
        )
        for listener in self._listeners:
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
        self._updates[idx.partition].append(
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
            )
        )

    async def _tail(self) -> None:
        tail = self._started_tail()
        while True:
            try:
                polled = await tail.poll(0.2, max_records=5000)
            except OffsetOutOfRange:
                await self._reconcile_with_retention(tail)
                continue
            for part, records in polled.records.items():
                idx = self.partitions.get(part.partition)
                if idx is None:
                    continue  # assigned a moment ago and not yet restored: re-read after seek
                for record in records:
                    self._apply(idx, record)
            for part, position in polled.positions.items():
                idx = self.partitions.get(part.partition)
                if idx is not None:
                    # Transaction markers and aborted records move the position without records.
                    idx.advance(position)
            self._notify_progress()

    def _notify_progress(self) -> None:
        """Wake every waiter once. The event is replaced, never left set: a waiter whose
        condition still fails must wait for the next progress, not spin on a set event."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def _reconcile_with_retention(self, tail: Tail) -> None:
        """Mark owned partitions whose uncounted records retention deleted as lost, and seek
        where counting goes on."""
        topic = self.settings.topics.events
        tps = [TopicPart(topic, p) for p in self.partitions]
        begins = await self._log.log_starts(tps)
        for tp in tps:
            idx = self.partitions.get(tp.partition)
            if idx is not None and idx.through < begins[tp]:
                self._lost(idx, begins[tp])
                tail.reposition(tp, idx.through)

    # --- persisting ----------------------------------------------------------------------

    def _cut(self, partition: int) -> tuple[list[tuple[bytes, bytes]], list[TaskUpdate]]:
        """Encode the partition's dirty entries, changed marker and queued updates at one
        instant (no await inside)."""
        idx = self.partitions[partition]
        batch = [(task_key(t), idx.encode_task(t)) for t in idx.dirty]
        idx.dirty.clear()
        marker = idx.marker()
        if idx.provisional and idx.through >= idx.unsigned_below:
            idx.provisional = False  # decided: every record below the offset was seen
        if not idx.provisional and marker != self._persisted_markers.get(partition):
            batch.append((marker_key(partition), marker))
        updates, self._updates[partition] = self._updates[partition], []
        return batch, updates

    async def flush(self) -> int:
        """Persist every owned partition's cut, one transaction per partition; returns the
        number of index records written."""
        total = 0
        for partition in list(self._writers):
            total += await self._flush_partition(partition)
        self.last_flush_records = total
        return total

    async def _flush_partition(self, partition: int) -> int:
        async with self._flush_lock:
            writer = self._writers.get(partition)
            if writer is None or partition not in self.partitions:
                return 0
            batch, updates = self._cut(partition)
            if not batch and not updates:
                return 0
            s = self.settings
            try:
                async with writer.transaction():
                    for key, value in batch:
                        await writer.send(s.topics.index, value, key=key, partition=partition)
                    for update in updates:
                        await writer.send(s.topics.updates, update.value(), key=update.key())
            except WriterFenced:
                await self._fenced(partition)
                return 0
            except BaseException:
                self._redirty(partition, batch, updates)
                raise
            for key, value in batch:
                if key.startswith(b"p:"):
                    self._persisted_markers[partition] = value
            return len(batch)

    async def _fenced(self, partition: int) -> None:
        self.fenced.add(partition)
        writer = self._writers.pop(partition, None)
        log.error(
            "the index writer of events partition %d was fenced by a newer one; %s",
            partition,
            "giving the partition up" if self.group else "no longer persisting it",
        )
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.close()

    def _redirty(
        self, partition: int, batch: list[tuple[bytes, bytes]], updates: list[TaskUpdate]
    ) -> None:
        idx = self.partitions.get(partition)
        if idx is None:
            return
        for key, _ in batch:
            if key.startswith(b"t:"):
                idx.dirty.add(key[2:].decode("utf-8"))
            else:
                self._persisted_markers.pop(partition, None)
        self._updates[partition][:0] = updates

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)  # the flush cadence, not synchronisation
            try:
                # No offsets are committed to the group: positions come from the index, and a
                # commit racing a rebalance (IllegalGeneration) makes aiokafka rejoin, which
                # turned one rebalance into a storm of them.
                await self.flush()
            except Exception:
                log.exception("index flush failed; will retry")


class _Rebalance:
    """The group's callbacks (a port GroupListener): flush before giving partitions back, then
    apply the new share."""

    def __init__(self, indexer: Indexer) -> None:
        self.indexer = indexer

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        # Eager rebalancing revokes everything before the new round: persist now, so whoever
        # gets a partition restores its latest counts (partitions kept lose nothing).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.indexer.flush()

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        if self.indexer.assignor is not None:
            self.indexer.assignor.on_assignment(parts, user_data)
        try:
            await self.indexer._assigned_now({p.partition for p in parts})
        except Exception:
            log.exception("could not take the assigned partitions")

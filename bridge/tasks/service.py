"""The task service: the tasks extension's operations, with all state in the task's event log.

``create`` writes the task's ``task.created`` event (seq 0, acknowledged by all in-sync
replicas and applied by the local indexer before it returns), then hands the job to the tool's
job topic. ``get`` folds what the indexer derived (status and the offset of the latest status
event) with the two records that describe the task — its ``task.created`` event and its latest
status event — so tasks/get and the event stream can never disagree. ``update`` and
``cancel`` write to the log and the control topic; workers do the rest.

Tasks are bound to their creator: the log stores a digest of the principal, and another
principal's task is reported exactly like an unknown one. The binding is the one the index took
from the task's seq 0 (its ``task.created``); later records, whoever writes them, never change it. This module knows nothing of
JSON-RPC; :mod:`bridge.server.handlers` maps its exceptions to wire errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from bridge import tracing
from bridge.clock import SYSTEM_CLOCK, SYSTEM_ENTROPY, Clock, Entropy
from bridge.component import NotStarted
from bridge.config import Settings, ToolSpec
from bridge.envelope import TaskEvent
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.clients import request_timeout_s
from bridge.kafka.port import Log, Producer
from bridge.log.fanout import Fanout, FeedClosed, TaskFeed
from bridge.log.indexer import IndexedEvent, Indexer, NotOwner
from bridge.log.publisher import Published, TaskEventPublisher
from bridge.log.reader import Reader
from bridge.log.seqindex import FLAG_OWNER_PREFIX, PartitionIndex, owner_key, owner_prefix
from bridge.tasks.create import publish_created
from bridge.tasks.messages import ControlMessage, JobRequest, iso_ms, new_task_id, owner_digest
from bridge.vocabulary import INTERNAL_ERROR, TERMINAL_WIRE, StatusPayload, TaskStatus

__all__ = ["KafkaUnavailable", "TaskNotFound", "TaskService", "TaskView", "TooManyTasks"]

log = logging.getLogger(__name__)

#: How long a replica that does not know a task id catches up before saying "not found".
_CATCH_UP_S = 5.0
_WRITE_VISIBLE_S = 30.0
#: Ids drawn at most to find one in an owned partition (1 - (1 - k/P)**4096 of the time; a
#: draw costs about a microsecond). A task in an owned partition is counted by this replica's
#: limit check, one elsewhere only by its owner, which does not refuse for it: the cluster bound
#: needs creations to land here.
_OWNED_ID_DRAWS = 4096
#: Events a waiting call buffers before it falls back to re-reading the task's state.
_WATCH_BUFFER = 256
#: The expiry counted for a task without a TTL (it counts until it ends, or its partition
#: moves away).
_NO_EXPIRY_MS = 10**15


class KafkaUnavailable(RuntimeError):
    """Kafka did not acknowledge a task's creation within the bound. The write goes on in the
    background (idempotent producers retry until the brokers answer): the task named here is
    created, and runs, once they do."""

    def __init__(self, task_id: str, bound_s: float) -> None:
        super().__init__(
            f"Kafka did not acknowledge task {task_id} within {bound_s:g} s (the brokers are "
            "unreachable or have no leader): it will be created when Kafka answers again; poll "
            "it with tasks/get, or retry later"
        )
        self.task_id = task_id
        self.bound_s = bound_s


class TaskNotFound(LookupError):
    """Unknown, expired, or another principal's task (the three are indistinguishable)."""

    def __init__(self, expired: bool = False) -> None:
        super().__init__("Task has expired" if expired else "Task not found")


class TooManyTasks(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"too many active tasks for this principal (limit {limit}); wait for some to finish"
        )
        self.limit = limit


@dataclass
class TaskView:
    """What tasks/get shows of a task (wire field names are applied by the wire module)."""

    task_id: str
    status: str
    created_ms: int
    last_updated_ms: int
    ttl_ms: int | None
    poll_interval_ms: int
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    #: False when the status event is no longer retained: ``result``/``error`` are stand-ins.
    retained: bool = True

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_WIRE

    def task_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": iso_ms(self.created_ms),
            "lastUpdatedAt": iso_ms(self.last_updated_ms),
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        return out


class _ActiveTasks:
    """Active (non-terminal, unexpired) tasks per principal, as this replica counts them for
    the active-task limit: the tasks of the partitions it owns, read from their index (seeded
    when a partition is gained or restored, dropped when it is lost, kept current as the
    indexer applies statuses), and the creations still in flight here.

    A creation takes its place (:meth:`reserve`) before its first await, so concurrent creates
    can never all pass the check; indexing the task turns the reservation into the index's
    entry, and the end of the creation gives back whatever is still only reserved
    (:meth:`release`): a task written into a partition another replica owns is counted there
    (but see :meth:`TaskService._create` for a replica that owns none).

    Entries of 8fd441c hold only the owner's first 64 bits: they are counted under that prefix
    (as ``-1 - prefix``, which no 128-bit key is), and :meth:`count` adds them to the
    principal's own count, so old and new tasks share one limit.
    """

    def __init__(self) -> None:
        #: count key -> task id -> expiry (ms).
        self._tasks: dict[int, dict[str, int]] = {}
        #: task id -> (count key, partition it is indexed in, or None while only reserved).
        self._where: dict[str, tuple[int, int | None]] = {}
        self._by_partition: dict[int, set[str]] = {}

    @staticmethod
    def _legacy_key(owner: int) -> int:
        # Negative: a legacy (64-bit prefix) key can never equal a full 128-bit owner key.
        return -1 - owner_prefix(owner)

    def reserve(self, owner: int, task_id: str, expires_ms: int, limit: int, now_ms: int) -> None:
        """Count ``task_id`` for ``owner`` now, or raise :class:`TooManyTasks` at the limit.
        Synchronous on purpose: the check and the count are one step."""
        if self.count(owner, now_ms) >= limit:
            raise TooManyTasks(limit)
        if task_id not in self._where:
            self._put(owner, task_id, expires_ms, None)

    def release(self, task_id: str) -> None:
        """The creation ended: a place only reserved (nothing written, or written into a
        partition this replica does not index) is free again; an indexed task keeps its."""
        where = self._where.get(task_id)
        if where is not None and where[1] is None:
            self._drop(task_id)

    def index(
        self, partition: int, task_id: str, owner: int, expires_ms: int, legacy: bool
    ) -> None:
        """The index of ``partition`` (owned here) holds ``task_id``, active, for ``owner``."""
        self._drop(task_id)
        self._put(self._legacy_key(owner) if legacy else owner, task_id, expires_ms, partition)

    def finish(self, task_id: str) -> None:
        """The task ended (a terminal status): its place is free."""
        self._drop(task_id)

    def seed(self, partition: int, idx: PartitionIndex, now_ms: int) -> None:
        """Count the active tasks of ``partition``'s index (just gained or restored)."""
        self.drop_partition(partition)
        for task_id, owner, expires, legacy in idx.active_tasks(now_ms):
            expires = expires if expires >= 0 else _NO_EXPIRY_MS
            self.index(partition, task_id, owner, expires, legacy)

    def drop_partition(self, partition: int) -> None:
        """``partition`` is no longer indexed here: its owner counts its tasks."""
        for task_id in self._by_partition.pop(partition, ()):
            self._drop(task_id)

    def count(self, owner: int, now_ms: int) -> int:
        """``owner``'s active tasks, with those 8fd441c stored under its 64-bit prefix."""
        return self._live(owner, now_ms) + self._live(self._legacy_key(owner), now_ms)

    def _live(self, key: int, now_ms: int) -> int:
        tasks = self._tasks.get(key)
        if tasks is None:
            return 0
        for task_id in [t for t, exp in tasks.items() if exp <= now_ms]:
            self._drop(task_id)
        return len(tasks)

    def _put(self, key: int, task_id: str, expires_ms: int, partition: int | None) -> None:
        self._tasks.setdefault(key, {})[task_id] = expires_ms
        self._where[task_id] = (key, partition)
        if partition is not None:
            self._by_partition.setdefault(partition, set()).add(task_id)

    def _drop(self, task_id: str) -> None:
        where = self._where.pop(task_id, None)
        if where is None:
            return
        key, partition = where
        tasks = self._tasks[key]
        del tasks[task_id]
        if not tasks:
            del self._tasks[key]  # memory follows the principals with active tasks
        if partition is None:
            return
        in_partition = self._by_partition.get(partition)
        if in_partition is not None:  # None too while drop_partition empties the partition
            in_partition.discard(task_id)
            if not in_partition:
                del self._by_partition[partition]


K = TypeVar("K")
V = TypeVar("V")


class _LRU(OrderedDict[K, V]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class TaskService:
    """Creates tasks and answers the tasks/* operations from the log."""

    def __init__(
        self,
        settings: Settings,
        indexer: Indexer,
        reader: Reader,
        tools: dict[str, ToolSpec],
        fanout: Fanout | None = None,
        *,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
        entropy: Entropy = SYSTEM_ENTROPY,
    ) -> None:
        """``log``: where jobs, control messages and the bridge's own events are written (the cluster of ``settings``
        when None). ``clock`` and ``entropy``: creation times and task ids (a simulation's
        replay)."""
        self.settings = settings
        self._clock = clock
        self._entropy = entropy
        self._log: Log = log if log is not None else KafkaLog(settings, pool_size=1)
        self.indexer = indexer
        self.reader = reader
        #: Events of one task from now on (shared with the stream hub when the app builds both).
        self.fanout = fanout or Fanout(indexer)
        self.tools = tools
        self.publisher = TaskEventPublisher(settings, log=self._log)
        self._producer: Producer | None = None
        self._types = settings.own_types
        self._status_cache: _LRU[tuple[str, int], TaskEvent] = _LRU(20_000)
        self._active = _ActiveTasks()
        #: The partition indexes whose tasks ``_active`` counts (compared by identity: a
        #: partition lost and gained again has a new index, restored afresh).
        self._counted: dict[int, PartitionIndex] = {}
        #: Creations still writing after their caller was answered KafkaUnavailable.
        self._late_writes: set[asyncio.Task[TaskView]] = set()
        indexer.add_listener(self._on_event)
        indexer.add_ownership_listener(self._on_ownership)

    def _now_ms(self) -> int:
        return int(self._clock.wall() * 1000)

    async def start(self) -> None:
        self._count_owned()  # what the indexer restored before this service existed
        await self.publisher.start()
        producer = self._log.producer("tasks")
        await producer.start()
        self._producer = producer

    def _started_producer(self) -> Producer:
        if self._producer is None:
            raise NotStarted("the task service")
        return self._producer

    async def stop(self) -> None:
        for late in self._late_writes:  # Kafka never answered: nothing of these was written
            late.cancel()
        await asyncio.gather(*self._late_writes, return_exceptions=True)
        await self.publisher.stop()
        if self._producer is not None:
            await self._producer.close()
            self._producer = None

    # --- the indexer's view, kept current -------------------------------------------------

    def _on_ownership(self, gained: set[int], lost: set[int]) -> None:
        self._count_owned()

    def _count_owned(self) -> None:
        """Make the counts follow the partitions owned now: drop those no longer owned (their
        owner counts them), seed those gained or restored since from their index. Cheap when
        nothing moved (one identity check per partition), so it runs before every check."""
        owned = self.indexer.partitions
        for partition in [p for p in self._counted if p not in owned]:
            del self._counted[partition]
            self._active.drop_partition(partition)
        now = self._now_ms()
        for partition, idx in owned.items():
            if self._counted.get(partition) is not idx:
                self._active.seed(partition, idx, now)
                self._counted[partition] = idx

    def _on_event(self, indexed: IndexedEvent) -> None:
        if self._counted.get(indexed.partition) is not self.indexer.partitions.get(
            indexed.partition
        ):
            self._count_owned()  # a partition not seeded yet: its seed includes this record
            return
        # has_type, not event.type: records nobody watches are never decoded (the cheap tail).
        if indexed.seq == 0 and indexed.has_type(self._types.created):
            self._track_owner(indexed.partition, indexed.task_id)
        elif indexed.has_type(self._types.status):
            found = self.indexer.lookup(indexed.task_id)
            if found is not None and found[1].terminal:
                self._active.finish(indexed.task_id)

    def _track_owner(self, partition: int, task_id: str) -> None:
        # Read the identity the index took from this record, never the record itself: any
        # producer can write a task.created, and only the one at seq 0 defines a task.
        found = self.indexer.lookup(task_id)
        if found is None or found[1].owner == 0 or found[1].terminal:
            return
        entry = found[1]
        expires = entry.created_ms + (entry.ttl_ms if entry.ttl_ms >= 0 else _NO_EXPIRY_MS)
        legacy = bool(entry.flags & FLAG_OWNER_PREFIX)
        self._active.index(partition, task_id, entry.owner, expires, legacy)

    # --- create --------------------------------------------------------------------------

    def new_task_id(self) -> str:
        """A fresh task id (192 random bits) whose partition this replica owns when it owns
        any, so that creating the task, waiting for it and streaming it need no hop.

        Drawing until the partition fits keeps every id uniformly random among the ids of the
        owned partitions: with P partitions of which this replica owns k, an id keeps
        192 - log2(P/k) bits of randomness (far above 128 for any partition count).
        """
        owned = self.indexer.partitions
        for _ in range(_OWNED_ID_DRAWS):
            task_id = new_task_id(self._entropy)
            if not owned or self.indexer.partition_of(task_id) in owned:
                return task_id
        return task_id  # owning very few of many partitions: the owner serves it, one hop away

    def watch(self, task_id: str) -> contextlib.AbstractContextManager[TaskFeed]:
        """Events of ``task_id`` indexed from now on, in a bounded buffer, while in the block.

        On overflow the feed says so and drops what it held: re-read the task's state
        (:meth:`get`) rather than rely on every event.
        """
        return self.fanout.subscribe(task_id, _WATCH_BUFFER)

    async def create(
        self,
        tool: ToolSpec,
        arguments: dict[str, Any],
        principal: str,
        *,
        task_id: str | None = None,
        input_responses: dict[str, Any] | None = None,
    ) -> TaskView:
        """Durably create a task for ``tool`` and hand its job to the workers.

        Pass ``task_id`` (from :func:`new_task_id`) to :meth:`watch` the task before it exists.
        :class:`KafkaUnavailable` when Kafka does not answer within the request timeout.
        """
        owner = owner_digest(principal)
        now = self._now_ms()
        task_id = task_id or self.new_task_id()
        # Reserved before the first await: concurrent creates see each other's places.
        self._count_owned()
        self._active.reserve(
            owner_key(owner),
            task_id,
            now + (tool.ttl_ms if tool.ttl_ms is not None else _NO_EXPIRY_MS),
            self.settings.tasks.max_active_per_principal,
            now,
        )
        tracing.set_task_id(task_id)
        # Idempotent producers wait for the brokers for ever; the caller is answered within a
        # bound instead, and the creation runs on to its end (a task, with its job, or nothing).
        creating = asyncio.create_task(
            self._create(tool, arguments, principal, task_id, now, input_responses)
        )
        bound = request_timeout_s(self.settings)
        try:
            async with asyncio.timeout(bound):
                return await asyncio.shield(creating)
        except TimeoutError:
            if creating.done():
                raise  # the creation's own timeout (the indexer's view), not the bound's
            self._late_writes.add(creating)
            creating.add_done_callback(self._late_write_done)
            raise KafkaUnavailable(task_id, bound) from None

    def _late_write_done(self, creating: asyncio.Task[TaskView]) -> None:
        self._late_writes.discard(creating)
        if not creating.cancelled() and creating.exception() is not None:
            log.error("a late task creation failed", exc_info=creating.exception())

    async def _create(
        self,
        tool: ToolSpec,
        arguments: dict[str, Any],
        principal: str,
        task_id: str,
        now: int,
        input_responses: dict[str, Any] | None,
    ) -> TaskView:
        """The creation itself: ``task.created`` (indexed here), then the job. When it ends
        the reservation goes: the index that holds the task counts it from then on (this
        replica's, or the partition owner's), and a creation that wrote nothing frees its place.
        A replica that owns no partition keeps the place until the task's expiry instead: no
        index of its own would ever stop it, and the owners count but never refuse for it."""
        try:
            where = await publish_created(
                self.publisher, self._types, tool, principal, task_id, now
            )
        except BaseException:
            self._active.release(task_id)  # nothing was written
            raise
        try:
            return await self._queue(tool, arguments, task_id, now, input_responses, where)
        finally:
            if self.indexer.partitions:
                self._active.release(task_id)

    async def _queue(
        self,
        tool: ToolSpec,
        arguments: dict[str, Any],
        task_id: str,
        now: int,
        input_responses: dict[str, Any] | None,
        where: Published,
    ) -> TaskView:
        """Hand the job of the task just written (at ``where``) to the tool's workers."""
        await self._visible(where.partition, where.offset)
        job = JobRequest(
            task_id=task_id,
            tool=tool.name,
            arguments=arguments,
            input_responses=input_responses,
            created_ms=now,
            partition=where.partition,
            offset=where.offset,
            ttl_ms=tool.ttl_ms,
        )
        producer = self._started_producer()
        try:
            topic = tool.job_topic or self.settings.topics.jobs(tool.name)
            await producer.send(
                topic, job.to_bytes(), key=task_id.encode(), headers=tracing.record_headers()
            )
        except Exception:
            log.exception("could not hand task %s to the %s workers", task_id, tool.name)
            why = "the job could not be queued"
            await self._publish_status(task_id, StatusPayload.failed(why, why))
        return TaskView(
            task_id=task_id,
            status="working",
            created_ms=now,
            last_updated_ms=now,
            ttl_ms=tool.ttl_ms,
            poll_interval_ms=tool.poll_interval_ms,
        )

    async def _publish_status(self, task_id: str, status: StatusPayload) -> None:
        where = await self.publisher.publish(task_id, self._types.status, status.payload())
        await self._visible(where.partition, where.offset)

    async def _visible(self, partition: int, offset: int) -> None:
        """Wait until this replica's view holds the record just written (acks=all: it is
        durable). A partition owned elsewhere is its owner's to index: a replica asked about a
        task it does not know catches up with the partition's end before it answers."""
        with contextlib.suppress(NotOwner):
            async with asyncio.timeout(_WRITE_VISIBLE_S):
                await self.indexer.wait_indexed(partition, offset)

    # --- get -----------------------------------------------------------------------------

    async def _catch_up(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CATCH_UP_S):
                await self.indexer.catch_up()

    async def _lookup(self, task_id: str) -> tuple[int, Any]:
        found = self.indexer.lookup(task_id)
        if found is None:
            # Another replica may have created it a moment ago: catch up, then decide.
            await self._catch_up()
            found = self.indexer.lookup(task_id)
        if found is None:
            raise TaskNotFound()
        return found

    async def _status_event(self, task_id: str, partition: int, offset: int) -> TaskEvent | None:
        key = (task_id, offset)
        cached = self._status_cache.get(key)
        if cached is None:
            cached = await self.reader.event_at(partition, offset)
            if cached is not None:
                self._status_cache.put(key, cached)
        return cached

    async def get(self, task_id: str, principal: str) -> TaskView:
        """The task as tasks/get shows it; :class:`TaskNotFound` for unknown/expired/foreign."""
        partition, entry = await self._lookup(task_id)
        if not entry.owned_by(owner_key(owner_digest(principal))):
            # Answer exactly like an unknown id, in time too: an unknown id costs a catch-up.
            await self._catch_up()
            raise TaskNotFound()
        ttl_ms = None if entry.ttl_ms < 0 else entry.ttl_ms
        now = self._now_ms()
        if ttl_ms is not None and entry.created_ms + ttl_ms <= now:
            raise TaskNotFound(expired=True)
        view = TaskView(
            task_id=task_id,
            status=entry.status.wire if entry.status is not TaskStatus.UNKNOWN else "working",
            created_ms=entry.created_ms,
            last_updated_ms=entry.created_ms,
            ttl_ms=ttl_ms,
            poll_interval_ms=entry.poll_ms,
        )
        if entry.status_offset > entry.first_offset:
            event = await self._status_event(task_id, partition, entry.status_offset)
            if event is not None:
                self._apply_status(view, event)
                return view
            view.retained = False
            if view.status == "completed":
                view.result = {"content": []}
                view.status_message = "the result is no longer retained"
        return view

    @staticmethod
    def _apply_status(view: TaskView, event: TaskEvent) -> None:
        try:
            status = StatusPayload.model_validate(event.payload)
        except ValidationError:
            return
        view.status = status.status
        view.last_updated_ms = event.timestamp_ms
        view.status_message = status.status_message
        if status.status == "completed":
            view.result = status.result or {"content": []}
        elif status.status == "failed":
            view.error = status.error or {"code": INTERNAL_ERROR, "message": "the job failed"}
        elif status.status == "input_required":
            view.input_requests = status.input_requests or {}

    @staticmethod
    def status_view(task_id: str, event: TaskEvent) -> TaskView | None:
        """The task as its status ``event`` alone shows it, without the index (None when the
        event holds no valid status): what a call that waited here answers when the event
        arrived just before the task's partition moved to another replica."""
        view = TaskView(task_id, "", event.timestamp_ms, event.timestamp_ms, None, 0)
        TaskService._apply_status(view, event)
        return view if view.status else None  # "" is no status: the event did not validate

    async def wait_until(self, task_id: str, principal: str, statuses: frozenset[str]) -> TaskView:
        """Wait until the task's status is one of ``statuses`` (the caller bounds the wait);
        :class:`NotOwner` when the task's partition moves to another replica meanwhile."""
        with self.watch(task_id) as sub:
            view = await self.get(task_id, principal)
            while view.status not in statuses:
                await self.next_events(sub)
                if self.status_changed(sub):
                    view = await self.get(task_id, principal)
            return view

    async def next_events(self, sub: TaskFeed) -> None:
        """Wait until a :meth:`watch` feed has something to take. :class:`NotOwner`
        once the task's partition moved away (nothing more arrives here: its owner serves it
        now), :class:`FeedClosed` if it was closed for another reason."""
        try:
            await sub.wait()
        except FeedClosed as exc:
            if exc.moved:
                raise NotOwner(self.indexer.partition_of(sub.task_id)) from None
            raise

    async def abandon(self, task_id: str) -> None:
        """Ask the workers to cancel the job of a task this replica created and no longer
        follows (its partition moved while a direct call waited on it): no view is read, as
        this replica may not index the task any more. A no-op for a finished job."""
        await self._control(ControlMessage(type="cancel", task_id=task_id))

    def status_changed(self, sub: TaskFeed) -> bool:
        """Take what ``sub`` buffered: True when a status event (or an overflow) was among it."""
        changed = sub.overflowed or any(e.event.type == self._types.status for e in sub.take())
        sub.reset()
        return changed

    async def wait_terminal(self, task_id: str, principal: str) -> TaskView:
        """Wait until the task is completed, failed or cancelled (the caller bounds it)."""
        return await self.wait_until(task_id, principal, TERMINAL_WIRE)

    # --- update / cancel -----------------------------------------------------------------

    async def _control(self, message: ControlMessage) -> None:
        await self._started_producer().send(
            self.settings.topics.control, message.to_bytes(), key=message.task_id.encode()
        )

    async def update(self, task_id: str, principal: str, responses: dict[str, Any]) -> None:
        """Deliver answers to outstanding input requests; others are ignored."""
        view = await self.get(task_id, principal)
        if view.status != "input_required" or not view.input_requests:
            return
        answered = {k: v for k, v in responses.items() if k in view.input_requests}
        if not answered:
            return
        remaining = {k: v for k, v in view.input_requests.items() if k not in answered}
        # The status is written before the worker can see the answers, so a new request the
        # worker makes after them always lands later in the log than this status.
        if remaining:
            status = StatusPayload(
                status="input_required",
                input_requests=remaining,
                status_message=view.status_message,
            )
        else:
            status = StatusPayload(status="working", status_message="input received")
        await self._publish_status(task_id, status)
        await self._control(ControlMessage(type="input", task_id=task_id, input_responses=answered))

    async def cancel(self, task_id: str, principal: str) -> None:
        """Ask the task's worker to cancel; a no-op for terminal tasks."""
        view = await self.get(task_id, principal)
        if not view.terminal:
            await self._control(ControlMessage(type="cancel", task_id=task_id))

"""The worker SDK: run tool jobs from Kafka and report their events into the task's log.

A :class:`Worker` consumes the job topics of its handlers in a consumer group (at-least-once:
a job's offset is committed only after its terminal status is in the log, so a worker that
crashes mid-job leaves the job to another worker). It also tails the control topic for cancel
requests and input answers. A handler is ``async def handler(ctx: JobContext) -> dict`` that
returns the tool's ``CallToolResult``; it can ``emit`` events, set a ``status`` message, ``ask``
for input and observe ``ctx.cancelled``. Raising :class:`JobError` fails the task with that
JSON-RPC error; any other exception fails it with -32603.

A worker that stops (SIGTERM) cancels its jobs in flight without reporting anything, leaving
them to the rest of the group; so does a worker whose job partitions a rebalance moved to
another member (that member runs them now). A retried job runs again from the start: events
of the crashed attempt stay in the log (seq is derived, so nothing is corrupted), answers
already given are reused by ``ask`` and a job whose "finished" mark is in the control topic is
not run twice. A copy still running when another worker's "finished" mark arrives stops at
once and emits nothing more: no event may follow a task's terminal status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from bridge import tracing
from bridge.clock import SYSTEM_CLOCK, Clock
from bridge.component import Component, NotStarted
from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import GroupTail, Log, LogError, LogRecord, Producer, Tail, TopicPart
from bridge.log.publisher import EventTooLarge, TaskEventPublisher
from bridge.tasks.messages import ControlMessage, JobRequest
from bridge.vocabulary import StatusPayload, error_object

__all__ = ["JobContext", "JobError", "JobHandler", "Worker"]

log = logging.getLogger(__name__)


class JobError(Exception):
    """Fail the task with this JSON-RPC error (a protocol-level failure, status ``failed``)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def error(self) -> dict[str, Any]:
        return error_object(self.code, self.message, self.data)


@dataclass
class _TaskControl:
    """What the control topic said about one task."""

    answers: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False
    finished: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def is_finished(self) -> bool:
        """Whether a worker has written the task's outcome (read anew after every await)."""
        return self.finished

    def apply(self, message: ControlMessage) -> None:
        if message.type == "cancel":
            self.cancelled = True
        elif message.type == "finished":
            self.finished = True
        elif message.input_responses:
            self.answers.update(message.input_responses)
        self.changed.set()
        self.changed = asyncio.Event()


class JobContext:
    """What a handler gets: the job, and ways to report progress into the task's log."""

    def __init__(self, worker: Worker, job: JobRequest, control: _TaskControl) -> None:
        self._worker = worker
        self._control = control
        self.job = job
        self.task_id = job.task_id
        self.tool = job.tool
        self.arguments = job.arguments
        #: Answers to the tool's ``input_before`` requests (multi round-trip), if it has any.
        self.input_responses = job.input_responses or {}
        self.cancelled = asyncio.Event()
        if control.cancelled:
            self.cancelled.set()

    async def emit(
        self, event_type: str, payload: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None:
        """Append a vendor-prefixed event to the task's stream."""
        if self._control.is_finished():
            raise asyncio.CancelledError  # another worker ended the task: nothing may follow
        await self._worker.publisher.publish(self.task_id, event_type, payload, meta=meta)

    async def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress; a direct call with a progressToken sees notifications/progress."""
        payload: dict[str, Any] = {"progress": progress}
        if total is not None:
            payload["total"] = total
        if message is not None:
            payload["message"] = message
        await self.emit(self._worker.settings.own_types.progress, payload)

    async def status(self, message: str) -> None:
        """Set the task's status message (the task stays ``working``)."""
        await self._worker.publish_status(
            self.task_id, StatusPayload(status="working", status_message=message)
        )

    async def ask(self, requests: dict[str, Any], message: str | None = None) -> dict[str, Any]:
        """Put the task in ``input_required`` with ``requests``; return the answers by key.

        Keys must be unique over the task's life. Answers already given (to an earlier attempt
        of this job) are reused without asking again.
        """
        missing = [k for k in requests if k not in self._control.answers]
        if missing:
            await self._worker.publish_status(
                self.task_id,
                StatusPayload(
                    status="input_required",
                    input_requests={k: requests[k] for k in missing},
                    status_message=message,
                ),
            )
        while any(k not in self._control.answers for k in requests):
            if self._control.cancelled:
                raise asyncio.CancelledError
            await self._control.changed.wait()
        return {k: self._control.answers[k] for k in requests}


JobHandler = Callable[[JobContext], Coroutine[Any, Any, dict[str, Any]]]


class Worker(Component):
    """Runs the handlers' jobs; ``async with Worker(settings, handlers) as w: await w.run()``.

    Cancel the task running :meth:`run` before leaving the ``async with`` block (or calling
    :meth:`stop`): stopping cancels the jobs in flight without reporting anything, so another
    worker of the group runs them again.
    """

    def __init__(
        self,
        settings: Settings,
        handlers: dict[str, JobHandler],
        *,
        group_id: str | None = None,
        concurrency: int = 32,
        job_topics: dict[str, str] | None = None,
        session_timeout_ms: int | None = None,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``clock``: where the control topic's look-back window starts (a simulation's is
        virtual)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.settings = settings
        self._clock = clock
        self.handlers = handlers
        self.group_id = group_id or f"{settings.topics.prefix}.workers"
        self.concurrency = concurrency
        #: How fast the group notices that this worker died (its jobs then move to others).
        self.session_timeout_ms = session_timeout_ms
        self.topics = {
            tool: (job_topics or {}).get(tool) or settings.topics.jobs(tool) for tool in handlers
        }
        #: Where jobs, control messages and outcomes are read and written.
        self._log: Log = log if log is not None else KafkaLog(settings, pool_size=1)
        self.publisher = TaskEventPublisher(settings, log=self._log)
        self._jobs: GroupTail | None = None
        self._control_tail: Tail | None = None
        self._producer: Producer | None = None
        self._control: dict[str, _TaskControl] = defaultdict(_TaskControl)
        self._running: dict[str, tuple[asyncio.Task[dict[str, Any]], JobContext]] = {}
        #: Per partition: offsets fetched and not finished (queued or running).
        self._pending: dict[TopicPart, set[int]] = defaultdict(set)
        #: Per partition: offsets finished here and not yet committed (skipped if re-fetched).
        self._done: dict[TopicPart, set[int]] = defaultdict(set)
        #: Per partition: the offset after the last record fetched since the last assignment.
        self._fetched: dict[TopicPart, int] = {}
        self._committed: dict[TopicPart, int] = {}
        #: Records waiting for a free slot, in fetch order.
        self._queue: deque[tuple[TopicPart, LogRecord]] = deque()
        self._job_tasks: set[asyncio.Task[None]] = set()
        #: The job partition of each task whose job runs here (a rebalance may move it).
        self._job_partitions: dict[str, TopicPart] = {}
        self._background: list[asyncio.Task[None]] = []
        self.completed = 0

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        await self.publisher.start()
        self._producer = self._log.producer("worker")
        await self._producer.start()
        await self._start_control()
        session = self.session_timeout_ms
        self._jobs = self._log.group_tail(
            self.group_id,
            list(self.topics.values()),
            _Rebalance(self),
            # Without a session of its own, the client's defaults (10 s, heartbeats every 3 s).
            session_timeout_ms=session or 10_000,
            heartbeat_interval_ms=max(100, session // 4) if session else 3000,
            max_poll_interval_ms=600_000,
            reset="earliest",
            role="worker",
        )
        await self._jobs.start()

    async def stop(self) -> None:
        """Cancel the jobs in flight (they stay uncommitted, for another worker) and close."""
        for task in [*self._job_tasks, *self._background]:
            task.cancel()
        for task in [*self._job_tasks, *self._background]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._job_tasks.clear()
        self._background.clear()
        if self._jobs is not None:
            # Commit what finished here (cancelled jobs stay uncommitted), then leave the group.
            with contextlib.suppress(Exception):
                await self._commit(self._jobs, self._jobs.assignment())
        for tail in (self._jobs, self._control_tail):
            if tail is not None:
                await tail.close()
        self._jobs = self._control_tail = None
        if self._producer is not None:
            await self._producer.close()
            self._producer = None
        await self.publisher.stop()

    # --- control topic -------------------------------------------------------------------

    async def _start_control(self) -> None:
        topic = self.settings.topics.control
        tail = self._log.tail("worker-control")
        self._control_tail = tail
        await tail.start()
        parts = [TopicPart(topic, p) for p in await self._log.partitions(topic)]
        since = int(self._clock.wall() * 1000) - self.settings.tasks.control_lookback_ms
        starts = await self._log.offsets_for_times({p: max(since, 0) for p in parts})
        ends = await self._log.log_ends(parts)
        first = {p: _or(starts.get(p), ends[p]) for p in parts}
        tail.assign(first)
        # Read what the lookback window holds before taking jobs, so a cancel or an answer
        # given before this worker started is known to the jobs it runs.
        remaining = {p for p in parts if first[p] < ends[p]}
        while remaining:
            polled = await tail.poll(0.5)
            for records in polled.records.values():
                for record in records:
                    self._on_control(record)
            remaining -= {p for p, at in polled.positions.items() if at >= ends[p]}
        self._background.append(asyncio.create_task(self._tail_control(tail)))

    def _on_control(self, record: LogRecord) -> None:
        try:
            message = ControlMessage.model_validate_json(record.value or b"")
        except ValidationError:
            log.warning("ignoring an unreadable control message at offset %d", record.offset)
            return
        self._control[message.task_id].apply(message)
        running = self._running.get(message.task_id)
        if running is None:
            return
        if message.type == "cancel":
            running[1].cancelled.set()
            running[0].cancel()
        elif message.type == "finished":
            running[0].cancel()  # another worker's outcome is in: this copy is a duplicate

    async def _tail_control(self, tail: Tail) -> None:
        while True:
            polled = await tail.poll(0.5)
            for records in polled.records.values():
                for record in records:
                    self._on_control(record)

    # --- jobs ----------------------------------------------------------------------------

    async def publish_status(self, task_id: str, status: StatusPayload) -> None:
        await self.publisher.publish(task_id, self.settings.own_types.status, status.payload())

    async def run(self) -> None:
        """Take jobs until cancelled.

        At most ``concurrency`` jobs run at once. While every slot is taken the job partitions
        are paused, but the consumer keeps polling, so the group does not drop a worker whose
        jobs wait a long time (for input, say) and hand its jobs to another worker.
        """
        jobs = self._jobs
        if jobs is None:
            raise NotStarted("the worker")
        while True:
            self._start_queued()
            assigned = jobs.assignment()
            if self._queue:
                jobs.pause(*assigned)
            else:
                jobs.resume(*assigned)
            polled = await jobs.poll(0.1 if self._queue else 0.5)
            for tp, records in polled.records.items():
                pending, done = self._pending[tp], self._done[tp]
                for record in records:
                    # After a rebalance the partition is read again from the committed
                    # offset: never start a second copy of a job this worker has.
                    if record.offset not in pending and record.offset not in done:
                        pending.add(record.offset)
                        self._queue.append((tp, record))
                if records:
                    self._fetched[tp] = records[-1].offset + 1
            self._start_queued()
            await self._commit(jobs, jobs.assignment())

    def _start_queued(self) -> None:
        while self._queue and len(self._job_tasks) < self.concurrency:
            tp, record = self._queue.popleft()
            task = asyncio.create_task(self._run_job(tp, record))
            self._job_tasks.add(task)
            task.add_done_callback(self._job_tasks.discard)

    def _commit_point(self, tp: TopicPart) -> int | None:
        """The offset to commit for ``tp``: its first unfinished job, else all it fetched."""
        pending = self._pending.get(tp)
        if pending:
            return min(pending)
        return self._fetched.get(tp)

    async def _commit(self, jobs: GroupTail, partitions: Iterable[TopicPart]) -> None:
        offsets = {}
        for tp in partitions:
            point = self._commit_point(tp)
            if point is not None and point > self._committed.get(tp, -1):
                offsets[tp] = point
        if not offsets:
            return
        try:
            await jobs.commit(offsets)
        except LogError as exc:  # e.g. a rebalance in progress; the next round retries
            log.warning("could not commit job offsets (%s); will retry", exc)
            return
        for tp, point in offsets.items():
            self._committed[tp] = point
            self._done[tp] = {o for o in self._done[tp] if o >= point}

    async def _revoked(self, jobs: GroupTail, revoked: set[TopicPart]) -> None:
        """Before a rebalance: commit what is finished, forget the queued (unstarted) jobs."""
        await self._commit(jobs, revoked)
        dropped = [(tp, r) for tp, r in self._queue if tp in revoked]
        self._queue = deque((tp, r) for tp, r in self._queue if tp not in revoked)
        for tp, record in dropped:
            self._pending[tp].discard(record.offset)
        for tp in revoked:
            # Positions restart from the committed offsets; jobs still running here stay in
            # _pending (so they are not started twice if the partition comes back).
            self._fetched.pop(tp, None)
            self._committed.pop(tp, None)

    def _assigned(self, assigned: set[TopicPart]) -> None:
        """After a rebalance: stop the jobs of partitions that went elsewhere (their new
        owner runs them from the committed offset; two copies would both write events, one of
        them after the other's terminal status) and forget those partitions."""
        for task_id, tp in self._job_partitions.items():
            running = self._running.get(task_id)
            if tp not in assigned and running is not None:
                # Like a stopping worker: nothing reported. A job already writing its outcome
                # finishes that (the new owner then finds its "finished" mark).
                running[0].cancel()
        for tp in [tp for tp in self._pending if tp not in assigned]:
            del self._pending[tp]
            self._done.pop(tp, None)

    async def _run_job(self, tp: TopicPart, record: LogRecord) -> None:
        try:
            job = JobRequest.model_validate_json(record.value or b"")
        except ValidationError:
            job = None
            task_id = (record.key or b"").decode("utf-8", "replace")
            log.error(
                "unreadable job request at %s offset %d (task %s)", tp, record.offset, task_id
            )
            why = "the job request could not be read"
            if task_id:
                # Never leave the task working for ever: it fails with a clear error.
                await self._finish(
                    task_id,
                    StatusPayload.failed(why, why),
                )
        if job is not None:
            # Cancellation (the worker stopping) leaves the job unfinished: not marked done,
            # so its offset is never committed and another worker runs it.
            self._job_partitions[job.task_id] = tp
            try:
                with tracing.job_span(record.headers, job.tool, job.task_id):
                    await self._execute(job)
            except Exception:
                # A bug, not a tool failure (those become statuses): keep the job pending, so
                # its offset is not committed and a restarted worker runs it again.
                log.exception(
                    "job of task %s at %s offset %d broke", job.task_id, tp, record.offset
                )
                return
            finally:
                self._job_partitions.pop(job.task_id, None)
        self._pending[tp].discard(record.offset)
        self._done[tp].add(record.offset)

    async def _execute(self, job: JobRequest) -> None:
        control = self._control[job.task_id]
        if control.is_finished():
            return
        handler = self.handlers.get(job.tool)
        if handler is None:
            # -32603, not -32601: the client's tools/call exists and the bridge listed the tool;
            # a worker group without its handler is the deployment's fault (docs/workers.md).
            outcome = StatusPayload.failed(f"no handler for tool {job.tool}")
        elif control.cancelled:
            outcome = StatusPayload(
                status="cancelled", status_message="cancelled before it started"
            )
        else:
            outcome = await self._outcome(handler, JobContext(self, job, control), control)
            if control.is_finished():
                # Another worker finished this task meanwhile (the job was handed to it by a
                # rebalance while it ran here): its outcome stands, do not report a second one.
                return
        await self._finish(job.task_id, outcome)
        self.completed += 1

    async def _finish(self, task_id: str, outcome: StatusPayload) -> None:
        """Write the terminal status, then the "finished" mark; retry until both are written.

        A job whose outcome cannot be written must not count as done (its offset would be
        committed and the task would stay ``working`` for ever), so Kafka errors are retried
        with backoff until the write succeeds or the worker stops.
        """
        if self._producer is None:
            raise NotStarted("the worker")
        finished = ControlMessage(type="finished", task_id=task_id)
        status_written = False
        delay = 0.5
        while True:
            try:
                if not status_written:
                    try:
                        await self.publish_status(task_id, outcome)
                    except EventTooLarge as exc:
                        outcome = StatusPayload.failed(str(exc), "the tool's result is too large")
                        continue
                    status_written = True
                await self._producer.send(
                    self.settings.topics.control, finished.to_bytes(), key=task_id.encode()
                )
                return
            except LogError as exc:  # the publisher's, the producer's (the port maps every error)
                log.warning("task %s: could not write the outcome (%s); retrying", task_id, exc)
            await asyncio.sleep(delay)  # backoff before retrying a failed write
            delay = min(delay * 2, 30.0)

    async def _outcome(
        self, handler: JobHandler, ctx: JobContext, control: _TaskControl
    ) -> StatusPayload:
        run = asyncio.create_task(handler(ctx))
        self._running[ctx.task_id] = (run, ctx)
        try:
            result: Any = await run
        except asyncio.CancelledError:
            if control.is_finished():
                # Another worker's outcome stands; the caller reports nothing (the job is done).
                return StatusPayload(status="cancelled", status_message="finished elsewhere")
            if not control.cancelled:
                raise  # the worker itself is stopping: leave the job to another worker
            return StatusPayload(
                status="cancelled", status_message="cancelled at the client's request"
            )
        except JobError as exc:
            return StatusPayload(status="failed", status_message=exc.message, error=exc.error())
        except Exception:
            log.exception("tool %s failed on task %s", ctx.tool, ctx.task_id)
            return StatusPayload.failed(f"internal error in tool {ctx.tool}", "the tool failed")
        finally:
            self._running.pop(ctx.task_id, None)
        if not isinstance(result, dict):
            return StatusPayload.failed("the tool returned no result object")
        return StatusPayload(status="completed", result=result)


def _or(found: int | None, otherwise: int) -> int:
    return otherwise if found is None else found


class _Rebalance:
    """Commits a worker's finished jobs before its partitions move to another worker (the
    group's callbacks, a port GroupListener)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        jobs = self.worker._jobs
        if jobs is not None:
            await self.worker._revoked(jobs, set(parts))

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        self.worker._assigned(set(parts))

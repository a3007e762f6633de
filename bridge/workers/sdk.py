"""The worker SDK: run tool jobs from Kafka and report their events into the task's log.

A :class:`Worker` consumes the job topics of its handlers in a consumer group (at-least-once:
a job's offset is committed only after its terminal status is in the log, so a worker that
crashes mid-job leaves the job to another worker). It also tails the control topic for cancel
requests and input answers. A handler is ``async def handler(ctx: JobContext) -> dict`` that
returns the tool's ``CallToolResult``; it can ``emit`` events, set a ``status`` message, ``ask``
for input and observe ``ctx.cancelled``. Raising :class:`JobError` fails the task with that
JSON-RPC error; any other exception fails it with -32603.

A retried job runs again from the start: events of the crashed attempt stay in the log (seq is
derived, so nothing is corrupted), answers already given are reused by ``ask`` and a job whose
"finished" mark is in the control topic is not run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from pydantic import ValidationError

from bridge.config import Settings
from bridge.constants import EventSuffix
from bridge.kafka.clients import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRecord,
    TopicPartition,
    committed_consumer,
    idempotent_producer,
)
from bridge.kafka.topics import topic_partition_ids
from bridge.log.publisher import TaskEventPublisher
from bridge.tasks.messages import ControlMessage, JobRequest, StatusPayload

__all__ = ["Handler", "JobContext", "JobError", "Worker"]

log = logging.getLogger(__name__)


class JobError(Exception):
    """Fail the task with this JSON-RPC error (a protocol-level failure, status ``failed``)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def error(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


@dataclass
class _TaskControl:
    """What the control topic said about one task."""

    answers: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False
    finished: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

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
        await self.emit(
            f"{self._worker.settings.event_type_prefix}.{EventSuffix.PROGRESS}", payload
        )

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


Handler = Callable[[JobContext], Coroutine[Any, Any, dict[str, Any]]]


class Worker:
    """Runs the handlers' jobs; ``async with Worker(settings, handlers) as w: await w.run()``."""

    def __init__(
        self,
        settings: Settings,
        handlers: dict[str, Handler],
        *,
        group_id: str | None = None,
        concurrency: int = 32,
        job_topics: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.handlers = handlers
        self.group_id = group_id or f"{settings.topics.prefix}.workers"
        self.topics = {
            tool: (job_topics or {}).get(tool) or settings.topics.jobs(tool) for tool in handlers
        }
        self.publisher = TaskEventPublisher(settings)
        self._slots = asyncio.Semaphore(concurrency)
        self._jobs: AIOKafkaConsumer | None = None
        self._control_consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._control: dict[str, _TaskControl] = defaultdict(_TaskControl)
        self._running: dict[str, tuple[asyncio.Task[dict[str, Any]], JobContext]] = {}
        self._pending: dict[TopicPartition, set[int]] = defaultdict(set)
        self._done: dict[TopicPartition, set[int]] = defaultdict(set)
        self._background: list[asyncio.Task[None]] = []
        self._control_ready = asyncio.Event()
        self.completed = 0

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        await self.publisher.start()
        self._producer = idempotent_producer(self.settings, role="worker")
        await self._producer.start()
        await self._start_control()
        self._jobs = committed_consumer(
            self.settings,
            role="worker",
            group_id=self.group_id,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_interval_ms=600_000,
        )
        self._jobs.subscribe(list(self.topics.values()))
        await self._jobs.start()

    async def stop(self) -> None:
        for task in [*(t for t, _ in self._running.values()), *self._background]:
            task.cancel()
        for task in [*(t for t, _ in self._running.values()), *self._background]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for client in (self._jobs, self._control_consumer):
            if client is not None:
                await client.stop()
        if self._producer is not None:
            await self._producer.stop()
        await self.publisher.stop()

    # --- control topic -------------------------------------------------------------------

    async def _start_control(self) -> None:
        topic = self.settings.topics.control
        consumer = committed_consumer(self.settings, role="worker-control")
        await consumer.start()
        self._control_consumer = consumer
        tps = [TopicPartition(topic, p) for p in await topic_partition_ids(self.settings, topic)]
        consumer.assign(tps)
        since = time.time_ns() // 1_000_000 - self.settings.control_lookback_ms
        starts = await consumer.offsets_for_times({tp: max(since, 0) for tp in tps})
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            found = starts.get(tp)
            consumer.seek(tp, found.offset if found is not None else ends[tp])
        # Read what the lookback window holds before taking jobs, so a cancel or an answer
        # given before this worker started is known to the jobs it runs.
        remaining = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=500)
            for records in batches.values():
                for record in records:
                    self._on_control(record)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        self._background.append(asyncio.create_task(self._tail_control(consumer)))

    def _on_control(self, record: ConsumerRecord[bytes, bytes]) -> None:
        try:
            message = ControlMessage.model_validate_json(record.value or b"")
        except ValidationError:
            log.warning("ignoring an unreadable control message at offset %d", record.offset)
            return
        self._control[message.task_id].apply(message)
        running = self._running.get(message.task_id)
        if message.type == "cancel" and running is not None:
            running[1].cancelled.set()
            running[0].cancel()

    async def _tail_control(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    self._on_control(record)

    # --- jobs ----------------------------------------------------------------------------

    async def publish_status(self, task_id: str, status: StatusPayload) -> None:
        await self.publisher.publish(
            task_id, f"{self.settings.event_type_prefix}.{EventSuffix.STATUS}", status.payload()
        )

    async def run(self) -> None:
        """Take jobs until cancelled."""
        consumer = self._jobs
        assert consumer is not None, "worker not started"
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    await self._slots.acquire()
                    self._pending[tp].add(record.offset)
                    task = asyncio.create_task(self._run_job(tp, record))
                    task.add_done_callback(lambda _t: self._slots.release())
            await self._commit(consumer)

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        """Commit, per partition, up to the first job that has not finished."""
        offsets = {}
        for tp, done in self._done.items():
            pending = self._pending[tp]
            if not done:
                continue
            lowest_pending = min(pending) if pending else None
            finished = [o for o in done if lowest_pending is None or o < lowest_pending]
            if finished:
                offsets[tp] = max(finished) + 1
                done.difference_update(finished)
        if offsets:
            await consumer.commit(offsets)

    async def _run_job(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes]) -> None:
        try:
            job = JobRequest.model_validate_json(record.value or b"")
        except ValidationError:
            log.error("skipping an unreadable job request at %s offset %d", tp, record.offset)
            job = None
        try:
            if job is not None:
                await self._execute(job)
        finally:
            self._pending[tp].discard(record.offset)
            self._done[tp].add(record.offset)

    async def _execute(self, job: JobRequest) -> None:
        control = self._control[job.task_id]
        if control.finished:
            return
        handler = self.handlers.get(job.tool)
        if handler is None:
            outcome = StatusPayload(
                status="failed",
                error={"code": -32601, "message": f"no handler for tool {job.tool}"},
            )
        elif control.cancelled:
            outcome = StatusPayload(
                status="cancelled", status_message="cancelled before it started"
            )
        else:
            outcome = await self._outcome(handler, JobContext(self, job, control), control)
        await self.publish_status(job.task_id, outcome)
        assert self._producer is not None
        finished = ControlMessage(type="finished", task_id=job.task_id)
        await self._producer.send_and_wait(
            self.settings.topics.control, key=job.task_id.encode(), value=finished.to_bytes()
        )
        self.completed += 1

    async def _outcome(
        self, handler: Handler, ctx: JobContext, control: _TaskControl
    ) -> StatusPayload:
        run = asyncio.create_task(handler(ctx))
        self._running[ctx.task_id] = (run, ctx)
        try:
            result: Any = await run
        except asyncio.CancelledError:
            if not control.cancelled:
                raise  # the worker itself is stopping: leave the job to another worker
            return StatusPayload(
                status="cancelled", status_message="cancelled at the client's request"
            )
        except JobError as exc:
            return StatusPayload(status="failed", status_message=exc.message, error=exc.error())
        except Exception:
            log.exception("tool %s failed on task %s", ctx.tool, ctx.task_id)
            return StatusPayload(
                status="failed",
                status_message="the tool failed",
                error={"code": -32603, "message": f"internal error in tool {ctx.tool}"},
            )
        finally:
            self._running.pop(ctx.task_id, None)
        if not isinstance(result, dict):
            return StatusPayload(
                status="failed",
                error={"code": -32603, "message": "the tool returned no result object"},
            )
        return StatusPayload(status="completed", result=result)

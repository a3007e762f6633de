"""tasks/stream (SEP-2694): resumable, gap-free task event streams served from Kafka.

The :class:`StreamHub` is one listener on the process's indexer, whose tail is the only Kafka
reader of live events: every indexed event is offered to the streams of its task through a
bounded queue, never blocking the tail. A stream first registers for live events, then reads
history through the :class:`~bridge.log.reader.Reader` (checkpoint seek), then drains its
queue; it delivers exactly ``last + 1`` each time, so nothing is skipped or repeated across the
hand-off. A stream whose queue overflows (its client reads slowly) drops back to catch-up
reads from Kafka until it is level again; no event is lost for anyone.

A stream ends with the empty result once the task's terminal status event (the first one, as
the index folds it) has been delivered. Closing the HTTP stream ends only the stream; the task
goes on. "Connection" on stateless HTTP is defined as the principal: one active stream per
(principal, task) per replica (see docs/tasks-stream.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from bridge.config import Settings
from bridge.constants import EventSuffix
from bridge.envelope import TaskEvent
from bridge.log.indexer import IndexedEvent, Indexer
from bridge.log.reader import EventsGone, Reader, SeqUntrusted
from bridge.metrics import Metrics
from bridge.server.wire import (
    EVENTS_GONE,
    INVALID_PARAMS,
    INVALID_REQUEST,
    RELATED_TASK_META,
    RpcError,
    dumps,
)

__all__ = ["StreamHub", "cursor_prefix", "decode_cursor", "encode_cursor", "events_gone_error"]

log = logging.getLogger(__name__)

_CURSOR_PREFIX = "v1."


def cursor_prefix(request_id: str | int, task_id: str) -> str:
    """The part of a stream's cursors that names the request and the task (one per stream)."""
    raw = f"{type(request_id).__name__[0]}{request_id}\x00{task_id}".encode()
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=") + "."


def encode_cursor(request_id: str | int, task_id: str, seq: int) -> str:
    """The SSE ``id`` of an event: opaque to clients, it names the request, task and seq."""
    return f"{cursor_prefix(request_id, task_id)}{seq}"


def decode_cursor(cursor: str) -> tuple[str | int, str, int]:
    """``(request id, task id, seq)``; ValueError for anything that is not our cursor."""
    if not cursor.startswith(_CURSOR_PREFIX):
        raise ValueError("not a stream cursor")
    body, _, seq_text = cursor[len(_CURSOR_PREFIX) :].rpartition(".")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        rid, task_id = raw.split("\x00")
        if not seq_text.isdigit():
            raise ValueError(seq_text)
        seq = int(seq_text)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a stream cursor") from None
    if not task_id or not rid or rid[0] not in "is":
        raise ValueError("not a stream cursor")
    request_id: str | int = int(rid[1:]) if rid[0] == "i" else rid[1:]
    return request_id, task_id, seq


def seq_untrusted_error(exc: SeqUntrusted) -> RpcError:
    return RpcError(INVALID_PARAMS, str(exc), {"reason": "seq_untrusted", "taskId": exc.task_id})


def events_gone_error(task_id: str, earliest_seq: int, *, http_status: int = 200) -> RpcError:
    return RpcError(
        EVENTS_GONE,
        "Task events are no longer available",
        {"reason": "events_gone", "taskId": task_id, "earliestSeq": earliest_seq},
        http_status=http_status,
    )


class _Subscription:
    """One stream's place in the fan-out: a bounded buffer the tail appends to, never waiting."""

    __slots__ = ("buffer", "closed", "limit", "overflowed", "partition", "task_id", "waiter")

    def __init__(self, task_id: str, partition: int, limit: int) -> None:
        self.task_id = task_id
        self.partition = partition
        self.limit = limit
        self.buffer: deque[IndexedEvent] = deque()
        self.overflowed = False
        self.closed = False  # the process is draining
        self.waiter: asyncio.Future[None] | None = None

    def offer(self, indexed: IndexedEvent) -> bool:
        """Buffer a live event; False (and overflowed) when the stream is too far behind."""
        if len(self.buffer) >= self.limit:
            self.overflowed = True
            self.buffer.clear()
        else:
            self.buffer.append(indexed)
        self._wake()
        return not self.overflowed

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, idle_s: float) -> bool:
        """Wait up to ``idle_s`` seconds for something to do; False when idle that long."""
        if self.buffer or self.overflowed or self.closed:
            return True
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(idle_s):
                await self.waiter
        except TimeoutError:
            return False
        finally:
            self.waiter = None
        return True


Batch = list[tuple[int, TaskEvent]]


class StreamHub:
    """Fans the indexer's live events out to the active streams of this process."""

    def __init__(
        self, settings: Settings, indexer: Indexer, reader: Reader, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.indexer = indexer
        self.reader = reader
        self.metrics = metrics
        self.draining = asyncio.Event()
        self._subs: dict[str, set[_Subscription]] = defaultdict(set)
        self._active: dict[tuple[str, str], int] = {}
        self._per_principal: dict[str, int] = defaultdict(int)
        self._opens: dict[str, deque[float]] = defaultdict(deque)
        self._status_type = f"{settings.event_type_prefix}.{EventSuffix.STATUS}"
        indexer.add_listener(self._on_event)

    def drain(self) -> None:
        """SIGTERM: end every stream now, without its result, so clients resume elsewhere."""
        self.draining.set()
        for subs in self._subs.values():
            for sub in subs:
                sub.close()

    @property
    def active_streams(self) -> int:
        return len(self._active)

    def _on_event(self, indexed: IndexedEvent) -> None:
        for sub in self._subs.get(indexed.task_id, ()):
            if not sub.overflowed and not sub.offer(indexed):
                # The stream re-reads from Kafka; the tail never waits for a slow client.
                self.metrics.slow_fallbacks.inc()

    # --- admission -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _admit(self, principal: str, task_id: str) -> Any:
        key = (principal, task_id)
        if key in self._active:
            raise RpcError(
                INVALID_PARAMS,
                "a tasks/stream for this task is already active on this connection; cancel it first",
                {"reason": "stream_active", "taskId": task_id},
            )
        limit = self.settings.max_streams_per_principal
        if self._per_principal[principal] >= limit:
            raise RpcError(
                INVALID_REQUEST,
                f"too many active streams for this principal (limit {limit})",
                {"reason": "too_many_streams", "limit": limit},
                http_status=429,
            )
        self._active[key] = 1
        self._per_principal[principal] += 1
        self.metrics.streams_active.inc()
        try:
            yield
        finally:
            self.metrics.streams_active.dec()
            del self._active[key]
            self._per_principal[principal] -= 1
            if not self._per_principal[principal]:
                del self._per_principal[principal]

    # --- one stream ----------------------------------------------------------------------

    def check_admission(self, principal: str, task_id: str) -> None:
        """Refuse early (before the SSE response starts) what :meth:`events` would refuse."""
        self._rate(principal, record=False)
        with self._admit(principal, task_id):
            pass

    def _rate(self, principal: str, *, record: bool) -> None:
        """At most ``max_stream_opens_per_minute`` opens per principal (cursor/id guessing)."""
        window = self._opens[principal]
        now = time.monotonic()
        while window and window[0] <= now - 60:
            window.popleft()
        limit = self.settings.max_stream_opens_per_minute
        if len(window) >= limit:
            raise RpcError(
                INVALID_REQUEST,
                f"too many tasks/stream requests for this principal (limit {limit} a minute)",
                {"reason": "rate_limited", "retryAfterSeconds": round(window[0] + 60 - now, 1)},
                http_status=429,
            )
        if record:
            window.append(now)

    async def check_cursor(self, task_id: str, after: int | None) -> None:
        """Raise events_gone / refuse untrusted seq before any byte of the stream is sent."""
        try:
            if after is None:
                await self.reader.head(task_id)  # refuses a task whose seq cannot be trusted
                return
            earliest = await self.reader.earliest_seq(task_id)
        except SeqUntrusted as exc:
            raise seq_untrusted_error(exc) from None
        if after + 1 < earliest:
            raise events_gone_error(task_id, earliest)

    async def events(
        self, principal: str, task_id: str, after: int | None
    ) -> AsyncIterator[Batch | None]:
        """The stream's events in seq order, in batches; ``None`` items are keep-alive ticks.

        Ends after the task's terminal status event, or at once for a terminal task with
        nothing after the cursor. Raises :class:`RpcError` for events_gone found mid-stream.
        """
        self._rate(principal, record=True)
        with self._admit(principal, task_id):
            self.metrics.stream_opens.labels("fresh" if after is None else "resume").inc()
            partition = self.indexer.partition_of(task_id)
            sub = _Subscription(task_id, partition, self.settings.stream_queue_size)
            self._subs[task_id].add(sub)
            try:
                async for item in self._run(sub, task_id, after):
                    yield item
            finally:
                subs = self._subs[task_id]
                subs.discard(sub)
                if not subs:
                    del self._subs[task_id]

    def _terminal_offset(self, task_id: str) -> int | None:
        found = self.indexer.lookup(task_id)
        if found is None or not found[1].terminal:
            return None
        return found[1].status_offset

    async def _run(
        self, sub: _Subscription, task_id: str, after: int | None
    ) -> AsyncIterator[Batch | None]:
        last = -1 if after is None else after
        first_read = after is None
        keepalive = self.settings.stream_keepalive_s
        while True:
            if self.draining.is_set():
                return
            # Catch up from Kafka: history, or what the buffer dropped while the client was slow.
            sub.overflowed = False
            sub.buffer.clear()
            self.metrics.catchup_reads.inc()
            # Terminal before the read: the read reaches the head, past the terminal event (or
            # that event is gone with retention), so nothing can follow it live.
            terminal_before = self._terminal_offset(task_id) is not None
            try:
                reading = self.reader.read_batches(
                    task_id, None if first_read or last < 0 else last
                )
                async for chunk in reading:
                    batch: Batch = []
                    ended = False
                    for event in chunk:
                        if event.seq <= last:
                            continue
                        if event.seq != last + 1 and not (first_read and last == -1):
                            self.metrics.seq_gaps.inc()  # the canary: never expected
                            raise RpcError(
                                -32603, "internal error: a seq gap in catch-up", {"taskId": task_id}
                            )
                        last = event.seq
                        batch.append((event.seq, event.event))
                        if self._ends(task_id, event.offset, event.event):
                            ended = True
                            break
                    if batch:
                        self._delivered(sub, batch, live=False)
                        yield batch
                    if ended:
                        return
            except EventsGone as exc:
                raise events_gone_error(task_id, exc.earliest_seq) from None
            except SeqUntrusted as exc:
                raise seq_untrusted_error(exc) from None
            if first_read and last < 0:
                # Nothing retained: the next event is the task's earliest retained seq (its
                # head when everything is gone), whatever arrives live from here.
                try:
                    last = await self.reader.earliest_seq(task_id) - 1
                except SeqUntrusted as exc:
                    raise seq_untrusted_error(exc) from None
            first_read = False
            if terminal_before:
                return  # a finished task: everything retained after the cursor was replayed
            # Live: take what the tail buffered, delivering exactly last + 1 each time.
            while True:
                if not await sub.wait(keepalive):
                    yield None  # idle: keep-alive
                    continue
                if sub.closed or self.draining.is_set():
                    return
                if sub.overflowed:
                    break  # fell behind: catch up from Kafka
                batch = []
                gap = ended = False
                while sub.buffer:
                    indexed = sub.buffer.popleft()
                    if indexed.seq <= last:
                        continue
                    if indexed.seq > last + 1:
                        gap = True  # re-read from Kafka
                        break
                    last = indexed.seq
                    batch.append((indexed.seq, indexed.event))
                    if self._ends(task_id, indexed.offset, indexed.event):
                        ended = True
                        break
                if batch:
                    self._delivered(sub, batch, live=True)
                    yield batch
                if ended:
                    return
                if gap:
                    break

    def _delivered(self, sub: _Subscription, batch: Batch, *, live: bool) -> None:
        """Count a batch about to be written: one backlog and one latency sample per write."""
        m = self.metrics
        m.events_delivered.inc(len(batch))
        head = self.indexer.partitions[sub.partition].next_seq_of(sub.task_id)
        if head is not None:
            m.backlog.observe(max(0, head - 1 - batch[-1][0]))
        if live:  # the oldest event of the batch waited longest
            m.delivery_latency.observe(max(0.0, time.time() - batch[0][1].timestamp_ms / 1000))

    def _ends(self, task_id: str, offset: int, event: TaskEvent) -> bool:
        return event.type == self._status_type and self._terminal_offset(task_id) == offset

    # --- wire --------------------------------------------------------------------------

    @staticmethod
    def renderer(task_id: str) -> Callable[[int, TaskEvent], str]:
        """A function rendering one notification as single-line JSON, for one stream.

        The same JSON as ``dumps(notification(...))``; the parts fixed for the stream (the task
        id, the related-task ``_meta``) are serialised once instead of for every event.
        """
        head = '{"jsonrpc":"2.0","method":"notifications/tasks/event","params":{"seq":'
        task_json = dumps(task_id)
        related = {"taskId": task_id}
        plain_meta = dumps({RELATED_TASK_META: related})

        def render(seq: int, event: TaskEvent) -> str:
            meta = (
                plain_meta if not event.meta else dumps({**event.meta, RELATED_TASK_META: related})
            )
            return (
                f'{head}{seq},"taskId":{task_json},"type":{dumps(event.type)},'
                f'"payload":{dumps(event.payload)},"_meta":{meta}}}}}'
            )

        return render

    @staticmethod
    def notification(task_id: str, seq: int, event: TaskEvent) -> dict[str, Any]:
        meta = dict(event.meta or {})
        meta[RELATED_TASK_META] = {"taskId": task_id}
        return {
            "jsonrpc": "2.0",
            "method": "notifications/tasks/event",
            "params": {
                "seq": seq,
                "taskId": task_id,
                "type": event.type,
                "payload": event.payload,
                "_meta": meta,
            },
        }

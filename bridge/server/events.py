"""The Events extension's methods (SEP-3415): ``events/list``, ``events/poll``, ``events/stream``.

A :class:`~bridge.server.handlers.MethodSet` (declared in ``server/discover`` as
``io.modelcontextprotocol/events`` with empty settings: no ``notifications/events/list_changed``)
over the event sources of :mod:`bridge.mcpevents`. This module owns the wire shapes of the
extension (params, notifications, the five error codes) and maps the sources' exceptions to them
once (:func:`_mapped`). Webhook delivery is not offered: ``events/subscribe`` and
``events/unsubscribe`` answer ``Unsupported`` for a known event name, as the draft says for a
delivery mode an event type does not list.

Push: one SSE response per ``events/stream``; ``notifications/events/active`` first, then
``event`` and ``heartbeat`` (carrying the cursor), each with the request id in
``_meta["io.modelcontextprotocol/subscriptionId"]``. A read failure is reported with
``notifications/events/error`` and retried from the last cursor sent; repeated failures, or the
task becoming invisible, end the stream with ``notifications/events/terminated``. The final
``StreamEventsResult`` is sent only when the server ends the stream (after a task's terminal
status event); a draining process closes streams without it, so clients resume elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from bridge.config import Settings
from bridge.events import FORBIDDEN, NOT_FOUND, UNSUPPORTED
from bridge.mcpevents import (
    BadCursor,
    EventSource,
    Heartbeat,
    InvalidArguments,
    Occurrence,
    StreamItem,
)
from bridge.mcpevents.configured import ConfiguredSource, NotPermitted
from bridge.mcpevents.cursor import decode_page, encode_page
from bridge.mcpevents.kafkalog import LiveTopics, TopicReader
from bridge.mcpevents.sources import LiveEvents, TaskEvents, TaskLog, TaskLookup
from bridge.mcpevents.taskupdates import TaskUpdates
from bridge.server.handlers import Call, MethodHandler, Outcome, Streamed
from bridge.server.wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    SUBSCRIPTION_ID_META,
    EventsListParams,
    EventsPollParams,
    EventsSubscriptionParams,
    RpcError,
    events_notification,
    result_response,
)
from bridge.tasks.service import TaskNotFound

__all__ = [
    "EVENTS_EXTENSION",
    "EventsMethods",
    "events_extension",
]

EVENTS_EXTENSION = "io.modelcontextprotocol/events"

#: events/poll's maxEvents when the client gives none, and the most it may ask for.
DEFAULT_MAX_EVENTS = 100
MAX_EVENTS = 1000
#: events/list entries per page.
PAGE_SIZE = 50
#: Consecutive failed reads of a push stream before it is terminated.
STREAM_ATTEMPTS = 5
#: events/poll's nextPollMs for task.updated (the draft's recommended client floor).
TASK_UPDATES_POLL_MS = 1000


def _not_found(name: str) -> RpcError:
    return RpcError(NOT_FOUND, f"Unknown event: {name}", {"kind": "event"})


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """The sources' exceptions as the draft's errors (here and only here)."""
    try:
        yield
    except TaskNotFound as exc:
        # Unknown, expired and another principal's task are one answer, as in tasks/get.
        raise RpcError(NOT_FOUND, str(exc), {"kind": "task"}) from None
    except InvalidArguments as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None
    except BadCursor as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None
    except NotPermitted as exc:
        raise RpcError(FORBIDDEN, "Forbidden", {"reason": str(exc)}) from None


def _stream_message(item: StreamItem, subscription_id: Any) -> dict[str, Any]:
    if isinstance(item, Occurrence):
        return events_notification("event", subscription_id, **item.wire(with_cursor=True))
    if isinstance(item, Heartbeat):
        return events_notification("heartbeat", subscription_id, cursor=item.cursor)
    return events_notification(
        "active", subscription_id, cursor=item.cursor, truncated=item.truncated
    )


def events_extension(
    settings: Settings,
    tasks: TaskLookup,
    log: TaskLog,
    live: LiveEvents,
    stopping: asyncio.Event,
) -> EventsMethods:
    """The extension with the bridge's event sources (what :mod:`bridge.server.app` wires)."""
    task_events = TaskEvents(
        f"{settings.own_types.prefix}.task.event",
        tasks,
        log,
        live,
        status_type=settings.own_types.status,
        queue_size=settings.stream_queue_size,
        heartbeat_s=settings.stream_keepalive_s,
        stopping=stopping,
    )
    return EventsMethods(
        [task_events, *offset_sources(settings, tasks, stopping)], stopping=stopping
    )


def offset_sources(
    settings: Settings, tasks: TaskLookup, stopping: asyncio.Event
) -> list[EventSource]:
    """``<prefix>.task.updated`` and the configured sources, in the settings' order; they share
    one pool of history readers and one live tail per topic."""
    reader = TopicReader(settings)
    common: dict[str, Any] = {
        "queue_size": settings.stream_queue_size,
        "heartbeat_s": settings.stream_keepalive_s,
        "stopping": stopping,
    }
    live = LiveTopics(settings, reader)
    updates = TaskUpdates(
        f"{settings.own_types.prefix}.task.updated",
        settings.topics.updates,
        reader,
        live,
        tasks=tasks,
        next_poll_ms=TASK_UPDATES_POLL_MS,
        **common,
    )
    configured = [
        ConfiguredSource(spec, reader, live, max_value_bytes=settings.max_event_bytes, **common)
        for spec in settings.event_sources
    ]
    return [updates, *configured]


class EventsMethods:
    """The ``events/*`` methods over ``sources`` (one per event type)."""

    identifier = EVENTS_EXTENSION

    def __init__(
        self,
        sources: Sequence[EventSource],
        *,
        stopping: asyncio.Event | None = None,
        retry_s: float = 1.0,
    ) -> None:
        self.sources = {source.name: source for source in sources}
        self.stopping = stopping or asyncio.Event()
        self.retry_s = retry_s

    async def close(self) -> None:
        """Close the Kafka clients of the sources that hold any."""
        for source in self.sources.values():
            close = getattr(source, "close", None)
            if close is not None:
                await close()

    def settings(self) -> dict[str, Any]:
        return {}  # listChanged false: the event types are fixed while the process runs

    def methods(self) -> dict[str, MethodHandler]:
        return {
            "events/list": self.list,
            "events/poll": self.poll,
            "events/stream": self.stream,
            "events/subscribe": self.webhook,
            "events/unsubscribe": self.webhook,
        }

    def _source(self, name: str) -> EventSource:
        source = self.sources.get(name)
        if source is None:
            raise _not_found(name)
        return source

    async def list(self, call: Call) -> Outcome:
        params = EventsListParams.model_validate(call.params)
        try:
            start = 0 if params.cursor is None else decode_page(params.cursor)
        except BadCursor as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        names = list(self.sources)
        page = [self.sources[name].descriptor() for name in names[start : start + PAGE_SIZE]]
        result: dict[str, Any] = {"events": page}
        if start + PAGE_SIZE < len(names):
            result["nextCursor"] = encode_page(start + PAGE_SIZE)
        return result

    async def poll(self, call: Call) -> Outcome:
        params = EventsPollParams.model_validate(call.params)
        source = self._source(params.name)
        limit = min(params.max_events or DEFAULT_MAX_EVENTS, MAX_EVENTS)
        with _mapped():
            batch = await source.poll(
                call.principal, params.arguments or {}, params.cursor, params.max_age_ms, limit
            )
        return {
            "events": [event.wire(with_cursor=False) for event in batch.events],
            "cursor": batch.cursor,
            "truncated": batch.truncated,
            "hasMore": batch.has_more,
            "nextPollMs": batch.next_poll_ms,
        }

    async def stream(self, call: Call) -> Outcome:
        params = EventsSubscriptionParams.model_validate(call.params)
        source = self._source(params.name)
        request_id = call.rpc.id
        with _mapped():
            items = await source.open_stream(
                call.principal, params.arguments or {}, params.cursor, params.max_age_ms
            )
        return Streamed(self._frames(call, source, params, items), request_id)

    async def _frames(
        self,
        call: Call,
        source: EventSource,
        params: EventsSubscriptionParams,
        items: AsyncIterator[StreamItem],
    ) -> AsyncIterator[dict[str, Any]]:
        """The stream's messages; a failed read is reported and retried from the last cursor."""
        sid = call.rpc.id
        cursor, failures = params.cursor, 0
        while True:
            try:
                async for item in items:
                    failures = 0
                    cursor = item.cursor or cursor
                    yield _stream_message(item, sid)
                break
            except Exception as exc:  # the reads failed: say so, and try again from the cursor
                failures += 1
                error = RpcError(INTERNAL_ERROR, "UpstreamError", {"reason": type(exc).__name__})
                if failures >= STREAM_ATTEMPTS:
                    yield events_notification("terminated", sid, error=error.error())
                    return
                yield events_notification("error", sid, error=error.error())
            await asyncio.sleep(self.retry_s)  # the retry cadence, not synchronisation
            try:
                with _mapped():
                    items = await source.open_stream(
                        call.principal, params.arguments or {}, cursor, None
                    )
            except RpcError as gone:
                yield events_notification("terminated", sid, error=gone.error())
                return
        if not self.stopping.is_set():
            final = {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_META: sid}}
            yield result_response(sid, final)

    async def webhook(self, call: Call) -> Outcome:
        name = call.params.get("name")
        self._source(name if isinstance(name, str) else "")
        raise RpcError(
            UNSUPPORTED,
            "webhook delivery is not offered by this server",
            {"feature": "deliveryMode", "value": "webhook"},
        )

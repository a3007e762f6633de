"""The Events extension's JSON-RPC methods (SEP-3415): ``events/list``, ``events/poll``,
``events/stream``, ``events/subscribe`` and ``events/unsubscribe``.

Only the extension's JSON-RPC face: the extension itself (event sources, cursors, occurrences,
webhook subscriptions and their delivery) is :mod:`bridge.events_extension`, and the task-event
vocabulary (the bridge's event types, statuses, error codes) is :mod:`bridge.vocabulary`.

A :class:`~bridge.server.handlers.MethodSet` (declared in ``server/discover`` as
``io.modelcontextprotocol/events`` with empty settings: no ``notifications/events/list_changed``)
over the event sources of :mod:`bridge.events_extension`. This module owns the wire shapes of the
extension (params, notifications, the draft's error codes) and maps the sources' exceptions to
them once (:func:`_mapped`).

Webhooks (:class:`WebhookMethods`): ``events/subscribe`` and ``events/unsubscribe`` over the
durable subscriptions of :class:`~bridge.events_extension.delivery.WebhookService`, offered only when
callers authenticate (auth mode ``none`` answers ``Forbidden``, as the draft requires). The
delivery loops read events through :func:`delivery_poll`, the very ``events/poll`` path.

Push: one SSE response per ``events/stream``; ``notifications/events/active`` first, then
``event`` and ``heartbeat`` (carrying the cursor), each with the request id in
``_meta["io.modelcontextprotocol/subscriptionId"]``; the sources heartbeat in every phase
(replay and live), and at each heartbeat the caller's access is checked again (a stream whose
access is gone ends with ``terminated``). A read failure is reported with
``notifications/events/error`` and retried from the last cursor sent; repeated failures, or the
task becoming invisible, end the stream with ``notifications/events/terminated``. The final
``StreamEventsResult`` is sent only when the server ends the stream (after a task's terminal
status event); a draining process closes streams without it, so clients resume elsewhere, and
so does a stream whose task's partition moved to another replica.

Several replicas (``replicas.ownership = "group"``): a request naming a task is served by the owner of
its partition (the HTTP layer forwards it). A webhook delivery loop runs wherever the webhooks
group placed its subscription, so its read of a task goes to the task's owner as an internal
``events/poll`` (:func:`delivery_poll`), signed for the subscription's principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from math import ceil
from typing import Any

import httpx

from bridge.config import Settings, env_name, task_cursor_version
from bridge.events_extension import (
    BadCursor,
    EventSource,
    Heartbeat,
    InvalidArguments,
    Occurrence,
    PollBatch,
    StreamItem,
)
from bridge.events_extension.configured import ConfiguredSource, NotPermitted
from bridge.events_extension.cursor import decode_page, encode_page
from bridge.events_extension.delivery import (
    DeliveryPolicy,
    Poll,
    Revoked,
    Shape,
    VerificationThrottled,
    WebhookService,
    as_is,
)
from bridge.events_extension.kafkalog import LiveTopics, TopicReader
from bridge.events_extension.sources import (
    CursorAhead,
    LiveEvents,
    Moved,
    TaskEvents,
    TaskLog,
    TaskLookup,
)
from bridge.events_extension.subscriptions import (
    DeliveryStatus,
    NotCanonical,
    Subscription,
    TtlPolicy,
    subscription_id,
)
from bridge.events_extension.taskupdates import TaskUpdates
from bridge.events_extension.webhooks import InvalidSecret, Verdict, check_secret
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log
from bridge.log.indexer import NotOwner
from bridge.log.reader import SeqUntrusted
from bridge.sealing import KeyRing, Sealer
from bridge.server.admission import label
from bridge.server.handlers import Call, MethodHandler, Outcome, Streamed, Streams, detailed_task
from bridge.server.hops import PeerIdentity
from bridge.server.peers import Peers, routed_task_id
from bridge.server.profile import EVENTS_EXTENSION, EventsProfile
from bridge.server.routing import RETRY_AFTER_MS, Routing
from bridge.server.wire import (
    CLIENT_CAPS_META,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_EXHAUSTED,
    RESULT_RETAINED_META,
    SUBSCRIPTION_ID_META,
    EventsListParams,
    EventsPollParams,
    EventsSubscribeParams,
    EventsSubscriptionParams,
    EventsUnsubscribeParams,
    RpcError,
    events_notification,
    result_response,
    seq_untrusted_error,
    tasks_capability,
)
from bridge.tasks.messages import iso_ms
from bridge.tasks.service import TaskNotFound
from bridge.vocabulary import FORBIDDEN, NOT_FOUND, UNSUPPORTED

__all__ = [
    "EVENTS_EXTENSION",
    "EVENT_CURSORS_META",
    "EVENT_ID_META",
    "EventsMethods",
    "WebhookMethods",
    "delivery_poll",
    "events_extension",
    "owner_poll",
]

log = logging.getLogger(__name__)

#: ``_meta`` flag of an events/poll asking for each occurrence's own cursor, as push and webhook
#: occurrences carry it (the draft puts only the batch cursor in a poll result). A webhook
#: delivery reading at a task's owner sets it: it writes its cursor back after every event.
EVENT_CURSORS_META = "io.mcpbridge/eventCursors"
#: ``_meta`` of an events/poll that reads one occurrence, the one with this ``eventId`` (an
#: oversized webhook body's ``resultRequest`` names its record so: :class:`FittedBodies`). The
#: source's authorization and filters apply as to any poll; the result holds that occurrence
#: or nothing (not one of the subscription's, or no longer retained), and its ``cursor`` is
#: the request's own: the read does not move the client's position.
EVENT_ID_META = "io.mcpbridge/eventId"
#: Errors of an owner's events/poll that end a webhook subscription (as they do locally).
_REVOKING = frozenset({NOT_FOUND, FORBIDDEN, INVALID_PARAMS})

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
    except CursorAhead as exc:
        data = {"reason": "cursor_ahead", "taskId": exc.task_id, "nextSeq": exc.next_seq}
        raise RpcError(INVALID_PARAMS, str(exc), data) from None
    except NotPermitted as exc:
        raise RpcError(FORBIDDEN, "Forbidden", {"reason": str(exc)}) from None
    except NotCanonical as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None


async def _discard(items: AsyncIterator[StreamItem]) -> None:
    """Close a stream's items that were never iterated (it was refused a slot)."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


async def _access_gone(
    source: EventSource, principal: str, params: EventsSubscriptionParams
) -> RpcError | None:
    """The error a new subscription of ``principal`` would get now, or None (still allowed)."""
    try:
        with _mapped():
            await source.authorize(principal, params.arguments or {})
    except RpcError as exc:
        return exc
    return None


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
    *,
    streams: Streams,
    routing: Routing | None = None,
    peers: Peers | None = None,
    on_throttled: Callable[[], None] = lambda: None,
    on_too_large: Callable[[], None] = lambda: None,
    catch_up: Callable[[], Awaitable[None]] | None = None,
    port: Log | None = None,
) -> EventsMethods:
    """The extension with the bridge's event sources (what :mod:`bridge.server.app` wires);
    ``streams`` admits each push stream (the stream hub); ``routing`` and ``peers`` when
    replicas divide the partitions; ``on_throttled`` counts webhook verifications refused by
    the throttle, ``on_too_large`` webhook events whose body stays over the profile's bound;
    ``catch_up`` catches the index up with the log before a task event cursor
    past the head is refused; ``port`` is the log the Events extension reads and writes: the
    topic sources (None: a Kafka log of their own, see :func:`offset_sources`) and the
    webhook subscriptions topic (None: the Kafka cluster of ``settings``)."""
    task_events = TaskEvents(
        f"{settings.own_types.prefix}.task.event",
        tasks,
        log,
        live,
        status_type=settings.own_types.status,
        queue_size=settings.streams.queue_size,
        heartbeat_s=settings.streams.keepalive_s,
        stopping=stopping,
        catch_up=catch_up,
        catch_up_s=settings.streams.cursor_catch_up_s,
        bind_cursors=task_cursor_version(settings) == 2,
    )
    sources: list[EventSource] = [
        task_events,
        *offset_sources(settings, tasks, stopping, port),
    ]
    webhooks = webhook_methods(
        settings,
        sources,
        routing=routing,
        peers=peers,
        on_throttled=on_throttled,
        on_too_large=on_too_large,
        tasks=tasks,
        port=port,
    )
    return EventsMethods(
        sources,
        streams=streams,
        stopping=stopping,
        webhooks=webhooks,
        recheck_s=settings.streams.keepalive_s,
    )


def offset_sources(
    settings: Settings,
    tasks: TaskLookup,
    stopping: asyncio.Event,
    log: Log | None = None,
) -> list[EventSource]:
    """``<prefix>.task.updated`` and the configured sources, in the settings' order; they share
    one history reader and one live tail per topic, on ``log``.

    ``log`` None: a log of their own on the Kafka cluster of ``settings`` (closed with the
    sources), whose pool of fetching consumers (role ``event-sources``) is apart from the task
    streams' reader: a poll over a busy pipeline topic may fetch up to its scan budget, and
    should not make a task stream's catch-up queue behind it."""
    if log is None:
        kafka = KafkaLog(settings, role="event-sources")
        reader = TopicReader(kafka, on_close=kafka.close)
        log = kafka
    else:
        reader = TopicReader(log)
    common: dict[str, Any] = {
        "queue_size": settings.streams.queue_size,
        "heartbeat_s": settings.streams.keepalive_s,
        "stopping": stopping,
    }
    live = LiveTopics(log, reader)
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
        ConfiguredSource(
            spec, reader, live, max_value_bytes=settings.tasks.max_event_bytes, **common
        )
        for spec in settings.events.sources
    ]
    return [updates, *configured]


class EventsMethods:
    """The ``events/*`` methods over ``sources`` (one per event type)."""

    identifier = EVENTS_EXTENSION

    def __init__(
        self,
        sources: Sequence[EventSource],
        *,
        streams: Streams | None,
        stopping: asyncio.Event | None = None,
        retry_s: float = 1.0,
        webhooks: WebhookMethods | None = None,
        recheck_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``streams``: the admission every push stream takes a slot of (the stream hub's);
        None only where nothing is served over HTTP (tests of the methods themselves)."""
        self.sources = {source.name: source for source in sources}
        self.streams = streams
        self.stopping = stopping or asyncio.Event()
        self.retry_s = retry_s
        self.webhooks = webhooks
        #: A push stream checks its caller's access at each heartbeat, and at least this often
        #: while events keep it busy (it then sends no heartbeat); ``clock`` measures it.
        self.recheck_s = recheck_s
        self.clock = clock

    async def start(self) -> None:
        """Start webhook delivery, when offered (the other methods need no start)."""
        if self.webhooks is not None:
            await self.webhooks.start()

    async def stop(self) -> None:
        """Stop webhook delivery, then close the sources' Kafka clients."""
        if self.webhooks is not None:
            await self.webhooks.stop()
        await self.close()

    def subscription_positions(self) -> list[tuple[str, int]]:
        """``(task id, last delivered seq)`` of every live webhook subscription to a task's
        events (none without webhook delivery): for the distance to data loss."""
        service = self.webhooks.service if self.webhooks is not None else None
        return [] if service is None else service.registry.table.task_positions(_now_ms())

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
            "events/subscribe": self.webhooks.subscribe if self.webhooks else self.webhook,
            "events/unsubscribe": self.webhooks.unsubscribe if self.webhooks else self.webhook,
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
        page = [self._descriptor(name) for name in names[start : start + PAGE_SIZE]]
        result: dict[str, Any] = {"events": page}
        if start + PAGE_SIZE < len(names):
            result["nextCursor"] = encode_page(start + PAGE_SIZE)
        return result

    def _descriptor(self, name: str) -> dict[str, Any]:
        descriptor = self.sources[name].descriptor()
        if self.webhooks is not None and self.webhooks.offered:
            descriptor["delivery"] = [*descriptor["delivery"], "webhook"]
        return descriptor

    async def poll(self, call: Call) -> Outcome:
        params = EventsPollParams.model_validate(call.params)
        source = self._source(params.name)
        if EVENT_ID_META in call.meta:
            return await self._poll_one(call, source, params, call.meta[EVENT_ID_META])
        limit = min(params.max_events or DEFAULT_MAX_EVENTS, MAX_EVENTS)
        with _mapped():
            batch = await source.poll(
                call.principal, params.arguments or {}, params.cursor, params.max_age_ms, limit
            )
        with_cursor = call.meta.get(EVENT_CURSORS_META) is True
        return {
            "events": [event.wire(with_cursor=with_cursor) for event in batch.events],
            "cursor": batch.cursor,
            "truncated": batch.truncated,
            "hasMore": batch.has_more,
            "nextPollMs": batch.next_poll_ms,
        }

    async def _poll_one(
        self, call: Call, source: EventSource, params: EventsPollParams, event_id: Any
    ) -> Outcome:
        """events/poll of the one occurrence ``event_id`` (see :data:`EVENT_ID_META`)."""
        if not isinstance(event_id, str) or not event_id:
            raise RpcError(INVALID_PARAMS, f"_meta {EVENT_ID_META} must be an event id")
        arguments = params.arguments or {}
        with _mapped():
            if isinstance(source, ConfiguredSource):  # its event ids name the record's offset
                found = await source.read_event(call.principal, arguments, event_id)
            else:  # one ordered log per subscription: the occurrence is the next one read
                batch = await source.poll(call.principal, arguments, params.cursor, None, 1)
                found = next((e for e in batch.events if e.event_id == event_id), None)
        with_cursor = call.meta.get(EVENT_CURSORS_META) is True
        return {
            "events": [] if found is None else [found.wire(with_cursor=with_cursor)],
            "cursor": params.cursor,
            "truncated": False,
            "hasMore": False,
            "nextPollMs": TASK_UPDATES_POLL_MS,
        }

    async def stream(self, call: Call) -> Outcome:
        """A push stream, checked, then admitted, then read. The source authorizes the caller
        and validates the arguments and the cursor first, so a client at its stream limit is
        still answered NotFound, Forbidden or InvalidParams as the SEP says; ``open_stream``
        reads nothing until its items are iterated, so a stream refused a slot costs no read.
        The slot is given back when the response ends, however it ends."""
        params = EventsSubscriptionParams.model_validate(call.params)
        source = self._source(params.name)
        request_id = call.rpc.id
        with _mapped():
            items = await source.open_stream(
                call.principal, params.arguments or {}, params.cursor, params.max_age_ms
            )
        release: Callable[[], None] | None = None
        if self.streams is not None:
            try:
                ticket = self.streams.admit(
                    call.caller, label("events/stream", request_id), request_id
                )
            except BaseException:
                await _discard(items)
                raise
            release = functools.partial(self.streams.release, ticket)
        return Streamed(self._frames(call, source, params, items), request_id, on_close=release)

    async def _frames(
        self,
        call: Call,
        source: EventSource,
        params: EventsSubscriptionParams,
        items: AsyncIterator[StreamItem],
    ) -> AsyncIterator[dict[str, Any]]:
        """The stream's messages; a failed read is reported and retried from the last cursor
        (a task made untrusted ends the stream with ``seq_untrusted``: retrying cannot help).
        At each heartbeat, and every ``recheck_s`` while events keep the stream busy, the
        caller's access is checked again: when it is gone the stream ends with ``terminated``
        and the error a new subscription would get."""
        sid = call.rpc.id
        cursor, failures, checked_at = params.cursor, 0, self.clock()
        while True:
            try:
                async for item in items:
                    failures = 0
                    if isinstance(item, Heartbeat) or self.clock() - checked_at >= self.recheck_s:
                        checked_at = self.clock()
                        gone = await _access_gone(source, call.principal, params)
                        if gone is not None:
                            yield events_notification("terminated", sid, error=gone.error())
                            return
                    cursor = item.cursor or cursor
                    yield _stream_message(item, sid)
                break
            except (Moved, NotOwner):
                return  # the task's partition moved: no result, the client resumes at its owner
            except SeqUntrusted as exc:  # retrying cannot help: tasks/stream's answer, at once
                untrusted = seq_untrusted_error(exc.task_id, str(exc))
                yield events_notification("terminated", sid, error=untrusted.error())
                return
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
            except NotOwner:
                return
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


# --- webhooks ------------------------------------------------------------------------------

#: How long events/subscribe waits for this replica's view of the subscriptions at start.
RESTORE_WAIT_S = 30.0


def delivery_poll(
    sources: dict[str, EventSource],
    *,
    routing: Routing | None = None,
    peers: Peers | None = None,
) -> Poll:
    """The delivery loops' read: ``events/poll`` of the subscription's source, with the errors
    that end a subscription (unknown event, a task no longer visible) as :class:`Revoked`.

    With ``routing`` and ``peers`` (replicas divide the partitions) a subscription naming a
    task is read where that task is served: here, or at its owner through :func:`owner_poll`.
    A partition moving, or an owner not answering, is a read failure that the loop retries.
    """

    async def poll(
        principal: str,
        name: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
        max_events: int,
    ) -> PollBatch:
        task_id = routed_task_id("events/poll", {"arguments": arguments})
        if routing is not None and peers is not None and task_id is not None:
            owner = await routing.where(task_id)
            if owner is not None:
                request = _poll_params(name, arguments, cursor, max_age_ms, max_events)
                return await owner_poll(peers, owner, principal, request)
        try:
            source = sources.get(name)
            if source is None:
                raise _not_found(name)
            with _mapped():
                return await source.poll(principal, arguments, cursor, max_age_ms, max_events)
        except RpcError as exc:
            raise Revoked(exc.error()) from None

    return poll


def _poll_params(
    name: str,
    arguments: dict[str, Any],
    cursor: str | None,
    max_age_ms: int | None,
    max_events: int,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "name": name,
        "arguments": arguments,
        "cursor": cursor,
        "maxEvents": max_events,
        "_meta": {EVENT_CURSORS_META: True},
    }
    if max_age_ms is not None:
        params["maxAgeMs"] = max_age_ms
    return params


async def owner_poll(peers: Peers, owner: str, principal: str, params: dict[str, Any]) -> PollBatch:
    """``events/poll`` at the replica ``owner`` for ``principal``, as a :class:`PollBatch`;
    the errors that end a subscription as :class:`Revoked`, others raised for a retry."""
    try:
        answer = await peers.call(owner, "events/poll", params, PeerIdentity(principal, principal))
    except RpcError as exc:
        if exc.code in _REVOKING:
            raise Revoked(exc.error()) from None
        raise
    return PollBatch(
        [_occurrence(event) for event in answer["events"]],
        answer["cursor"],
        bool(answer["truncated"]),
        bool(answer["hasMore"]),
        int(answer["nextPollMs"]),
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _occurrence(wire: Mapping[str, Any]) -> Occurrence:
    """An occurrence from its wire form (with its own cursor: see :data:`EVENT_CURSORS_META`)."""
    moment = datetime.fromisoformat(str(wire["timestamp"]).replace("Z", "+00:00"))
    return Occurrence(
        event_id=str(wire["eventId"]),
        name=str(wire["name"]),
        timestamp_ms=(moment - _EPOCH) // timedelta(milliseconds=1),
        data=dict(wire["data"]),
        cursor=wire["cursor"],
    )


def webhook_methods(
    settings: Settings,
    sources: Sequence[EventSource],
    *,
    routing: Routing | None = None,
    peers: Peers | None = None,
    on_throttled: Callable[[], None] = lambda: None,
    on_too_large: Callable[[], None] = lambda: None,
    tasks: TaskLookup | None = None,
    port: Log | None = None,
) -> WebhookMethods:
    """Webhook subscriptions over ``sources``; delivery only when callers authenticate and a
    key seals the secrets at rest (:func:`webhook_sealer`). The deployment's client profile
    (:class:`~bridge.server.profile.EventsProfile`) sets the loops' envelopes and bodies;
    ``tasks`` reads the outcomes it puts inline (here, or at the task's owner);
    ``on_too_large`` counts the events whose body stays over the profile's bound (never sent);
    ``port``: the log the subscriptions topic is on (None: the Kafka cluster of ``settings``)."""
    by_name = {source.name: source for source in sources}
    profile = EventsProfile.of(settings)
    sealer = webhook_sealer(settings) if settings.auth.mode != "none" else None
    service = None
    if sealer is not None:
        poll = delivery_poll(by_name, routing=routing, peers=peers)
        policy = DeliveryPolicy.of(
            settings,
            control_envelopes=profile.control_envelopes,
            max_body_bytes=profile.max_body_bytes,
        )
        service = WebhookService(
            settings,
            poll,
            sealer,
            on_throttled=on_throttled,
            on_too_large=on_too_large,
            policy=policy,
            shape=fitted_bodies(
                settings, profile, task_outcomes(tasks, routing=routing, peers=peers)
            ),
            log=port,
        )
    return WebhookMethods(settings, by_name, service, profile=profile)


#: Reads the outcome (``{"result": …}`` or ``{"error": …}``) of a task for a principal, or None
#: when it cannot be had now (the delivery then carries the request that fetches it).
Outcomes = Callable[[str, str], Awaitable[dict[str, Any] | None]]

#: How long a delivery waits for a task's outcome before it sends the request that fetches it
#: instead: an owner that does not answer must not hold up every later event (the peers'
#: own timeout is 30 s).
OUTCOME_WAIT_S = 1.5


def fitted_bodies(settings: Settings, profile: EventsProfile, outcomes: Outcomes) -> Shape:
    """The delivery loops' :class:`~bridge.events_extension.delivery.Shape` the profile asks for:
    bodies as they are, or :class:`FittedBodies` when it bounds them or inlines outcomes
    (each decided on its own)."""
    if profile.max_body_bytes is None and not profile.inline_outcomes:
        return as_is
    return FittedBodies(
        profile.max_body_bytes,
        f"{settings.own_types.prefix}.task.updated",
        outcomes if profile.inline_outcomes else None,
    )


def task_outcomes(
    tasks: TaskLookup | None,
    *,
    routing: Routing | None = None,
    peers: Peers | None = None,
) -> Outcomes:
    """tasks/get's outcome of a task for a principal, where the task is served: locally, or at
    the owner of its partition (signed for the principal, as :func:`owner_poll`)."""

    async def outcome(principal: str, task_id: str) -> dict[str, Any] | None:
        try:
            if routing is not None and peers is not None:
                owner = await routing.where(task_id)
                if owner is not None:
                    params = {"taskId": task_id, "_meta": {CLIENT_CAPS_META: tasks_capability()}}
                    identity = PeerIdentity(principal, principal)
                    return _outcome_of(await peers.call(owner, "tasks/get", params, identity))
            if tasks is None:
                return None
            return _outcome_of(detailed_task(await tasks.get(task_id, principal)))
        except Exception as exc:  # the request it carries instead fetches it later
            log.info("task outcome not read for a delivery (%s)", type(exc).__name__)
            return None

    return outcome


def _outcome_of(task: Mapping[str, Any]) -> dict[str, Any] | None:
    """The task's result or error, None when there is none or it is a stand-in for one no
    longer retained (the request it carries instead then says so when followed)."""
    meta = task.get("_meta")
    if isinstance(meta, Mapping) and meta.get(RESULT_RETAINED_META) is False:
        return None
    for key in ("result", "error"):
        if key in task:
            return {key: task[key]}
    return None


class FittedBodies:
    """Webhook bodies a client can act on without a second call where possible, and of at most
    ``limit`` bytes, the envelope included (a :class:`~bridge.events_extension.delivery.Shape`, for
    the ``chatgpt`` profile):

    * a ``task.updated`` (``updates``, the type's name) delivery of a completed or failed task
      carries the task's ``result`` (or ``error``) in ``data`` instead of the ``resultRequest``
      that fetches it, when the body with it still fits (``outcomes``; None: never inline).
      The read waits at most :data:`OUTCOME_WAIT_S`; a result no longer retained is not
      inlined (the request stays);
    * any body that does not fit is sent with its ``data`` replaced by
      ``{"omitted": "too_large", "bytes": n, "resultRequest": …}`` (a ``task.updated``
      stub keeps ``taskId``, ``seq`` and ``status``): a ``task.updated`` occurrence's own
      ``resultRequest``, else the ``events/poll`` that reads this occurrence alone, named by
      its ``eventId`` (:data:`EVENT_ID_META`, from the cursor before it, ``maxEvents`` 1).

    Only ``task.updated`` data is the bridge's own: a pipeline record's value may hold a
    ``resultRequest`` of any producer's making, which is never acted on nor passed on as ours.
    """

    #: The small fields of a ``task.updated`` occurrence its stub keeps (the bridge's own).
    KEPT = ("taskId", "seq", "status")

    def __init__(
        self,
        limit: int | None,
        updates: str,
        outcomes: Outcomes | None,
        *,
        wait_s: float = OUTCOME_WAIT_S,
    ) -> None:
        self.limit = limit
        self.updates = updates
        self.outcomes = outcomes
        self.wait_s = wait_s

    async def __call__(
        self, sub: Subscription, occurrence: Occurrence, before: str | None
    ) -> dict[str, Any]:
        message = occurrence.wire(with_cursor=True)
        inline = await self._inline(sub, occurrence)
        if inline is not None and self._fits(inline):
            return inline
        if self._fits(message):
            return message
        own = self._own_request(occurrence)
        stub: dict[str, Any] = {"omitted": "too_large", "bytes": len(_encoded(message))}
        if own is not None:
            stub.update({k: occurrence.data[k] for k in self.KEPT if k in occurrence.data})
        stub["resultRequest"] = own if own is not None else self._read_one(sub, occurrence, before)
        return {**message, "data": stub}

    @staticmethod
    def _read_one(sub: Subscription, occurrence: Occurrence, before: str | None) -> dict[str, Any]:
        """The ``events/poll`` that reads ``occurrence`` and nothing else."""
        return {
            "method": "events/poll",
            "params": {
                "name": sub.name,
                "arguments": sub.arguments,
                "cursor": before,
                "maxEvents": 1,
                "_meta": {EVENT_ID_META: occurrence.event_id},
            },
        }

    def _own_request(self, occurrence: Occurrence) -> dict[str, Any] | None:
        """The ``resultRequest`` a ``task.updated`` occurrence carries (the bridge wrote it)."""
        request = occurrence.data.get("resultRequest")
        if occurrence.name != self.updates or not isinstance(request, dict):
            return None
        return request

    async def _inline(self, sub: Subscription, occurrence: Occurrence) -> dict[str, Any] | None:
        request = self._own_request(occurrence)
        if self.outcomes is None or request is None:
            return None
        task_id = occurrence.data.get("taskId")
        if not isinstance(task_id, str):
            return None
        try:
            async with asyncio.timeout(self.wait_s):
                outcome = await self.outcomes(sub.principal, task_id)
        except TimeoutError:
            log.info("task outcome not read within %.1f s for a delivery", self.wait_s)
            return None
        if outcome is None:
            return None
        data = {k: v for k, v in occurrence.data.items() if k != "resultRequest"}
        return {**occurrence.wire(with_cursor=True), "data": {**data, **outcome}}

    def _fits(self, message: dict[str, Any]) -> bool:
        return self.limit is None or len(_encoded(message)) <= self.limit


def _encoded(message: dict[str, Any]) -> bytes:
    """The body as the delivery loop encodes it (compact UTF-8 JSON)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def webhook_sealer(settings: Settings) -> Sealer | None:
    """The sealer of webhook secrets at rest, or None (webhooks off) without a key file.

    A missing file is created only when ``webhooks.keys.create`` says so (development).
    """
    keys = settings.webhooks.keys
    if keys.file is None:
        log.warning(
            "webhook delivery is off: no key seals webhook secrets at rest (set %s)",
            env_name("webhooks", "keys", "file"),
        )
        return None
    if keys.create and not keys.file.exists():
        KeyRing.with_new_key(keys.file)
        log.warning("webhook secrets key file created at %s (development only)", keys.file)
    return Sealer(KeyRing.load(keys.file))


#: The longest delivery mode echoed in an Unsupported error (a client's string, not ours).
_MODE_ECHO = 64


def webhook_mode(params: Mapping[str, Any]) -> None:
    """Unsupported for a ``delivery.mode`` other than ``"webhook"`` (the SEP's error for an
    option this server does not offer), before the rest of ``delivery`` is read: a client
    asking for another mode need not send a webhook's url and secret. A mode that is not a
    string is left to the params model (InvalidParams)."""
    delivery = params.get("delivery")
    mode = delivery.get("mode", "webhook") if isinstance(delivery, Mapping) else "webhook"
    if isinstance(mode, str) and mode != "webhook":
        raise RpcError(
            UNSUPPORTED,
            "events/subscribe offers webhook delivery only",
            {"feature": "deliveryMode", "value": mode[:_MODE_ECHO]},
        )


def _callback_url(url: str) -> str:
    """``url`` if it can be a callback (https, a host, no credentials), else InvalidParams."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise RpcError(INVALID_PARAMS, "delivery.url is not a valid URL") from None
    if parsed.scheme != "https":
        raise RpcError(INVALID_PARAMS, "delivery.url must be an https URL")
    if not parsed.host:
        raise RpcError(INVALID_PARAMS, "delivery.url has no host")
    if parsed.userinfo:
        raise RpcError(INVALID_PARAMS, "delivery.url must not carry credentials")
    return url


def _status(sub: Subscription) -> dict[str, Any]:
    """The draft's ``deliveryStatus`` (categories only, never the endpoint's words)."""
    status: DeliveryStatus = sub.status
    out: dict[str, Any] = {
        "active": sub.active,
        "lastDeliveryAt": None
        if status.last_delivery_ms is None
        else iso_ms(status.last_delivery_ms),
        "lastError": status.last_error,
    }
    if status.failed_since_ms is not None:
        out["failedSince"] = iso_ms(status.failed_since_ms)
    return out


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class WebhookMethods:
    """``events/subscribe`` and ``events/unsubscribe`` (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        sources: dict[str, EventSource],
        service: WebhookService | None,
        *,
        now_ms: Callable[[], int] = _now_ms,
        profile: EventsProfile | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sources = sources
        self.service = service
        #: The client profile: its verification error, results and unsubscribe answer.
        self.profile = profile or EventsProfile.of(settings)
        self.auth_mode = settings.auth.mode
        self.now_ms = now_ms
        #: Measures the profile's deadline on events/subscribe (seconds, monotonic).
        self.clock = clock
        self.ttl = TtlPolicy(
            settings.webhooks.ttl_default_ms,
            settings.webhooks.ttl_min_ms,
            settings.webhooks.ttl_max_ms,
        )
        self.max_per_principal = settings.webhooks.max_subscriptions_per_principal
        self.grace_ms = int(settings.webhooks.rotation_grace_s * 1000)

    @property
    def offered(self) -> bool:
        return self.service is not None

    async def start(self) -> None:
        if self.service is not None:
            await self.service.start()

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()

    def _running(self) -> WebhookService:
        """The service; ``Forbidden`` when callers do not authenticate (the draft: webhooks
        need a principal, or anyone could guess another tenant's subscription key)."""
        if self.service is None and self.auth_mode == "none":
            raise RpcError(
                FORBIDDEN,
                "webhook delivery requires an authenticated principal",
                {"reason": "unauthenticated"},
            )
        if self.service is None:
            raise RpcError(
                UNSUPPORTED,
                "webhook delivery is off: this server has no key to seal webhook secrets",
                {"feature": "deliveryMode", "value": "webhook"},
            )
        return self.service

    def _source(self, name: str) -> EventSource:
        source = self.sources.get(name)
        if source is None:
            raise _not_found(name)
        return source

    async def _restored(self, service: WebhookService, wait_s: float = RESTORE_WAIT_S) -> None:
        try:
            async with asyncio.timeout(wait_s):
                await service.registry.restored.wait()
        except TimeoutError:
            raise RpcError(INTERNAL_ERROR, "webhook subscriptions are not available yet") from None

    def _deadline(self) -> float | None:
        """When (on :attr:`clock`) this events/subscribe must have stored, or None."""
        bound = self.profile.answer_within_s
        return None if bound is None else self.clock() + bound

    def _in_time(self, deadline: float | None) -> None:
        """A retriable refusal, before anything is stored, once the profile's deadline passed:
        the client has given up waiting, and its retry runs afresh (a new challenge, within
        the throttle; the registry restored by then)."""
        if deadline is not None and self.clock() >= deadline:
            raise RpcError(
                INTERNAL_ERROR,
                "events/subscribe could not finish in time; nothing was stored: retry",
                {"reason": "deadline", "retryAfterMs": RETRY_AFTER_MS},
                http_status=503,
            )

    def _expiry(self, call: Call, now: int, granted_ms: int) -> int:
        """The subscription's expiry: the TTL granted, but never past the credential the
        caller subscribed with (a subscription outlives no credential: its deliveries carry
        results, which need one to read). A refresh with a newer credential extends it."""
        expires = now + granted_ms
        credential = call.caller.expires
        if credential is not None:
            expires = min(expires, int(credential * 1000))
        return expires

    async def subscribe(self, call: Call) -> Outcome:
        deadline = self._deadline()
        service = self._running()
        webhook_mode(call.params)
        params = EventsSubscribeParams.model_validate(call.params)
        source = self._source(params.name)
        url = _callback_url(params.delivery.url)
        try:
            secret = check_secret(params.delivery.secret)
        except InvalidSecret as exc:
            raise RpcError(INVALID_PARAMS, f"delivery.secret: {exc}") from None
        wait_s = RESTORE_WAIT_S if deadline is None else max(deadline - self.clock(), 0.0)
        try:
            await self._restored(service, min(wait_s, RESTORE_WAIT_S))
        except RpcError:
            self._in_time(deadline)  # the wait took the profile's deadline: retriable
            raise
        arguments = params.arguments or {}
        with _mapped():
            sid = subscription_id(call.principal, url, params.name, arguments)
        now = self.now_ms()
        existing = service.registry.table.live(sid, now)
        # Authorization and arguments as events/poll checks them; for a new subscription the
        # read also places the start (cursor null: now) and says whether events were skipped.
        cursor = None if existing else params.cursor
        with _mapped():
            probe = await source.poll(
                call.principal, arguments, cursor, None if existing else params.max_age_ms, 1
            )
        if existing is None:
            self._within_limit(service, call.principal, now)
        await self._verify(service, call.principal, url, sid, secret)
        expires = self._expiry(call, now, self.ttl.grant(params.ttl_ms, given=params.ttl_given))
        self._in_time(deadline)
        if existing is not None:
            await service.put(existing.refreshed(secret, expires, now, self.grace_ms))
        else:
            fresh = self._new(service, sid, call.principal, url, params, probe, expires, now)
            await service.put(fresh)
        stored = service.registry.table.get(sid)
        assert stored is not None, "a subscription is in the view once put returned"
        result: dict[str, Any] = {
            "id": sid,
            "refreshBefore": iso_ms(stored.expires_ms),
            "cursor": stored.cursor,
            "truncated": existing is None and probe.truncated,
        }
        if existing is not None and self.profile.reports_delivery_status:
            result["deliveryStatus"] = _status(existing)  # what this refresh resumes, if anything
        return result

    def _new(
        self,
        service: WebhookService,
        sid: str,
        principal: str,
        url: str,
        params: EventsSubscribeParams,
        probe: PollBatch,
        expires: int,
        now: int,
    ) -> Subscription:
        table = service.registry.table
        lapsed = table.get(sid)  # expired but not yet tombstoned: its delivery state is replaced
        replay = params.cursor is not None
        # A cursor past retention or the maxAgeMs floor starts at the fresh position the read
        # went on from (the one the result gives with truncated), not at the stale one.
        start = probe.resumed if probe.truncated and probe.resumed is not None else params.cursor
        return Subscription(
            id=sid,
            name=params.name,
            principal=principal,
            arguments=params.arguments or {},
            url=url,
            secrets=(params.delivery.secret,),
            previous_until_ms=0,
            expires_ms=expires,
            refreshed_ms=max(now, table.deleted_rev(sid) + 1),
            cursor=start if replay else probe.cursor,
            floor_ms=now - params.max_age_ms if replay and params.max_age_ms is not None else None,
            delivery_rev=0 if lapsed is None else lapsed.delivery_rev + 1,
        )

    def _within_limit(self, service: WebhookService, principal: str, now: int) -> None:
        if service.registry.table.count_live(principal, now) >= self.max_per_principal:
            raise RpcError(
                RESOURCE_EXHAUSTED,
                "too many webhook subscriptions",
                {"limit": "subscriptions", "max": self.max_per_principal},
            )

    async def _verify(
        self, service: WebhookService, principal: str, url: str, sid: str, secret: str
    ) -> None:
        """The draft's challenge, unless cached or throttled (:meth:`WebhookService.verify`)."""
        try:
            outcome = await service.verify(principal, url, sid, secret)
        except VerificationThrottled as throttled:
            raise RpcError(
                RESOURCE_EXHAUSTED,
                "too many webhook verifications to this callback host",
                {"limit": "verifications", "retryAfterMs": ceil(throttled.retry_after_s * 1000)},
            ) from None
        if outcome.verdict is not Verdict.DELIVERED:
            raise RpcError(
                self.profile.callback_error_code,
                "the callback endpoint failed verification",
                {"reason": outcome.error or "challenge_failed"},
            )

    async def unsubscribe(self, call: Call) -> Outcome:
        service = self._running()
        webhook_mode(call.params)
        params = EventsUnsubscribeParams.model_validate(call.params)
        self._source(params.name)
        await self._restored(service)
        arguments = params.arguments or {}
        with _mapped():
            sid = subscription_id(call.principal, params.delivery.url, params.name, arguments)
        if service.registry.table.live(sid, self.now_ms()) is None:
            if self.profile.unknown_unsubscribe_is_error:
                raise RpcError(NOT_FOUND, "No such subscription", {"kind": "subscription"})
            return {}  # the client's answer for a subscription already gone
        await service.delete(sid)
        return {}

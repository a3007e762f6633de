"""``subscriptions/listen`` (SEP-2575) with the tasks extension's ``notifications/tasks``.

A listen names task ids (``notifications.taskIds``); its SSE stream starts with
``notifications/subscriptions/acknowledged`` (the task ids agreed to), then carries one
``notifications/tasks`` per status change of those tasks, each the full task exactly as
``tasks/get`` answers it (:func:`~bridge.server.handlers.detailed_task`). Every message carries
the listen request's id as ``_meta["io.modelcontextprotocol/subscriptionId"]``.

Where the changes come from: the process's fan-out of live events (:mod:`bridge.log.fanout`,
through ``TaskService.watch``), one subscription per task id; a status event (or an overflow of
the bounded buffer) makes the listen re-read the task's state, so nothing depends on seeing
every event. The current state of each task is sent first, right after the acknowledgement:
a change between the client's last ``tasks/get`` and its listen is never missed.

Several replicas (``replicas.ownership = "group"``, :class:`Replicas`): a listen names tasks that may
live on several owners, so it is served where it arrives. Each state is read where the task is
served: here, or at its owner by a signed internal ``tasks/get`` (the owner's answer, as the
client would get it). Changes of tasks owned elsewhere come from the task-updates topic, which
every partition's owner writes (the ``task.updated`` source, followed from the moment the
listen opens; each (re)start of that follower re-reads every state, so a change made before it
was in place is not missed either). A read that fails for a moment (a partition moving, an
owner not answering) is retried after :data:`RETRY_S`.

Choices where the texts are open, written down in docs/tasks-stream.md:

* A task id the caller may not see (unknown, expired, another principal's: the three alike, as
  ``tasks/get`` has them) is left out of the acknowledged ``taskIds``, and the error
  ``tasks/get`` would answer for it is given in the acknowledgement's
  ``_meta["<prefix>/taskErrors"]``; the other task ids are served.
* The stream stays open after every task has ended (the SEP: until the client cancels).
* ``notifications/cancelled`` ends the stream without a response (the cancellation rule);
  a draining process ends it with the ``SubscriptionsListenResult`` (the server tore it down).

Who may listen is counted beside tasks/stream: each listen takes a slot of the stream hub's
:class:`~bridge.server.admission.Admission` (rate, per-client and per-replica limits, and the
``notifications/cancelled`` hook), and at most :data:`MAX_LISTENS_PER_CLIENT` of a client's
slots may be listens, each of at most :data:`MAX_TASK_IDS` task ids. Nothing here reads Kafka
or knows HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.events_extension import Active, EventSource, Occurrence, StreamItem
from bridge.log.fanout import FeedClosed, TaskFeed
from bridge.server.admission import Caller, Ticket, label
from bridge.server.errors import DOMAIN_ERRORS, wire_error
from bridge.server.handlers import Call, MethodHandler, Outcome, Streamed, Streams, detailed_task
from bridge.server.hops import PeerIdentity
from bridge.server.peers import Peers
from bridge.server.routing import Routing
from bridge.server.sse import Frame
from bridge.server.wire import (
    CLIENT_CAPS_META,
    INVALID_PARAMS,
    INVALID_REQUEST,
    SUBSCRIPTION_ID_META,
    RpcError,
    has_capability,
    missing_capability,
    notification_message,
    result_response,
    tasks_capability,
)
from bridge.tasks.service import TaskView

__all__ = [
    "MAX_LISTENS_PER_CLIENT",
    "MAX_TASK_IDS",
    "RETRY_S",
    "Listen",
    "PeerTasks",
    "Replicas",
    "TaskStates",
]

log = logging.getLogger(__name__)

#: Task ids one listen may name: each is a fan-out subscription held while the listen is open.
MAX_TASK_IDS = 64
#: Concurrent listens of one client (within its tasks/stream budget, which they count in).
MAX_LISTENS_PER_CLIENT = 8
#: After a state read or the updates follower failed for a moment: when to try again.
RETRY_S = 1.0


class TaskStates(Protocol):
    """What a listen needs of the task service (:class:`~bridge.tasks.service.TaskService`)."""

    async def get(self, task_id: str, principal: str) -> TaskView: ...

    def watch(self, task_id: str) -> contextlib.AbstractContextManager[TaskFeed]: ...

    def status_changed(self, sub: TaskFeed) -> bool: ...


class Replicas(Protocol):
    """The other replicas, when they divide the partitions (:class:`PeerTasks`)."""

    async def owner(self, task_id: str) -> str | None:
        """None: the task is served here; else its owner's URL (RpcError while it moves)."""
        ...

    async def get(self, owner: str, task_id: str, caller: Caller) -> dict[str, Any]:
        """tasks/get at ``owner`` for ``caller``: the task as it answers (RpcError if not)."""
        ...

    async def updates(self, principal: str, cursor: str | None) -> AsyncIterator[StreamItem]:
        """The status changes of ``principal``'s tasks after ``cursor`` (None: from now)."""
        ...


class PeerTasks:
    """:class:`Replicas` over the routing, the signed hop and the ``task.updated`` source."""

    def __init__(self, routing: Routing, peers: Peers, updates: EventSource) -> None:
        self.routing = routing
        self.peers = peers
        self.source = updates

    async def owner(self, task_id: str) -> str | None:
        return await self.routing.where(task_id)

    async def get(self, owner: str, task_id: str, caller: Caller) -> dict[str, Any]:
        params = {"taskId": task_id, "_meta": {CLIENT_CAPS_META: tasks_capability()}}
        identity = PeerIdentity(caller.principal, caller.client)
        answer = await self.peers.call(owner, "tasks/get", params, identity)
        answer.pop("resultType", None)  # a notification carries the task, not a result
        return answer

    async def updates(self, principal: str, cursor: str | None) -> AsyncIterator[StreamItem]:
        return await self.source.open_stream(principal, {}, cursor, None)


class _Filter(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    task_ids: list[StrictStr] | None = Field(None, alias="taskIds")


class _ListenParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    notifications: _Filter


@dataclass(eq=False)
class _Listening:
    """One open listen: what it serves and what changed since it last looked."""

    request_id: str | int
    principal: str
    ticket: Ticket
    task_ids: list[str]
    #: task id -> the JSON-RPC error tasks/get answers for it (left out of the listen).
    refused: dict[str, dict[str, Any]]
    asked_tasks: bool
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Task ids whose state must be re-read, oldest first (a dict as an ordered set).
    changed: dict[str, None] = field(default_factory=dict)

    @property
    def meta(self) -> dict[str, Any]:
        return {SUBSCRIPTION_ID_META: self.request_id}

    def mark(self, task_id: str) -> None:
        self.changed[task_id] = None
        self.wake.set()


async def _woken(event: asyncio.Event, idle_s: float) -> bool:
    """Wait up to ``idle_s`` for ``event``; False when idle that long."""
    try:
        async with asyncio.timeout(idle_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Listen:
    """The ``subscriptions/listen`` method (core, so no extension identifier)."""

    identifier = ""

    def __init__(
        self,
        config: Settings,
        tasks: TaskStates,
        streams: Streams,
        *,
        max_task_ids: int = MAX_TASK_IDS,
        listens_per_client: int = MAX_LISTENS_PER_CLIENT,
        replicas: Replicas | None = None,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.streams = streams
        self.replicas = replicas
        self.max_task_ids = max_task_ids
        self.listens_per_client = listens_per_client
        self._listens: Counter[str] = Counter()
        self._errors_meta = f"{config.tasks.event_type_prefix}/taskErrors"

    def methods(self) -> dict[str, MethodHandler]:
        return {"subscriptions/listen": self.listen}

    def settings(self) -> dict[str, Any]:
        return {}

    @property
    def active(self) -> int:
        """Listens open in this process."""
        return sum(self._listens.values())

    async def listen(self, call: Call) -> Outcome:
        """Check, sort the task ids by visibility and take a slot, before any byte is sent."""
        asked = _ListenParams.model_validate(call.params).notifications.task_ids
        if asked is not None and not has_capability(call.client_caps, tasks_capability()):
            raise missing_capability(tasks_capability())
        task_ids = list(dict.fromkeys(asked or ()))
        if len(task_ids) > self.max_task_ids:
            raise RpcError(
                INVALID_PARAMS,
                f"at most {self.max_task_ids} taskIds in one subscriptions/listen",
                {"reason": "too_many_task_ids", "limit": self.max_task_ids},
            )
        visible, refused = await self._sort(task_ids, call.caller)
        request_id = call.rpc.id if call.rpc.id is not None else ""  # handlers see requests only
        ticket = self._admit(call.caller, request_id)
        listening = _Listening(
            request_id, call.principal, ticket, visible, refused, asked_tasks=asked is not None
        )
        ticket.on_cancel.append(listening.wake.set)
        return Streamed(
            self._messages(listening), request_id, on_close=functools.partial(self._release, ticket)
        )

    async def _sort(
        self, task_ids: list[str], caller: Caller
    ) -> tuple[list[str], dict[str, dict[str, Any]]]:
        """The task ids the caller may see, and for the others what tasks/get answers. A task
        that cannot be read right now (its partition moving) fails the whole listen with that
        retriable error: the client cannot be told yet whether it may see the task."""
        found = await asyncio.gather(
            *(self._read(task_id, caller) for task_id in task_ids), return_exceptions=True
        )
        visible: list[str] = []
        refused: dict[str, dict[str, Any]] = {}
        for task_id, outcome in zip(task_ids, found, strict=True):
            if isinstance(outcome, RpcError) and outcome.code == INVALID_PARAMS:
                refused[task_id] = outcome.error()
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                visible.append(task_id)
        return visible, refused

    async def _read(self, task_id: str, caller: Caller) -> dict[str, Any]:
        """The task as tasks/get answers it, wherever it is served; the error tasks/get would
        answer as :class:`RpcError` (``-32602`` for a task the caller may not see)."""
        if self.replicas is not None:
            owner = await self.replicas.owner(task_id)
            if owner is not None:
                return await self.replicas.get(owner, task_id, caller)
        try:
            return detailed_task(await self.tasks.get(task_id, caller.principal))
        except DOMAIN_ERRORS as exc:  # as tasks/get answers them (bridge.server.errors)
            raise wire_error(exc, task_id).error from None

    # --- slots ---------------------------------------------------------------------------

    def _admit(self, caller: Caller, request_id: str | int) -> Ticket:
        if self._listens[caller.client] >= self.listens_per_client:
            raise RpcError(
                INVALID_REQUEST,
                f"too many active subscriptions/listen for this client "
                f"(limit {self.listens_per_client})",
                {"reason": "too_many_listens", "limit": self.listens_per_client},
                http_status=429,
            )
        # A key no task id can equal: the hub's one-stream-per-task-per-connection rule does not
        # apply to listens, which name no single task.
        ticket = self.streams.admit(caller, label("subscriptions/listen", request_id), request_id)
        self._listens[caller.client] += 1
        return ticket

    def _release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        self.streams.release(ticket)
        client = ticket.caller.client
        self._listens[client] -= 1
        if self._listens[client] <= 0:
            del self._listens[client]

    # --- the stream ----------------------------------------------------------------------

    async def _messages(self, listening: _Listening) -> AsyncIterator[dict[str, Any] | Frame]:
        with contextlib.ExitStack() as stack:
            subs = [stack.enter_context(self.tasks.watch(t)) for t in listening.task_ids]
            # Subscribed before the first read: a change from here on is never missed.
            watchers = [asyncio.create_task(self._watch(sub, listening)) for sub in subs]
            watchers.append(asyncio.create_task(self._wake_on_drain(listening)))
            if self.replicas is not None and listening.task_ids:
                watchers.append(asyncio.create_task(self._follow(self.replicas, listening)))
            try:
                yield self._acknowledged(listening)
                for task_id in listening.task_ids:
                    listening.mark(task_id)  # the current state of each comes first
                async for message in self._changes(listening):
                    yield message
            finally:
                await cancel_and_wait(*watchers)
        # A cancelled request gets no response (MCP cancellation); a torn-down one its result.
        if not listening.ticket.cancelled:
            yield result_response(
                listening.request_id, {"resultType": "complete", "_meta": listening.meta}
            )

    def _acknowledged(self, listening: _Listening) -> dict[str, Any]:
        agreed: dict[str, Any] = {}
        if listening.asked_tasks:
            agreed["taskIds"] = list(listening.task_ids)
        meta = listening.meta
        if listening.refused:
            meta = {**meta, self._errors_meta: listening.refused}
        return notification_message(
            "notifications/subscriptions/acknowledged", {"_meta": meta, "notifications": agreed}
        )

    def _ended(self, listening: _Listening) -> bool:
        return listening.ticket.cancelled or self.streams.draining.is_set()

    async def _changes(self, listening: _Listening) -> AsyncIterator[dict[str, Any] | Frame]:
        """One ``notifications/tasks`` per changed state, keep-alives while nothing changes."""
        sent: dict[str, dict[str, Any]] = {}
        keepalive = self.config.streams.keepalive_s
        while not self._ended(listening):
            if not listening.changed:
                if not await _woken(listening.wake, keepalive):
                    yield Frame(None)
                listening.wake.clear()
                continue
            task_id = next(iter(listening.changed))
            del listening.changed[task_id]
            state = await self._state(task_id, listening)
            # An overflow or a status event that left the task as it was is no change.
            if state is not None and state != sent.get(task_id):
                sent[task_id] = state
                yield notification_message(
                    "notifications/tasks", {**state, "_meta": listening.meta}
                )

    async def _state(self, task_id: str, listening: _Listening) -> dict[str, Any] | None:
        """The task as tasks/get answers it; None once it has expired (nothing more to say),
        and None for now when it cannot be read: it is read again after :data:`RETRY_S`."""
        try:
            return await self._read(task_id, listening.ticket.caller)
        except RpcError as exc:
            if exc.code != INVALID_PARAMS:
                log.info("listen: task state unavailable (%s); retrying", exc.message)
                loop = asyncio.get_running_loop()
                loop.call_later(RETRY_S, listening.mark, task_id)
            return None

    async def _follow(self, replicas: Replicas, listening: _Listening) -> None:
        """Mark the listen's tasks whose status changed, from the task-updates topic (any
        owner's tasks); every (re)start re-reads every state, then only what changed."""
        listed, cursor = set(listening.task_ids), None
        while not self._ended(listening):
            items: AsyncIterator[StreamItem] | None = None
            try:
                items = await replicas.updates(listening.principal, cursor)
                async for item in items:
                    cursor = item.cursor or cursor
                    if isinstance(item, Active):
                        for task_id in listening.task_ids:
                            listening.mark(task_id)
                    elif isinstance(item, Occurrence) and item.data.get("taskId") in listed:
                        listening.mark(item.data["taskId"])
                return  # the process is draining
            except Exception as exc:
                log.warning("listen: following task updates failed (%s)", type(exc).__name__)
            finally:
                # Its live-tail registration ends now, not when the generator is collected.
                close = getattr(items, "aclose", None)
                if close is not None:
                    await close()
            await asyncio.sleep(RETRY_S)  # the retry cadence, not synchronisation

    async def _watch(self, sub: TaskFeed, listening: _Listening) -> None:
        # Closed: the task's partition moved (the updates topic still says when it changes)
        # or the process is draining.
        with contextlib.suppress(FeedClosed):
            while await sub.wait():
                if self.tasks.status_changed(sub):
                    listening.mark(sub.task_id)

    async def _wake_on_drain(self, listening: _Listening) -> None:
        await self.streams.draining.wait()
        listening.wake.set()

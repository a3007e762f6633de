"""Who may open a long-lived response: SEP-2694's one-stream-per-connection rule and the DoS
limits.

Every response that stays open takes one slot here before its first byte and gives it back
when it ends, however it ends: ``tasks/stream`` and its ``GET`` resume, ``subscriptions/listen``,
``events/stream``, a ``tools/call`` that streams its progress, and the browser view's
EventSource endpoint. One budget for all of them, so no kind of stream walks around another's
limit. Responses that name no single task take a slot under a label of their own
(:func:`label`), which no task id can equal, so the connection rule (per task) never meets them.

Pure bookkeeping, no I/O: the stream hub asks :class:`Admission` before a stream starts and
gives the slot back when it ends, so every rule here is unit-tested in-process. The refusals'
wire shapes are :mod:`bridge.server.wire`'s.

*Connection* is the transport connection (the SEP's rule is per connection, and its own use case
is several clients on one task: a late joiner, a dashboard beside the agent, two tabs). On
HTTP/1.1 an open stream occupies its TCP connection, so a second stream always arrives on
another one and the rule holds by construction; a multiplexing transport (HTTP/2) carries many
requests on one connection, and there the rule is enforced by the connection key the transport
gives (see :func:`connection_of`).

The limits are denial-of-service limits only, counted per *client*: the principal when the
caller authenticated, else the anonymous caller's network address, so that auth mode ``none``
does not put every caller in one budget. A process-wide cap bounds the total.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.server.wire import rate_limited_error, stream_active_error, too_many_streams_error

__all__ = ["Admission", "Caller", "Limits", "Ticket", "connection_of", "label"]

#: Rate windows kept before idle clients' windows are dropped (memory follows active clients).
_RATE_WINDOWS = 10_000


def connection_of(scope: Mapping[str, Any]) -> Hashable | None:
    """The transport connection of an ASGI request: its local and peer addresses.

    Both ends of an open TCP connection are unique on this host; under HTTP/2 every request of
    one connection shares them, so the key enforces the rule where a transport multiplexes.
    None when the server gives no peer address (a Unix socket): each request is then its own
    connection.
    """
    client, server = scope.get("client"), scope.get("server")
    if client is None:
        return None
    return (tuple(server or ()), tuple(client))


def label(method: str, request_id: str | int | None) -> str:
    """The slot key of a long-lived response that names no single task (a listen, an
    events/stream, a tools/call with progress): a task id never contains a space."""
    return f"{method} {request_id!r}"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks: the verified principal, the client the limits count, the connection, and
    when the credential it presented expires (epoch seconds; None: never), which ends the
    long-lived responses it opened."""

    principal: str
    client: str
    connection: Hashable | None = None
    expires: float | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    streams_per_client: int
    opens_per_minute: int
    streams_total: int


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted stream's slot; :meth:`Admission.release` gives it back (idempotent)."""

    caller: Caller
    task_id: str
    request_id: str | int | None
    #: Set by :meth:`Admission.cancel` (``notifications/cancelled``): end without a result.
    cancelled: bool = False
    #: Set when the task's partition moved to another replica: end without a result, so the
    #: client resumes (with its cursor) where the partition is served now.
    moved: bool = False
    released: bool = False
    on_cancel: list[Callable[[], None]] = field(default_factory=list)


class Admission:
    """The open streams of this process, by connection, client and request id."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._on_connection: dict[tuple[Hashable, str], Ticket] = {}
        self._per_client: dict[str, int] = defaultdict(int)
        self._opens: dict[str, deque[float]] = defaultdict(deque)
        self._by_request: dict[tuple[str, str | int], set[Ticket]] = defaultdict(set)
        self.active = 0

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket:
        """Take a slot, or raise the :class:`~bridge.server.wire.RpcError` that refuses it.

        The connection rule is checked first: a second stream on one connection is -32602
        whatever else is wrong with it. Every attempt that passes it counts as an open.
        """
        if caller.connection is not None and (caller.connection, task_id) in self._on_connection:
            raise stream_active_error(task_id)
        self._count_open(caller.client)
        self._check_limits(caller.client)
        ticket = Ticket(caller, task_id, request_id)
        if caller.connection is not None:
            self._on_connection[(caller.connection, task_id)] = ticket
        self._per_client[caller.client] += 1
        if request_id is not None:
            self._by_request[(caller.client, request_id)].add(ticket)
        self.active += 1
        return ticket

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        caller = ticket.caller
        if caller.connection is not None:
            self._on_connection.pop((caller.connection, ticket.task_id), None)
        self._per_client[caller.client] -= 1
        if not self._per_client[caller.client]:
            del self._per_client[caller.client]
        if ticket.request_id is not None:
            key = (caller.client, ticket.request_id)
            self._by_request[key].discard(ticket)
            if not self._by_request[key]:
                del self._by_request[key]
        self.active -= 1

    def cancel(self, client: str, request_id: str | int) -> int:
        """``notifications/cancelled`` from ``client``: end its streams of that request id."""
        tickets = list(self._by_request.get((client, request_id), ()))
        for ticket in tickets:
            ticket.cancelled = True
            for callback in ticket.on_cancel:
                callback()
        return len(tickets)

    def _count_open(self, client: str) -> None:
        """At most ``opens_per_minute`` opens per client (cursor and task id guessing)."""
        if len(self._opens) > _RATE_WINDOWS:
            self.forget_idle_clients()
        window = self._opens[client]
        now = self._clock()
        while window and window[0] <= now - 60:
            window.popleft()
        limit = self.limits.opens_per_minute
        if len(window) >= limit:
            raise rate_limited_error(limit, window[0] + 60 - now)
        window.append(now)

    def _check_limits(self, client: str) -> None:
        per_client = self.limits.streams_per_client
        if self._per_client.get(client, 0) >= per_client:
            raise too_many_streams_error(per_client, replica=False)
        total = self.limits.streams_total
        if self.active >= total:
            raise too_many_streams_error(total, replica=True)

    def forget_idle_clients(self) -> None:
        """Drop the rate windows of clients with no open in the last minute."""
        now = self._clock()
        for client in [c for c, w in self._opens.items() if not w or w[-1] <= now - 60]:
            del self._opens[client]

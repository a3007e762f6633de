"""Domain errors on the wire: the one table every endpoint answers them with.

Where it sits: at the edge, between the layers that raise their own exceptions (the task
service, the indexer, the fan-out, the Kafka client) and every endpoint that answers a client:
``POST /mcp`` (:meth:`~bridge.server.handlers.MethodHandlers.dispatch`, the JSON answer and
the last event of a streamed one), ``GET /mcp`` (a resume), and the browser view's JSON and
SSE endpoints. :func:`wire_error` gives the JSON-RPC error (code, message, ``data.reason``),
the HTTP statuses and the ``Retry-After`` header; each endpoint only frames them its own way (a
JSON-RPC error response, the view's ``{"error", "reason"}`` body, an SSE event). So a
rebalance racing a request (:class:`~bridge.log.indexer.NotOwner`) is the retriable
``partition_moving`` (503, ``Retry-After``) wherever it lands, never a 500.

Two statuses per error: :attr:`WireError.status` answers a JSON-RPC request (MCP answers an
error of the request's own params, such as an unknown task, in a 200), and
:attr:`WireError.transport_status` answers a request that has no JSON-RPC channel for it
(``GET /mcp``, the view: never below 400; 404 for an unknown task, 410 for ``events_gone``).

What it does not do: map protocol errors (classify, params validation) or the Events
extension's own codes (:mod:`bridge.server.events`, which SEP-3415 fixes); frame anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.kafka.adapter import CLIENT_ERRORS, as_log_error
from bridge.kafka.port import LogError
from bridge.log.fanout import CANCELLED, DRAINING, FeedClosed
from bridge.log.indexer import NotOwner
from bridge.server.routing import RETRY_AFTER_MS, partition_moving_error
from bridge.server.wire import (
    EVENTS_GONE,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    RpcError,
)
from bridge.tasks.service import KafkaUnavailable, TaskNotFound, TooManyTasks

__all__ = ["DOMAIN_ERRORS", "WireError", "retry_after", "wire_error"]

log = logging.getLogger(__name__)


def retry_after(status: int, error: RpcError | None = None) -> dict[str, str]:
    """The ``Retry-After`` header of an answer with ``status``: a 503 is only ever retriable
    here (a partition moving, an owner not answering, Kafka not answering, a full replica).
    Its value is the error's ``data.retryAfterMs`` in whole seconds (at least 1), so the header
    and the body never disagree; one second when the error names none."""
    if status != 503:
        return {}
    data = error.data if error is not None else None
    wait_ms = data.get("retryAfterMs") if isinstance(data, dict) else None
    if not isinstance(wait_ms, int) or isinstance(wait_ms, bool):
        wait_ms = RETRY_AFTER_MS
    return {"Retry-After": str(max(1, -(-wait_ms // 1000)))}


@dataclass(frozen=True)
class WireError:
    """How every endpoint answers one error."""

    error: RpcError
    #: The HTTP status of a request with no JSON-RPC channel for the error (GET, the view).
    transport_status: int

    @property
    def status(self) -> int:
        """The HTTP status of a JSON-RPC answer (``POST /mcp``)."""
        return self.error.http_status

    @property
    def retriable(self) -> bool:
        """503: the same request may succeed shortly (here or on another replica)."""
        return self.transport_status == 503

    @property
    def headers(self) -> dict[str, str]:
        """``Retry-After`` for a retriable answer, else nothing."""
        return retry_after(self.transport_status, self.error)

    @property
    def reason(self) -> str | None:
        """``data.reason``, the stable name clients branch on, if the error has one."""
        data = self.error.data
        reason = data.get("reason") if isinstance(data, dict) else None
        return reason if isinstance(reason, str) else None


def _internal() -> RpcError:
    """An error the client cannot fix by retrying: no detail on the wire (it is logged here)."""
    return RpcError(INTERNAL_ERROR, "Internal error", http_status=500)


def _not_found(exc: TaskNotFound, task_id: str) -> RpcError:
    # Unknown, expired and another principal's task: one answer (docs/tasks-stream.md §10).
    return RpcError(INVALID_PARAMS, f"Failed to retrieve task: {exc}")


def _moving(exc: NotOwner, task_id: str) -> RpcError:
    return partition_moving_error(task_id)


#: A closed subscription's reason (other than a move) -> the wire's reason and message. A
#: cancelled one is not a cancelled task: its waiter was ended here, so it says so.
_CLOSED_BECAUSE = {
    DRAINING: ("draining", "This replica stopped serving the task (it is draining); retry shortly"),
    CANCELLED: ("wait_ended", "This replica stopped following the task; retry shortly"),
}


def _closed(exc: FeedClosed, task_id: str) -> RpcError:
    task_id = task_id or exc.task_id
    if exc.moved:
        return partition_moving_error(task_id)
    reason, message = _CLOSED_BECAUSE.get(exc.reason, _CLOSED_BECAUSE[CANCELLED])
    return _retriable(message, reason, task_id)


def _retriable(message: str, reason: str, task_id: str, **data: Any) -> RpcError:
    """A 503 the client may retry: every retriable reason has one shape (``reason``,
    ``retryAfterMs``, ``taskId`` when a task was named)."""
    fields: dict[str, Any] = {"reason": reason, "retryAfterMs": RETRY_AFTER_MS, **data}
    if task_id:
        fields["taskId"] = task_id
    return RpcError(INTERNAL_ERROR, message, fields, http_status=503)


def _kafka_unavailable(exc: KafkaUnavailable, task_id: str) -> RpcError:
    return _retriable(str(exc), "kafka_unavailable", exc.task_id)


def _client_error(exc: Exception, task_id: str) -> RpcError:
    """The Kafka client's own error, met outside the log port: as the port's would be."""
    return _log_error(as_log_error(exc), task_id)


def _log_error(exc: LogError, task_id: str) -> RpcError:
    """A Kafka error met through the log port: answered as the client's own error is."""
    return _kafka_failed(exc, exc.kind, exc.retriable, task_id)


def _kafka_failed(exc: Exception, kind: str, may_retry: bool, task_id: str) -> RpcError:
    if not may_retry:
        # Retrying cannot help (an authorization, a message too large, ...): the operator must.
        log.error("Kafka refused a request: %s", kind, exc_info=exc)
        return _internal()
    # Logged here, once, for every endpoint that maps it (the answer says only "retry").
    log.warning("a request failed: Kafka did not answer (%r)", exc)
    return _retriable(
        f"Kafka did not answer ({kind}): nothing was lost; retry later",
        "kafka_unavailable",
        task_id,
        error=kind,
    )


def _too_many_tasks(exc: TooManyTasks, task_id: str) -> RpcError:
    return RpcError(
        INVALID_REQUEST, str(exc), {"reason": "too_many_tasks", "limit": exc.limit}, http_status=429
    )


#: The table: domain error -> its JSON-RPC error (with the POST status) and the transport
#: status (None: the error's own status, as for Kafka errors, retriable or not).
_TABLE: tuple[tuple[type[BaseException], Callable[[Any, str], RpcError], int | None], ...] = (
    (TaskNotFound, _not_found, 404),
    (NotOwner, _moving, 503),
    (FeedClosed, _closed, 503),
    (KafkaUnavailable, _kafka_unavailable, 503),
    *((kind, _client_error, None) for kind in CLIENT_ERRORS),
    (LogError, _log_error, None),
    (TooManyTasks, _too_many_tasks, 429),
)

#: Every exception type the table maps (``except DOMAIN_ERRORS``).
DOMAIN_ERRORS: tuple[type[BaseException], ...] = tuple(kind for kind, _, _ in _TABLE)


def wire_error(exc: BaseException, task_id: str | None = None) -> WireError:
    """How every endpoint answers ``exc``, raised while serving a request about ``task_id``.

    An :class:`RpcError` answers as it is (its transport status at least 400, 410 for
    ``events_gone``); a domain error as the table says; anything else is an internal error
    (-32603, 500), logged here with its traceback and never shown to the client.
    """
    if isinstance(exc, RpcError):
        transport = 410 if exc.code == EVENTS_GONE else max(exc.http_status, 400)
        return WireError(exc, transport)
    for kind, build, status in _TABLE:
        if isinstance(exc, kind):
            error = build(exc, task_id or "")
            return WireError(error, status or error.http_status)
    log.error("internal error serving a request", exc_info=exc)
    return WireError(_internal(), 500)

"""The wire: JSON-RPC 2.0 and MCP shapes, error codes, and the one error type the server raises.

Only this module knows JSON-RPC message shapes: requests and their params, responses, the
errors tasks/stream answers with, and the ``notifications/tasks/event`` message
(:func:`notification`; its fast text, the same value, is rendered by :mod:`bridge.server.sse`,
which writes every SSE byte). Handlers raise :class:`RpcError` (or domain exceptions that
:mod:`bridge.server.handlers` maps once at the boundary); pydantic validation errors become
-32602 without library text on the wire. The error codes themselves live in
:mod:`bridge.vocabulary`.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictInt,
    StrictStr,
    model_validator,
)

from bridge.envelope import TaskEvent
from bridge.vocabulary import (
    EVENTS_GONE,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CAPABILITY,
    PARSE_ERROR,
    UNSUPPORTED_VERSION,
    error_object,
)

__all__ = [
    "CALLBACK_ENDPOINT_ERROR",
    "CHATGPT_CALLBACK_ENDPOINT_ERROR",
    "CLIENT_CAPS_META",
    "CLIENT_INFO_META",
    "EVENTS_GONE",
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LATEST_VERSION",
    "LEGACY_VERSIONS",
    "MAX_SEQ",
    "METHOD_NOT_FOUND",
    "MISSING_CAPABILITY",
    "PARSE_ERROR",
    "PROTOCOL_VERSION_META",
    "RELATED_TASK_META",
    "RESOURCE_EXHAUSTED",
    "RESULT_RETAINED_META",
    "SERVER_INFO_META",
    "SUBSCRIPTION_ID_META",
    "SUPPORTED_VERSIONS",
    "TASKS_EXTENSION",
    "UNSUPPORTED_VERSION",
    "EventsListParams",
    "EventsPollParams",
    "EventsSubscribeParams",
    "EventsSubscriptionParams",
    "EventsUnsubscribeParams",
    "InitializeParams",
    "JsonRpcRequest",
    "RpcError",
    "TaskIdParams",
    "TasksStreamParams",
    "TasksUpdateParams",
    "ToolsCallParams",
    "WebhookDelivery",
    "WebhookTarget",
    "cursor_ahead_error",
    "dumps",
    "error_response",
    "events_gone_error",
    "events_notification",
    "has_capability",
    "missing_capability",
    "notification",
    "notification_message",
    "progress_notification",
    "rate_limited_error",
    "result_response",
    "seq_untrusted_error",
    "stream_active_error",
    "tasks_capability",
    "too_many_streams_error",
]

log = logging.getLogger(__name__)

LATEST_VERSION = "2026-07-28"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
SUPPORTED_VERSIONS = (LATEST_VERSION, *LEGACY_VERSIONS)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPS_META = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
#: ``_meta`` of a tasks/get answer whose result (or error) is a stand-in: the task's status event
#: is no longer retained, so what it held cannot be shown (``false``; absent otherwise).
RESULT_RETAINED_META = "io.mcpbridge/resultRetained"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"


#: The largest sequence number (seq counts records at Kafka's int64 offsets).
MAX_SEQ = 2**63 - 1


class RpcError(Exception):
    """A JSON-RPC error with the HTTP status the Streamable HTTP transport answers with."""

    def __init__(
        self, code: int, message: str, data: Any = None, *, http_status: int = 200
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status

    def error(self) -> dict[str, Any]:
        return error_object(self.code, self.message, self.data)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class JsonRpcRequest(BaseModel):
    """A request or notification as received (params are validated per method)."""

    model_config = ConfigDict(extra="forbid")

    jsonrpc: StrictStr = Field(pattern=r"^2\.0$")
    id: StrictStr | StrictInt | None = None
    method: StrictStr
    params: dict[str, Any] | None = None


def result_response(request_id: str | int | None, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id: str | int | None, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.error()}


# --- params of the methods we serve (validated at the boundary) -----------------------------


class _Params(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    meta: dict[str, Any] | None = Field(default=None, alias="_meta")


class ToolsCallParams(_Params):
    name: StrictStr
    arguments: dict[str, Any] | None = None
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")
    request_state: StrictStr | None = Field(default=None, alias="requestState")


class TaskIdParams(_Params):
    task_id: StrictStr = Field(alias="taskId", min_length=1, max_length=256)


class TasksUpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def _seq_value(value: Any) -> int:
    """A sequence number: a JSON integer from 0 to :data:`MAX_SEQ`.

    An integral JSON number written with a fraction or exponent (``1.0``, ``1e0``) is that
    integer, as JSON Schema's ``"type": "integer"`` (SEP-2694's ``after``) defines it. Seq counts
    Kafka records, so no seq reaches 2**63: a larger value names no event and is refused.
    """
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise ValueError("a sequence number is an integer from 0 to 2**63-1")
    return value


SeqValue = Annotated[int, PlainValidator(_seq_value)]


class TasksStreamParams(TaskIdParams):
    after: SeqValue | None = None

    @model_validator(mode="before")
    @classmethod
    def _after_is_not_null(cls, data: Any) -> Any:
        if isinstance(data, dict) and "after" in data and data["after"] is None:
            raise ValueError("after: null is not a sequence number")
        return data


class InitializeParams(_Params):
    protocol_version: StrictStr = Field(alias="protocolVersion")
    capabilities: dict[str, Any] = Field(default_factory=dict)
    client_info: dict[str, Any] | None = Field(default=None, alias="clientInfo")


def dumps(message: Any) -> str:
    """One line of compact JSON (SSE frames and some clients split bodies on newlines)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def missing_capability(required: dict[str, Any]) -> RpcError:
    return RpcError(
        MISSING_CAPABILITY,
        "Missing required client capability",
        {"requiredCapabilities": required},
        http_status=400,
    )


def tasks_capability() -> dict[str, Any]:
    return {"extensions": {TASKS_EXTENSION: {}}}


def has_capability(client_caps: dict[str, Any], required: dict[str, Any]) -> bool:
    """True when every key of ``required`` (one level into ``extensions``) is declared."""
    for key, value in required.items():
        declared = client_caps.get(key)
        if not isinstance(declared, dict):
            return False
        wanted = value if key == "extensions" and isinstance(value, dict) else {}
        if any(not isinstance(declared.get(ext), dict) for ext in wanted):
            return False
    return True


# --- tasks/stream errors --------------------------------------------------------------------


def cursor_ahead_error(task_id: str, next_seq: int) -> RpcError:
    return RpcError(
        INVALID_PARAMS,
        f"after names a seq this task never had (its next seq is {next_seq})",
        {"reason": "cursor_ahead", "taskId": task_id, "nextSeq": next_seq},
    )


def seq_untrusted_error(task_id: str, message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, message, {"reason": "seq_untrusted", "taskId": task_id})


def events_gone_error(task_id: str, earliest_seq: int, *, http_status: int = 200) -> RpcError:
    return RpcError(
        EVENTS_GONE,
        "Task events are no longer available",
        {"reason": "events_gone", "taskId": task_id, "earliestSeq": earliest_seq},
        http_status=http_status,
    )


# --- admission: the refusals of every long-lived response ---------------------------------


def stream_active_error(task_id: str) -> RpcError:
    """A second tasks/stream of one task on one transport connection (SEP-2694: -32602)."""
    return RpcError(
        INVALID_PARAMS,
        "a tasks/stream for this task is already active on this connection; cancel it first",
        {"reason": "stream_active", "taskId": task_id},
    )


def rate_limited_error(limit: int, retry_after_s: float) -> RpcError:
    """A client over its opens of long-lived responses a minute (429)."""
    return RpcError(
        INVALID_REQUEST,
        f"too many stream requests from this client (limit {limit} a minute)",
        {"reason": "rate_limited", "retryAfterSeconds": round(retry_after_s, 1)},
        http_status=429,
    )


def too_many_streams_error(limit: int, *, replica: bool) -> RpcError:
    """A client (429) or the whole replica (503, retry on another) at its limit of open
    long-lived responses: streams, listens, events/stream, tools/call with progress."""
    if replica:
        return RpcError(
            INVALID_REQUEST,
            f"this replica serves its maximum of {limit} streams; retry on another",
            {"reason": "too_many_streams", "limit": limit, "scope": "replica"},
            http_status=503,
        )
    return RpcError(
        INVALID_REQUEST,
        f"too many active streams for this client (limit {limit})",
        {"reason": "too_many_streams", "limit": limit},
        http_status=429,
    )


# --- notifications/tasks/event -----------------------------------------------------------


def notification(task_id: str, seq: int, event: TaskEvent) -> dict[str, Any]:
    """One ``notifications/tasks/event`` message (what :func:`renderer` writes, as a dict)."""
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


# --- notifications/progress (a direct tools/call) ------------------------------------------


def progress_notification(token: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """``notifications/progress`` for a direct call's progress event."""
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, **_progress_fields(payload)},
    }


def _progress_fields(payload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("progress", "total", "message"):
        if key in payload:
            out[key] = payload[key]
    out.setdefault("progress", 0)
    return out


# --- the Events extension (SEP-3415) ------------------------------------------------------

SUBSCRIPTION_ID_META = "io.modelcontextprotocol/subscriptionId"


class EventsSubscriptionParams(BaseModel):
    """events/poll, events/stream: an event type, its arguments, where to resume."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: StrictStr
    arguments: dict[str, Any] | None = None
    cursor: StrictStr | None = None
    max_age_ms: StrictInt | None = Field(default=None, alias="maxAgeMs", ge=0)


class EventsPollParams(EventsSubscriptionParams):
    max_events: StrictInt | None = Field(default=None, alias="maxEvents", ge=1)


class EventsListParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cursor: StrictStr | None = None


#: The draft's codes beside NotFound, Forbidden and Unsupported (provisional, like them).
RESOURCE_EXHAUSTED = -32025
CALLBACK_ENDPOINT_ERROR = -32027
#: The code ChatGPT's MCP Events integration expects for a failed callback verification, with
#: ``data.reason`` (the ``chatgpt`` profile: :mod:`bridge.server.profile`). It sits in the
#: legacy -32000..-32019 band: the client's number, not ours to choose.
CHATGPT_CALLBACK_ENDPOINT_ERROR = -32015


class WebhookTarget(BaseModel):
    """``delivery`` of events/unsubscribe: where the subscription delivers."""

    model_config = ConfigDict(extra="ignore")

    #: Anything but "webhook" is refused as Unsupported before this model is read
    #: (:func:`bridge.server.events.webhook_mode`); absent means webhook.
    mode: Literal["webhook"] = "webhook"
    url: StrictStr = Field(max_length=2048)


class WebhookDelivery(WebhookTarget):
    """``delivery`` of events/subscribe; the secret is never echoed (not even in errors)."""

    secret: StrictStr = Field(repr=False, max_length=256)


class EventsUnsubscribeParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: StrictStr
    arguments: dict[str, Any] | None = None
    delivery: WebhookTarget


class EventsSubscribeParams(EventsUnsubscribeParams):
    """events/subscribe. ``ttlMs`` absent (server default) and ``null`` (a request for no
    expiry) differ: :meth:`ttl_given` tells them apart."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    delivery: WebhookDelivery
    cursor: StrictStr | None = None
    max_age_ms: StrictInt | None = Field(default=None, alias="maxAgeMs", ge=0)
    #: Any integer: the grant clamps it (the SEP has no rejection path for TTL values).
    ttl_ms: StrictInt | None = Field(default=None, alias="ttlMs")

    @property
    def ttl_given(self) -> bool:
        return "ttl_ms" in self.model_fields_set


def notification_message(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC notification."""
    return {"jsonrpc": "2.0", "method": method, "params": params}


def events_notification(method: str, subscription_id: Any, **params: Any) -> dict[str, Any]:
    """A ``notifications/events/<method>`` of one push stream (its subscription id in _meta)."""
    params["_meta"] = {SUBSCRIPTION_ID_META: subscription_id}
    return notification_message(f"notifications/events/{method}", params)

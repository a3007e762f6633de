"""From a POSTed body and its headers to a classified JSON-RPC message, or the rejection.

Pure: no I/O, no state, nothing of tasks or Kafka. The transport (:mod:`bridge.server.http`)
reads the body and hands it here with the headers; what comes back is an :class:`Inbound`
message for the handlers, or a :class:`Rejected` carrying the JSON-RPC error and the request
id to echo.

A request's era is chosen by its ``MCP-Protocol-Version`` header: 2026-07-28 (and any version
we do not know) takes the stateless path, where every request carries ``params._meta`` and the
``Mcp-Method`` / ``Mcp-Name`` headers are checked; no header or a 2025 version takes the legacy
path (``initialize`` handshake, no routing headers).

Order of checks on the stateless path: unknown method (404, -32601) → ``_meta`` (400, -32602) →
version header vs ``_meta`` (400, -32020) → supported version (400, -32022) → ``Mcp-Method`` →
``Mcp-Name`` (400, -32020). ``Mcp-Param-*`` headers need the tool's schema and are checked by
the tools/call handler.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from bridge import strictjson
from bridge.server.wire import (
    CLIENT_CAPS_META,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LEGACY_VERSIONS,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION_META,
    SUPPORTED_VERSIONS,
    UNSUPPORTED_VERSION,
    JsonRpcRequest,
    RpcError,
)

__all__ = ["Inbound", "Methods", "Rejected", "classify", "decode_header_value"]

#: Methods whose ``Mcp-Name`` header must equal a param.
NAME_PARAM = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}


@dataclass(frozen=True)
class Methods:
    """The method names served on each path (a method not listed is -32601 before any check)."""

    modern: Collection[str]
    legacy: Collection[str]


@dataclass(frozen=True)
class Inbound:
    """A classified message: a request (``rpc.id`` set) or a notification."""

    rpc: JsonRpcRequest
    legacy: bool
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def is_notification(self) -> bool:
        return self.rpc.id is None


class Rejected(Exception):
    """The message is refused: answer ``error`` for ``request_id`` (None when unreadable).

    ``method`` names the method when it is one the server serves (a bounded metric label).
    """

    def __init__(
        self, request_id: str | int | None, error: RpcError, method: str | None = None
    ) -> None:
        super().__init__(str(error))
        self.request_id = request_id
        self.error = error
        self.method = method


def classify(headers: Mapping[str, str], body: bytes, methods: Methods) -> Inbound:
    """Classify one POSTed message; raises :class:`Rejected` with the error to answer.

    ``headers`` is looked up by lower-case name (Starlette's headers, or a plain dict in tests).
    Notifications are classified without the routing checks: they get no answer anyway.
    """
    message = _parse(body)
    request_id = _request_id(message)
    served: str | None = None
    try:
        rpc = _rpc(message)
        if rpc.id is None:
            return Inbound(rpc, legacy=True, params=rpc.params or {})
        version = headers.get("mcp-protocol-version")
        legacy = version is None or version.strip() in LEGACY_VERSIONS
        inbound = Inbound(rpc, legacy, rpc.params or {})
        if rpc.method not in (methods.legacy if legacy else methods.modern):
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {rpc.method}", http_status=404)
        served = rpc.method
        if not legacy:
            _check_routing(headers, inbound)
        return inbound
    except RpcError as exc:
        raise Rejected(request_id, exc, served) from None


def _parse(body: bytes) -> Any:
    """The body under the wire's rules (:mod:`bridge.strictjson`): what could not be written
    back out (NaN, non-finite numbers, lone surrogates, nesting past its bound) is a parse
    error, like text that is not JSON at all."""
    try:
        return strictjson.loads(body)
    except strictjson.NotWireJson:
        error = RpcError(PARSE_ERROR, "Parse error: the body is not valid JSON", http_status=400)
        raise Rejected(None, error) from None


def _request_id(message: Any) -> str | int | None:
    if not isinstance(message, dict):
        return None
    raw = message.get("id")
    if isinstance(raw, str | int) and not isinstance(raw, bool):
        return raw
    return None


def _rpc(message: Any) -> JsonRpcRequest:
    if isinstance(message, list):
        raise RpcError(INVALID_REQUEST, "batch requests are not supported", http_status=400)
    if isinstance(message, dict) and "id" in message and message["id"] is None:
        raise RpcError(INVALID_REQUEST, "Invalid Request: id must not be null", http_status=400)
    try:
        return JsonRpcRequest.model_validate(message)
    except ValidationError:
        raise RpcError(
            INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request", http_status=400
        ) from None


def _check_routing(headers: Mapping[str, str], inbound: Inbound) -> None:
    version = _meta_version(inbound.params)
    if headers.get("mcp-protocol-version", "").strip() != version:
        raise RpcError(
            HEADER_MISMATCH, "MCP-Protocol-Version header does not match _meta", http_status=400
        )
    if version not in SUPPORTED_VERSIONS:
        raise RpcError(
            UNSUPPORTED_VERSION,
            f"unsupported protocol version {version!r}",
            {"supported": list(SUPPORTED_VERSIONS), "requested": version},
            http_status=400,
        )
    method = inbound.rpc.method
    if headers.get("mcp-method", "").strip() != method:
        raise RpcError(
            HEADER_MISMATCH, "Mcp-Method header does not match the method", http_status=400
        )
    name_param = NAME_PARAM.get(method)
    if name_param is not None:
        raw = headers.get("mcp-name")
        wanted = inbound.params.get(name_param)
        if raw is None or not isinstance(wanted, str) or decode_header_value(raw) != wanted:
            raise RpcError(
                HEADER_MISMATCH,
                f"Mcp-Name header does not match params.{name_param}",
                http_status=400,
            )


def _meta_version(params: dict[str, Any]) -> str:
    meta = params.get("_meta")
    if (
        not isinstance(meta, dict)
        or not isinstance(meta.get(PROTOCOL_VERSION_META), str)
        or not isinstance(meta.get(CLIENT_CAPS_META), dict)
    ):
        raise RpcError(
            INVALID_PARAMS,
            f"params._meta must carry {PROTOCOL_VERSION_META} and {CLIENT_CAPS_META}",
            http_status=400,
        )
    version: str = meta[PROTOCOL_VERSION_META]
    return version


def decode_header_value(raw: str) -> str:
    """Trim optional whitespace and decode the ``=?base64?…?=`` form (-32020 if malformed)."""
    value = raw.strip()
    if value.startswith("=?base64?") and value.endswith("?="):
        encoded = value[len("=?base64?") : -2]
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise RpcError(
                HEADER_MISMATCH, "malformed base64 header value", http_status=400
            ) from None
    return value

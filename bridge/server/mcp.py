"""The MCP endpoint: Streamable HTTP ``POST /mcp``, both wire eras, and the method handlers.

A request's era is chosen by its ``MCP-Protocol-Version`` header: 2026-07-28 (and any version
we do not know) takes the stateless path, where every request carries ``params._meta`` and
the ``Mcp-Method`` / ``Mcp-Name`` / ``Mcp-Param-*`` routing headers are checked; no header or a
2025 version takes the legacy path (``initialize`` handshake, no routing headers).

Order of checks on the stateless path: unknown method (404, -32601) → ``_meta`` (400, -32602) →
version header vs ``_meta`` (400, -32020) → supported version (400, -32022) → ``Mcp-Method`` →
``Mcp-Name`` → ``Mcp-Param-*`` (400, -32020) → the method, which may need a client capability
(400, -32021). Exceptions become JSON-RPC errors here and only here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bridge import __version__, strictjson
from bridge.config import Settings, ToolSpec
from bridge.events import TERMINAL_WIRE
from bridge.server.admission import Caller, Ticket, connection_of
from bridge.server.auth import Authenticator, Unauthorized
from bridge.server.streams import StreamHub, cursor_prefix, decode_cursor, renderer
from bridge.server.wire import (
    CLIENT_CAPS_META,
    EVENTS_GONE,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LATEST_VERSION,
    LEGACY_VERSIONS,
    MAX_SEQ,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION_META,
    SERVER_INFO_META,
    SUPPORTED_VERSIONS,
    TASKS_EXTENSION,
    UNSUPPORTED_VERSION,
    InitializeParams,
    JsonRpcRequest,
    RpcError,
    TaskIdParams,
    TasksStreamParams,
    TasksUpdateParams,
    ToolsCallParams,
    dumps,
    error_response,
    has_capability,
    missing_capability,
    result_response,
    tasks_capability,
)
from bridge.tasks.messages import new_task_id
from bridge.tasks.service import TaskNotFound, TaskService, TaskView, TooManyTasks

__all__ = ["Frame", "McpEndpoint", "Streamed"]

log = logging.getLogger(__name__)

SERVER_NAME = "mcp-kafka-bridge"
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}
_SETTLED = TERMINAL_WIRE | {"input_required"}
#: Methods whose ``Mcp-Name`` header must equal a param.
_NAME_PARAM = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}


@dataclass
class Frame:
    """One SSE event: a JSON-RPC message with an optional ``id``; no message = keep-alive.

    ``data`` is the message already rendered as one line of JSON (the hot path), if given.
    """

    message: dict[str, Any] | None
    event_id: str | None = None
    data: str | None = None


@dataclass
class Streamed:
    """A response sent as ``text/event-stream``: each yielded item is one SSE event."""

    messages: AsyncIterator[dict[str, Any] | Frame | list[Frame]]
    request_id: str | int | None = None
    #: Called once the response has ended, however it ended (even if it never started).
    on_close: Callable[[], None] | None = None


class _SseResponse(StreamingResponse):
    """A streamed response that always runs its ``on_close`` (the stream's admission slot is
    given back even when the client is gone before the first byte)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None] | None) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()


@dataclass
class Call:
    """One JSON-RPC request being served."""

    request: Request
    rpc: JsonRpcRequest
    caller: Caller
    legacy: bool
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def principal(self) -> str:
        return self.caller.principal

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else {}

    @property
    def client_caps(self) -> dict[str, Any]:
        caps = self.meta.get(CLIENT_CAPS_META)
        return caps if isinstance(caps, dict) else {}

    @property
    def accepts_sse(self) -> bool:
        return "text/event-stream" in self.request.headers.get("accept", "")


Outcome = dict[str, Any] | Streamed
Handler = Callable[[Call], Awaitable[Outcome]]


def _decode_header_value(raw: str) -> str:
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


def _sse_frame(frame: Frame) -> str:
    if frame.data is None and frame.message is None:
        return ": keep-alive\n\n"
    data = frame.data if frame.data is not None else dumps(frame.message or {})
    if frame.event_id is not None:
        return f"id: {frame.event_id}\nevent: message\ndata: {data}\n\n"
    return f"event: message\ndata: {data}\n\n"


def _utf8(text: str) -> bytes:
    """UTF-8 for the wire. A lone surrogate can only stand inside a JSON string here, where
    ``backslashreplace`` writes it as the JSON escape ``\\udXXX``: one bad character never
    fails a stream (the decoder refuses such records; this is the last line of defence)."""
    return text.encode("utf-8", "backslashreplace")


def _parse_json(body: bytes) -> Any:
    """The request body under the wire's rules (:mod:`bridge.strictjson`): what could not be
    written back out (NaN, non-finite numbers, lone surrogates, nesting past its bound) is a
    parse error, like text that is not JSON at all."""
    try:
        return strictjson.loads(body)
    except strictjson.NotWireJson:
        raise RpcError(
            PARSE_ERROR, "Parse error: the body is not valid JSON", http_status=400
        ) from None


def _header_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


class McpEndpoint:
    """Serves ``/mcp``; one instance per app."""

    def __init__(
        self,
        settings: Settings,
        service: TaskService,
        tools: list[ToolSpec],
        auth: Authenticator,
        hub: StreamHub,
    ) -> None:
        self.settings = settings
        self.service = service
        self.hub = hub
        self.tools = {tool.name: tool for tool in tools}
        self.tool_order = [tool.name for tool in tools]
        self.auth = auth
        self._validators = {
            tool.name: jsonschema.validators.validator_for(
                tool.input_schema, default=jsonschema.Draft202012Validator
            )(tool.input_schema)
            for tool in tools
        }
        self._allowed_hosts = {h.lower() for h in settings.allowed_hosts} | _LOOPBACK
        if settings.http_host not in ("0.0.0.0", "::", ""):
            self._allowed_hosts.add(settings.http_host.lower())
        self.modern: dict[str, Handler] = {
            "server/discover": self.discover,
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "prompts/list": self.prompts_list,
            "prompts/get": self.prompts_get,
            "resources/list": self.resources_list,
            "resources/templates/list": self.resource_templates_list,
            "resources/read": self.resources_read,
            "tasks/get": self.tasks_get,
            "tasks/update": self.tasks_update,
            "tasks/cancel": self.tasks_cancel,
            "tasks/stream": self.tasks_stream,
        }
        self.legacy: dict[str, Handler] = {
            "initialize": self.initialize,
            "ping": self.ping,
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "prompts/list": self.prompts_list,
            "resources/list": self.resources_list,
            "resources/templates/list": self.resource_templates_list,
        }

    # --- HTTP ----------------------------------------------------------------------------

    def _origin_allowed(self, request: Request) -> bool:
        if "*" in self._allowed_hosts:
            return True
        host = request.headers.get("host", "").strip().lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") and host.count(":") == 1 else host
        if host.startswith("[") and "]" in host:
            name = host[: host.index("]") + 1]
        if name not in self._allowed_hosts:
            return False
        origin = request.headers.get("origin")
        if origin is None:
            return True
        if origin in self.settings.allowed_origins:
            return True
        origin_host = (urlsplit(origin).hostname or "").lower()
        return origin_host in self._allowed_hosts or f"[{origin_host}]" in self._allowed_hosts

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RpcError(INVALID_REQUEST, f"request body over {limit} bytes", http_status=413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RpcError(INVALID_REQUEST, f"request body over {limit} bytes", http_status=413)
        return bytes(body)

    def _gate(self, request: Request) -> Caller | Response:
        """Who is calling, or the 403/401 response that refuses the request."""
        if not self._origin_allowed(request):
            return JSONResponse({"error": "forbidden host or origin"}, status_code=403)
        try:
            principal = self.auth.principal(request)
        except Unauthorized as exc:
            return JSONResponse(
                {"error": str(exc)},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="mcp"'},
            )
        # Limits count an authenticated principal; anonymous callers are told apart by address.
        client = principal
        if not self.auth.authenticates:
            client = f"{principal}@{request.client.host if request.client else 'unknown'}"
        return Caller(principal, client, connection_of(request.scope))

    async def post(self, request: Request) -> Response:
        caller = self._gate(request)
        if isinstance(caller, Response):
            return caller
        request_id: str | int | None = None
        started = time.perf_counter()
        method = "invalid"
        try:
            body = await self._read_body(request)
            message = _parse_json(body)
            if isinstance(message, dict):
                raw_id = message.get("id")
                if isinstance(raw_id, str | int) and not isinstance(raw_id, bool):
                    request_id = raw_id
                if "id" in message and raw_id is None:
                    raise RpcError(
                        INVALID_REQUEST, "Invalid Request: id must not be null", http_status=400
                    )
            if isinstance(message, list):
                raise RpcError(INVALID_REQUEST, "batch requests are not supported", http_status=400)
            try:
                rpc = JsonRpcRequest.model_validate(message)
            except ValidationError:
                raise RpcError(
                    INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request", http_status=400
                ) from None
            if rpc.id is None:
                self._notification(caller, rpc)
                return Response(status_code=202)  # notifications need no answer
            method = rpc.method
            version = request.headers.get("mcp-protocol-version")
            call = Call(
                request,
                rpc,
                caller,
                legacy=version is None or version.strip() in LEGACY_VERSIONS,
            )
            call.params = rpc.params or {}
            outcome = await self._dispatch(call)
        except RpcError as exc:
            self.hub.metrics.rpc(method, exc.code, time.perf_counter() - started)
            return self._json(error_response(request_id, exc), exc.http_status)
        except Exception:
            log.exception("internal error serving an MCP request")
            self.hub.metrics.rpc(method, INTERNAL_ERROR, time.perf_counter() - started)
            return self._json(
                error_response(request_id, RpcError(INTERNAL_ERROR, "Internal error")), 500
            )
        self.hub.metrics.rpc(method, "ok", time.perf_counter() - started)
        if isinstance(outcome, Streamed):
            return _SseResponse(self._sse(outcome, rpc.id), outcome.on_close)
        return self._json(result_response(rpc.id, outcome), 200)

    def _notification(self, caller: Caller, rpc: JsonRpcRequest) -> None:
        """``notifications/cancelled`` ends the caller's stream of that request; others are
        accepted and ignored (this server has no use for them)."""
        if rpc.method != "notifications/cancelled" or not rpc.params:
            return
        request_id = rpc.params.get("requestId")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            self.hub.cancel(caller.client, request_id)

    @staticmethod
    def _json(message: dict[str, Any], status: int) -> Response:
        return Response(dumps(message), status_code=status, media_type="application/json")

    async def _sse(self, outcome: Streamed, request_id: str | int | None) -> AsyncIterator[bytes]:
        try:
            async for item in outcome.messages:
                if isinstance(item, list):  # a batch: one write for what was at hand
                    yield _utf8("".join(_sse_frame(frame) for frame in item))
                else:
                    yield _utf8(_sse_frame(item if isinstance(item, Frame) else Frame(item)))
        except RpcError as exc:
            yield _utf8(_sse_frame(Frame(error_response(request_id, exc))))
        except Exception:
            log.exception("internal error in a streamed MCP response")
            error = RpcError(INTERNAL_ERROR, "Internal error")
            yield _utf8(_sse_frame(Frame(error_response(request_id, error))))

    async def not_allowed(self, request: Request) -> Response:
        return Response(status_code=405, headers={"Allow": "POST"})

    async def get(self, request: Request) -> Response:
        """Transport-level resume: ``GET /mcp`` with ``Last-Event-ID`` continues a tasks/stream."""
        cursor = request.headers.get("last-event-id")
        if cursor is None:
            return Response(status_code=405, headers={"Allow": "POST"})
        caller = self._gate(request)
        if isinstance(caller, Response):
            return caller
        try:
            request_id, task_id, seq = decode_cursor(cursor.strip())
        except ValueError:
            error = RpcError(INVALID_PARAMS, "Last-Event-ID is not a stream cursor")
            return self._json(error_response(None, error), 400)
        try:
            outcome = await self._open_stream(caller, request_id, task_id, seq)
        except TaskNotFound as exc:
            error = RpcError(INVALID_PARAMS, f"Failed to retrieve task: {exc}")
            return self._json(error_response(request_id, error), 404)
        except RpcError as exc:
            # The transport's own statuses: 410 for events_gone, else the error's (400 at least).
            status = 410 if exc.code == EVENTS_GONE else max(exc.http_status, 400)
            return self._json(error_response(request_id, exc), status)
        return _SseResponse(self._sse(outcome, request_id), outcome.on_close)

    # --- dispatch ------------------------------------------------------------------------

    async def _dispatch(self, call: Call) -> Outcome:
        table = self.legacy if call.legacy else self.modern
        handler = table.get(call.rpc.method)
        if handler is None:
            raise RpcError(
                METHOD_NOT_FOUND, f"Method not found: {call.rpc.method}", http_status=404
            )
        if not call.legacy:
            self._check_modern(call)
        try:
            outcome = await handler(call)
        except ValidationError:
            raise RpcError(INVALID_PARAMS, f"Invalid params for {call.rpc.method}") from None
        except TaskNotFound as exc:
            raise RpcError(INVALID_PARAMS, f"Failed to retrieve task: {exc}") from None
        except TooManyTasks as exc:
            raise RpcError(
                INVALID_REQUEST,
                str(exc),
                {"reason": "too_many_tasks", "limit": exc.limit},
                http_status=429,
            ) from None
        if isinstance(outcome, dict) and not call.legacy:
            outcome.setdefault("resultType", "complete")
        return outcome

    def _check_modern(self, call: Call) -> None:
        headers = call.request.headers
        meta = call.params.get("_meta")
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
        version = meta[PROTOCOL_VERSION_META]
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
        method = call.rpc.method
        if headers.get("mcp-method", "").strip() != method:
            raise RpcError(
                HEADER_MISMATCH, "Mcp-Method header does not match the method", http_status=400
            )
        name_param = _NAME_PARAM.get(method)
        if name_param is not None:
            raw = headers.get("mcp-name")
            wanted = call.params.get(name_param)
            if raw is None or not isinstance(wanted, str) or _decode_header_value(raw) != wanted:
                raise RpcError(
                    HEADER_MISMATCH,
                    f"Mcp-Name header does not match params.{name_param}",
                    http_status=400,
                )

    def _check_param_headers(self, call: Call, tool: ToolSpec, arguments: dict[str, Any]) -> None:
        properties = tool.input_schema.get("properties")
        if call.legacy or not isinstance(properties, dict):
            return
        for prop, schema in properties.items():
            header = schema.get("x-mcp-header") if isinstance(schema, dict) else None
            if not isinstance(header, str):
                continue
            raw = call.request.headers.get(f"mcp-param-{header}")
            expected = _header_text(arguments.get(prop)) if prop in arguments else None
            given = None if raw is None else _decode_header_value(raw)
            if given != expected:
                raise RpcError(
                    HEADER_MISMATCH,
                    f"Mcp-Param-{header} header does not match arguments.{prop}",
                    http_status=400,
                )

    # --- discovery and lists -------------------------------------------------------------

    def _server_info(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__}

    async def discover(self, call: Call) -> Outcome:
        return {
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": {
                "tools": {},
                "prompts": {},
                "resources": {},
                "extensions": {TASKS_EXTENSION: {}},
            },
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {SERVER_INFO_META: self._server_info()},
        }

    async def initialize(self, call: Call) -> Outcome:
        params = InitializeParams.model_validate(call.params)
        version = (
            params.protocol_version
            if params.protocol_version in LEGACY_VERSIONS
            else LEGACY_VERSIONS[0]
        )
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {}, "prompts": {}, "resources": {}},
            "serverInfo": self._server_info(),
        }

    async def ping(self, call: Call) -> Outcome:
        return {}

    def _cache_hints(self, call: Call, result: dict[str, Any]) -> dict[str, Any]:
        if not call.legacy:
            result.update(ttlMs=0, cacheScope="private")
        return result

    async def tools_list(self, call: Call) -> Outcome:
        tools = []
        for name in self.tool_order:
            tool = self.tools[name]
            entry: dict[str, Any] = {
                "name": tool.name,
                "description": tool.description or tool.name,
            }
            if tool.title:
                entry["title"] = tool.title
            entry["inputSchema"] = tool.input_schema
            if tool.output_schema is not None:
                entry["outputSchema"] = tool.output_schema
            entry["execution"] = {"taskSupport": tool.task}
            tools.append(entry)
        return self._cache_hints(call, {"tools": tools})

    async def prompts_list(self, call: Call) -> Outcome:
        return self._cache_hints(call, {"prompts": []})

    async def prompts_get(self, call: Call) -> Outcome:
        raise RpcError(INVALID_PARAMS, f"Unknown prompt: {call.params.get('name')!r}")

    async def resources_list(self, call: Call) -> Outcome:
        return self._cache_hints(call, {"resources": []})

    async def resource_templates_list(self, call: Call) -> Outcome:
        return self._cache_hints(call, {"resourceTemplates": []})

    async def resources_read(self, call: Call) -> Outcome:
        raise RpcError(INVALID_PARAMS, "Resource not found", {"uri": call.params.get("uri")})

    # --- tools/call ----------------------------------------------------------------------

    def _validate_arguments(self, tool: ToolSpec, arguments: dict[str, Any]) -> None:
        error = jsonschema.exceptions.best_match(self._validators[tool.name].iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise RpcError(
                INVALID_PARAMS,
                f"Invalid arguments for tool {tool.name}: {where} fails the '{error.validator}' rule",
            )

    async def tools_call(self, call: Call) -> Outcome:
        params = ToolsCallParams.model_validate(call.params)
        tool = self.tools.get(params.name)
        if tool is None:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        caps = call.client_caps
        if tool.requires and not call.legacy and not has_capability(caps, tool.requires):
            raise missing_capability(tool.requires)
        arguments = params.arguments or {}
        self._validate_arguments(tool, arguments)
        self._check_param_headers(call, tool, arguments)
        declares = not call.legacy and has_capability(caps, tasks_capability())
        if tool.task == "required" and not declares:
            raise missing_capability(tasks_capability())
        if params.request_state is not None:
            return await self._resume_direct(call, tool, params)
        answers = params.input_responses or {}
        if tool.input_before:
            if call.legacy:
                raise RpcError(
                    INVALID_REQUEST, f"tool {tool.name} needs input; use protocol {LATEST_VERSION}"
                )
            missing = {k: v for k, v in tool.input_before.items() if k not in answers}
            if missing:
                return {"resultType": "input_required", "inputRequests": missing}
            answers = {k: answers[k] for k in tool.input_before}
        else:
            answers = {}
        if tool.task == "required" or (tool.task == "optional" and declares):
            view = await self.service.create(
                tool, arguments, call.principal, input_responses=answers or None
            )
            return {"resultType": "task", **view.task_fields()}
        task_id = new_task_id()
        return await self._direct(
            call,
            tool,
            task_id,
            self.service.create(
                tool, arguments, call.principal, task_id=task_id, input_responses=answers or None
            ),
        )

    async def _resume_direct(self, call: Call, tool: ToolSpec, params: ToolsCallParams) -> Outcome:
        """A retry of a direct call that returned input_required: answer, then wait again."""
        task_id = params.request_state or ""
        try:
            view = await self.service.get(task_id, call.principal)
        except TaskNotFound:
            raise RpcError(INVALID_PARAMS, "requestState does not name a pending call") from None
        if view.status != "input_required":
            raise RpcError(INVALID_PARAMS, "requestState does not name a call waiting for input")
        return await self._direct(
            call,
            tool,
            task_id,
            self.service.update(task_id, call.principal, params.input_responses or {}),
        )

    async def _direct(
        self, call: Call, tool: ToolSpec, task_id: str, start: Awaitable[Any]
    ) -> Outcome:
        """Run the job on a worker and answer with its result (streaming progress if asked)."""
        token = call.meta.get("progressToken")
        if token is not None and call.accepts_sse:
            return Streamed(self._direct_stream(call, task_id, start, token))
        result: dict[str, Any] | None = None
        async for message in self._direct_stream(call, task_id, start, None):
            result = message
        assert result is not None
        return result["result"]  # type: ignore[no-any-return]

    async def _direct_stream(
        self, call: Call, task_id: str, start: Awaitable[Any], token: Any
    ) -> AsyncIterator[dict[str, Any]]:
        progress_type = self.settings.own_types.progress
        status_type = self.settings.own_types.status
        timeout = self.settings.direct_result_timeout_s
        with self.service.watch(task_id) as events:
            await start
            view = await self.service.get(task_id, call.principal)
            try:
                async with asyncio.timeout(timeout):
                    while view.status not in _SETTLED:
                        indexed = await events.get()
                        event = indexed.event
                        if event.type == progress_type and token is not None:
                            yield {
                                "jsonrpc": "2.0",
                                "method": "notifications/progress",
                                "params": {
                                    "progressToken": token,
                                    **_progress_fields(event.payload),
                                },
                            }
                        elif event.type == status_type:
                            view = await self.service.get(task_id, call.principal)
            except TimeoutError:
                with contextlib.suppress(Exception):
                    await self.service.cancel(task_id, call.principal)
                raise RpcError(
                    INTERNAL_ERROR, f"the tool did not finish within {timeout:g} s"
                ) from None
        yield result_response(call.rpc.id, self._direct_result(call, view, task_id))

    def _direct_result(self, call: Call, view: TaskView, task_id: str) -> dict[str, Any]:
        if view.status == "completed":
            result = dict(view.result or {"content": []})
            if not call.legacy:
                result.setdefault("resultType", "complete")
            return result
        if view.status == "input_required" and not call.legacy:
            return {
                "resultType": "input_required",
                "inputRequests": view.input_requests or {},
                "requestState": task_id,
            }
        if view.status == "failed":
            error = view.error or {}
            raw_code = error.get("code")
            code = (
                raw_code
                if isinstance(raw_code, int) and not isinstance(raw_code, bool)
                else INTERNAL_ERROR
            )
            raise RpcError(code, str(error.get("message", "the tool failed")), error.get("data"))
        raise RpcError(INTERNAL_ERROR, f"the tool call ended {view.status}")

    # --- tasks ---------------------------------------------------------------------------

    def _require_tasks(self, call: Call) -> None:
        if not has_capability(call.client_caps, tasks_capability()):
            raise missing_capability(tasks_capability())

    async def tasks_get(self, call: Call) -> Outcome:
        self._require_tasks(call)
        params = TaskIdParams.model_validate(call.params)
        view = await self.service.get(params.task_id, call.principal)
        result = view.task_fields()
        if view.status == "completed":
            result["result"] = view.result or {"content": []}
        elif view.status == "failed":
            result["error"] = view.error or {"code": INTERNAL_ERROR, "message": "the job failed"}
        elif view.status == "input_required":
            result["inputRequests"] = view.input_requests or {}
        return result

    async def tasks_update(self, call: Call) -> Outcome:
        self._require_tasks(call)
        params = TasksUpdateParams.model_validate(call.params)
        await self.service.update(params.task_id, call.principal, params.input_responses)
        return {}

    async def tasks_stream(self, call: Call) -> Outcome:
        self._require_tasks(call)
        try:
            params = TasksStreamParams.model_validate(call.params)
        except ValidationError:
            raise RpcError(
                INVALID_PARAMS,
                "tasks/stream needs a taskId string and, optionally, after: an integer from 0 to "
                f"{MAX_SEQ}",
            ) from None
        assert call.rpc.id is not None  # requests only: notifications never reach a handler
        return await self._open_stream(call.caller, call.rpc.id, params.task_id, params.after)

    async def _open_stream(
        self, caller: Caller, request_id: str | int, task_id: str, after: int | None
    ) -> Streamed:
        """Authorize, admit and check the cursor, in that order, before any byte is sent.

        Authorization first (a foreign task is unknown, whatever else); then the connection
        rule and the limits (a second stream on one connection is -32602 even when its cursor
        is bad too); then the cursor. The slot taken is given back when the response ends.
        """
        await self.service.get(task_id, caller.principal)  # same authorization as tasks/get
        ticket = self.hub.admit(caller, task_id, request_id)
        try:
            await self.hub.check_cursor(task_id, after)
        except BaseException as exc:
            self.hub.release(ticket)
            if isinstance(exc, RpcError) and exc.code == EVENTS_GONE:
                self.hub.metrics.stream_opens.labels("gone").inc()
            raise
        return Streamed(
            self._stream_frames(ticket, request_id, after),
            request_id,
            on_close=functools.partial(self.hub.release, ticket),
        )

    async def _stream_frames(
        self, ticket: Ticket, request_id: str | int, after: int | None
    ) -> AsyncIterator[Frame | list[Frame]]:
        task_id = ticket.task_id
        render = renderer(task_id, self.settings.event_type_prefix)
        cursor = cursor_prefix(request_id, task_id)
        async for batch in self.hub.events(ticket, after):
            if batch is None:
                yield Frame(None)
                continue
            yield [Frame(None, f"{cursor}{seq}", render(seq, event)) for seq, event in batch]
        # A cancelled request gets no response (MCP cancellation); a drained one resumes elsewhere.
        if not ticket.cancelled and not self.hub.draining.is_set():
            yield Frame(result_response(request_id, {"resultType": "complete"}))

    async def tasks_cancel(self, call: Call) -> Outcome:
        self._require_tasks(call)
        params = TaskIdParams.model_validate(call.params)
        await self.service.cancel(params.task_id, call.principal)
        return {}


def _progress_fields(payload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("progress", "total", "message"):
        if key in payload:
            out[key] = payload[key]
    out.setdefault("progress", 0)
    return out

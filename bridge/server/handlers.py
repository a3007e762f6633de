"""The MCP methods: what each request means for tools and tasks, with no transport in sight.

:class:`MethodHandlers` answers a classified request (:class:`Call`) with a result dict or a
:class:`Streamed` response, written against two interfaces: the task service's public methods
(create, get, update, cancel, watch) and :class:`Streams` (the stream hub: admission, cursor
checks, events); tests pass fakes of both. Domain errors become JSON-RPC errors here, once (:meth:`MethodHandlers.dispatch`).
It knows nothing of HTTP (:mod:`bridge.server.http`) or of how requests were classified
(:mod:`bridge.server.classify`), so every method is tested in-process with fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema
from pydantic import ValidationError

from bridge import __version__, tracing
from bridge.config import Settings, ToolSpec
from bridge.envelope import Item
from bridge.log.fanout import TaskFeed
from bridge.log.indexer import NotOwner
from bridge.log.records import Batch
from bridge.server.admission import Caller, Ticket, label
from bridge.server.classify import decode_header_value
from bridge.server.errors import DOMAIN_ERRORS, wire_error
from bridge.server.peers import routed_task_id
from bridge.server.profile import EventsProfile
from bridge.server.sse import RecentTexts, Streamed, task_stream
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
    RESULT_RETAINED_META,
    SERVER_INFO_META,
    SUPPORTED_VERSIONS,
    TASKS_EXTENSION,
    InitializeParams,
    JsonRpcRequest,
    RpcError,
    TaskIdParams,
    TasksStreamParams,
    TasksUpdateParams,
    ToolsCallParams,
    has_capability,
    missing_capability,
    progress_notification,
    result_response,
    tasks_capability,
)
from bridge.tasks.service import (
    TaskNotFound,
    TaskService,
    TaskView,
)
from bridge.vocabulary import TERMINAL_WIRE

__all__ = [
    "Call",
    "MethodHandler",
    "MethodHandlers",
    "MethodSet",
    "Outcome",
    "Streamed",
    "Streams",
    "detailed_task",
]

SERVER_NAME = "mcp-kafka-bridge"
_SETTLED = TERMINAL_WIRE | {"input_required"}


Outcome = dict[str, Any] | Streamed


@dataclass
class Call:
    """One JSON-RPC request being served."""

    rpc: JsonRpcRequest
    caller: Caller
    legacy: bool
    params: dict[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

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
        return "text/event-stream" in self.headers.get("accept", "")


MethodHandler = Callable[[Call], Awaitable[Outcome]]


class MethodSet(Protocol):
    """More methods on the stateless path, from an extension or a core feature built beside the
    tasks (``subscriptions/listen``, the Events extension). ``identifier`` (an extension id, or
    empty for core methods) is declared in ``server/discover`` with ``settings()``."""

    identifier: str

    def methods(self) -> dict[str, MethodHandler]: ...

    def settings(self) -> dict[str, Any]: ...


class Streams(Protocol):
    """What the handlers need of the stream hub (:class:`bridge.server.streams.StreamHub`)."""

    draining: asyncio.Event

    def admit(self, caller: Caller, task_id: str, request_id: str | int | None) -> Ticket: ...

    def release(self, ticket: Ticket) -> None: ...

    async def check_cursor(self, task_id: str, after: int | None) -> int | None: ...

    def events(
        self, ticket: Ticket, after: int | None, log_start: int | None = None, *, wire: bool
    ) -> AsyncIterator[Batch[Item] | None]: ...

    def count_gone(self) -> None: ...


class MethodHandlers:
    """Every MCP method the bridge serves, on both wire eras."""

    def __init__(
        self,
        settings: Settings,
        service: TaskService,
        tools: list[ToolSpec],
        streams: Streams,
        extensions: Sequence[MethodSet] = (),
    ) -> None:
        self.settings = settings
        self.extensions = list(extensions)
        #: The Events client profile: its top-level capability and its legacy methods.
        self.profile = EventsProfile.of(settings)
        self.service = service
        self.streams = streams
        self._texts = RecentTexts()  # notification texts, shared by the streams of a task
        self.tools = {tool.name: tool for tool in tools}
        self.tool_order = [tool.name for tool in tools]
        self._validators = {
            tool.name: jsonschema.validators.validator_for(
                tool.input_schema, default=jsonschema.Draft202012Validator
            )(tool.input_schema)
            for tool in tools
        }
        self.modern: dict[str, MethodHandler] = {
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
        for extension in self.extensions:
            self.modern.update(extension.methods())
        self.legacy: dict[str, MethodHandler] = {
            "initialize": self.initialize,
            "ping": self.ping,
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "prompts/list": self.prompts_list,
            "resources/list": self.resources_list,
            "resources/templates/list": self.resource_templates_list,
        }
        for method in self.profile.legacy_methods:
            if method in self.modern:  # served when the Events extension is
                self.legacy[method] = self.modern[method]

    def _profile_capabilities(self) -> dict[str, Any]:
        return self.profile.capabilities({x.identifier for x in self.extensions})

    async def dispatch(self, call: Call) -> Outcome:
        """Run the method; domain errors become JSON-RPC errors here and only here."""
        handler = (self.legacy if call.legacy else self.modern).get(call.rpc.method)
        if handler is None:
            raise RpcError(
                METHOD_NOT_FOUND, f"Method not found: {call.rpc.method}", http_status=404
            )
        try:
            with tracing.rpc_span(call.rpc.method, call.headers, call.params):
                outcome = await handler(call)
        except ValidationError:
            raise RpcError(INVALID_PARAMS, f"Invalid params for {call.rpc.method}") from None
        except DOMAIN_ERRORS as exc:
            # One table for every endpoint (bridge.server.errors): a NotOwner here was
            # forwarded a moment before the partition moved on, and the client retries.
            raise wire_error(exc, _named_task(call)).error from None
        if isinstance(outcome, dict) and not call.legacy:
            outcome.setdefault("resultType", "complete")
        return outcome

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
                **self._profile_capabilities(),
                "extensions": {
                    TASKS_EXTENSION: {},
                    **{x.identifier: x.settings() for x in self.extensions if x.identifier},
                },
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
            "capabilities": {
                "tools": {},
                "prompts": {},
                "resources": {},
                **self._profile_capabilities(),
            },
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
        _check_param_headers(call, tool, arguments)
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
        task_id = self.service.new_task_id()
        return await self._direct(
            call,
            tool,
            task_id,
            functools.partial(
                self.service.create,
                tool,
                arguments,
                call.principal,
                task_id=task_id,
                input_responses=answers or None,
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
            functools.partial(
                self.service.update, task_id, call.principal, params.input_responses or {}
            ),
        )

    async def _direct(
        self, call: Call, tool: ToolSpec, task_id: str, start: Callable[[], Awaitable[Any]]
    ) -> Outcome:
        """Run the job on a worker and answer with its result (streaming progress if asked).

        A call that streams its progress is a long-lived response: it takes a stream slot
        before the job starts (a refused call creates no task) and gives it back when the
        response ends. A call answered as JSON is bounded by the active-task limit instead
        (each is a task until it ends) and by ``tasks.direct_result_timeout_s``.
        """
        token = call.meta.get("progressToken")
        if token is not None and call.accepts_sse:
            request_id = call.rpc.id
            ticket = self.streams.admit(call.caller, label("tools/call", request_id), request_id)
            return Streamed(
                self._direct_stream(call, task_id, start, token),
                request_id,
                on_close=functools.partial(self.streams.release, ticket),
            )
        last: dict[str, Any] = {}
        async for message in self._direct_stream(call, task_id, start, None):
            last = message  # without a token the only message is the response
        return dict(last["result"])

    async def _direct_stream(
        self, call: Call, task_id: str, start: Callable[[], Awaitable[Any]], token: Any
    ) -> AsyncIterator[dict[str, Any]]:
        timeout = self.settings.tasks.direct_result_timeout_s
        rising = _RisingProgress()
        with self.service.watch(task_id) as sub:
            await start()
            # The job is queued from here on: every way out but its result cancels it first,
            # so a client retrying a retriable answer does not leave a second copy running.
            try:
                async with asyncio.timeout(timeout):
                    view = await self.service.get(task_id, call.principal)
                    while view.status not in _SETTLED:
                        await self.service.next_events(sub)
                        took = _Took(self.settings, task_id, sub, token)
                        for message in took.progress:
                            if rising.admit(message):
                                yield message
                        if took.changed:
                            view = await self._reread(call, task_id, took.status)
            except TimeoutError:
                await self._stop_job(call, task_id, cancel=True)
                raise RpcError(
                    INTERNAL_ERROR, f"the tool did not finish within {timeout:g} s"
                ) from None
            except Exception as exc:
                # The partition moved (or the replica drains, or Kafka failed) while the call
                # waited, maybe while the task was being created: nothing more arrives here.
                await self._stop_job(call, task_id, cancel=False)
                raise wire_error(exc, task_id).error from None
        yield result_response(call.rpc.id, self._direct_result(call, view, task_id))

    async def _reread(self, call: Call, task_id: str, buffered: TaskView | None) -> TaskView:
        """The task's view after its status changed; the ``buffered`` status when the task's
        partition moved just after it arrived (this replica no longer indexes the task)."""
        try:
            return await self.service.get(task_id, call.principal)
        except NotOwner:
            if buffered is None or buffered.status not in _SETTLED:
                raise
            return buffered

    async def _stop_job(self, call: Call, task_id: str, *, cancel: bool) -> None:
        """Ask the workers to cancel the job of a call that will not answer its result:
        through the task (``cancel``, which reads its view) when this replica still serves it,
        else with a bare cancel message (:meth:`TaskService.abandon`)."""
        if cancel:
            with contextlib.suppress(Exception):
                await self.service.cancel(task_id, call.principal)
                return
        with contextlib.suppress(Exception):
            await self.service.abandon(task_id)

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
        return detailed_task(await self.service.get(params.task_id, call.principal))

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
        request_id = call.rpc.id if call.rpc.id is not None else ""  # handlers see requests only
        return await self.open_stream(call.caller, request_id, params.task_id, params.after)

    async def open_stream(
        self, caller: Caller, request_id: str | int, task_id: str, after: int | None
    ) -> Streamed:
        """Authorize, admit and check the cursor, in that order, before any byte is sent.

        Authorization first (a foreign task is unknown, whatever else); then the connection
        rule and the limits (a second stream on one connection is -32602 even when its cursor
        is bad too); then the cursor. The slot taken is given back when the response ends.
        """
        await self.service.get(task_id, caller.principal)  # same authorization as tasks/get
        ticket = self.streams.admit(caller, task_id, request_id)
        try:
            log_start = await self.streams.check_cursor(task_id, after)
        except BaseException as exc:
            self.streams.release(ticket)
            if isinstance(exc, RpcError) and exc.code == EVENTS_GONE:
                self.streams.count_gone()
            raise
        # The body is the SSE module's: nothing of this module is on a stream's path.
        batches = self.streams.events(ticket, after, log_start, wire=True)
        prefix = self.settings.tasks.event_type_prefix
        return Streamed(
            task_stream(batches, ticket, request_id, self._texts, prefix, self.streams.draining),
            request_id,
            on_close=functools.partial(self.streams.release, ticket),
        )

    async def tasks_cancel(self, call: Call) -> Outcome:
        self._require_tasks(call)
        params = TaskIdParams.model_validate(call.params)
        await self.service.cancel(params.task_id, call.principal)
        return {}


class _RisingProgress:
    """A direct call's progress notifications, passed only while their value increases.

    MCP: the progress value MUST increase with each notification. A job that runs again (its
    worker crashed, or it was re-delivered) restarts its progress, and any writer of the events
    topic may write any number: what does not increase, or is not a finite number, is dropped.
    """

    def __init__(self) -> None:
        self.last: float | None = None

    def admit(self, notification: dict[str, Any]) -> bool:
        """True when ``notification`` may be sent (and it becomes the value to beat)."""
        value = notification["params"].get("progress")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not math.isfinite(value) or (self.last is not None and value <= self.last):
            return False
        self.last = value
        return True


class _Took:
    """What one wake of a direct call's feed brought: its progress notifications
    (sent only with a progress token), whether the task's status changed, and the status the
    index holds after these events, as the events show it (None if none was valid)."""

    def __init__(self, settings: Settings, task_id: str, sub: TaskFeed, token: Any) -> None:
        types = settings.own_types
        self.progress: list[dict[str, Any]] = []
        # Progress is best effort: what an overflow dropped is not re-sent.
        self.changed = sub.overflowed
        self.status: TaskView | None = None
        for indexed in sub.take():
            event = indexed.event
            if event.type == types.progress and token is not None:
                self.progress.append(progress_notification(token, event.payload))
            elif event.type == types.status:
                self.changed = True
                if self.status is None or not self.status.terminal:  # the first end stays
                    self.status = TaskService.status_view(task_id, event) or self.status
        sub.reset()


def detailed_task(view: TaskView) -> dict[str, Any]:
    """The task as tasks/get answers it (the extension's DetailedTask): its fields and, by
    status, its result, error or outstanding input requests. ``notifications/tasks`` carries
    exactly this too (:mod:`bridge.server.listen`)."""
    result = view.task_fields()
    if view.status == "completed":
        result["result"] = view.result or {"content": []}
    elif view.status == "failed":
        result["error"] = view.error or {"code": INTERNAL_ERROR, "message": "the job failed"}
    elif view.status == "input_required":
        result["inputRequests"] = view.input_requests or {}
    if not view.retained:
        result["_meta"] = {RESULT_RETAINED_META: False}
    return result


def _header_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


def _check_param_headers(call: Call, tool: ToolSpec, arguments: dict[str, Any]) -> None:
    """Each ``x-mcp-header`` argument must be echoed in its ``Mcp-Param-*`` header (-32020)."""
    properties = tool.input_schema.get("properties")
    if call.legacy or not isinstance(properties, dict):
        return
    for prop, schema in properties.items():
        header = schema.get("x-mcp-header") if isinstance(schema, dict) else None
        if not isinstance(header, str):
            continue
        raw = call.headers.get(f"mcp-param-{header}")
        expected = _header_text(arguments.get(prop)) if prop in arguments else None
        given = None if raw is None else decode_header_value(raw)
        if given != expected:
            raise RpcError(
                HEADER_MISMATCH,
                f"Mcp-Param-{header} header does not match arguments.{prop}",
                http_status=400,
            )


def _named_task(call: Call) -> str:
    return routed_task_id(call.rpc.method, call.params) or ""

"""Built-in worker packs: tool specs plus the handlers that run them on a worker.

* ``conformance``: the fixture tools the official MCP conformance suite calls (see
  ``docs/dev/conformance-suite-facts.md``). ``test_simple_text`` comes first because the suite
  calls the first listed tool with no arguments and default capabilities.
* ``demo``: ``agent_run``, a deterministic fake agent that streams a realistic timeline of
  vendor-prefixed events (``com.example.agent.*``) into the task's log.

The server lists the tools of ``Settings.tool_packs`` with :func:`pack_tools`; ``bridge workers``
runs the handlers of the same packs with :func:`pack_handlers`.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Iterable
from typing import Any

from bridge.config import ToolSpec
from bridge.vocabulary import INTERNAL_ERROR
from bridge.workers.sdk import JobContext, JobError, JobHandler

__all__ = ["PACKS", "UnknownPack", "pack_handlers", "pack_tools"]


class UnknownPack(KeyError):
    """A pack name that is not built in."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown worker pack {self.name!r}; known packs: {', '.join(sorted(PACKS))}"


# --- shared bits ------------------------------------------------------------------------------

#: A 1x1 red PNG and a tiny WAV, the canonical data of the conformance fixtures.
PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

_NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}


def text_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A ``CallToolResult`` with one text item."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if is_error:
        result["isError"] = True
    return result


def elicitation(message: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An ``elicitation/create`` input request with a flat object schema of primitives."""
    return {
        "method": "elicitation/create",
        "params": {
            "message": message,
            "requestedSchema": {"type": "object", "properties": properties, "required": required},
        },
    }


def _str_arg(ctx: JobContext, name: str, default: str) -> str:
    value = ctx.arguments.get(name, default)
    return value if isinstance(value, str) else str(value)


def _int_arg(ctx: JobContext, name: str, default: int, low: int, high: int) -> int:
    value = ctx.arguments.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobError(-32602, f"argument {name!r} must be a number")
    return max(low, min(high, int(value)))


def _accepted(answer: Any) -> dict[str, Any] | None:
    """The content of an accepted elicitation answer, else None (declined/cancelled/garbled)."""
    if isinstance(answer, dict) and answer.get("action") == "accept":
        content = answer.get("content")
        return content if isinstance(content, dict) else {}
    return None


# --- conformance pack -------------------------------------------------------------------------


async def simple_text(ctx: JobContext) -> dict[str, Any]:
    return text_result("This is a simple text response for testing.")


async def image_content(ctx: JobContext) -> dict[str, Any]:
    return {"content": [{"type": "image", "data": PNG_BASE64, "mimeType": "image/png"}]}


async def audio_content(ctx: JobContext) -> dict[str, Any]:
    return {"content": [{"type": "audio", "data": WAV_BASE64, "mimeType": "audio/wav"}]}


async def embedded_resource(ctx: JobContext) -> dict[str, Any]:
    resource = {
        "uri": "test://embedded-resource",
        "mimeType": "text/plain",
        "text": "This is an embedded resource content.",
    }
    return {"content": [{"type": "resource", "resource": resource}]}


async def multiple_content_types(ctx: JobContext) -> dict[str, Any]:
    resource = {
        "uri": "test://mixed-content-resource",
        "mimeType": "application/json",
        "text": '{"test":"data","value":123}',
    }
    return {
        "content": [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "data": PNG_BASE64, "mimeType": "image/png"},
            {"type": "resource", "resource": resource},
        ]
    }


async def error_handling(ctx: JobContext) -> dict[str, Any]:
    # A tool-level error: a result with isError, not a protocol error.
    return text_result("This tool intentionally returns an error for testing", is_error=True)


async def tool_with_progress(ctx: JobContext) -> dict[str, Any]:
    for step, value in enumerate((0, 50, 100)):
        if step:
            await asyncio.sleep(0.05)
        await ctx.progress(value, total=100)
    return text_result("Progress test completed")


async def json_schema_tool(ctx: JobContext) -> dict[str, Any]:
    return text_result(f"Received arguments: {sorted(ctx.arguments)}")


async def missing_capability(ctx: JobContext) -> dict[str, Any]:
    return text_result("This tool needs the sampling capability, and the client has it.")


async def streaming_elicitation(ctx: JobContext) -> dict[str, Any]:
    answer = ctx.input_responses.get("confirm")
    content = _accepted(answer)
    if content is None:
        action = answer.get("action") if isinstance(answer, dict) else None
        return text_result(f"Elicitation not accepted (action: {action or 'none'})")
    return text_result(f"Elicitation accepted: confirm={content.get('confirm')!r}")


async def logging_tool(ctx: JobContext) -> dict[str, Any]:
    return text_result("Logging tool finished (log notifications only with a requested level).")


async def header_param(ctx: JobContext) -> dict[str, Any]:
    return text_result(f"Region: {_str_arg(ctx, 'region', '')}")


async def greet(ctx: JobContext) -> dict[str, Any]:
    return text_result(f"Hello, {_str_arg(ctx, 'name', 'World')}!")


async def slow_compute(ctx: JobContext) -> dict[str, Any]:
    """Sleep ``seconds`` in small steps, reporting progress each second.

    Cancellation needs nothing special here: the worker cancels this coroutine on a cancel
    request and reports the task ``cancelled``; it only must not swallow ``CancelledError``.
    """
    seconds = ctx.arguments.get("seconds", 1)
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds < 86_400
    ):
        raise JobError(-32602, "argument 'seconds' must be a number from 0 to 86400")
    label = _str_arg(ctx, "label", "result")
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + float(seconds)
    reported = -1
    while True:
        now = loop.time()
        whole = int(now - start)
        if whole > reported and now < deadline:
            reported = whole
            await ctx.progress(whole, total=seconds, message=f"computing {label}")
        if now >= deadline:
            break
        await asyncio.sleep(min(0.1, deadline - now))
    return text_result(f"Computed {label} in {seconds}s")


async def failing_job(ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(1.0)
    return text_result("The job ran and failed: this is a tool error (isError)", is_error=True)


async def protocol_error_job(ctx: JobContext) -> dict[str, Any]:
    raise JobError(INTERNAL_ERROR, "protocol_error_job always fails with an internal error")


async def confirm_delete(ctx: JobContext) -> dict[str, Any]:
    filename = _str_arg(ctx, "filename", "file")
    answers = await ctx.ask(
        {
            "confirm": elicitation(
                f"Delete {filename}? This cannot be undone.",
                {"confirm": {"type": "boolean", "description": "Delete the file"}},
                ["confirm"],
            )
        },
        message=f"waiting for confirmation to delete {filename}",
    )
    content = _accepted(answers["confirm"])
    if content is not None and content.get("confirm") is True:
        return text_result(f"Deleted {filename}")
    return text_result(f"Kept {filename}")


async def multi_input(ctx: JobContext) -> dict[str, Any]:
    answers = await ctx.ask(
        {
            "name": elicitation(
                "What name should be used?", {"name": {"type": "string"}}, ["name"]
            ),
            "confirm": elicitation(
                "Proceed with this name?", {"confirm": {"type": "boolean"}}, ["confirm"]
            ),
        },
        message="waiting for a name and a confirmation",
    )
    name = (_accepted(answers["name"]) or {}).get("name")
    confirmed = (_accepted(answers["confirm"]) or {}).get("confirm")
    return text_result(f"Name: {name}; confirmed: {confirmed}")


async def tool_with_task(ctx: JobContext) -> dict[str, Any]:
    content = _accepted(ctx.input_responses.get("user_name"))
    name = content.get("name") if content is not None else None
    if not isinstance(name, str) or not name:
        raise JobError(-32602, "the user_name input request was not answered with a name")
    return text_result(f"Hello, {name}!")


JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _spec(name: str, description: str, **fields: Any) -> ToolSpec:
    fields.setdefault("input_schema", dict(_NO_ARGS))
    fields.setdefault("task", "forbidden")
    return ToolSpec(name=name, description=description, **fields)


_CONFORMANCE: list[tuple[ToolSpec, JobHandler]] = [
    (_spec("test_simple_text", "Returns a simple text response."), simple_text),
    (_spec("test_image_content", "Returns a 1x1 PNG image."), image_content),
    (_spec("test_audio_content", "Returns a short WAV audio clip."), audio_content),
    (_spec("test_embedded_resource", "Returns an embedded text resource."), embedded_resource),
    (
        _spec("test_multiple_content_types", "Returns text, an image and a resource."),
        multiple_content_types,
    ),
    (_spec("test_error_handling", "Returns a tool error (isError)."), error_handling),
    (
        _spec("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100."),
        tool_with_progress,
    ),
    (
        _spec(
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features",
            input_schema=JSON_SCHEMA_2020_12,
        ),
        json_schema_tool,
    ),
    (
        _spec(
            "test_missing_capability",
            "Needs the client's sampling capability.",
            requires={"sampling": {}},
        ),
        missing_capability,
    ),
    (
        _spec(
            "test_streaming_elicitation",
            "Asks the client to confirm (elicitation) before it runs.",
            input_before={
                "confirm": elicitation(
                    "Please confirm to continue.",
                    {"confirm": {"type": "boolean"}},
                    ["confirm"],
                )
            },
        ),
        streaming_elicitation,
    ),
    (_spec("test_logging_tool", "Returns text; logs only at a requested level."), logging_tool),
    (
        _spec(
            "test_header_param",
            "Echoes a region that is also sent as the Mcp-Param-Region header.",
            input_schema={
                "type": "object",
                "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
                "required": ["region"],
            },
        ),
        header_param,
    ),
    (
        _spec(
            "greet",
            "Greets someone by name.",
            input_schema={
                "type": "object",
                "properties": {"name": {"type": "string", "description": "Who to greet"}},
                "required": ["name"],
            },
        ),
        greet,
    ),
    (
        _spec(
            "slow_compute",
            "Computes for the given number of seconds; cancellable.",
            task="optional",
            input_schema={
                "type": "object",
                "properties": {
                    "seconds": {"type": "number", "minimum": 0, "default": 1},
                    "label": {"type": "string"},
                },
            },
        ),
        slow_compute,
    ),
    (
        _spec("failing_job", "Runs for a second, then reports a tool error.", task="required"),
        failing_job,
    ),
    (
        _spec("protocol_error_job", "Fails with a JSON-RPC internal error.", task="optional"),
        protocol_error_job,
    ),
    (
        _spec(
            "confirm_delete",
            "Deletes a file after the user confirms.",
            task="optional",
            input_schema={
                "type": "object",
                "properties": {"filename": {"type": "string"}},
                "required": ["filename"],
            },
        ),
        confirm_delete,
    ),
    (
        _spec("multi_input", "Asks for a name and a confirmation at once.", task="optional"),
        multi_input,
    ),
    (
        _spec(
            "test_tool_with_task",
            "Asks for your name, then greets you from a task.",
            task="required",
            input_before={
                "user_name": elicitation(
                    "What is your name?", {"name": {"type": "string"}}, ["name"]
                )
            },
        ),
        tool_with_task,
    ),
]


# --- demo pack --------------------------------------------------------------------------------

AGENT_PREFIX = "com.example.agent"

_WORDS = (
    "reading the repository layout",
    "checking the failing test",
    "the fix is small",
    "tracing the call path",
    "the index is stale here",
    "comparing both branches",
    "writing the patch",
    "re-running the suite",
    "all green now",
)
_TOOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "search_code": ("query", ("TaskService", "seq", "retention", "cursor")),
    "read_file": ("path", ("bridge/cli.py", "README.md", "docs/benchmarks.md")),
    "run_tests": ("selector", ("tests/", "tests/test_log.py")),
}


def _agent_timeline(prompt: str, steps: int) -> list[tuple[str, dict[str, Any]]]:
    """The same prompt always gives the same timeline (seeded by the prompt's SHA-256)."""
    rng = random.Random(int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big"))
    events: list[tuple[str, dict[str, Any]]] = []
    subtask = 0
    while len(events) < steps:
        subtask += 1
        sid = f"subtask-{subtask}"
        events.append((f"{AGENT_PREFIX}.subtask.started", {"id": sid, "title": rng.choice(_WORDS)}))
        for _ in range(rng.randint(1, 3)):
            events.append((f"{AGENT_PREFIX}.message.delta", {"text": rng.choice(_WORDS) + ". "}))
        name = rng.choice(sorted(_TOOLS))
        arg, choices = _TOOLS[name]
        call_id = f"call-{subtask}"
        events.append(
            (
                f"{AGENT_PREFIX}.tool.call",
                {"id": call_id, "name": name, "arguments": {arg: rng.choice(choices)}},
            )
        )
        events.append(
            (
                f"{AGENT_PREFIX}.tool.result",
                {"id": call_id, "ok": rng.random() > 0.15, "summary": rng.choice(_WORDS)},
            )
        )
        if rng.random() < 0.4:
            events.append(
                (
                    f"{AGENT_PREFIX}.artifact",
                    {"uri": f"artifact://{sid}/notes-{rng.randrange(1000)}.md"},
                )
            )
        events.append((f"{AGENT_PREFIX}.subtask.finished", {"id": sid}))
    return events[:steps]


async def agent_run(ctx: JobContext) -> dict[str, Any]:
    """Stream a deterministic agent timeline, one event every ``delay_ms``."""
    prompt = _str_arg(ctx, "prompt", "")
    steps = _int_arg(ctx, "steps", 20, 0, 10_000)
    delay = _int_arg(ctx, "delay_ms", 200, 0, 60_000) / 1000
    timeline = _agent_timeline(prompt, steps)
    for i, (event_type, payload) in enumerate(timeline):
        if i:
            await asyncio.sleep(delay)
        await ctx.emit(event_type, payload)
    subtasks = sum(1 for t, _ in timeline if t.endswith(".subtask.started"))
    return text_result(
        f"Agent finished {prompt!r}: {len(timeline)} events over {subtasks} subtasks."
    )


_DEMO: list[tuple[ToolSpec, JobHandler]] = [
    (
        ToolSpec(
            name="agent_run",
            description="A simulated agent run that streams its timeline as task events.",
            task="optional",
            input_schema={
                "type": "object",
                "properties": {
                    "prompt": {"type": "string"},
                    "steps": {"type": "integer", "minimum": 0, "default": 20},
                    "delay_ms": {"type": "integer", "minimum": 0, "default": 200},
                },
                "required": ["prompt"],
            },
        ),
        agent_run,
    )
]


#: The built-in packs, each a list of (spec, handler) in listing order.
PACKS: dict[str, list[tuple[ToolSpec, JobHandler]]] = {"conformance": _CONFORMANCE, "demo": _DEMO}


def _selected(names: Iterable[str]) -> list[tuple[ToolSpec, JobHandler]]:
    chosen: list[tuple[ToolSpec, JobHandler]] = []
    seen: set[str] = set()
    for name in dict.fromkeys(names):  # each pack once, in the order given
        pack = PACKS.get(name)
        if pack is None:
            raise UnknownPack(name)
        for spec, handler in pack:
            if spec.name in seen:
                raise ValueError(f"tool {spec.name!r} is in more than one selected pack")
            seen.add(spec.name)
            chosen.append((spec, handler))
    return chosen


def pack_tools(names: Iterable[str]) -> list[ToolSpec]:
    """The tool specs of the named packs, in pack order (fresh copies, safe to modify)."""
    return [spec.model_copy(deep=True) for spec, _ in _selected(names)]


def pack_handlers(names: Iterable[str]) -> dict[str, JobHandler]:
    """The handlers of the named packs by tool name."""
    return {spec.name: handler for spec, handler in _selected(names)}

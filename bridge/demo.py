"""The reviewer demo and the replay tool: a recorded agent session, streamed through real Kafka.

* :func:`load_session` reads a session file (``data/agent-session.jsonl``: one JSON object a line,
  ``{"offset_ms", "type", "payload"}``; see ``data/README.md``).
* :func:`replay_command` (``bridge replay FILE``) creates a task owned by a principal by writing
  its ``<prefix>.task.created`` event, publishes the file's events with
  :class:`~bridge.log.publisher.TaskEventPublisher` at ``speed`` times the recorded pacing, and
  ends with a terminal ``<prefix>.task.status`` event unless asked to keep the task open.
* :func:`demo_command` (``bridge demo``) brings up Kafka (the configured cluster, else the local
  broker), the topics and the bridge (in-process, with workers), then runs a narrated walkthrough
  of SEP-2694 on real Kafka: a live stream, a disconnect and resume with ``after``, a late joiner,
  a second writer that knows nothing of MCP (kcat), and ``events_gone`` after forced retention.
  Every step checks its own outcome and prints PASS or FAIL; see ``docs/demo.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

from bridge.config import Settings
from bridge.events import TERMINAL_WIRE, CreatedPayload, StatusPayload, is_prefixed_type
from bridge.log.publisher import Published, TaskEventPublisher

__all__ = [
    "DEFAULT_SESSION",
    "DemoError",
    "ReplayResult",
    "SessionEvent",
    "create_task",
    "demo_command",
    "finish_task",
    "load_session",
    "replay_command",
    "replay_events",
]

log = logging.getLogger(__name__)

#: The data set shipped with the repository (found from a source checkout or editable install).
DEFAULT_SESSION = Path(__file__).resolve().parent.parent / "data" / "agent-session.jsonl"
#: The tool name recorded in ``task.created`` of tasks that ``bridge replay`` creates.
REPLAY_TOOL = "replay"
#: How long a replayed task stays retrievable (tasks/get, tasks/stream).
REPLAY_TTL_MS = 24 * 3600 * 1000
#: The principal of auth mode "none" (every client is this principal).
ANONYMOUS = "anonymous"
#: Bound of every wait of a demo step, and of the bridge's start.
STEP_BOUND_S = 90.0
START_BOUND_S = 180.0


class DemoError(Exception):
    """A problem the user can fix (bad data file, busy port, unknown task...)."""


# --- the data set ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionEvent:
    """One line of a session file."""

    offset_ms: int
    type: str
    payload: dict[str, Any]
    meta: dict[str, Any] | None = None


_LINE_KEYS = {"offset_ms", "type", "payload", "_meta"}


def load_session(path: str | Path) -> list[SessionEvent]:
    """The events of a session file, validated; :class:`DemoError` names the bad line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DemoError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DemoError(f"{path} is not UTF-8 text") from None
    events: list[SessionEvent] = []
    last = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise DemoError(f"{where}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise DemoError(f"{where}: each line must be a JSON object")
        unknown = sorted(set(item) - _LINE_KEYS)
        if unknown:
            raise DemoError(f"{where}: unknown keys {unknown} (allowed: {sorted(_LINE_KEYS)})")
        offset, event_type = item.get("offset_ms"), item.get("type")
        payload, meta = item.get("payload"), item.get("_meta")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise DemoError(f"{where}: offset_ms must be a non-negative integer")
        if offset < last:
            raise DemoError(f"{where}: offset_ms goes backwards ({offset} < {last})")
        if not isinstance(event_type, str) or not is_prefixed_type(event_type):
            raise DemoError(
                f"{where}: type must be a vendor-prefixed event type such as "
                f"com.example.agent.message.delta, not {event_type!r}"
            )
        if not isinstance(payload, dict):
            raise DemoError(f"{where}: payload must be a JSON object")
        if meta is not None and not isinstance(meta, dict):
            raise DemoError(f"{where}: _meta must be a JSON object")
        last = offset
        events.append(SessionEvent(offset, event_type, payload, meta))
    if not events:
        raise DemoError(f"{path} has no events")
    return events


# --- replay ------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """Where each replayed event went, and when Kafka acknowledged it (``time.monotonic``)."""

    task_id: str
    published: list[Published] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def create_task(
    publisher: TaskEventPublisher,
    settings: Settings,
    *,
    principal: str = ANONYMOUS,
    task_id: str | None = None,
    ttl_ms: int = REPLAY_TTL_MS,
) -> tuple[str, Published]:
    """Create a task owned by ``principal``: its ``task.created`` event, as the bridge writes it.

    The bridge serves any task whose first record is its own ``task.created`` (see
    :meth:`bridge.tasks.service.TaskService.create`); no job is queued, the caller writes the
    task's events and its terminal status itself.
    """
    from bridge.tasks.messages import new_task_id, owner_digest

    task_id = task_id or new_task_id()
    now = _now_ms()
    created = CreatedPayload(
        tool=REPLAY_TOOL,
        owner=owner_digest(principal),
        created_ms=now,
        ttl_ms=ttl_ms,
        poll_interval_ms=500,
    )
    where = await publisher.publish(
        task_id,
        settings.own_types.created,
        created.to_dict(),
        timestamp_ms=now,
    )
    return task_id, where


async def replay_events(
    publisher: TaskEventPublisher,
    task_id: str,
    events: list[SessionEvent],
    *,
    speed: float,
    on_published: Callable[[int, Published], None] | None = None,
    into: ReplayResult | None = None,
) -> ReplayResult:
    """Publish ``events`` into ``task_id`` at ``speed`` x their recorded pacing (0: at once).

    Each event is acknowledged by Kafka before the next is sent (the task's order is the file's).
    Pass ``into`` to watch the progress of a replay running in another task.
    """
    if speed < 0:
        raise ValueError("speed must be >= 0")
    loop = asyncio.get_running_loop()
    start = loop.time()
    origin = events[0].offset_ms if events else 0
    out = into if into is not None else ReplayResult(task_id)
    for i, event in enumerate(events):
        if speed > 0:
            due = start + (event.offset_ms - origin) / 1000 / speed
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the recorded pacing, scaled
        where = await publisher.publish(task_id, event.type, event.payload, meta=event.meta)
        out.published.append(where)
        out.acked_at.append(time.monotonic())
        if on_published is not None:
            on_published(i, where)
    return out


def completed_result(events: list[SessionEvent], source: str) -> dict[str, Any]:
    """The ``CallToolResult`` of a replayed task: the session's own summary if it has one."""
    summary = next(
        (
            e.payload["summary"]
            for e in reversed(events)
            if isinstance(e.payload.get("summary"), str) and e.type.endswith("session.finished")
        ),
        None,
    )
    text = summary or f"Replayed {len(events)} events from {source}."
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"replayedEvents": len(events), "source": source},
    }


async def finish_task(
    publisher: TaskEventPublisher,
    settings: Settings,
    task_id: str,
    result: dict[str, Any],
    message: str = "finished",
) -> Published:
    """Write the task's terminal status ``completed`` with ``result`` (what tasks/get returns)."""

    status = StatusPayload(status="completed", status_message=message, result=result)
    return await publisher.publish(task_id, settings.own_types.status, status.payload())


def _err(text: str) -> None:
    print(f"… {text}", file=sys.stderr, flush=True)


async def _check_existing(url: str, token: str | None, task_id: str) -> None:
    """Refuse to append to a task the bridge does not serve to us, or one that has finished."""
    import httpx

    from bridge.client import StreamError, TaskStreamClient

    client = TaskStreamClient(url, token=token)
    try:
        async with asyncio.timeout(30):
            view = await client.call("tasks/get", {"taskId": task_id}, name=task_id)
    except StreamError as exc:
        raise DemoError(f"task {task_id} is not served to this principal at {url}: {exc}") from None
    except (httpx.TransportError, TimeoutError) as exc:
        raise DemoError(
            f"cannot check task {task_id} at {url} ({exc or type(exc).__name__}): is the bridge "
            "running? (--task-id appends to an existing task, which the bridge must know)"
        ) from None
    status = view.get("status")
    if status in TERMINAL_WIRE:
        raise DemoError(
            f"task {task_id} is {status}: its streams have ended, so appended events would "
            "never be delivered live"
        )


async def replay_command(
    settings: Settings,
    file: str | Path,
    *,
    task_id: str | None,
    speed: float,
    url: str,
    keep_open: bool,
    principal: str = ANONYMOUS,
    out: TextIO | None = None,
) -> int:
    """``bridge replay``: returns the exit status; the task id goes to ``out`` (stdout)."""
    out = out or sys.stdout
    if speed < 0:
        raise DemoError("--speed must be 0 (as fast as possible) or more")
    events = load_session(file)
    token = settings.client_token.get_secret_value() if settings.client_token else None
    if task_id is not None:
        await _check_existing(url, token, task_id)
    span_s = (events[-1].offset_ms - events[0].offset_ms) / 1000
    async with TaskEventPublisher(settings) as publisher:
        if task_id is None:
            task_id, where = await create_task(publisher, settings, principal=principal)
            _err(f"created task {task_id} (owner {principal!r}; partition {where.partition})")
        print(task_id, file=out, flush=True)
        _err(f"stream it: bridge tail {task_id} --url {url}")
        pace = "as fast as possible" if speed == 0 else f"{speed:g}x ({span_s / speed:.1f} s)"
        _err(f"replaying {len(events)} events recorded over {span_s:.1f} s, {pace}")
        started = time.monotonic()
        marks = {-(-len(events) * k // 10) for k in range(1, 11)}  # every 10%, rounded up

        def progress(i: int, where: Published) -> None:
            done = i + 1
            if done in marks:
                _err(
                    f"{done}/{len(events)} events ({100 * done // len(events)}%), "
                    f"{time.monotonic() - started:.1f} s, at offset {where.offset}"
                )

        await replay_events(publisher, task_id, events, speed=speed, on_published=progress)
        if keep_open:
            _err(f"task {task_id} stays open (--keep-open): append more with --task-id")
        else:
            result = completed_result(events, Path(file).name)
            await finish_task(publisher, settings, task_id, result, "replay finished")
            _err(f"task {task_id} completed")
    return 0


# --- the demo: process plumbing ------------------------------------------------------------------


def _settings_for_demo(settings: Settings, progress: Callable[[str], None]) -> Settings:
    """The configured cluster, else the long-lived local broker; the demo pack's tools served."""
    if settings.auth.mode != "none":
        raise DemoError(
            "bridge demo runs the bridge with auth mode none (its clients are 'anonymous'); "
            f"unset BRIDGE_AUTH__MODE (it is {settings.auth.mode!r})"
        )
    if not settings.kafka_bootstrap_servers:
        from bridge.devkafka import start_local_detached

        progress("starting the local Kafka broker (the first start downloads ~45 MB of jars)")
        info = start_local_detached(settings, progress=progress)
        settings = settings.model_copy(update={"kafka_bootstrap_servers": info.bootstrap_servers})
    packs = list(dict.fromkeys([*settings.tool_packs, "demo"]))
    return settings.model_copy(update={"tool_packs": packs})


def _listen(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket up front, so a busy port is a clear error, not a uvicorn exit."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise DemoError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass --port or set "
            "BRIDGE_HTTP_PORT"
        ) from None
    return sock


class _Server:
    """The bridge's ASGI app (with in-process workers) under uvicorn, in this event loop."""

    def __init__(self, settings: Settings, sock: socket.socket) -> None:
        import uvicorn

        from bridge.server.app import create_app
        from bridge.workers.inprocess import run_workers_in_process

        self.app = create_app(settings, companions=[run_workers_in_process])
        self.sock = sock
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=10,
            lifespan="on",
        )

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the demo handles SIGINT/SIGTERM itself

        self.server = Server(config)
        self.task: asyncio.Task[None] | None = None

    async def start(self, url: str) -> None:
        import httpx

        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name="bridge")
        ready = url.rsplit("/", 1)[0] + "/readyz"
        async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(START_BOUND_S):
            while True:
                if self.task.done():
                    raise DemoError("the bridge stopped while starting (see the log above)")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(ready)).status_code == 200:
                        return
                await asyncio.sleep(0.2)  # poll interval of the bounded readiness wait

    async def stop(self) -> None:
        components = self.app.state.components
        hub = components.hub if components is not None else None
        if hub is not None:
            hub.drain()  # open streams end now; their clients would resume elsewhere
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(30):
                    await self.task


# --- the demo: narration -----------------------------------------------------------------------

_AGENT = "com.example.agent."
_INDENT = " " * 14


class StepFailed(Exception):
    """A step's check did not hold."""


class Narrator:
    """Prints the walkthrough: step headers, event lines, streamed text, PASS/FAIL."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        color = out.isatty() and not os.environ.get("NO_COLOR")
        self._green = "\033[32m" if color else ""
        self._red = "\033[31m" if color else ""
        self._bold = "\033[1m" if color else ""
        self._dim = "\033[2m" if color else ""
        self._reset = "\033[0m" if color else ""
        self._column = 0  # >0 while a streamed message is being written inline
        self.width = min(max(shutil.get_terminal_size((100, 24)).columns, 72), 120)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _end_text(self) -> None:
        if self._column:
            self._write("\n")
            self._column = 0

    def header(self, number: int, total: int, title: str) -> None:
        self._end_text()
        line = f"── {number}/{total} · {title} "
        self._write(f"\n{self._bold}{line}{'─' * max(3, self.width - len(line))}{self._reset}\n")

    def title(self, text: str) -> None:
        self._end_text()
        self._write(f"\n{self._bold}{text}{self._reset}\n")

    def say(self, text: str) -> None:
        self._end_text()
        wrapped = textwrap.fill(
            text,
            self.width - 2,
            initial_indent="  ",
            subsequent_indent="  ",
            break_on_hyphens=False,
        )
        self._write(wrapped + "\n")

    def command(self, text: str) -> None:
        """A command line the reader can copy (never wrapped)."""
        self._end_text()
        self._write(f"    {self._bold}{text}{self._reset}\n")

    def note(self, text: str) -> None:
        self._end_text()
        self._write(f"  {self._dim}{text}{self._reset}\n")

    def event(self, seq: int, event_type: str, payload: dict[str, Any], who: str = "") -> None:
        """One event: message deltas are written inline as the text they carry."""
        short = event_type.removeprefix(_AGENT)
        if short == "message.delta" and isinstance(payload.get("text"), str):
            self._text(seq, payload["text"])
            return
        self._end_text()
        label = f"{who} " if who else ""
        line = f"  {label}seq {seq:>4}  {short:<20} {_describe(short, payload)}"
        limit = self.width - 1
        self._write((line if len(line) <= limit else line[: limit - 1] + "…") + "\n")

    def _text(self, seq: int, text: str) -> None:
        margin = len(_INDENT) + 2
        for piece in re.findall(r"\S+\s*|\s+", text):
            if not self._column:  # a new block of text: show the seq it starts at
                self._write(f"  seq {seq:>4}".ljust(len(_INDENT)) + "│ ")
                self._column = margin
                piece = piece.lstrip()
            elif self._column + len(piece.rstrip()) > self.width:
                self._write("\n" + _INDENT + "│ ")
                self._column = margin
                piece = piece.lstrip()
            self._write(piece)
            self._column += len(piece)

    def cut(self, text: str) -> None:
        """Mark an interruption inside the streamed text."""
        if self._column:
            self._write(f" {self._red}✂{self._reset}\n")
            self._column = 0
        self.say(text)

    def passed(self, number: int, text: str) -> None:
        self._verdict(f"{self._green}{self._bold}PASS{self._reset}", number, text)

    def failed(self, number: int, text: str) -> None:
        self._verdict(f"{self._red}{self._bold}FAIL{self._reset}", number, text)

    def _verdict(self, word: str, number: int, text: str) -> None:
        self._end_text()
        lines = textwrap.wrap(f"step {number}: {text}", self.width - 8, break_on_hyphens=False)
        self._write(f"  {word}  " + "\n        ".join(lines) + "\n")


def _describe(short: str, p: dict[str, Any]) -> str:
    """A one-line human summary of a payload (the event types of data/agent-session.jsonl)."""

    def compact(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    if short == "tool.call":
        return f"{p.get('name')} {compact(p.get('arguments', {}))}"
    if short == "tool.result":
        keys = [k for k in p if k not in ("callId", "name", "ok", "durationMs", "subtaskId")]
        state = "ok" if p.get("ok") else "ERROR"
        return f"{p.get('name')} {state} in {p.get('durationMs')} ms: {', '.join(keys)}"
    if short == "subtask.progress":
        return f"{p.get('subtaskId')} {p.get('completed')}/{p.get('total')} · {p.get('message')}"
    if short in ("subtask.started", "subtask.finished"):
        return f"{p.get('subtaskId')} {p.get('title') or p.get('summary') or ''}"
    if short in ("message.started", "message.completed"):
        return f"{p.get('messageId')} {p.get('role') or str(p.get('chunks', '')) + ' chunks'}"
    if short == "artifact":
        return f"{p.get('uri')} ({p.get('mimeType')}, {p.get('sizeBytes')} bytes)"
    if short == "usage":
        return (
            f"in {p.get('inputTokens')} · out {p.get('outputTokens')} tokens · "
            f"{p.get('toolCalls')} tool calls · ${p.get('costUsd')}"
        )
    if short == "plan.updated" and isinstance(p.get("steps"), list):
        marks = {"done": "✓", "in_progress": "▶", "pending": "·"}
        return " ".join(f"{marks.get(s.get('status'), '?')}{s.get('id')}" for s in p["steps"])
    if short.endswith(".task.status"):
        return f"{p.get('status')} {compact(p.get('result', {}))}"
    return compact(p)


# --- the demo: the walkthrough -------------------------------------------------------------------


@dataclass(frozen=True)
class _Seen:
    seq: int
    type: str
    payload: dict[str, Any]
    at: float  # time.monotonic() of arrival


class _Collector:
    """A stream client running in the background, keeping what it received."""

    def __init__(self, url: str, task_id: str, after: int | None = None) -> None:
        from bridge.client import MemoryCursorStore, TaskStreamClient

        self.client = TaskStreamClient(url, store=MemoryCursorStore())
        self.task_id = task_id
        self.seen: list[_Seen] = []
        self.on_event: Callable[[_Seen], None] | None = None
        self._changed = asyncio.Event()
        self.runner = asyncio.create_task(self._run(after), name=f"collector-{task_id[:8]}")

    async def _run(self, after: int | None) -> None:
        try:
            async for event in self.client.stream(self.task_id, after):
                seen = _Seen(event.seq, event.type, event.payload, time.monotonic())
                self.seen.append(seen)
                if self.on_event is not None:
                    self.on_event(seen)
                self._changed.set()
        finally:
            self._changed.set()

    async def wait_for(self, done: Callable[[list[_Seen]], bool]) -> None:
        while not done(self.seen):
            if self.runner.done():
                self.runner.result()  # raises the stream's error, if any
                raise StepFailed(f"the stream ended early, after {len(self.seen)} events")
            self._changed.clear()
            await self._changed.wait()

    async def close(self) -> None:
        self.runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.runner


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise StepFailed(what)


def _contiguous(seqs: list[int], first: int = 0) -> bool:
    return seqs == list(range(first, first + len(seqs)))


def _seq_range(seqs: list[int]) -> str:
    return f"{seqs[0]}..{seqs[-1]}" if seqs else "none"


@dataclass
class _Walkthrough:
    settings: Settings
    publisher: TaskEventPublisher
    url: str
    session: list[SessionEvent]
    source: str
    speed: float
    workdir: Path
    say: Narrator
    task_id: str = ""
    a_seen: list[_Seen] = field(default_factory=list)
    b: _Collector | None = None
    replay: ReplayResult | None = None
    writer: asyncio.Task[ReplayResult] | None = None
    cursor_file: Path | None = None

    @property
    def created_type(self) -> str:
        return self.settings.own_types.created

    @property
    def status_type(self) -> str:
        return self.settings.own_types.status

    def matches_file(self, seen: list[_Seen], first_index: int = 0) -> bool:
        """Whether ``seen`` are the session's events from ``first_index`` on, in order."""
        expected = self.session[first_index : first_index + len(seen)]
        return len(expected) == len(seen) and all(
            s.type == e.type and s.payload == e.payload for s, e in zip(seen, expected, strict=True)
        )

    async def tasks_get(self, task_id: str) -> dict[str, Any]:
        from bridge.client import TaskStreamClient

        return await TaskStreamClient(self.url).call("tasks/get", {"taskId": task_id}, task_id)

    # --- step 1 and 2 --------------------------------------------------------------------------

    def _disconnect_index(self) -> int:
        """The middle of the longest streamed message: the drop happens mid-sentence."""
        by_message: dict[str, list[int]] = {}
        for i, e in enumerate(self.session):
            if e.type.endswith(".message.delta"):
                by_message.setdefault(str(e.payload.get("messageId")), []).append(i)
        if not by_message:
            return len(self.session) // 2
        longest = max(by_message.values(), key=len)
        return longest[len(longest) // 2]

    async def step_live(self) -> str:
        from bridge.client import FileCursorStore, TaskStreamClient

        say, n = self.say, len(self.session)
        span = (self.session[-1].offset_ms - self.session[0].offset_ms) / 1000
        say.say(
            f"The data set {self.source} is one agent session: {n} events recorded over "
            f"{span:.0f} s (streamed text, tool calls and results, two subtasks, artifacts, a "
            "pause, an input request, usage). It is replayed into Kafka as a new task at "
            f"{self.speed:g}x speed by TaskEventPublisher, while client A (bridge.client."
            "TaskStreamClient) streams the task through the bridge."
        )
        publisher = self.publisher
        self.task_id, where = await create_task(publisher, self.settings)
        say.say(f"task {self.task_id}: created (seq 0), partition {where.partition}")
        view = await self.tasks_get(self.task_id)
        _check(view.get("status") == "working", f"tasks/get says {view.get('status')!r}")
        say.note("tasks/get → status working; client A opens tasks/stream {taskId}")
        cursor_file = self.workdir / "client-a-cursors.json"
        client = TaskStreamClient(self.url, store=FileCursorStore(cursor_file))
        drop_at = self._disconnect_index() + 1  # the seq A is about to receive when it drops
        writer: asyncio.Task[ReplayResult] | None = None
        self.replay = ReplayResult(self.task_id)

        stream = cast(AsyncGenerator[Any, None], client.stream(self.task_id))
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if event.seq == drop_at:
                    break  # A "loses its connection" before processing this event
                self.a_seen.append(_Seen(event.seq, event.type, event.payload, time.monotonic()))
                say.event(event.seq, event.type, event.payload)
                if writer is None:  # A is connected: start the agent
                    writer = asyncio.create_task(
                        replay_events(
                            publisher,
                            self.task_id,
                            self.session,
                            speed=self.speed,
                            into=self.replay,
                        )
                    )
                    self.writer = writer  # cancelled at the end if a later check fails
        assert writer is not None
        still_writing = not writer.done()
        last = self.a_seen[-1].seq
        say.cut(
            f"client A drops its connection here. Last event it fully processed: seq {last} "
            f"(the agent is at seq {len(self.replay.published)} and keeps going)"
        )
        seqs = [s.seq for s in self.a_seen]
        _check(_contiguous(seqs), f"A's seqs are not 0..{last} in order: {seqs}")
        _check(self.a_seen[0].type == self.created_type, "seq 0 is not task.created")
        _check(self.matches_file(self.a_seen[1:]), "A's events differ from the data set")
        _check(still_writing, "the replay had finished before A dropped: not a live stream")
        self.cursor_file = cursor_file
        latencies = self._latencies(self.a_seen, self.replay)
        return (
            f"client A received seqs {_seq_range(seqs)} live, in order, each one the data set's "
            f"event; {latencies}"
        )

    def _latencies(self, seen: list[_Seen], result: ReplayResult) -> str:
        """Kafka's acknowledgement of each write → its arrival at the client."""
        lags = [
            max(0.0, s.at - result.acked_at[s.seq - 1]) * 1000
            for s in seen
            if 1 <= s.seq <= len(result.acked_at)
        ]
        if not lags:
            return "no latency sample"
        return (
            f"write-to-screen latency median {statistics.median(lags):.0f} ms, "
            f"max {max(lags):.0f} ms"
        )

    async def step_resume(self) -> str:
        from bridge.client import FileCursorStore, TaskStreamClient

        say = self.say
        cursor_file, writer = self.cursor_file, self.writer
        assert cursor_file is not None and writer is not None
        saved = json.loads(cursor_file.read_text(encoding="utf-8"))
        cursor = saved.get(self.task_id)
        say.say(f"A's cursor file {cursor_file.name}: {json.dumps(saved)}")
        _check(cursor == self.a_seen[-1].seq, f"saved cursor {cursor} != last processed seq")
        before = time.monotonic()
        assert self.replay is not None
        at_drop = len(self.replay.published)
        await asyncio.sleep(1.5)  # A is offline; the agent keeps working
        while_away = len(self.replay.published) - at_drop
        say.say(
            f"A is offline for {time.monotonic() - before:.1f} s; meanwhile the agent wrote "
            f"{while_away} more events. A restarts (a new client, same cursor file) and sends "
            f"tasks/stream {{taskId, after: {cursor}}}"
        )
        client = TaskStreamClient(self.url, store=FileCursorStore(cursor_file))
        last_seq = len(self.session)  # seq 0 is task.created
        after: list[_Seen] = []
        stream = cast(AsyncGenerator[Any, None], client.stream(self.task_id))
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                seen = _Seen(event.seq, event.type, event.payload, time.monotonic())
                after.append(seen)
                say.event(event.seq, event.type, event.payload)
                if event.seq >= last_seq:
                    break  # the session's last event: A has everything the agent wrote
        await writer
        first = after[0].seq if after else None
        seqs_before, seqs_after = [s.seq for s in self.a_seen], [s.seq for s in after]
        say.say(
            f"before the drop: seqs {_seq_range(seqs_before)}; after the resume: seqs "
            f"{_seq_range(seqs_after)}"
        )
        self.a_seen.extend(after)
        all_seqs = [s.seq for s in self.a_seen]
        _check(first == cursor + 1, f"the resumed stream began at seq {first}, not {cursor + 1}")
        _check(len(set(all_seqs)) == len(all_seqs), "an event was delivered twice")
        _check(_contiguous(all_seqs), f"seqs are not contiguous 0..{last_seq}")
        _check(all_seqs[-1] == last_seq, f"A stopped at seq {all_seqs[-1]}, not {last_seq}")
        _check(self.matches_file(self.a_seen[1:]), "A's events differ from the data set")
        _check(while_away > 0, "nothing was written while A was away")
        return (
            f"resumed with after={cursor}: got {_seq_range(seqs_after)}; together "
            f"{_seq_range(all_seqs)} with no gap and no repeat ({while_away} events were "
            "written while A was offline)"
        )

    # --- step 3 --------------------------------------------------------------------------------

    async def step_late_joiner(self) -> str:
        say = self.say
        last_seq = len(self.session)
        view = await self.tasks_get(self.task_id)
        say.say(
            f"The task is still {view.get('status')} (tasks/get). Client B joins now, with no "
            "cursor: tasks/stream {taskId} starts at the earliest retained event."
        )
        _check(view.get("status") == "working", "the task is not live any more")
        started = time.monotonic()
        self.b = _Collector(self.url, self.task_id)
        await self.b.wait_for(lambda seen: bool(seen) and seen[-1].seq >= last_seq)
        took = time.monotonic() - started
        seen = self.b.seen
        for s in seen[:3]:
            say.event(s.seq, s.type, s.payload, who="B")
        say.note(f"{_INDENT}… {max(0, len(seen) - 5)} more …")
        for s in seen[-2:]:
            say.event(s.seq, s.type, s.payload, who="B")
        seqs = [s.seq for s in seen]
        same = [(s.seq, s.type, s.payload) for s in seen] == [
            (s.seq, s.type, s.payload) for s in self.a_seen
        ]
        _check(_contiguous(seqs), f"B's seqs are not contiguous: {_seq_range(seqs)}")
        _check(same, "B's history differs from what A received live")
        return (
            f"B replayed seqs {_seq_range(seqs)} from Kafka in {took:.2f} s, identical to what A "
            "saw live; B stays connected for what comes next"
        )

    # --- step 4 --------------------------------------------------------------------------------

    async def step_second_writer(self) -> str:
        say, settings = self.say, self.settings
        assert self.b is not None
        topic = settings.topics.events
        lines = [
            {"type": "com.example.export.run.started", "payload": {"job": "orders-export", "run": "run-5532", "date": "2026-09-14", "env": "staging"}},
            {"type": "com.example.export.batch.committed", "payload": {"run": "run-5532", "batch": 1, "rows": 642100}},
            {"type": "com.example.export.batch.committed", "payload": {"run": "run-5532", "batch": 2, "rows": 642211}},
            {"type": "com.example.export.run.finished", "payload": {"run": "run-5532", "rows": 1284311, "failedSends": 0}},
        ]  # fmt: skip
        kcat = shutil.which("kcat") or shutil.which("kafkacat")
        use_kcat = kcat is not None and settings.kafka_security_protocol == "PLAINTEXT"
        head = self.b.seen[-1].seq
        say.say(
            "The nightly export job (a shell script; no MCP, no seq) appends its own events to the "
            "same task: plain JSON values, key = task id, header content-type: application/json."
        )
        printed = 0

        def show(seen: _Seen) -> None:
            nonlocal printed
            printed += 1
            say.event(seen.seq, seen.type, seen.payload, who="B")

        self.b.on_event = show
        if use_kcat:
            assert kcat is not None
            command = [
                kcat, "-P", "-b", settings.kafka_bootstrap_servers or "", "-t", topic,
                "-k", self.task_id, "-H", "content-type=application/json",
                "-X", "partitioner=murmur2_random",
            ]  # fmt: skip
            say.note(
                f"$ kcat -P -b {settings.kafka_bootstrap_servers} -t {topic} -k {self.task_id} "
                "-H content-type=application/json -X partitioner=murmur2_random  < 4 JSON lines"
            )
            body = "".join(json.dumps(line) + "\n" for line in lines).encode()
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await proc.communicate(body)
            _check(proc.returncode == 0, f"kcat failed ({proc.returncode}): {err.decode()[-300:]}")
            writer_name = "kcat"
        else:
            from bridge.kafka.clients import AIOKafkaProducer

            say.note("kcat is not installed: a plain aiokafka producer writes the same records")
            producer = AIOKafkaProducer(
                bootstrap_servers=settings.kafka_bootstrap_servers,
                security_protocol=settings.kafka_security_protocol,
            )
            await producer.start()
            try:
                for line in lines:
                    await producer.send_and_wait(
                        topic,
                        json.dumps(line).encode(),
                        key=self.task_id.encode(),
                        headers=[("content-type", b"application/json")],
                    )
            finally:
                await producer.stop()
            writer_name = "a plain aiokafka producer"
        await self.b.wait_for(lambda seen: seen[-1].seq >= head + len(lines))
        new = [s for s in self.b.seen if s.seq > head]
        _check(
            [(s.type, s.payload) for s in new] == [(x["type"], x["payload"]) for x in lines],
            "B did not receive the export job's events as written",
        )
        say.say(
            "The agent's work is done: its terminal status event (io.mcpbridge.task.status "
            "completed, with the tool result) ends every open stream of the task."
        )
        await finish_task(
            self.publisher, settings, self.task_id, completed_result(self.session, self.source)
        )
        async with asyncio.timeout(STEP_BOUND_S):
            await self.b.runner  # the stream ends with the tasks/stream result
        self.b.on_event = None
        seqs = [s.seq for s in self.b.seen]
        final = self.b.seen[-1]
        view = await self.tasks_get(self.task_id)
        _check(_contiguous(seqs), f"B's seqs have a gap: {_seq_range(seqs)}")
        _check(
            final.type == self.status_type and final.payload.get("status") == "completed",
            "B's stream did not end with the completed status",
        )
        _check(view.get("status") == "completed", f"tasks/get says {view.get('status')!r}")
        return (
            f"{writer_name} wrote seqs {new[0].seq}..{new[-1].seq} without knowing seq; B's "
            f"stream stayed gap-free ({_seq_range(seqs)}) and ended with the task (tasks/get: "
            "completed)"
        )

    # --- step 5 --------------------------------------------------------------------------------

    async def step_events_gone(self) -> str:
        from aiokafka.admin import RecordsToDelete

        from bridge.client import StreamError, TaskStreamClient
        from bridge.kafka.clients import TopicPartition, admin_client, partition_for_key
        from bridge.kafka.topics import topic_partition_ids
        from bridge.tasks.messages import new_task_id

        say, settings = self.say, self.settings
        topic = settings.topics.events
        partitions = await topic_partition_ids(settings, topic)
        main_partition = partition_for_key(self.task_id.encode(), len(partitions))
        task_id = new_task_id()
        for _ in range(1000):  # a task on another partition: the first task keeps its history
            if len(partitions) == 1 or partition_for_key(task_id.encode(), len(partitions)) != (
                main_partition
            ):
                break
            task_id = new_task_id()
        say.say(
            "Kafka drops old records by retention (retention.ms / retention.bytes); here it is "
            "forced. A second task gets the same session at full speed, then DeleteRecords "
            "removes the start of its partition."
        )
        n = len(self.session)
        publisher = self.publisher
        _, created = await create_task(publisher, settings, task_id=task_id)
        marks = {n * k // 4 for k in (1, 2, 3, 4)}

        def progress(i: int, where: Published) -> None:
            if i + 1 in marks:
                say.note(f"… wrote {i + 1}/{n} events")

        replayed = await replay_events(
            publisher, task_id, self.session, speed=0, on_published=progress
        )
        await finish_task(publisher, settings, task_id, completed_result(self.session, self.source))
        last_seq = n + 1
        full = _Collector(self.url, task_id)
        await full.runner
        seqs = [s.seq for s in full.seen]
        _check(_contiguous(seqs) and seqs[-1] == last_seq, f"task 2 reads {_seq_range(seqs)}")
        say.say(f"task {task_id}: seqs 0..{last_seq}, partition {created.partition}")
        cut_seq = min(100, n)  # the first seq kept (seq s is the session's event s-1)
        cut = replayed.published[cut_seq - 1]
        old_cursor = min(42, cut_seq - 2)
        admin = admin_client(settings)
        await admin.start()
        try:
            await admin.delete_records(
                {TopicPartition(topic, cut.partition): RecordsToDelete(cut.offset)},
                timeout_ms=30_000,
            )
        finally:
            await admin.close()
        say.note(
            f"DeleteRecords({topic}[{cut.partition}], before offset {cut.offset}): seqs "
            f"0..{cut_seq - 1} of this task are gone"
        )
        client = TaskStreamClient(self.url)
        say.say(f"A client that saved cursor {old_cursor} yesterday resumes: after={old_cursor}")
        try:
            await client.call("tasks/stream", {"taskId": task_id, "after": old_cursor}, task_id)
            error: dict[str, Any] = {}
        except StreamError as exc:
            error = {"code": exc.code, "message": exc.message, "data": exc.data}
        say.note(f"← error {json.dumps(error)}")
        expected = {
            "code": -32010,
            "message": "Task events are no longer available",
            "data": {"reason": "events_gone", "taskId": task_id, "earliestSeq": cut_seq},
        }
        _check(error == expected, f"expected {expected}, got {error}")
        say.say(f"It resumes from earliestSeq - 1: after={cut_seq - 1}")
        resumed = _Collector(self.url, task_id, after=cut_seq - 1)
        await resumed.runner
        rseqs = [s.seq for s in resumed.seen]
        for s in [*resumed.seen[:2], *resumed.seen[-1:]]:
            say.event(s.seq, s.type, s.payload)
        _check(_contiguous(rseqs, cut_seq), f"resumed seqs {_seq_range(rseqs)}")
        _check(bool(rseqs) and rseqs[-1] == last_seq, "the resumed stream did not reach the end")
        _check(self.matches_file(resumed.seen[:-1], cut_seq - 1), "resumed events differ")
        fresh = _Collector(self.url, task_id)
        await fresh.runner
        _check(bool(fresh.seen) and fresh.seen[0].seq == cut_seq, "no-cursor stream start")
        say.note(f"(without a cursor the stream starts at seq {fresh.seen[0].seq}, too)")
        return (
            f"after={old_cursor} → events_gone with earliestSeq {cut_seq} (exact); "
            f"after={cut_seq - 1} → seqs {_seq_range(rseqs)} and the task's end"
        )


def _default_data() -> Path:
    if not DEFAULT_SESSION.is_file():
        raise DemoError(
            f"the data set {DEFAULT_SESSION} is missing (bridge demo runs from a source checkout);"
            " pass --data FILE"
        )
    return DEFAULT_SESSION


async def _run_demo(
    settings: Settings, session: list[SessionEvent], source: str, speed: float, exit_after: bool
) -> int:
    say = Narrator(sys.stdout)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sock = _listen(settings.http_host, settings.http_port)
    host, port = sock.getsockname()[:2]
    shown_host = settings.http_host if settings.http_host not in ("0.0.0.0", "::") else host
    url = f"http://{shown_host}:{port}/mcp"
    server = _Server(settings, sock)
    started = time.monotonic()
    say.title("SEP-2694 resumable task event streams: the reviewer demo")
    say.say(f"Kafka: {settings.kafka_bootstrap_servers} · topics {settings.topics.prefix}.*")
    try:
        await server.start(url)
    except TimeoutError:
        await server.stop()
        raise DemoError(f"the bridge was not ready within {START_BOUND_S:.0f} s") from None
    except BaseException:
        await server.stop()
        raise
    say.say(
        f"bridge: ready in {time.monotonic() - started:.1f} s at {url} (in-process, with workers "
        f"for the tool packs {', '.join(settings.tool_packs)})"
    )
    code = 0
    async with contextlib.AsyncExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bridge-demo-"))
        publisher = await stack.enter_async_context(TaskEventPublisher(settings))
        walk = _Walkthrough(settings, publisher, url, session, source, speed, Path(workdir), say)
        steps: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("A long task, streaming live", walk.step_live),
            ("Disconnect, then resume with `after`", walk.step_resume),
            ("A late joiner replays the retained history", walk.step_late_joiner),
            ("A second writer that knows nothing of MCP", walk.step_second_writer),
            ("Retention: events_gone and earliestSeq", walk.step_events_gone),
        ]
        began = time.monotonic()
        results: list[bool] = []
        for number, (title, step) in enumerate(steps, 1):
            say.header(number, len(steps), title)
            runner = asyncio.create_task(_bounded(step()))
            stopping = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait(
                {runner, stopping, *([server.task] if server.task else [])},
                return_when=asyncio.FIRST_COMPLETED,
            )
            stopping.cancel()
            if runner not in done:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await runner
                say.failed(number, "interrupted" if stop.is_set() else "the bridge stopped")
                results.append(False)
                break
            try:
                summary = runner.result()
            except (StepFailed, AssertionError) as exc:
                say.failed(number, str(exc) or type(exc).__name__)
                results.append(False)
                break
            except Exception as exc:
                log.debug("step %d failed", number, exc_info=True)
                say.failed(number, f"{type(exc).__name__}: {exc}")
                results.append(False)
                break
            say.passed(number, summary)
            results.append(True)
        if walk.b is not None:
            await walk.b.close()
        if walk.writer is not None and not walk.writer.done():
            walk.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await walk.writer
        elapsed = time.monotonic() - began
        passed = sum(results)
        if passed == len(steps):
            say.title(f"All {len(steps)} steps passed in {elapsed:.1f} s.")
        else:
            say.title(
                f"{passed} of {len(steps)} steps passed; step {len(results)} failed "
                f"({elapsed:.1f} s). Nothing below it ran."
            )
            code = 130 if stop.is_set() else 1
        if code == 0 and not exit_after:
            tail_url = "" if url == "http://127.0.0.1:8080/mcp" else f" --url {url}"
            say.say(f"The bridge keeps serving at {url}. Try, in another terminal:")
            say.command(f"bridge tail {walk.task_id}{tail_url}")
            say.note("    (the whole session again, from seq 0; add --after N to resume)")
            say.command(f"bridge replay {source} --speed 2{tail_url}")
            say.note("    (a new task from the data set at 2x; tail the id it prints)")
            say.say("Ctrl-C stops the bridge (the local Kafka keeps running: bridge kafka stop).")
            waits: set[asyncio.Future[Any]] = {asyncio.create_task(stop.wait())}
            if server.task is not None:
                waits.add(server.task)
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                if task is not server.task:
                    task.cancel()
    await server.stop()
    if code == 0 and not exit_after:
        say.say("bridge stopped")
    return code


async def _bounded(step: Awaitable[str]) -> str:
    try:
        async with asyncio.timeout(STEP_BOUND_S):
            return await step
    except TimeoutError:
        raise StepFailed(f"did not finish within {STEP_BOUND_S:.0f} s") from None


def demo_command(
    settings: Settings,
    *,
    exit_after: bool,
    speed: float,
    data: str | Path | None,
    progress: Callable[[str], None],
) -> int:
    """``bridge demo``: exit status 0 when every step passed, 1 when one failed."""
    if speed <= 0:
        raise DemoError("--speed must be more than 0 (the live steps need pacing)")
    path = Path(data) if data is not None else _default_data()
    session = load_session(path)
    settings = _settings_for_demo(settings, progress)
    from bridge.cli import create_topics

    for line in asyncio.run(create_topics(settings)):
        progress(line)
    quiet = settings.log_level == "INFO"
    if quiet:  # the narration is the output; the bridge's INFO logs would drown it
        logging.getLogger().setLevel(logging.WARNING)
    try:
        shown = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
        return asyncio.run(_run_demo(settings, session, shown, speed, exit_after))
    finally:
        if quiet:
            logging.getLogger().setLevel(logging.INFO)

"""Recorded sessions into Kafka as a task's events: the library of ``bridge replay FILE``.

* :func:`load_session` reads a session file (``data/agent-session.jsonl``: one JSON object a
  line, ``{"offset_ms", "type", "payload"}``, optional ``_meta``; see ``data/README.md``).
* :func:`create_task` creates a task owned by a principal with the same code as the task
  service (:func:`bridge.tasks.create.publish_created`); no job is queued.
* :func:`replay_events` publishes the file's events with
  :class:`~bridge.log.publisher.TaskEventPublisher` at ``speed`` times the recorded pacing.
* :func:`finish_task` writes the terminal ``completed`` status that ends the task's streams.
* :func:`replay_command` is the command: those four steps, with progress lines.

The demo (:mod:`bridgedev.demo`) replays through the same functions. This module starts no server
and no Kafka: it writes to the configured cluster, and asks a running bridge only when told to
append to an existing task.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bridge.config import Settings, ToolSpec
from bridge.log.publisher import Published, TaskEventPublisher
from bridge.server.auth import ANONYMOUS
from bridge.tasks.create import now_ms, publish_created
from bridge.tasks.messages import new_task_id
from bridge.vocabulary import TERMINAL_WIRE, StatusPayload, is_prefixed_type

__all__ = [
    "ANONYMOUS",
    "REPLAY_TOOL",
    "ReplayError",
    "ReplayResult",
    "SessionEvent",
    "completed_result",
    "create_task",
    "finish_task",
    "load_session",
    "replay_command",
    "replay_events",
]

#: What a replayed task records as its tool in ``task.created`` (no worker runs it), and how
#: long it stays retrievable (tasks/get, tasks/stream).
REPLAY_TOOL = ToolSpec(name="replay", ttl_ms=24 * 3600 * 1000, poll_interval_ms=500)
#: Bound of the tasks/get that checks a task before appending to it.
CHECK_BOUND_S = 30.0


class ReplayError(Exception):
    """A problem the user can fix: a bad session file, a task that cannot take more events."""


# --- the session file --------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionEvent:
    """One line of a session file."""

    offset_ms: int
    type: str
    payload: dict[str, Any]
    meta: dict[str, Any] | None = None


_LINE_KEYS = {"offset_ms", "type", "payload", "_meta"}


def load_session(path: str | Path) -> list[SessionEvent]:
    """The events of a session file, validated; :class:`ReplayError` names the bad line."""
    path = Path(path)
    events: list[SessionEvent] = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if line.strip():
            last = events[-1].offset_ms if events else 0
            events.append(_parse_line(line, f"{path}:{number}", last))
    if not events:
        raise ReplayError(f"{path} has no events")
    return events


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReplayError(f"{path} is not UTF-8 text") from None


def _parse_line(line: str, where: str, last_offset: int) -> SessionEvent:
    """One line as an event; ``last_offset`` is the previous line's (offsets never go back)."""
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ReplayError(f"{where}: not JSON ({exc})") from None
    if not isinstance(item, dict):
        raise ReplayError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(item) - _LINE_KEYS)
    if unknown:
        raise ReplayError(f"{where}: unknown keys {unknown} (allowed: {sorted(_LINE_KEYS)})")
    offset, event_type = item.get("offset_ms"), item.get("type")
    payload, meta = item.get("payload"), item.get("_meta")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ReplayError(f"{where}: offset_ms must be a non-negative integer")
    if offset < last_offset:
        raise ReplayError(f"{where}: offset_ms goes backwards ({offset} < {last_offset})")
    if not isinstance(event_type, str) or not is_prefixed_type(event_type):
        raise ReplayError(
            f"{where}: type must be a vendor-prefixed event type such as "
            f"com.example.agent.message.delta, not {event_type!r}"
        )
    if not isinstance(payload, dict):
        raise ReplayError(f"{where}: payload must be a JSON object")
    if meta is not None and not isinstance(meta, dict):
        raise ReplayError(f"{where}: _meta must be a JSON object")
    return SessionEvent(offset, event_type, payload, meta)


# --- writing a task ----------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """Where each replayed event went, and when Kafka acknowledged it (``time.monotonic``)."""

    task_id: str
    published: list[Published] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)


async def create_task(
    publisher: TaskEventPublisher,
    settings: Settings,
    *,
    principal: str = ANONYMOUS,
    task_id: str | None = None,
) -> tuple[str, Published]:
    """Create a task owned by ``principal``: its ``task.created``, as the task service writes it.

    The bridge serves any task whose first record is its own ``task.created``; no job is
    queued, the caller writes the task's events and its terminal status itself.
    """
    task_id = task_id or new_task_id()
    where = await publish_created(
        publisher, settings.own_types, REPLAY_TOOL, principal, task_id, now_ms()
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
            delay = start + (event.offset_ms - origin) / 1000 / speed - loop.time()
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


# --- the command -------------------------------------------------------------------------------


async def _check_existing(url: str, token: str | None, task_id: str) -> None:
    """Refuse to append to a task the bridge does not serve to us, or one that has finished."""
    import httpx

    from bridge.client import StreamError, TaskStreamClient

    client = TaskStreamClient(url, token=token)
    try:
        async with asyncio.timeout(CHECK_BOUND_S):
            view = await client.call("tasks/get", {"taskId": task_id}, name=task_id)
    except StreamError as exc:
        raise ReplayError(
            f"task {task_id} is not served to this principal at {url}: {exc}"
        ) from None
    except (httpx.TransportError, TimeoutError) as exc:
        raise ReplayError(
            f"cannot check task {task_id} at {url} ({exc or type(exc).__name__}): is the bridge "
            "running? (--task-id appends to an existing task, which the bridge must know)"
        ) from None
    status = view.get("status")
    if status in TERMINAL_WIRE:
        raise ReplayError(
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
    progress: Callable[[str], None],
    principal: str = ANONYMOUS,
    out: TextIO | None = None,
) -> int:
    """``bridge replay``: returns the exit status; the task id goes to ``out`` (stdout) as soon
    as the task exists, everything else to ``progress``."""
    if speed < 0:
        raise ReplayError("--speed must be 0 (as fast as possible) or more")
    events = load_session(file)
    token = settings.client.token.get_secret_value() if settings.client.token else None
    if task_id is not None:
        await _check_existing(url, token, task_id)
    async with TaskEventPublisher(settings) as publisher:
        if task_id is None:
            task_id, where = await create_task(publisher, settings, principal=principal)
            progress(f"created task {task_id} (owner {principal!r}; partition {where.partition})")
        print(task_id, file=out, flush=True)
        progress(f"stream it: bridge tail {task_id} --url {url}")
        progress(_pace(events, speed))
        on_published = _every_tenth(len(events), progress)
        await replay_events(publisher, task_id, events, speed=speed, on_published=on_published)
        if keep_open:
            progress(f"task {task_id} stays open (--keep-open): append more with --task-id")
        else:
            result = completed_result(events, Path(file).name)
            await finish_task(publisher, settings, task_id, result, "replay finished")
            progress(f"task {task_id} completed")
    return 0


def _pace(events: list[SessionEvent], speed: float) -> str:
    span_s = (events[-1].offset_ms - events[0].offset_ms) / 1000
    pace = "as fast as possible" if speed == 0 else f"{speed:g}x ({span_s / speed:.1f} s)"
    return f"replaying {len(events)} events recorded over {span_s:.1f} s, {pace}"


def _every_tenth(total: int, progress: Callable[[str], None]) -> Callable[[int, Published], None]:
    """An ``on_published`` that reports every 10% of ``total`` events (rounded up)."""
    marks = {-(-total * k // 10) for k in range(1, 11)}
    started = time.monotonic()

    def report(i: int, where: Published) -> None:
        done = i + 1
        if done in marks:
            progress(
                f"{done}/{total} events ({100 * done // total}%), "
                f"{time.monotonic() - started:.1f} s, at offset {where.offset}"
            )

    return report

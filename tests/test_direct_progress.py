"""A direct ``tools/call`` with a ``progressToken`` gets ``notifications/progress`` only while
the value increases (MCP: progress MUST increase). A job that runs again restarts its progress
at its first step; the bridge drops what does not increase (in-process, a fake task service
that plays the task's events).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from test_admission_kinds import DirectTasks, call, full_streams
from test_server_inprocess import GREET, settings

from bridge.envelope import TaskEvent
from bridge.log.fanout import TaskFeed
from bridge.log.indexer import IndexedEvent
from bridge.server.handlers import MethodHandlers, Streamed


class PlayedTasks(DirectTasks):
    """Each wait of the call's subscription brings the next event of ``events``."""

    def __init__(self, events: list[TaskEvent]) -> None:
        super().__init__()
        self.events = events
        self.sub: TaskFeed | None = None

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[TaskFeed]:
        self.sub = TaskFeed(task_id, 16)
        yield self.sub

    async def next_events(self, sub: TaskFeed) -> None:
        event = self.events.pop(0)
        sub.offer(IndexedEvent(sub.task_id, 0, 0, 1, event))
        if event.payload.get("status") == "completed":
            _owner, view = self.views[sub.task_id]
            view.status = "completed"
            view.result = event.payload["result"]


async def test_a_direct_calls_progress_that_does_not_increase_is_not_sent() -> None:
    types = settings().own_types
    values: list[Any] = [1, 2, 1, 2, 3, 3, float("nan"), "4", True, 5]
    events = [TaskEvent(types.progress, {"progress": v, "total": 5}, None, 1) for v in values]
    done = {"status": "completed", "result": {"content": [{"type": "text", "text": "ok"}]}}
    events.append(TaskEvent(types.status, done, None, 2))
    handlers = MethodHandlers(settings(), PlayedTasks(events), [GREET], full_streams())  # type: ignore[arg-type]
    no_tasks = {"io.modelcontextprotocol/clientCapabilities": {}}
    params = {
        "name": "greet",
        "arguments": {"name": "x"},
        "_meta": {"progressToken": 7, **no_tasks},
    }
    streamed = await handlers.dispatch(call("tools/call", params, 1, accept="text/event-stream"))
    assert isinstance(streamed, Streamed)
    sent = [message async for message in streamed.messages]
    progress = [
        m["params"]["progress"] for m in sent if m.get("method") == "notifications/progress"
    ]
    assert progress == [1, 2, 3, 5]  # the re-run's 1, 2, the repeated 3 and non-numbers dropped
    assert sent[-1]["result"]["content"] == done["result"]["content"]

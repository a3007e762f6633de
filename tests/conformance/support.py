"""What the conformance tests share: bounds, error codes, checks of events, and the task pool.

Nothing here talks to Kafka or imports the project: checks work on what a stream delivered
(``params`` of ``notifications/tasks/event``), and tasks come from the hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import pytest

from .hooks import Hooks, ServerUnderTest
from .wire import McpClient, TaskStream

BOUND = 30.0  # any one wait
QUICK = 5.0  # "immediately": a reply that must not wait for anything
TERMINAL = frozenset({"completed", "failed", "cancelled"})
RESERVED_EXAMPLES = frozenset({"content.partial", "task.status", "tool.started"})
#: First labels of the SEP's reserved examples: ``tool.call.started`` extends a reserved name,
#: it is not a vendor's namespace.
RESERVED_ROOTS = frozenset({"content", "task", "tool"})
LABEL = re.compile(r"^[A-Za-z0-9_-]+$")
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
EVENTS_GONE = -32010


def own(hooks: Hooks, events: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(k, seq)`` of the emitted events among ``events``, in arrival order."""
    out = []
    for event in events:
        k = hooks.emitted_index(event)
        if k is not None:
            out.append((k, event["seq"]))
    return out


def has_own(hooks: Hooks, k: int) -> Callable[[TaskStream], bool]:
    return lambda stream: any(hooks.emitted_index(e) == k for e in stream.events)


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def assert_contiguous(seqs: list[Any], first: int | None = None, what: str = "seqs") -> None:
    assert all(is_int(s) for s in seqs), f"{what}: not all integers: {seqs}"
    if seqs:
        start = seqs[0] if first is None else first
        assert seqs == list(range(start, start + len(seqs))), f"{what}: not contiguous: {seqs}"


def assert_empty_result(result: dict[str, Any] | None, where: str) -> None:
    assert result is not None, f"{where}: no result"
    extra = set(result) - {"resultType", "_meta"}
    assert not extra, f"{where}: the result is not empty: {result}"
    assert result.get("resultType", "complete") == "complete", f"{where}: {result}"


def is_vendor_prefixed(event_type: Any) -> bool:
    """``<vendor prefix>.<name>``: 3+ labels, not a reserved name nor an extension of one."""
    if not isinstance(event_type, str) or event_type in RESERVED_EXAMPLES:
        return False
    labels = event_type.split(".")
    return (
        len(labels) >= 3
        and all(LABEL.match(label) for label in labels)
        and labels[0] not in RESERVED_ROOTS
    )


def assert_gone_or_intact(stream: TaskStream, first: int, what: str) -> None:
    """The stream is gap-free from ``first``; if it ended with an error, that is events_gone.

    What SEP-2694 allows when retention races a stream: continue gap-free, or stop with
    events_gone; never skip silently, never an internal error.
    """
    assert_contiguous(stream.seqs, first, what)
    error = stream.error
    if error is not None:
        data = error.get("data") or {}
        assert error.get("code") == EVENTS_GONE and data.get("reason") == "events_gone", (
            f"{what}: an error that is not events_gone: {stream.describe()}"
        )


async def task_status(client: McpClient, task_id: str) -> str:
    view = await client.result("tasks/get", {"taskId": task_id})
    return str(view.get("status"))


async def wait_terminal(client: McpClient, task_id: str, bound: float = BOUND) -> dict[str, Any]:
    """Poll tasks/get (at the task's pollIntervalMs, at most 0.2 s) until the task is terminal."""
    try:
        async with asyncio.timeout(bound):
            while True:
                view = await client.result("tasks/get", {"taskId": task_id})
                if view.get("status") in TERMINAL:
                    return view
                given = view.get("pollIntervalMs")
                interval: int = given if is_int(given) else 100
                await asyncio.sleep(min(max(interval, 20), 200) / 1000)  # the tasks poll
    except TimeoutError:
        raise AssertionError(f"task {task_id} not terminal within {bound:g} s") from None


async def first_reply(stream: TaskStream, bound: float = QUICK) -> None:
    """Read until the stream answered: its response, its first event, or its end."""
    with contextlib.suppress(AssertionError):
        await stream.until(lambda s: bool(s.events), "a first event", bound)


def our_bridge_only(server: ServerUnderTest, what: str) -> Mapping[str, Any]:
    """The details of our own bridge (its settings); for a foreign server the test is skipped,
    and a clause whose every test skips this way is reported N/A."""
    if not server.started_by_suite:
        pytest.skip(f"{what}: checked only against our bridge, started by the suite")
    return server.details


@dataclass
class TaskPool:
    """Tasks made by one test; those not finished by it are finished at teardown."""

    hooks: Hooks
    live: list[str] = field(default_factory=list)

    async def new(self) -> str:
        task_id = await self.hooks.create_task()
        self.live.append(task_id)
        return task_id

    async def quiet(self) -> str:
        task_id = await self.hooks.create_quiet_task()
        self.live.append(task_id)
        return task_id

    async def finish(self, task_id: str, outcome: str | None = None) -> None:
        await self.hooks.finish(task_id, outcome)
        self.live.remove(task_id)

    async def finish_all(self) -> None:
        for task_id in list(self.live):
            with contextlib.suppress(Exception):
                await self.hooks.finish(task_id)
        self.live.clear()

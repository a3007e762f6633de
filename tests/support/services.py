"""A task service on the real broker, without HTTP: the indexer, the reader and the service,
started and stopped together, for tests of the task limit, its counts and waits across a
rebalance (one per test file before; the same harness now)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from bridge.config import Settings, ToolSpec
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.tasks.service import TaskService, TaskView, TooManyTasks

__all__ = ["HOLD", "create_many", "task_service"]

#: A tool no worker runs: its tasks stay working, so they stay active.
HOLD = ToolSpec(name="hold", description="Never picked up", task="required")


@contextlib.asynccontextmanager
async def task_service(
    settings: Settings, *, persist: bool = False, tool: ToolSpec = HOLD
) -> AsyncIterator[TaskService]:
    """A started :class:`TaskService` offering ``tool``, over an indexer that persists its
    index when ``persist`` (so that a later service restores it)."""
    async with Indexer(settings, persist=persist) as indexer:
        reader = Reader(settings, indexer)
        service = TaskService(settings, indexer, reader, {tool.name: tool})
        await service.start()
        try:
            yield service
        finally:
            await service.stop()
            await reader.close()


async def create_many(
    service: TaskService, principal: str, n: int, tool: ToolSpec = HOLD
) -> list[TaskView]:
    """``n`` creates at once; the tasks created (every other outcome must be TooManyTasks)."""
    outcomes = await asyncio.gather(
        *(service.create(tool, {}, principal) for _ in range(n)), return_exceptions=True
    )
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, TooManyTasks) for o in refused), refused
    return [o for o in outcomes if isinstance(o, TaskView)]

"""A direct ``tools/call`` whose task's partition moves never leaves its job running unanswered.

Once the job is queued, the call ends in one of two ways: the job's result, or a retriable
answer (``partition_moving``, naming the task) after the workers were asked to cancel the job,
so the client's retry does not leave a second copy running. Two windows the rebalance tests
(tests/test_rebalance_waits.py, whose calls already wait when the partition moves) cannot hit:

- the partition moves *during* the creation: the creation's own wait for its record gives up
  quietly (the new owner indexes it), the job is queued, and the first read of the task says
  this replica no longer owns it;
- the task's final status arrives in the same loop turn as the move: it is the call's answer
  (the result is not lost, and the retry does not run the tool again).

A task service stand-in plays the log (no broker): the test decides what each read sees.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from support.layout import make_settings
from support.waits import BOUND
from test_rebalance_waits import HOLD, Slots, direct_call

from bridge.envelope import TaskEvent
from bridge.log.fanout import MOVED, TaskFeed
from bridge.log.indexer import IndexedEvent, NotOwner
from bridge.server.handlers import MethodHandlers, Streamed
from bridge.server.wire import RpcError
from bridge.tasks.service import TaskService, TaskView
from bridge.vocabulary import StatusPayload

TASK = "T" * 32


class MovingTasks:
    """The task service of a replica that loses the task's partition at a chosen moment.

    ``moves_after`` reads of the task succeed (the task is working); the next read raises
    :class:`NotOwner`. ``on_read`` runs at the last successful read (the log's doing: the
    status the tail indexed, then the rebalance, in one loop turn).
    """

    def __init__(self, moves_after: int, on_read: Any = None) -> None:
        self.settings = make_settings(
            "127.0.0.1:1", "moving", tasks={"direct_result_timeout_s": BOUND}
        )
        self.moves_after = moves_after
        self.on_read = on_read
        self.reads = 0
        self.created: list[str] = []
        self.abandoned: list[str] = []
        self.sub: TaskFeed | None = None

    def new_task_id(self) -> str:
        return TASK

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[TaskFeed]:
        self.sub = TaskFeed(task_id, 16)
        yield self.sub

    async def create(self, tool: Any, arguments: Any, principal: str, **kw: Any) -> None:
        self.created.append(kw["task_id"])  # the job is queued: it runs unless cancelled

    async def get(self, task_id: str, principal: str) -> TaskView:
        self.reads += 1
        if self.reads > self.moves_after:
            raise NotOwner(3)
        if self.reads == self.moves_after and self.on_read is not None:
            self.on_read(self)
        return TaskView(task_id, "working", 0, 0, None, 1000)

    next_events = TaskService.next_events  # the real one: a moved closure is NotOwner

    @property
    def indexer(self) -> Any:
        return self  # next_events asks the indexer for the task's partition

    def partition_of(self, task_id: str) -> int:
        return 3

    async def abandon(self, task_id: str) -> None:
        self.abandoned.append(task_id)

    async def cancel(self, task_id: str, principal: str) -> None:
        raise AssertionError("the call did not time out")


async def call(service: MovingTasks, progress: bool) -> Any:
    handlers = MethodHandlers(service.settings, service, [HOLD], Slots())  # type: ignore[arg-type]
    async with asyncio.timeout(BOUND):
        answer = await handlers.dispatch(direct_call(1, progress))
        if not isinstance(answer, Streamed):
            return answer
        last: Any = None
        async for message in answer.messages:
            last = message
        return last["result"]


@pytest.mark.parametrize("progress", [False, True], ids=["json", "streamed"])
async def test_a_call_whose_partition_moves_during_creation_cancels_its_job_first(
    progress: bool,
) -> None:
    service = MovingTasks(moves_after=0)
    with pytest.raises(RpcError) as refused:
        await call(service, progress)
    assert refused.value.http_status == 503
    assert refused.value.data["reason"] == "partition_moving"
    assert refused.value.data["taskId"] == TASK
    assert service.created == [TASK] and service.abandoned == [TASK]


def completes_then_moves(service: MovingTasks) -> None:
    """The tail indexes the task's final status, then the rebalance takes its partition."""
    assert service.sub is not None
    done = StatusPayload(status="completed", result={"content": [{"type": "text", "text": "42"}]})
    status = TaskEvent(service.settings.own_types.status, done.payload(), None, 7)
    service.sub.offer(IndexedEvent(TASK, 3, 11, 1, status))
    service.sub.close(MOVED)


@pytest.mark.parametrize("progress", [False, True], ids=["json", "streamed"])
async def test_a_result_that_arrives_as_the_partition_moves_is_the_answer(progress: bool) -> None:
    service = MovingTasks(moves_after=1, on_read=completes_then_moves)
    result = await call(service, progress)
    assert result["content"] == [{"type": "text", "text": "42"}]
    assert service.abandoned == []  # finished: nothing to cancel, nothing to retry


@pytest.mark.parametrize("progress", [False, True], ids=["json", "streamed"])
async def test_a_call_whose_partition_moves_while_it_waits_cancels_its_job_first(
    progress: bool,
) -> None:
    def moves(service: MovingTasks) -> None:
        assert service.sub is not None
        service.sub.close(MOVED)

    service = MovingTasks(moves_after=1, on_read=moves)
    with pytest.raises(RpcError) as refused:
        await call(service, progress)
    assert refused.value.data == {
        "reason": "partition_moving",
        "taskId": TASK,
        "retryAfterMs": 1000,
    }
    assert service.abandoned == [TASK]

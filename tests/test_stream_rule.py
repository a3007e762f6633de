"""A stream's delivery under generated interleavings, in-process: the real stream hub and
fan-out over a fake log, with history reads in random chunks, live events arriving while the
stream reads, overflows of a tiny buffer, and the terminal status at a random point.

Whatever the interleaving, a stream delivers exactly the events after its cursor up to the
terminal one, each once and in order, and then ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import load_settings
from bridge.envelope import TaskEvent
from bridge.log.fanout import Fanout
from bridge.log.indexer import IndexedEvent
from bridge.metrics import StreamMetrics
from bridge.server.admission import Caller
from bridge.server.streams import StreamHub
from bridge.server.wire import RpcError

TASK = "task-1"
CONFIG = load_settings(
    kafka={"bootstrap_servers": "127.0.0.1:1"}, streams={"queue_size": 3, "keepalive_s": 60}
)
STATUS = CONFIG.own_types.status


@dataclass(frozen=True)
class Read:
    seq: int
    offset: int
    event: TaskEvent


class FakeLog:
    """One task's committed events as the indexer sees them, and its listeners."""

    def __init__(self, chunks: Callable[[], int]) -> None:
        self.events: list[Read] = []
        self.terminal_offset: int | None = None
        self.listeners: list[Callable[[IndexedEvent], None]] = []
        self.chunks = chunks  # how many events the next history fetch returns
        self.trusted = True  # False once retention deleted records before they were counted
        self.partitions = {
            0: SimpleNamespace(
                next_seq_of=lambda task_id: len(self.events), trusts=lambda task_id: self.trusted
            )
        }

    # the indexer's side
    def add_listener(self, listener: Callable[[IndexedEvent], None]) -> None:
        self.listeners.append(listener)

    def add_ownership_listener(self, listener: Callable[[set[int], set[int]], None]) -> None:
        """One process owning its one partition for good: no assignment ever changes."""

    def partition_of(self, task_id: str) -> int:
        return 0

    def lookup(self, task_id: str) -> tuple[int, Any]:
        entry = SimpleNamespace(
            terminal=self.terminal_offset is not None,
            status_offset=self.terminal_offset,
            trusted=self.trusted,
        )
        return 0, entry

    async def catch_up(self) -> None:
        return None

    def append(self, terminal: bool = False) -> None:
        seq = len(self.events)
        offset = 10 * seq
        if terminal:
            event = TaskEvent(STATUS, {"status": "completed"}, None, 0)
            self.terminal_offset = offset
        else:
            event = TaskEvent("com.example.step", {"i": seq}, None, 0)
        self.events.append(Read(seq, offset, event))
        for listener in self.listeners:
            listener(IndexedEvent(TASK, 0, offset, seq, event))

    # the reader's side
    async def read_batches(
        self, task_id: str, after: int | None, *, log_start: int | None = None
    ) -> AsyncIterator[list[Read]]:
        head = len(self.events)  # a read goes up to the head at its start, like the real one
        position = 0 if after is None else after + 1
        while position < head:
            await asyncio.sleep(0)  # a fetch: other tasks (the tail) run meanwhile
            size = self.chunks()
            yield self.events[position : min(head, position + size)]
            position += size

    async def earliest_seq(self, task_id: str) -> int:
        return 0

    async def earliest(self, task_id: str) -> tuple[int, int]:
        return 0, 0  # nothing is ever deleted here: seq 0 at the log start, offset 0

    def observe(self, **hooks: Callable[..., None]) -> None:
        """No shared scans here: nothing to report."""

    async def head(self, task_id: str) -> int:
        return len(self.events)


@settings(deadline=None, max_examples=150)
@given(st.data())
def test_every_interleaving_delivers_each_seq_once_up_to_the_terminal_event(
    data: st.DataObject,
) -> None:
    history = data.draw(st.integers(0, 12), label="events before the stream opens")
    after = data.draw(st.one_of(st.none(), st.integers(0, max(0, history - 1))), label="after")
    if history == 0:
        after = None
    bursts = data.draw(st.lists(st.integers(0, 8), max_size=6), label="live bursts")
    yields = data.draw(st.lists(st.integers(0, 6), min_size=len(bursts), max_size=len(bursts)))
    log = FakeLog(lambda: data.draw(st.integers(1, 5)))
    for _ in range(history):
        log.append()

    async def scenario() -> list[int]:
        hub = StreamHub(CONFIG, log, log, Fanout(log), StreamMetrics())  # type: ignore[arg-type]
        ticket = hub.admit(Caller("p", "p", None), TASK, 1)
        delivered: list[int] = []

        async def consume() -> None:
            async for batch in hub.events(ticket, after):
                delivered.extend(seq for seq, _ in batch or [])

        stream = asyncio.create_task(consume())
        for burst, pause in zip(bursts, yields, strict=True):
            for _ in range(burst):
                log.append()
            for _ in range(pause):  # let the stream run some steps, or none
                await asyncio.sleep(0)
        log.append(terminal=True)
        for _ in range(3):
            log.append()  # events after the terminal one belong to no stream opened before it
        async with asyncio.timeout(5):
            await stream
        return delivered

    delivered = asyncio.run(scenario())
    terminal = next(e.seq for e in log.events if e.offset == log.terminal_offset)
    first = 0 if after is None else after + 1
    assert delivered == list(range(first, terminal + 1))


@dataclass
class OpenStream:
    """A tasks/stream of the one task from its start, consumed in a task of its own."""

    hub: StreamHub
    task: asyncio.Task[None]
    delivered: list[int]
    #: Set once the stream handed its first batch (it is live from then on, here).
    first: asyncio.Event


def open_stream(log: FakeLog, fanout: Fanout) -> OpenStream:
    hub = StreamHub(CONFIG, log, log, fanout, StreamMetrics())  # type: ignore[arg-type]
    ticket = hub.admit(Caller("p", "p", None), TASK, 1)
    delivered: list[int] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for batch in hub.events(ticket, None):
            delivered.extend(seq for seq, _ in batch or [])
            first.set()

    return OpenStream(hub, asyncio.create_task(consume()), delivered, first)


def test_a_drain_ends_the_streams_but_not_the_calls_waiting_on_the_same_task() -> None:
    """SIGTERM ends every stream at once; a direct call waiting for the task's status (the task
    service's subscription to the same fan-out) must keep waiting, not spin on a closed buffer."""
    log = FakeLog(lambda: 5)
    log.append()

    async def scenario() -> tuple[list[int], bool]:
        fanout = Fanout(log)  # type: ignore[arg-type]
        with fanout.subscribe(TASK, 16) as waiting_call:
            stream = open_stream(log, fanout)
            async with asyncio.timeout(5):
                await stream.first.wait()
                stream.hub.drain()
                await stream.task  # the stream ended, without its terminal event
            return stream.delivered, waiting_call.closed

    delivered, call_closed = asyncio.run(scenario())
    assert delivered == [0] and not call_closed


def test_a_live_stream_whose_task_became_untrusted_ends_with_seq_untrusted() -> None:
    """Retention deleted records of the task's partition before they were counted while the
    stream waited live: the seqs of what follows are not known (its terminal status may be
    among the lost), so the stream ends with the error a new request would get."""
    log = FakeLog(lambda: 5)
    log.append()

    async def scenario() -> tuple[list[int], BaseException | None]:
        stream = open_stream(log, Fanout(log))  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            await stream.first.wait()  # live now, waiting for the next event
            log.trusted = False
            log.append()  # what it is woken by: never handed under an unknown seq
            try:
                await stream.task
            except RpcError as exc:
                return stream.delivered, exc
        return stream.delivered, None

    delivered, ended = asyncio.run(scenario())
    assert delivered == [0]
    assert isinstance(ended, RpcError) and ended.data["reason"] == "seq_untrusted", ended


def test_the_hub_knows_each_open_stream_s_last_delivered_seq_until_it_ends() -> None:
    """What the distance to data loss is computed from: an open stream's position (its task
    and the last seq it was handed), gone once the stream ended."""
    log = FakeLog(lambda: 5)
    for _ in range(5):
        log.append()

    async def scenario() -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[int]]:
        stream = open_stream(log, Fanout(log))  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            await stream.first.wait()  # the catch-up's one chunk: seqs 0-4
            open_ = stream.hub.positions()
            log.append(terminal=True)
            await stream.task
        return open_, stream.hub.positions(), stream.delivered

    open_, ended, delivered = asyncio.run(scenario())
    assert open_ == [(TASK, 4)] and ended == [] and delivered == [0, 1, 2, 3, 4, 5]

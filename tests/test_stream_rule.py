"""A stream's delivery under generated interleavings, in-process: the real stream hub and
fan-out over a fake log, with history reads in random chunks, live events arriving while the
stream reads, overflows of a tiny buffer, and the terminal status at a random point.

The log holds real records, and the stream takes the path production takes: history read as
a tasks/stream reads it (:meth:`~bridge.log.records.RecordDecoder.wire_batch`: the usual
records as their checked wire members, spliced into the text unparsed), live events decoded on
first use (:class:`~bridge.log.records.LazyEvent`), every batch through the one delivery rule
and rendered and framed by :func:`bridge.server.sse.task_stream`; the browser view's decoded
path is drawn as well. Whatever the interleaving, a stream delivers exactly the events after
its cursor up to the terminal one, each once and in order, each as its event renders, and
then ends with its result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import load_settings
from bridge.envelope import Item, TaskEvent, encode_event
from bridge.kafka.port import Record
from bridge.log.fanout import Fanout
from bridge.log.indexer import IndexedEvent
from bridge.log.records import Batch, LazyEvent, RecordDecoder
from bridge.metrics import StreamMetrics
from bridge.server.admission import Caller
from bridge.server.sse import EventBatch, Frame, RecentTexts, renderer, task_stream
from bridge.server.streams import StreamHub
from bridge.server.wire import RpcError

TASK = "task-1"
CONFIG = load_settings(
    kafka={"bootstrap_servers": "127.0.0.1:1"}, streams={"queue_size": 3, "keepalive_s": 60}
)
STATUS = CONFIG.own_types.status
PREFIX = CONFIG.tasks.event_type_prefix
DECODER = RecordDecoder(PREFIX, CONFIG.tasks.max_event_bytes, CONFIG.type_rule)
#: Records of the usual shape carry a timestamp of these days (one of 1970 is not spliced).
NOW_MS = 1_764_000_000_000


@dataclass(frozen=True)
class Read:
    seq: int
    offset: int
    record: Record

    @property
    def event(self) -> TaskEvent:
        return DECODER.event(self.record)


class FakeLog:
    """One task's committed records as the indexer sees them, and its listeners."""

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
            event = TaskEvent(STATUS, {"status": "completed"}, None, NOW_MS + seq)
            self.terminal_offset = offset
        else:
            event = TaskEvent("com.example.step", {"i": seq, "note": "a b"}, None, NOW_MS + seq)
        value, headers = encode_event(event)
        record = Record("events", 0, offset, TASK.encode(), value, NOW_MS + seq, tuple(headers))
        self.events.append(Read(seq, offset, record))
        for listener in self.listeners:  # as the tail hands it over: decoded on first use
            listener(IndexedEvent(TASK, 0, offset, seq, LazyEvent(record, DECODER)))

    # the reader's side
    async def _chunks(self, after: int | None) -> AsyncIterator[tuple[int, list[Record]]]:
        head = len(self.events)  # a read goes up to the head at its start, like the real one
        position = 0 if after is None else after + 1
        while position < head:
            await asyncio.sleep(0)  # a fetch: other tasks (the tail) run meanwhile
            size = self.chunks()
            yield position, [e.record for e in self.events[position : min(head, position + size)]]
            position += size

    async def read_batches(
        self, task_id: str, after: int | None, *, log_start: int | None = None
    ) -> AsyncIterator[Batch[TaskEvent]]:
        async for first, records in self._chunks(after):
            yield DECODER.batch(first, records)

    async def read_wire(
        self, task_id: str, after: int | None, *, log_start: int | None = None
    ) -> AsyncIterator[Batch[Item]]:
        async for first, records in self._chunks(after):
            yield DECODER.wire_batch(first, records)

    async def earliest_seq(self, task_id: str) -> int:
        return 0

    async def earliest(self, task_id: str) -> tuple[int, int]:
        return 0, 0  # nothing is ever deleted here: seq 0 at the log start, offset 0

    def observe(self, **hooks: Callable[..., None]) -> None:
        """No shared scans here: nothing to report."""

    async def head(self, task_id: str) -> int:
        return len(self.events)


def sse_seqs(text: str, log: FakeLog) -> list[int]:
    """The seqs of a write's SSE events, each checked to be exactly its event's text."""
    render = renderer(TASK, PREFIX)
    seqs = []
    for block in text.split("\n\n")[:-1]:
        id_line, event_line, data_line = block.split("\n")
        assert event_line == "event: message" and data_line.startswith("data: ")
        data = data_line.removeprefix("data: ")
        seq = json.loads(data)["params"]["seq"]
        assert id_line.startswith("id: ") and id_line.endswith(str(seq))
        assert data == render(seq, log.events[seq].event)  # spliced or not: the same bytes
        seqs.append(seq)
    return seqs


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
    # tasks/stream's path (wire members, rendered and framed) three times in four; else the
    # browser view's (decoded events).
    wire = data.draw(st.sampled_from([True, True, True, False]), label="wire")
    log = FakeLog(lambda: data.draw(st.integers(1, 5)))
    for _ in range(history):
        log.append()

    async def scenario() -> tuple[list[int], bool]:
        hub = StreamHub(CONFIG, log, log, Fanout(log), StreamMetrics())  # type: ignore[arg-type]
        ticket = hub.admit(Caller("p", "p", None), TASK, 1)
        delivered: list[int] = []
        completed: list[bool] = [False]

        async def consume() -> None:
            if not wire:
                async for batch in hub.events(ticket, after):
                    delivered.extend(batch.seqs if batch is not None else ())
                completed[0] = True
                return
            batches = hub.events(ticket, after, wire=True)
            body = task_stream(batches, ticket, 1, RecentTexts(), PREFIX, hub.draining)
            async for item in body:
                if isinstance(item, EventBatch):
                    delivered.extend(sse_seqs(item.text, log))
                elif isinstance(item, Frame) and item.message is not None:
                    completed[0] = item.message["result"] == {"resultType": "complete"}

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
        return delivered, completed[0]

    delivered, completed = asyncio.run(scenario())
    terminal = next(e.seq for e in log.events if e.offset == log.terminal_offset)
    first = 0 if after is None else after + 1
    assert delivered == list(range(first, terminal + 1))
    assert completed


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
            delivered.extend(batch.seqs if batch is not None else ())
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

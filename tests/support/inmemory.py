"""The whole bridge in the test process, over the in-memory log: no broker, real HTTP.

:func:`memory_bridge` runs the bridge as ``bridge serve`` does: the production runner
(:func:`~bridge.server.runner.bridge_server`: its read timeout, head bound, keep-alive, access
log, drain of open streams on stop and peer listener) around the app of
:func:`~bridge.server.app.create_app` and every component, with the worker SDK of the configured
packs as a companion, all on one :class:`~bridge.kafka.memory.MemoryLog` holding the topic
layout. It serves a real loopback port from a background thread with an event loop of its own,
so a test talks to it over real HTTP (SSE streamed as written, never buffered by a transport)
from sync or async code alike. Only the process's logging configuration is left as pytest set it.

The log lives on the server's loop: test code reaches it with :meth:`MemoryBridge.call`
(a coroutine run there, its result returned here) or through :attr:`MemoryBridge.log`, a
:class:`LoopLog` that does so for every port call a producer or a reader makes.

What it does not cover: the Events extension's topic sources read Kafka themselves still
(a webhook subscription to one of them is delivered only on the broker); tests of those stay
on the broker tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from bridge.config import Settings
from bridge.kafka.memory import MemoryLog
from bridge.kafka.port import Fetched, Log, Producer, Sent, TopicPart
from bridge.kafka.topics import topic_layout
from bridge.server.app import Components
from bridge.server.runner import bridge_server
from bridge.tasks.tools import job_topics
from bridge.workers.packs import pack_handlers
from bridge.workers.sdk import Worker

from .waits import wait_until_sync

__all__ = ["NO_BROKER", "LoopLog", "MemoryBridge", "WallClock", "memory_bridge", "memory_log"]

T = TypeVar("T")

#: The broker an in-memory bridge's settings name: nothing listens there (the discard port),
#: so a part that still reads Kafka fails loudly instead of finding a broker.
NO_BROKER = "127.0.0.1:9"

#: Seconds a call into the server's loop, or its start and stop, may take.
BOUND_S = 60.0


class WallClock:
    """The memory log's clock on real wall time (record timestamps are epoch milliseconds, as
    the broker's are), its timers on the running loop."""

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)


def memory_log(settings: Settings) -> MemoryLog:
    """A memory log with the topics `bridge topics create` makes for ``settings``."""
    log = MemoryLog(WallClock())
    for spec in topic_layout(settings, job_topics(settings)):
        log.create_topic(spec.name, spec.partitions)
    return log


class LoopLog:
    """The parts of the port a test's producers and readers use, on the log of another loop:
    each call runs there (the memory log and its waiters belong to the server's loop) and is
    awaited here without blocking this loop."""

    def __init__(self, bridge: MemoryBridge) -> None:
        self._bridge = bridge
        self._log = bridge.memory

    async def partitions(self, topic: str) -> list[int]:
        return await self._bridge.acall(self._log.partitions(topic))

    async def fetch(self, part: TopicPart, offset: int, max_records: int = 500) -> Fetched:
        return await self._bridge.acall(self._log.fetch(part, offset, max_records))

    async def log_starts(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        return await self._bridge.acall(self._log.log_starts(list(parts)))

    async def log_ends(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        return await self._bridge.acall(self._log.log_ends(list(parts)))

    async def offsets_for_times(
        self, times: Mapping[TopicPart, int]
    ) -> dict[TopicPart, int | None]:
        return await self._bridge.acall(self._log.offsets_for_times(dict(times)))

    async def delete_records_before(self, part: TopicPart, offset: int) -> None:
        await self._bridge.acall(self._log.delete_records_before(part, offset))

    async def remove_members(self, group: str, instance_ids: Sequence[str]) -> None:
        await self._bridge.acall(self._log.remove_members(group, list(instance_ids)))

    def producer(self, role: str = "producer") -> LoopProducer:
        return LoopProducer(self._bridge, self._log.producer(role))


class LoopProducer:
    """An idempotent producer of the memory log, used from another loop (see :class:`LoopLog`).

    Like Kafka's producer, it batches: the sends made together (in one turn of the caller's
    loop, e.g. under ``asyncio.gather``) are appended in order in one turn of the log's loop,
    so readers see them land together, as they see a broker's batch.
    """

    def __init__(self, bridge: MemoryBridge, producer: Producer) -> None:
        self._bridge = bridge
        self._producer = producer
        self._batch: list[tuple[Callable[[], Coroutine[Any, Any, Sent]], asyncio.Future[Sent]]]
        self._batch = []
        self._flushing: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._bridge.acall(self._producer.start())

    async def close(self) -> None:
        await self._bridge.acall(self._producer.close())

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> Sent:
        def send() -> Coroutine[Any, Any, Sent]:
            return self._producer.send(
                topic,
                value,
                key=key,
                partition=partition,
                headers=headers,
                timestamp_ms=timestamp_ms,
            )

        loop = asyncio.get_running_loop()
        sent: asyncio.Future[Sent] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._start_flush)
        self._batch.append((send, sent))
        return await sent

    def _start_flush(self) -> None:
        # Held until done: the loop keeps only a weak reference to a task.
        flushing = asyncio.get_running_loop().create_task(self._flush())
        self._flushing.add(flushing)
        flushing.add_done_callback(self._flushing.discard)

    async def _flush(self) -> None:
        batch, self._batch = self._batch, []

        async def append_all() -> list[Sent | BaseException]:
            done: list[Sent | BaseException] = []
            for send, _ in batch:
                try:
                    done.append(await send())
                except Exception as exc:  # handed to its sender
                    done.append(exc)
            return done

        try:
            results = await self._bridge.acall(append_all())
        except Exception as exc:
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue  # its sender gave up (cancelled)
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


@dataclass
class MemoryBridge:
    """A running in-process bridge: what tests use of :class:`support.procs.Bridge` (``url``,
    ``port``, ``settings``), and the memory log it runs on."""

    settings: Settings
    port: int
    memory: MemoryLog
    loop: asyncio.AbstractEventLoop
    components: Components
    #: The server's log lines (uvicorn's access log and the bridge's), when asked for.
    log_path: Path | None = None

    @property
    def log(self) -> Log:
        """The memory log as a port usable from any other event loop (the test's)."""
        return cast(Log, LoopLog(self))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T], bound: float = BOUND_S) -> T:
        """Run ``coro`` on the server's loop (where the log and the components live)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=bound)

    async def acall(self, coro: Coroutine[Any, Any, T], bound: float = BOUND_S) -> T:
        """:meth:`call` from a coroutine of another loop, without blocking that loop."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        async with asyncio.timeout(bound):
            return await asyncio.wrap_future(future)


def _companion(log: Log) -> Callable[[Settings, contextlib.AsyncExitStack], Any]:
    """The packs' workers in the server's process, on ``log`` (``bridge workers`` would run
    them in a process of their own, on the same topics)."""

    async def start(settings: Settings, stack: contextlib.AsyncExitStack) -> None:
        worker = Worker(settings, pack_handlers(settings.tool_packs), log=log)
        await worker.start()
        stack.push_async_callback(worker.stop)
        runner = asyncio.create_task(worker.run(), name="memory-bridge-workers")

        async def stop() -> None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

        stack.push_async_callback(stop)

    return start


#: The loggers a ``log_path`` collects: the access log and the bridge's own.
LOGGERS = ("uvicorn.error", "uvicorn.access", "bridge")
#: The loggers whose levels the runner sets (from the settings' log level): put back after.
LEVELLED = (*LOGGERS, "uvicorn.asgi")


@contextlib.contextmanager
def _logged_to(path: Path | None) -> Iterator[None]:
    """The server's log lines written to ``path`` (at INFO) while the block runs; the levels
    of the server's loggers as they were afterwards."""
    loggers = [logging.getLogger(name) for name in LEVELLED]
    levels = [logger.level for logger in loggers]
    handler = None
    if path is not None:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        for logger in loggers[: len(LOGGERS)]:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
            if handler is not None:
                logger.removeHandler(handler)
        if handler is not None:
            handler.close()


@contextlib.contextmanager
def memory_bridge(
    settings: Settings,
    *,
    workers: bool = True,
    log_path: Path | None = None,
    memory: MemoryLog | None = None,
) -> Iterator[MemoryBridge]:
    """The bridge of ``settings`` served in this process over a fresh memory log, with the
    packs' workers when ``workers``; yielded once it is ready (its lifespan has run).
    ``log_path``: where its log lines go (else they reach the test process's logging, at the
    settings' log level while it runs).
    ``memory``: the log to serve instead of a fresh one (what an earlier bridge, or the test,
    wrote to it; a restart is a new bridge on the same log, once the earlier one stopped)."""
    with _logged_to(log_path), _serving(settings, workers, memory) as running:
        running.log_path = log_path
        yield running


@contextlib.contextmanager
def _serving(settings: Settings, workers: bool, memory: MemoryLog | None) -> Iterator[MemoryBridge]:
    memory = memory if memory is not None else memory_log(settings)
    sock = socket.create_server(("127.0.0.1", 0))
    # The production runner, as `bridge serve` has it (its read timeout, head bound, keep-alive,
    # access log, drain on stop and peer listener), with the process's logging left as is.
    server = bridge_server(
        settings,
        companions=[_companion(memory)] if workers else [],
        sock=sock,
        handle_signals=False,
        log=memory,
        configure_logging=False,
    )
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failed: list[BaseException] = []

    async def serve_until_stopped() -> None:
        await server.start()
        ready.set()
        assert server.task is not None
        await server.task

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve_until_stopped())
        except BaseException as exc:  # shown by the waiting test, not lost in the thread
            failed.append(exc)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=serve, name="memory-bridge", daemon=True)
    thread.start()
    try:
        wait_until_sync(
            lambda: ready.is_set() or not thread.is_alive(), BOUND_S, what="the bridge serves"
        )
        assert ready.is_set(), f"the in-memory bridge did not start: {failed!r}"
        port = int(sock.getsockname()[1])
        components = server.app.state.components  # type: ignore[attr-defined]
        yield MemoryBridge(settings, port, memory, loop, components)
    finally:
        if thread.is_alive():
            loop.call_soon_threadsafe(server.stop)  # drains the open streams, as on SIGTERM
        thread.join(BOUND_S)
        sock.close()

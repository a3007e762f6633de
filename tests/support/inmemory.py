"""The whole bridge in the test process, over the in-memory log: no broker, real HTTP.

:func:`memory_bridge` composes the app as ``bridge serve`` does (:func:`~bridge.server.app.
create_app`, every component of :func:`~bridge.server.app.start_components`) with the worker
SDK of the configured packs as a companion, all on one :class:`~bridge.kafka.memory.MemoryLog`
holding the topic layout. uvicorn serves it on a real loopback port from a background thread
with an event loop of its own, so a test talks to it over real HTTP (SSE streamed as written,
never buffered by a transport) from sync or async code alike.

The log lives on the server's loop: test code reaches it with :meth:`MemoryBridge.call`
(a coroutine run there, its result returned here) or through :attr:`MemoryBridge.log`, a
:class:`ThreadLog` that does so for every port call.

What it does not cover: the Events extension's topic sources and the webhook registry read
Kafka themselves still; tests of those stay on the broker tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import uvicorn

from bridge.config import Settings
from bridge.kafka.memory import MemoryLog
from bridge.kafka.port import Fetched, Log, Sent, TopicPart
from bridge.kafka.topics import topic_layout
from bridge.server.app import Components, create_app
from bridge.tasks.tools import job_topics
from bridge.workers.packs import pack_handlers
from bridge.workers.sdk import Worker

from .waits import wait_until_sync

__all__ = ["MemoryBridge", "ThreadLog", "WallClock", "memory_bridge"]

T = TypeVar("T")

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


class ThreadLog:
    """The parts of the port a test uses, called from another thread than the log's loop."""

    def __init__(self, bridge: MemoryBridge) -> None:
        self._bridge = bridge
        self._log = bridge.memory

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> Sent:
        """One record through an idempotent producer."""

        async def send() -> Sent:
            producer = self._log.producer("test")
            await producer.start()
            try:
                return await producer.send(
                    topic, value, key=key, partition=partition, headers=tuple(headers)
                )
            finally:
                await producer.close()

        return self._bridge.call(send())

    def fetch(self, part: TopicPart, offset: int, max_records: int = 500) -> Fetched:
        return self._bridge.call(self._log.fetch(part, offset, max_records))

    def log_starts(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        return self._bridge.call(self._log.log_starts(list(parts)))

    def log_ends(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        return self._bridge.call(self._log.log_ends(list(parts)))

    def delete_records_before(self, part: TopicPart, offset: int) -> None:
        self._bridge.call(self._log.delete_records_before(part, offset))

    def offsets_for_times(self, times: Mapping[TopicPart, int]) -> dict[TopicPart, int | None]:
        return self._bridge.call(self._log.offsets_for_times(dict(times)))


@dataclass
class MemoryBridge:
    """A running in-process bridge: what tests use of :class:`support.procs.Bridge` (``url``,
    ``port``, ``settings``), and the memory log it runs on."""

    settings: Settings
    port: int
    memory: MemoryLog
    loop: asyncio.AbstractEventLoop
    components: Components
    log: ThreadLog = field(init=False)

    def __post_init__(self) -> None:
        self.log = ThreadLog(self)

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


@contextlib.contextmanager
def memory_bridge(settings: Settings, *, workers: bool = True) -> Iterator[MemoryBridge]:
    """The bridge of ``settings`` served in this process over a fresh memory log, with the
    packs' workers when ``workers``; yielded once it is ready (its lifespan has run)."""
    memory = memory_log(settings)
    companions = [_companion(memory)] if workers else []
    app = create_app(settings, companions=companions, log=memory)
    config = uvicorn.Config(app, lifespan="on", log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    failed: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        except BaseException as exc:  # shown by the waiting test, not lost in the thread
            failed.append(exc)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=serve, name="memory-bridge", daemon=True)
    thread.start()
    try:
        wait_until_sync(
            lambda: server.started or not thread.is_alive(), BOUND_S, what="the bridge serves"
        )
        assert server.started, f"the in-memory bridge did not start: {failed!r}"
        port = int(sock.getsockname()[1])
        yield MemoryBridge(settings, port, memory, loop, app.state.components)
    finally:
        server.should_exit = True
        thread.join(BOUND_S)
        sock.close()

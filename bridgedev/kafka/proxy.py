"""A TCP fault proxy: forwards loopback ports to targets, and can cut, restore and slow them.

Where it sits: between a client (the bridge, a test's Kafka client) and the brokers of
:mod:`bridgedev.kafka.cluster`, which advertise the proxy's ports so that every client
connection goes through it while the brokers talk to each other directly. It knows nothing of
Kafka: it moves bytes. It runs an asyncio loop of its own in a daemon thread, so sync test code
and benches drive it through plain method calls, each of which returns once the fault is in
force (no half-applied state for the caller to wait on).

The faults, applied to every route of the proxy at once:

- :meth:`FaultProxy.cut` drops every live connection (both sides closed at once, unsent bytes
  discarded) and then, by default, *refuses* new ones: the listening sockets are closed, so a
  connect fails at once with "connection refused". With ``blackhole=True`` new connections
  are accepted but never forwarded nor answered: what the client sends vanishes and it only
  finds out through its own timeouts (a network partition without resets).
- :meth:`FaultProxy.restore` ends a cut: the same ports listen and forward again. Connections
  cut stay gone; clients must reconnect.
- :meth:`FaultProxy.slow` delays every chunk of bytes by ``latency_s`` in each direction (a
  delay line: chunks keep their order and back-to-back chunks are not delayed cumulatively),
  and with ``bytes_per_s`` also caps each direction of each connection to that rate. It applies
  to live and new connections alike.
- :meth:`FaultProxy.clear` ends every fault: a cut and the slowness.

Not a fault injector for single packets or half-open TCP states; not for production use.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = ["FaultProxy", "Route"]

T = TypeVar("T")

#: Bytes read at once from one side of a connection (one "chunk" of :meth:`FaultProxy.slow`).
CHUNK_BYTES = 64 * 1024
#: Chunks in flight per direction before the proxy stops reading (backpressure under slow).
_QUEUE_CHUNKS = 64
#: Bound of any one call into the proxy's loop.
_CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Route:
    """One forwarded port: ``listen_port`` on ``host`` to ``target_host``:``target_port``."""

    host: str
    listen_port: int
    target_host: str
    target_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.listen_port}"


@dataclass(frozen=True)
class _Slowness:
    latency_s: float = 0.0
    bytes_per_s: float | None = None


class _Link:
    """One client connection and its upstream: two pumps, closable together."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.writers: list[asyncio.StreamWriter] = [client]
        self.tasks: list[asyncio.Task[None]] = []
        self.blackholed = False

    def abort(self) -> None:
        # abort, not close: a cut drops the bytes in flight instead of flushing them
        for writer in self.writers:
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forwarding routes on one event loop in a daemon thread; see the module for the faults.

    Routes can be added at any time (also during a cut); :meth:`close` stops it all. Also a
    context manager.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        self._routes: list[Route] = []
        self._servers: dict[Route, asyncio.Server] = {}
        self._links: set[_Link] = set()
        self._cut: str | None = None  # None, "refuse" or "blackhole"
        self._slowness = _Slowness()
        self._closed = False

    # --- the sync interface (any thread but the proxy's own) ----------------------------------

    @property
    def routes(self) -> list[Route]:
        return list(self._routes)

    def add_route(self, target_host: str, target_port: int, listen_port: int = 0) -> Route:
        """Listen on ``listen_port`` (0: any free port) and forward to the target."""
        return self._call(self._add_route(target_host, target_port, listen_port))

    def cut(self, *, blackhole: bool = False) -> None:
        """Drop every live connection; refuse new ones (``blackhole``: accept and ignore them)."""
        self._call(self._set_cut("blackhole" if blackhole else "refuse"))

    def restore(self) -> None:
        """End a cut: listen and forward again on the same ports (slowness stays)."""
        self._call(self._set_cut(None))

    def slow(self, latency_s: float, bytes_per_s: float | None = None) -> None:
        """Delay each chunk by ``latency_s`` each way; cap each direction to ``bytes_per_s``."""
        if latency_s < 0 or (bytes_per_s is not None and bytes_per_s <= 0):
            raise ValueError(
                f"slow() needs latency_s >= 0 and bytes_per_s > 0 or None, "
                f"not {latency_s!r}, {bytes_per_s!r}"
            )
        self._slowness = _Slowness(latency_s, bytes_per_s)

    def clear(self) -> None:
        """End every fault: a cut and the slowness."""
        self._slowness = _Slowness()
        self.restore()

    def connection_count(self) -> int:
        """Client connections open through the proxy now (forwarded or blackholed)."""
        return len(self._links)

    def close(self) -> None:
        """Close every route and connection and stop the loop's thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CALL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self._cut or "forwarding"
        routes = ", ".join(f"{r.address}->{r.target_host}:{r.target_port}" for r in self._routes)
        return f"<FaultProxy {state} {self._slowness} [{routes}]>"

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed and self._loop.is_closed():
            coro.close()
            raise RuntimeError("the fault proxy is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT_S)

    # --- on the proxy's loop ------------------------------------------------------------------

    async def _add_route(self, target_host: str, target_port: int, listen_port: int) -> Route:
        server = await self._listen(self.host, listen_port, target_host, target_port)
        port = int(server.sockets[0].getsockname()[1])
        route = Route(self.host, port, target_host, target_port)
        self._routes.append(route)
        if self._cut == "refuse":
            server.close()
        else:
            self._servers[route] = server
        return route

    async def _listen(
        self, host: str, port: int, target_host: str, target_port: int
    ) -> asyncio.Server:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(reader, writer, target_host, target_port)

        return await asyncio.start_server(accepted, host, port, reuse_address=True)

    async def _set_cut(self, mode: str | None) -> None:
        self._cut = mode
        for link in list(self._links):
            # a restore also drops the blackholed connections: their clients reconnect now
            # instead of waiting out their timeouts on a connection that never forwards
            if mode is not None or link.blackholed:
                self._drop(link)
        if mode == "refuse":
            for server in self._servers.values():
                server.close()
            self._servers.clear()
        else:
            # the same port again: clients and advertised addresses keep pointing at it
            for route in self._routes:
                if route not in self._servers:
                    self._servers[route] = await self._listen(
                        route.host, route.listen_port, route.target_host, route.target_port
                    )

    async def _close_all(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        for link in list(self._links):
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        # gone from the count at once, not when its serving task next runs
        self._links.discard(link)
        link.abort()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        target_host: str,
        target_port: int,
    ) -> None:
        link = _Link(writer)
        self._links.add(link)
        try:
            if self._cut is not None:
                link.blackholed = True
                await self._swallow(reader)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
            except OSError:
                return  # the target is down: the client sees its connection closed
            link.writers.append(up_writer)
            if self._cutting():  # cut while connecting
                return
            link.tasks = [
                asyncio.create_task(self._pump(reader, up_writer)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            # either side closing ends the connection (Kafka clients never half-close)
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            self._drop(link)

    def _cutting(self) -> bool:
        return self._cut is not None

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        """A blackholed connection: read and drop until the client gives up."""
        while await reader.read(CHUNK_BYTES):
            pass

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: chunks read now, written at arrival + latency, paced by the cap."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
        sender = asyncio.create_task(self._send(queue, writer))
        try:
            while chunk := await reader.read(CHUNK_BYTES):
                await queue.put((time.monotonic(), chunk))
            await queue.put((time.monotonic(), b""))
            await sender
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            sender.cancel()

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        while True:
            arrived, chunk = await queue.get()
            if not chunk:
                return
            slowness = self._slowness  # read per chunk: slow() reaches live connections
            due = arrived + slowness.latency_s
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
            if slowness.bytes_per_s is not None:
                await asyncio.sleep(len(chunk) / slowness.bytes_per_s)

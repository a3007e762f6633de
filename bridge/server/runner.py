"""Running the bridge's HTTP server under uvicorn: the one place the package does it.

Two uses, one class (:class:`AppServer`):

* ``bridge serve`` runs the app as the process's main (:meth:`AppServer.run`): uvicorn's own
  event loop, and uvicorn's handling of SIGINT/SIGTERM;
* ``bridge demo`` runs it beside its own work in the current event loop (:meth:`AppServer.start`,
  :meth:`AppServer.close`), on a socket it bound up front so that a busy port is a clear error
  rather than a uvicorn exit, and handles the signals itself.

Whatever asks for the stop (a signal, or the caller), it takes one path: ``on_stop`` first, then
uvicorn's graceful shutdown (bounded by ``timeout_graceful_shutdown``), then the app's lifespan
shutdown. SIGTERM with ``hand_over`` set runs it first, serving on meanwhile: a replica of a
group gives its partitions to the others and waits until they serve them (bounded by
``handover.timeout_s``, docs/deployment.md), so its streams end only once their clients can
resume elsewhere at once; a second signal stops at once. The bridge drains its open streams in ``on_stop`` (:func:`bridge_server`): an open
``tasks/stream`` never ends by itself, so without the drain every viewer would hold the shutdown
until its bound, and then be cut off instead of told to resume. A second SIGINT forces the exit,
as in uvicorn.

With replicas (``replicas.ownership = "group"``) the process serves a second listener, the peer
listener (:func:`peer_listener`): another uvicorn server in the same loop, started by the app
once its components run and closed before they stop; it never handles signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import io
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any, Literal

import uvicorn
from starlette.types import ASGIApp

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.kafka.port import Log
from bridge.server.app import Companion, PeerListener, create_app
from bridge.server.peers import server_tls
from bridge.server.protocols import protocol_class

__all__ = ["AppServer", "ServerExited", "bridge_server", "peer_listener", "tune_gc"]

log = logging.getLogger(__name__)

#: Bound of uvicorn's graceful shutdown (requests in flight); streams are drained before it.
GRACEFUL_SHUTDOWN_S = 10


class ServerExited(RuntimeError):
    """The server ended before it served (see its log: the app's startup failed)."""

    def __init__(self) -> None:
        super().__init__("the HTTP server stopped before it started serving")


class AppServer:
    """An ASGI app under uvicorn, stopped the same way whoever asks.

    ``sock``: serve on this bound socket instead of ``host``/``port``. ``on_stop``: called once,
    when the stop begins, before uvicorn stops accepting connections. ``handle_signals``: let
    uvicorn turn SIGINT/SIGTERM into a stop (False when the caller handles them itself and
    calls :meth:`stop`). ``loop`` and ``http``: uvicorn's event loop and HTTP parser
    (``auto`` takes uvloop and httptools when installed); the loop applies to :meth:`run` only,
    :meth:`start` serves in the running loop. ``read_timeout_s``, ``max_head_bytes`` and
    ``keep_alive_s``: what a slow or idle client may hold (bridge/server/protocols.py).
    ``tls``: uvicorn's ``ssl_*`` options. ``proxy_headers``: uvicorn's (believe
    ``X-Forwarded-For``/``-Proto`` from ``FORWARDED_ALLOW_IPS``, loopback by default).
    ``configure_logging``: let uvicorn install its
    logging configuration (False keeps the process's own, for a server inside a test process).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        sock: socket.socket | None = None,
        log_level: str = "info",
        access_log: bool = True,
        timeout_graceful_shutdown: int = GRACEFUL_SHUTDOWN_S,
        on_stop: Callable[[], None] | None = None,
        handle_signals: bool = True,
        loop: Literal["auto", "asyncio", "uvloop"] = "auto",
        http: Literal["auto", "h11", "httptools"] = "auto",
        gc_young_threshold: int = 0,
        read_timeout_s: float = 30.0,
        max_head_bytes: int = 64 * 1024,
        keep_alive_s: int = 5,
        tls: Mapping[str, Any] | None = None,
        configure_logging: bool = True,
        hand_over: Callable[[], Awaitable[object]] | None = None,
        proxy_headers: bool = True,
    ) -> None:
        #: The app served.
        self.app = app
        logging_options: dict[str, Any] = {} if configure_logging else {"log_config": None}
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            loop=loop,
            # uvicorn's parser, with a deadline on reading each request and a bound on its head
            http=protocol_class(http, read_timeout_s=read_timeout_s, max_head_bytes=max_head_bytes),
            h11_max_incomplete_event_size=max_head_bytes,
            timeout_keep_alive=keep_alive_s,
            log_level=log_level,
            access_log=access_log,
            timeout_graceful_shutdown=timeout_graceful_shutdown,
            lifespan="on",
            # The bridge serves no WebSocket: an upgrade is never accepted, even with a
            # WebSocket library installed beside it (uvicorn's "auto" would take it).
            ws="none",
            proxy_headers=proxy_headers,
            **logging_options,
            **(tls or {}),
        )
        self._server = _Uvicorn(config, self, handle_signals)
        self._gc_young_threshold = gc_young_threshold
        self._tune_gc = False  # set by run(): only a process that is the server tunes its GC
        self._sockets = [sock] if sock is not None else None
        self._on_stop = on_stop
        self._hand_over = hand_over
        self._handing_over: asyncio.Task[None] | None = None  # held: a task needs a reference
        self._hand_over_begun = False
        self._stopping = False
        self._started = asyncio.Event()
        #: The serving task once :meth:`start` ran (done when the server has stopped).
        self.task: asyncio.Task[None] | None = None

    def run(self) -> None:
        """Serve as the process's main until SIGINT/SIGTERM (blocks, in uvicorn's own loop)."""
        self._tune_gc = True  # the process is the server's: its collector is ours to tune
        self._server.run(sockets=self._sockets)

    async def start(self) -> None:
        """Serve in the background of the running loop; returns once the app's lifespan startup
        is complete and the socket accepts connections (the caller bounds the wait).

        Raises :class:`ServerExited` when the server ended first.
        """
        self.task = asyncio.create_task(self._server.serve(sockets=self._sockets), name="http")
        started = asyncio.create_task(self._started.wait())
        try:
            await asyncio.wait({self.task, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(started)
        if not self._started.is_set():
            raise ServerExited()

    def stop(self) -> None:
        """Begin the graceful stop: ``on_stop``, then uvicorn's shutdown. Safe to call again."""
        self._before_stop()
        self._server.should_exit = True

    async def close(self, bound_s: float = 3.0 * GRACEFUL_SHUTDOWN_S) -> None:
        """:meth:`stop`, then wait for the server to end; past ``bound_s`` it is cancelled.

        The serving task's own failure, if it had one, is raised.
        """
        self.stop()
        if self.task is None:
            return
        done, _ = await asyncio.wait({self.task}, timeout=bound_s)
        if done:
            await self.task
        else:
            log.warning("the HTTP server did not stop within %.0f s: cancelled", bound_s)
            await cancel_and_wait(self.task)

    def _before_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            if self._on_stop is not None:
                self._on_stop()

    def _begin_hand_over(self, then: Callable[[], None]) -> bool:
        """SIGTERM's first step: run ``hand_over`` in the server's loop, then ``then`` (the
        stop). False when there is none, or it already began (a second signal stops now)."""
        if self._hand_over is None or self._hand_over_begun or self._stopping:
            return False
        hand_over = self._hand_over
        loop = asyncio.get_running_loop()  # a signal handler runs in the loop's (main) thread

        async def handing_over() -> None:
            try:
                await hand_over()
            except Exception:
                log.exception("the hand-over failed; stopping")
            finally:
                then()

        def begin() -> None:
            self._handing_over = loop.create_task(handing_over(), name="hand-over")

        loop.call_soon_threadsafe(begin)
        self._hand_over_begun = True  # a second signal is not a hand-over: it stops now
        return True

    def _mark_started(self) -> None:
        self._started.set()
        if self._tune_gc and self._gc_young_threshold > 0:
            tune_gc(self._gc_young_threshold)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, reporting its start and the stop signals to its :class:`AppServer`."""

    def __init__(self, config: uvicorn.Config, owner: AppServer, handle_signals: bool) -> None:
        super().__init__(config)
        self._owner = owner
        self._handle_signals = handle_signals

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self._handle_signals:
            _dump_on_signals()
        self._owner._mark_started()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if not self._handle_signals:
            yield  # the owner's caller handles SIGINT/SIGTERM and calls stop()
            return
        with super().capture_signals():
            yield

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._owner._begin_hand_over(lambda: self._exit(sig, frame)):
            return
        self._exit(sig, frame)

    def _exit(self, sig: int, frame: FrameType | None) -> None:
        self._owner._before_stop()
        super().handle_exit(sig, frame)


def bridge_server(
    settings: Settings,
    *,
    companions: Sequence[Companion] = (),
    sock: socket.socket | None = None,
    quiet: bool = False,
    handle_signals: bool = True,
    log: Log | None = None,
    configure_logging: bool = True,
) -> AppServer:
    """The bridge's app (:func:`~bridge.server.app.create_app`, with ``companions``) under
    uvicorn at the settings' host and port (or on ``sock``); its open streams are drained when
    it stops.

    ``quiet``: only uvicorn's warnings, no access log (the demo's narration is its output).
    ``log``: the log the components run on (else the settings' Kafka cluster), e.g. the
    in-memory log of a test. ``configure_logging``: as for :class:`AppServer`.
    """
    app = create_app(
        settings,
        companions=companions,
        peer_listener=peer_listener(settings, quiet=quiet, configure_logging=configure_logging),
        log=log,
    )

    def drain_streams() -> None:
        components = app.state.components
        if components is not None:  # None until the lifespan has started them
            components.hub.drain()  # open streams end now; clients resume elsewhere or later

    async def hand_over() -> None:
        components = app.state.components
        if components is not None:
            await components.indexer.hand_over()  # bounded by handover.timeout_s

    return AppServer(
        app,
        host=settings.server.host,
        port=settings.server.port,
        sock=sock,
        log_level="warning" if quiet else settings.log_level.lower(),
        access_log=not quiet,
        on_stop=drain_streams,
        handle_signals=handle_signals,
        loop=settings.server.loop,
        http=settings.server.http,
        gc_young_threshold=settings.server.gc_young_threshold,
        read_timeout_s=settings.server.read_timeout_s,
        max_head_bytes=settings.server.max_head_bytes,
        keep_alive_s=settings.server.keep_alive_s,
        configure_logging=configure_logging,
        hand_over=hand_over if settings.replicas.ownership == "group" else None,
    )


def peer_listener(
    settings: Settings, *, quiet: bool = False, configure_logging: bool = True
) -> PeerListener:
    """Serves the peer listener's app at ``peers.host`` (else ``server.host``) and
    ``peers.port``, with TLS when configured, in the running loop; closed with the stack.

    Its open hop streams were drained with the others by then (the same stream hub)."""

    async def serve(app: ASGIApp, stack: contextlib.AsyncExitStack) -> None:
        server = AppServer(
            app,
            host=settings.peers.host or settings.server.host,
            port=settings.peers.port,
            log_level="warning" if quiet else settings.log_level.lower(),
            # No access log line per hop: the public listener's names the request already,
            # and a refused hop is logged as a warning (bridge.server.http).
            access_log=False,
            handle_signals=False,  # the public server's: one stop for both
            http=settings.server.http,
            read_timeout_s=settings.server.read_timeout_s,
            max_head_bytes=settings.server.max_head_bytes,
            keep_alive_s=settings.server.keep_alive_s,
            tls=server_tls(settings.peers),
            configure_logging=configure_logging,
            # A hop's caller is what its signature vouches for: no X-Forwarded-* header is
            # believed there (nor parsed: uvicorn's middleware would, on every hop).
            proxy_headers=False,
        )
        await server.start()
        stack.push_async_callback(server.close)

    return serve


def tune_gc(young_threshold: int) -> None:
    """Fewer collections for a long-running server (``bridge serve``, once it has started).

    What exists now (modules, the loaded index, the Kafka clients) is frozen: moved to the
    permanent generation, which collections never scan again. A young collection runs every
    ``young_threshold`` allocations instead of Python's 700, so the full collections that
    follow (each scans every live stream's objects: 140-180 ms with a few thousand streams,
    measured with gc.callbacks) come far less often while thousands of streams open at once.
    bench_streams' storm stage, A/B on one machine: 1,000 resumes served in 1.8-2.0 s instead
    of 2.4-2.8 s, 10,000 in 15-18 s instead of not all within 25 s (docs/benchmarks-streams.md).
    Reference counting still frees everything that is not in a cycle at once.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


def _dump_on_signals() -> None:
    """Operations aids: SIGUSR1 writes every thread's stack to stderr (works even when the
    event loop is stuck), SIGUSR2 every asyncio task's (what each coroutine awaits)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def dump_tasks() -> None:
        for task in asyncio.all_tasks():
            buffer = io.StringIO()
            task.print_stack(limit=12, file=buffer)
            log.warning("task %s:\n%s", task.get_name(), buffer.getvalue())

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump_tasks)

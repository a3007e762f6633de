"""The ASGI application: routes, and the lifespan that owns the Kafka-side components.

Start order (:func:`start_components`): indexer (takes its partitions, every one or the group's
share, restores their index slices, then tails and persists them) → reader → the fan-out of live events → task service → stream hub → the
MCP endpoint → companions (in-process workers, when asked) → catch-up → the end-to-end canary,
when on (:mod:`bridge.canary`). ``/healthz`` answers while
the process serves HTTP (liveness); ``/readyz`` answers 200 once the indexer has caught up with
the log as it was at start (readiness), so a replica never serves a stale view.

With ``replicas.ownership = "group"`` a second app, the peer listener's (:func:`peer_app`), serves the
hops other replicas forward (``/mcp`` and the view's GETs, nothing else) from the same
components, on its own port: it is started once they are and stopped before them. Only there
is a signed hop believed; the public app authenticates every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bridge import tracing
from bridge.canary import Canary
from bridge.component import cancel_and_wait
from bridge.config import Settings, ToolSpec
from bridge.kafka.acls import Access, AccessDenied, refusals_explained
from bridge.kafka.port import Log
from bridge.log.fanout import Fanout
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.metrics import Metrics
from bridge.server.auth import Authenticator, check_exposure
from bridge.server.browser import BrowserView
from bridge.server.events import EventsMethods, events_extension
from bridge.server.failover import Removals
from bridge.server.handlers import MethodHandlers
from bridge.server.hops import PeerAuth, mark_peer_listener
from bridge.server.http import McpHttp, RawEndpoint
from bridge.server.listen import Listen, PeerTasks
from bridge.server.peers import PEER_HEALTH_PATH, Peers, client_tls
from bridge.server.profile import check_profile
from bridge.server.routing import Routing
from bridge.server.streams import StreamHub
from bridge.tasks.service import TaskService
from bridge.tasks.tools import job_topics, tool_catalog

__all__ = [
    "Companion",
    "Components",
    "PeerListener",
    "create_app",
    "peer_app",
    "start_components",
    "tool_catalog",
]

logger = logging.getLogger(__name__)

#: Something that runs beside the server in its process (the in-process workers), started
#: after the server's components and stopped before them through the exit stack.
Companion = Callable[[Settings, contextlib.AsyncExitStack], Awaitable[None]]
#: Serves the peer listener's app (bridge.server.runner: a second uvicorn server in this
#: process) until the exit stack closes; called once the components have started.
PeerListener = Callable[[ASGIApp, contextlib.AsyncExitStack], Awaitable[None]]


@dataclass(frozen=True)
class Components:
    """What a running bridge is made of (one per process)."""

    settings: Settings
    metrics: Metrics
    indexer: Indexer
    reader: Reader
    service: TaskService
    hub: StreamHub
    endpoint: McpHttp
    canary: Canary | None = None


async def start_components(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    *,
    metrics: Metrics,
    companions: Sequence[Companion] = (),
    log: Log | None = None,
) -> Components:
    """Start everything the server needs, registering each stop on ``stack``; returns once
    the indexer has caught up with the log (bounded), so the replica is ready.

    ``log``: the log the indexer, the reader and the task service use (None: the Kafka
    cluster of ``settings``; tests give the in-memory log), and so do the Events extension's
    topic sources (None: a log of their own, see :func:`~bridge.server.events.offset_sources`)
    and its webhook registry.

    Kafka refusing an ACL on the way is raised as :class:`~bridge.kafka.acls.AccessDenied`,
    whose one line (logged here) names the ACL; the replica then never turns ready.
    """
    tools = tool_catalog(settings)
    _warn_ttl_beyond_retention(settings, tools)
    auth = Authenticator(settings.auth)
    access = Access.serving(settings, job_topics(settings), workers=bool(companions))
    try:
        with refusals_explained(access, settings):
            indexer = Indexer(
                settings, persist=True, on_misrouted=metrics.events_misrouted.inc, log=log
            )
            await indexer.start()
            stack.push_async_callback(indexer.stop)
            # Metrics are wired here, once: no component rewires a shared one's reports.
            reader = Reader(
                settings,
                indexer,
                on_scan=metrics.catchup_scans.observe,
                on_detach=metrics.catchup_detached.inc,
                on_lookup=metrics.log_start_lookups.inc,
                log=log,
            )
            stack.push_async_callback(reader.close)
            fanout = Fanout(indexer, on_overflow=metrics.slow_fallbacks.inc)
            service = TaskService(
                settings, indexer, reader, {t.name: t for t in tools}, fanout, log=log
            )
            await service.start()
            stack.push_async_callback(service.stop)
            metrics.attach(indexer)
            indexer.report_hand_overs(metrics.handed_over, metrics.gain_seconds.observe)
            metrics.partitions_held.set_function(lambda: len(indexer.handovers.held))
            metrics.standby_partitions.set_function(lambda: len(indexer.standbys.copies))
            metrics.standby_lag_records.set_function(indexer.standbys.lag)
            hub = StreamHub(
                settings,
                indexer,
                reader,
                fanout,
                metrics.streams(),
                on_paced=metrics.replay_paced.inc,
            )
            routing = Routing(settings, indexer, on_refused=metrics.hop_refused)
            peers = _peers(settings, routing, stack, metrics)
            events = events_extension(
                settings,
                service,
                reader,
                fanout,
                hub.draining,
                streams=hub,
                routing=routing,
                peers=peers,
                on_throttled=metrics.webhook_verifications_throttled.inc,
                on_too_large=metrics.webhook_bodies_too_large.inc,
                catch_up=indexer.catch_up,
                port=log,
            )
            await events.start()  # webhook delivery, when offered
            stack.push_async_callback(events.stop)
            listen = Listen(
                settings, service, hub, replicas=_replicas(settings, routing, peers, events)
            )
            handlers = MethodHandlers(settings, service, tools, hub, [events, listen])
            endpoint = McpHttp(
                settings,
                auth,
                handlers,
                metrics,
                on_cancelled=hub.cancel,
                routing=routing,
                peers=peers,
            )
            for companion in companions:
                await companion(settings, stack)
            async with asyncio.timeout(300):
                await indexer.catch_up()
    except AccessDenied as denied:
        logger.error("%s", denied)
        raise

    def positions() -> list[tuple[str, int]]:  # what open streams and webhooks still need
        return [*hub.positions(), *events.subscription_positions()]

    refresher = asyncio.create_task(_refresh_gauges(metrics, indexer, reader, positions, settings))
    stack.push_async_callback(cancel_and_wait, refresher)
    watcher = asyncio.create_task(
        _watch_availability(metrics, indexer, settings, _reachable(routing, peers))
    )
    stack.push_async_callback(cancel_and_wait, watcher)
    canary = None
    if settings.canary.interval_s > 0:  # probes the stream path; stops first, ending its tasks
        probes = StreamHub(settings, indexer, reader, fanout, metrics.canary_streams())
        canary = Canary(settings, indexer, probes, service.publisher, metrics)
        await canary.start()
        stack.push_async_callback(canary.stop)
    logger.info("bridge ready: %d tools, Kafka at %s", len(tools), settings.kafka.bootstrap_servers)
    return Components(settings, metrics, indexer, reader, service, hub, endpoint, canary)


def create_app(
    settings: Settings,
    *,
    companions: Sequence[Companion] = (),
    peer_listener: PeerListener | None = None,
    log: Log | None = None,
) -> Starlette:
    """The bridge's ASGI app; ``app.state.components`` is set while it runs (None before).
    ``log``: as for :func:`start_components`.

    ``peer_listener``: how the peer listener's app is served beside it when replicas divide
    the partitions (without one, this replica forwards hops but receives none).
    """
    metrics = Metrics()
    Authenticator(settings.auth)  # refuse bad auth settings now, not at the first request
    check_exposure(settings)  # no unauthenticated listener beyond loopback unless opted in
    check_profile(settings)  # the Events client profile has what it needs

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(tracing.installed(settings))  # off unless enabled
            app.state.components = await start_components(
                settings, stack, metrics=metrics, companions=companions, log=log
            )
            if peer_listener is not None and settings.replicas.ownership == "group":
                await peer_listener(peer_app(settings, lambda: app.state.components), stack)
            try:
                yield
            finally:
                app.state.components = None

    def running(request: Request) -> Components:
        components: Components | None = request.app.state.components
        if components is None:
            raise RuntimeError("the bridge's components are not started")
        return components

    async def mcp_post(request: Request) -> Response:
        return await running(request).endpoint.post(request)

    async def mcp_get(request: Request) -> Response:
        return await running(request).endpoint.get(request)

    async def mcp_delete(request: Request) -> Response:
        return await running(request).endpoint.not_allowed(request)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def indexer_admin(request: Request) -> Response:
        # Operations drills (pausing the indexer to watch the lag alerts fire); off by default.
        if not settings.server.admin_endpoints:
            return JSONResponse({"error": "admin endpoints are disabled"}, 404)
        served = running(request)
        caller = served.endpoint.admin_gate(request)  # /mcp's authentication, same-origin only
        if isinstance(caller, Response):
            return caller
        indexer = served.indexer
        action = request.path_params["action"]
        if action == "pause":
            indexer.pause()
        elif action == "resume":
            indexer.resume()
        else:
            return JSONResponse({"error": "unknown action"}, 404)
        return JSONResponse({"indexer": action})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        components: Components | None = request.app.state.components
        if components is None:
            return JSONResponse({"status": "starting"}, 503)
        if components.indexer.failed is not None:
            # Partitions the group gave this replica are not served (their gain is retried):
            # no new traffic until they are. Never the error's text: it names topics.
            return JSONResponse({"status": "partitions unavailable"}, 503)
        return JSONResponse({"status": "ready"}, 200)

    direct = {"POST": RawEndpoint(mcp_post), "GET": RawEndpoint(mcp_get)}
    app = _BridgeApp(
        direct,
        routes=[
            # The stream-opening methods as plain ASGI apps: an open stream holds less.
            Route("/mcp", direct["POST"], methods=["POST"]),
            Route("/mcp", direct["GET"], methods=["GET"]),
            Route("/mcp", mcp_delete, methods=["DELETE"]),
            Route("/metrics", metrics_endpoint),
            Route("/admin/indexer/{action}", indexer_admin, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            *BrowserView(settings, running).routes(),  # the browser view (docs/browser.md)
        ],
        lifespan=lifespan,
    )
    app.state.components = None
    return app


def peer_app(settings: Settings, components: Callable[[], Components | None]) -> ASGIApp:
    """The peer listener's app: the hop endpoints of the same ``components`` (``/mcp``, and
    the browser view's GETs when the view is on), every request marked as arrived there, so
    that only its signed hop says who the caller is. Nothing else is served but an empty
    ``GET /healthz`` (a probe, and how a forwarding replica opens a spare connection)."""

    def running(request: Request) -> Components:
        served = components()
        if served is None:
            raise RuntimeError("the bridge's components are not started")
        return served

    async def post(request: Request) -> Response:
        return await running(request).endpoint.post(request)

    async def get(request: Request) -> Response:
        return await running(request).endpoint.get(request)

    async def healthz(request: Request) -> Response:
        # No state, no credential: a probe, and how a forwarding replica keeps a spare
        # connection to this listener (bridge.server.peers).
        return Response(status_code=204)

    routes = [
        Route("/mcp", RawEndpoint(post), methods=["POST"]),
        Route("/mcp", RawEndpoint(get), methods=["GET"]),
        Route(PEER_HEALTH_PATH, healthz, methods=["GET"]),
    ]
    if settings.view.enabled:
        view = BrowserView(settings, running)
        routes += [
            Route("/view/tasks/{task_id}", view.state, methods=["GET"]),
            Route("/view/tasks/{task_id}/events", view.events, methods=["GET"]),
        ]
    inner = Starlette(routes=routes)
    # Every hop is a /mcp request: straight to its endpoint behind the server-error middleware,
    # not through the router and exception middleware (as the public app does, _BridgeApp).
    direct = {
        "POST": ServerErrorMiddleware(RawEndpoint(post)),
        "GET": ServerErrorMiddleware(RawEndpoint(get)),
    }

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        mark_peer_listener(scope)
        if scope["type"] == "http" and scope["path"] == "/mcp":
            endpoint = direct.get(scope["method"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await inner(scope, receive, send)

    return app


class _BridgeApp(Starlette):
    """The app, with ``POST``/``GET /mcp`` (every stream) taken before the router.

    A response runs inside every layer that routed it, so an open stream holds each layer's
    suspended frame for its life: starlette's exception middleware with its wrapper closures,
    the router and the route, ~2.5 KiB of an idle stream (tracemalloc). These two requests
    skip them: they go to their endpoint behind starlette's own server-error middleware (a
    500 for an unexpected exception, as before). Their endpoints raise no ``HTTPException``
    (the exception middleware's business). The routes stay in the router too, for the rest.
    """

    def __init__(self, direct: Mapping[str, ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._direct = {m: ServerErrorMiddleware(a, debug=self.debug) for m, a in direct.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path as the router matches it: without the root path uvicorn prefixed to it.
        path = (
            scope["path"].removeprefix(scope.get("root_path", ""))
            if scope["type"] == "http"
            else ""
        )
        if path == "/mcp":
            endpoint = self._direct.get(scope["method"])
            if endpoint is not None:
                scope["app"] = self  # what Request.app reads, as the router would set it
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _peers(
    settings: Settings, routing: Routing, stack: contextlib.AsyncExitStack, metrics: Metrics
) -> Peers | None:
    """The client of the hops to other replicas, and the check of the hops they send here,
    when replicas divide the partitions; an owner whose peer port keeps refusing is dropped
    from the group (:class:`~bridge.server.failover.Removals`)."""
    secret = settings.peers.secret_value
    if settings.replicas.ownership != "group" or secret is None:
        return None
    p, r = settings.peers, settings.recovery
    auth = PeerAuth(secret, routing.own_url, max_age_s=p.max_age_s, max_nonces=p.max_nonces)
    indexer = routing.indexer
    removals = Removals(
        lambda: indexer.assignor.map if indexer.assignor is not None else None,
        indexer.remove_from_group,
        own_url=routing.own_url,
        interval_s=r.remove_interval_s,
        clock=time.monotonic,
        enabled=r.remove_dead_owners,
        on_outcome=metrics.peer_removal,
        on_removed=lambda url: peers.suspects.removed(url),
        origin=routing.origin,
    )
    peers = Peers(
        auth,
        tls=client_tls(p),
        max_streams=settings.streams.max_total,
        keep_alive_s=settings.server.keep_alive_s,
        connect_s=p.connect_timeout_s,
        suspect_s=p.suspect_s,
        session_s=settings.replicas.session_timeout_ms / 1000,
        refusals=r.refusals,
        refusal_window_s=r.refusal_window_s,
        generation=lambda: routing.generation,
        on_suspected=metrics.peer_suspicions.inc,
        on_refusing=removals.refusing,
        on_answered=removals.answered,
        # A refusing owner is dropped within the refusal window: what its clients are told.
        refusal_wait_s=r.refusal_window_s if r.remove_dead_owners else None,
        # An owner's stream writes at least a keep-alive each interval: four in a row missing
        # is an owner whose host vanished without a FIN (the stream ends, the client resumes).
        stream_idle_s=STREAM_IDLE_KEEPALIVES * settings.streams.keepalive_s,
        # A forwarded tools/call is answered once its tool's result is in.
        tool_answer_s=settings.tasks.direct_result_timeout_s,
    )
    stack.push_async_callback(peers.close)
    stack.push_async_callback(removals.close)
    return peers


def _replicas(
    settings: Settings, routing: Routing, peers: Peers | None, events: EventsMethods
) -> PeerTasks | None:
    """What a listen reads of tasks other replicas own (None: this process owns every one)."""
    updates = events.sources.get(f"{settings.own_types.prefix}.task.updated")
    if peers is None or updates is None:
        return None
    return PeerTasks(routing, peers, updates)


def _warn_ttl_beyond_retention(settings: Settings, tools: list[ToolSpec]) -> None:
    retention = settings.topics.retention_ms
    for tool in tools:
        if retention > 0 and (tool.ttl_ms is None or tool.ttl_ms >= retention):
            logger.warning(
                "tool %s: ttl_ms %s is not below the events topic's retention.ms %d; a task could "
                "outlive its task.created event, after which replicas may disagree on it",
                tool.name,
                tool.ttl_ms,
                retention,
            )


async def _refresh_gauges(
    metrics: Metrics,
    indexer: Indexer,
    reader: Reader,
    positions: Callable[[], list[tuple[str, int]]],
    settings: Settings,
) -> None:
    while True:
        try:
            await metrics.refresh_log_gauges(indexer, reader)
            await metrics.refresh_data_loss(indexer, reader, positions())
        except Exception:
            logger.exception("could not refresh the Kafka gauges")
        await asyncio.sleep(
            settings.server.metrics_refresh_s
        )  # the refresh cadence, not synchronisation


#: How often each events partition's owner is looked at (the unavailability's resolution).
AVAILABILITY_SAMPLE_S = 0.25
#: Keep-alive intervals a forwarded stream may go without a byte from its owner.
STREAM_IDLE_KEEPALIVES = 4


def _reachable(routing: Routing, peers: Peers | None) -> Callable[[str], bool]:
    """Whether an owner URL the group names is one this replica forwards to now (not while
    it suspects it: requests for it are answered at once as unavailable)."""
    if peers is None:
        return lambda url: True
    suspects = peers.suspects
    return lambda url: not suspects.is_suspected(routing.origin(url) or url)


async def _watch_availability(
    metrics: Metrics, indexer: Indexer, settings: Settings, reachable: Callable[[str], bool]
) -> None:
    """Sample who serves each events partition (no Kafka call: the last assignment, and the
    owners this replica suspects)."""
    before = time.monotonic()
    while True:
        await asyncio.sleep(AVAILABILITY_SAMPLE_S)  # the sampling cadence
        now = time.monotonic()
        metrics.sample_availability(indexer, settings.peers.advertised_url, now - before, reachable)
        before = now

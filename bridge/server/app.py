"""The ASGI application: routes, and the lifespan that owns the Kafka-side components.

Start order: indexer (restores the seq index, then tails; the index writer if configured) →
reader → task service → (optionally) in-process workers → HTTP. ``/healthz`` answers while the
process serves HTTP (liveness); ``/readyz`` answers 200 once the indexer has caught up with
the log as it was at start (readiness), so a replica never serves a stale view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bridge.config import Settings, ToolSpec
from bridge.log.indexer import Indexer
from bridge.log.reader import Reader
from bridge.metrics import Metrics
from bridge.server.auth import Authenticator
from bridge.server.mcp import McpEndpoint
from bridge.server.streams import StreamHub
from bridge.tasks.service import TaskService

__all__ = ["create_app", "tool_catalog"]

log = logging.getLogger(__name__)


def tool_catalog(settings: Settings) -> list[ToolSpec]:
    """The tools of the configured packs, then those declared in the settings."""
    from bridge.workers.packs import pack_tools

    tools: dict[str, ToolSpec] = {}
    for tool in [*pack_tools(settings.tool_packs), *settings.tools]:
        tools[tool.name] = tool
    return list(tools.values())


def create_app(settings: Settings, *, with_workers: bool = False) -> Starlette:
    """Build the bridge's ASGI app; ``with_workers`` also runs the packs' workers in-process."""
    auth = Authenticator(settings.auth)
    tools = tool_catalog(settings)
    retention = settings.topics.retention_ms
    for tool in tools:
        if retention > 0 and (tool.ttl_ms is None or tool.ttl_ms >= retention):
            log.warning(
                "tool %s: ttl_ms %s is not below the events topic's retention.ms %d; a task could "
                "outlive its task.created event, after which replicas may disagree on it",
                tool.name,
                tool.ttl_ms,
                retention,
            )
    state: dict[str, object] = {"ready": False}
    holder: dict[str, Any] = {}
    metrics = Metrics()
    holder["metrics"] = metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            indexer = Indexer(settings, persist=settings.index_writer)
            await indexer.start()
            stack.push_async_callback(indexer.stop)
            holder["indexer"] = indexer
            reader = Reader(settings, indexer)
            stack.push_async_callback(reader.close)
            service = TaskService(settings, indexer, reader, {t.name: t for t in tools})
            await service.start()
            stack.push_async_callback(service.stop)
            metrics.attach(indexer)
            hub = StreamHub(settings, indexer, reader, metrics)
            holder["hub"] = hub
            holder["mcp"] = McpEndpoint(settings, service, tools, auth, hub)
            if with_workers:
                await _start_workers(settings, stack)
            async with asyncio.timeout(300):
                await indexer.catch_up()
            refresher = asyncio.create_task(_refresh_gauges(metrics, indexer, reader, settings))
            stack.push_async_callback(_cancel, refresher)
            state["ready"] = True
            log.info(
                "bridge ready: %d tools, Kafka at %s", len(tools), settings.kafka_bootstrap_servers
            )
            try:
                yield
            finally:
                state["ready"] = False

    async def mcp_post(request: Request) -> Response:
        return await holder["mcp"].post(request)  # type: ignore[no-any-return]

    async def mcp_get(request: Request) -> Response:
        return await holder["mcp"].get(request)  # type: ignore[no-any-return]

    async def mcp_delete(request: Request) -> Response:
        return await holder["mcp"].not_allowed(request)  # type: ignore[no-any-return]

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def indexer_admin(request: Request) -> JSONResponse:
        # Operations drills (pausing the indexer to watch the lag alerts fire); off by default.
        if not settings.admin_endpoints:
            return JSONResponse({"error": "admin endpoints are disabled"}, 404)
        indexer = holder["indexer"]
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
        ready = bool(state["ready"])
        return JSONResponse({"status": "ready" if ready else "starting"}, 200 if ready else 503)

    app = Starlette(
        routes=[
            Route("/mcp", mcp_post, methods=["POST"]),
            Route("/mcp", mcp_get, methods=["GET"]),
            Route("/mcp", mcp_delete, methods=["DELETE"]),
            Route("/metrics", metrics_endpoint),
            Route("/admin/indexer/{action}", indexer_admin, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
        ],
        lifespan=lifespan,
    )
    app.state.components = holder
    return app


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _refresh_gauges(
    metrics: Metrics, indexer: Indexer, reader: Reader, settings: Settings
) -> None:
    while True:
        try:
            await metrics.refresh_log_gauges(indexer, reader)
        except Exception:
            log.exception("could not refresh the Kafka gauges")
        await asyncio.sleep(settings.metrics_refresh_s)  # the refresh cadence, not synchronisation


async def _start_workers(settings: Settings, stack: contextlib.AsyncExitStack) -> None:
    from bridge.workers.packs import pack_handlers
    from bridge.workers.sdk import Worker

    worker = Worker(settings, pack_handlers(settings.tool_packs))
    await worker.start()
    stack.push_async_callback(worker.stop)
    runner = asyncio.create_task(worker.run(), name="in-process-workers")

    async def stop_runner() -> None:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    stack.push_async_callback(stop_runner)

"""The ASGI application: routes and the lifespan that owns Kafka clients.

Health endpoints: ``/healthz`` answers while the process can serve HTTP (liveness);
``/readyz`` answers 200 only once Kafka answers (readiness). The MCP endpoint is added by
later modules; this one only wires them together.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bridge.config import Settings
from bridge.kafka.clients import admin_client

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> Starlette:
    """Build the bridge's ASGI app for ``settings``."""
    state: dict[str, bool] = {"kafka": False}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        admin = admin_client(settings)
        try:
            await admin.start()
            state["kafka"] = True
            log.info("connected to Kafka at %s", settings.kafka_bootstrap_servers)
            yield
        finally:
            state["kafka"] = False
            await admin.close()

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        ready = state["kafka"]
        return JSONResponse({"status": "ready" if ready else "starting"}, 200 if ready else 503)

    return Starlette(
        routes=[Route("/healthz", healthz), Route("/readyz", readyz)],
        lifespan=lifespan,
    )

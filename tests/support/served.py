"""A bridge served as production serves it: :func:`~bridge.server.app.create_app` under uvicorn on
a real socket, in the test's event loop, yielded once its lifespan has started every component;
on the broker, or on a log given (the in-memory one of :func:`support.inmemory.memory_log`)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette

from bridge.config import Settings
from bridge.kafka.port import Log
from bridge.server.app import Components, create_app
from support.layout import create_served_topics
from support.waits import BOUND, wait_until

__all__ = ["Served", "serving"]


@dataclass
class Served:
    settings: Settings
    base: str
    components: Components
    app: Starlette
    #: The log it runs on, when one was given (else the broker of its settings).
    log: Log | None = None


@asynccontextmanager
async def serving(
    settings: Settings, sock: socket.socket | None = None, *, log: Log | None = None
) -> AsyncIterator[Served]:
    """The bridge's app under uvicorn in this event loop, once it is ready (lifespan run);
    on ``log`` when given (its topics made already), else on the broker of ``settings``."""
    if log is None:
        create_served_topics(settings)
    app = create_app(settings, log=log)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    sock = sock or socket.create_server(("127.0.0.1", 0))
    running = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(
            lambda: server.started or running.done(), what="the bridge serves", poll_s=0.05
        )
        assert not running.done(), "the bridge did not start"
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield Served(settings, base, app.state.components, app, log)
    finally:
        server.should_exit = True
        async with asyncio.timeout(BOUND):
            await running
        sock.close()

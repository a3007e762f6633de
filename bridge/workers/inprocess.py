"""Workers in the server's own process (``bridge serve --with-workers``, the demo).

A :data:`bridge.server.app.Companion`: started after the server's components, stopped before
them. Production runs workers as their own processes (``bridge workers``).
"""

from __future__ import annotations

import asyncio
import contextlib

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.workers.packs import pack_handlers
from bridge.workers.sdk import Worker

__all__ = ["run_workers_in_process"]


async def run_workers_in_process(settings: Settings, stack: contextlib.AsyncExitStack) -> None:
    """Start the configured packs' workers; ``stack`` stops them."""
    worker = Worker(settings, pack_handlers(settings.tool_packs))
    await worker.start()
    stack.push_async_callback(worker.stop)
    runner = asyncio.create_task(worker.run(), name="in-process-workers")
    stack.push_async_callback(cancel_and_wait, runner)

"""A process that only indexes and persists (every partition, ``replicas.ownership = "all"``), for tests
that SIGKILL a writer mid-transaction: ``python -m support.index_writer`` with settings in the
environment (tests/support/procs.bridge_env)."""

from __future__ import annotations

import asyncio
import sys

from bridge.component import stop_signal
from bridge.config import load_settings
from bridge.log.indexer import Indexer


async def run(flush_interval_s: float) -> None:
    stop = stop_signal()
    async with Indexer(load_settings(), persist=True, flush_interval_s=flush_interval_s):
        print("indexer running", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(run(float(sys.argv[1]) if len(sys.argv) > 1 else 0.5))

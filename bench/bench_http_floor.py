"""The HTTP layer's floor: what opening one SSE stream costs in uvicorn itself, no bridge.

    .venv/bin/python bench/bench_http_floor.py             # 1,000 and 10,000 at once, 4 variants
    .venv/bin/python bench/bench_http_floor.py --small     # smoke run: 300 at once
    .venv/bin/python bench/bench_http_floor.py --json out.json

``bench_streams.py``'s ``storm`` and ``opens`` targets ask one bridge process to open 1,000
streams within a second. This bench measures the part of every open that is not the bridge's
code: a ``uvicorn`` subprocess serving a **bare ASGI app** that reads the request body,
answers ``200 text/event-stream`` with one SSE event shaped like a ``notifications/tasks/event``
and then holds the stream open until the client leaves (an open stream, exactly as the bridge
holds one). The clients are ``bench_streams``' own: the same ``tasks/stream`` request bytes, the
same raw-asyncio ``SseStream`` and the same storm (all at once, 1,000 TCP connects in flight).
The app's process tunes its garbage collector as ``bridge serve`` does
(:func:`bridge.server.runner.tune_gc`).

Each variant (event loop x HTTP parser, uvicorn's ``loop`` and ``http``) gets a fresh server; the
rows give the time until every stream has its first event, and the server's and this process's
CPU per connection (``utime + stime``). The last rows put the floor against the budget the
storm target leaves: 1,000 opens in 1 s on the one core a Python process uses is 1 ms of CPU per
open, for everything: HTTP, the bridge's checks, the Kafka read, the first event.

Kafka is not involved; nothing here has a target of its own (the verdicts are the bridge's, in
bench_streams.py). A wait that is not reached fails with what it waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import time
from typing import Any

from bench_streams import (
    STORM_CONNECTS,
    TARGET_STORM,
    SseStream,
    cpu_seconds,
    free_port,
    hot_path,
    raise_nofile,
    socket_fds,
    stream_request,
    wait_until,
)
from common import NotReached, Results, machine, report, say, within

from bridge.config import ServerSettings
from bridge.server.runner import tune_gc

VARIANTS = tuple((loop, http) for loop in ("asyncio", "uvloop") for http in ("h11", "httptools"))
#: The one SSE event every stream gets: a notification of the bridge's shape and size.
_EVENT = (
    b'id: floor:1\nevent: message\ndata: {"jsonrpc":"2.0","method":"notifications/tasks/event",'
    b'"params":{"taskId":"floor","seq":2,"type":"com.example.bench.tick","payload":{"n":2}}}\n\n'
)
_HEADERS = [
    (b"cache-control", b"no-cache"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
]


# --- the server: a bare ASGI app under uvicorn ----------------------------------------------------


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer every request with one SSE event, then hold the stream until the client leaves."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                tune_gc(ServerSettings.model_fields["gc_young_threshold"].default)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body", False):
        pass  # the request body, read as the bridge reads it
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _EVENT, "more_body": True})
    while (await receive())["type"] != "http.disconnect":
        pass


def serve(port: int, loop: str, http: str) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop=loop,  # type: ignore[arg-type]
        http=http,  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,
        backlog=2048,  # uvicorn's default, as the bridge runs it
    )


class FloorServer:
    """The bare app under uvicorn in a subprocess, on a free port."""

    def __init__(self, loop: str, http: str) -> None:
        self.port = free_port()
        self.popen = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--loop", loop, "--http", http],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.pid = self.popen.pid

    async def ready(self, bound_s: float = 30.0) -> None:
        async with within(bound_s, f"uvicorn listening on port {self.port}"):
            while True:
                if self.popen.poll() is not None:
                    err = self.popen.stderr.read().decode() if self.popen.stderr else ""
                    raise RuntimeError(f"the floor server exited:\n{err[-2000:]}")
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    await asyncio.sleep(0.05)  # poll interval of a bounded wait to listen
                    continue
                writer.close()
                return

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


# --- the clients: a storm, as bench_streams runs it -------------------------------------------------


async def storm(server: FloorServer, n: int, bound_s: float) -> tuple[float, float, float]:
    """``n`` streams at once; returns (seconds until every first event, server CPU ms and
    this process's CPU ms per connection), once the server let go of every stream again."""
    loop = asyncio.get_running_loop()
    requests = [stream_request(server.port, secrets.token_hex(16), i, 1) for i in range(1, n + 1)]
    gate = asyncio.Semaphore(STORM_CONNECTS)
    streams: list[SseStream] = []
    base = socket_fds(server.pid)

    async def one(request: bytes) -> None:
        async with gate:
            _, stream = await loop.create_connection(
                lambda: SseStream(request), "127.0.0.1", server.port
            )
        streams.append(stream)
        await stream.first_event

    server_cpu, own_cpu = cpu_seconds(server.pid), cpu_seconds(os.getpid())
    started = time.perf_counter()
    try:
        async with within(bound_s, f"{n:,} streams of the bare app have their first event"):
            await asyncio.gather(*(one(r) for r in requests))
        took = time.perf_counter() - started
        server_cpu, own_cpu = (
            cpu_seconds(server.pid) - server_cpu,
            cpu_seconds(os.getpid()) - own_cpu,
        )
    finally:
        for stream in streams:
            stream.close()
        await wait_until(
            lambda: socket_fds(server.pid) <= base, 60, f"the floor server closed {n:,} streams"
        )
    return took, server_cpu / n * 1e3, own_cpu / n * 1e3


async def run(sizes: tuple[int, ...], res: Results) -> None:
    floors: dict[str, float] = {}
    for loop, http in VARIANTS:
        server = FloorServer(loop, http)
        try:
            await server.ready()
            label = f"{loop}+{http}"
            runs = hot_path(server.pid)
            if runs != label:
                label = f"{label} (runs {runs})"
            say(f"floor: {label}")
            for n in sizes:
                took, per_conn, own = await storm(server, n, bound_s=60 + n / 100)
                res.add("floor", f"{label}: {n:,} streams at once, every first event in", took, "s")
                res.add(
                    "floor",
                    f"  {label}: {n:,} at once: CPU per connection server / this process",
                    f"{per_conn:.2f} / {own:.2f}",
                    "ms",
                )
                floors[f"{label} {n}"] = per_conn
        finally:
            server.stop()
    budget_n = min(TARGET_STORM)
    budget_ms = TARGET_STORM[budget_n] / budget_n * 1e3
    res.add(
        "budget",
        f"bridge CPU per open that the storm target leaves ({budget_n:,} in "
        f"{TARGET_STORM[budget_n]:g} s, one core)",
        f"{budget_ms:.2f}",
        "ms",
    )
    for key, per_conn in floors.items():
        res.add("budget", f"  {key}: the bare app's share of it", f"{per_conn / budget_ms:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="smoke run: 300 streams at once")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    parser.add_argument("--http", default="h11", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.loop, args.http)
        return
    raise_nofile()
    res = Results(order={"floor": 0, "budget": 1})
    res.environment = {**machine(), "kafka": "not used", "kafka_provider": "none"}
    sizes = (300,) if args.small else tuple(sorted(TARGET_STORM))
    started = time.perf_counter()
    try:
        asyncio.run(run(sizes, res))
    except NotReached as exc:
        say(f"FAILED: {exc}")
        sys.exit(1)
    report(
        res,
        "bench_http_floor.py" + ("  size=small" if args.small else ""),
        f"run:     {time.perf_counter() - started:.1f} s",
        json_path=args.json,
    )


if __name__ == "__main__":
    main()

"""bridge.server.runner: the server_loop / server_http settings reach uvicorn.

``run`` (``bridge serve``) runs in the chosen loop with the chosen parser; ``start`` (``bridge
demo``) serves in the running loop, with the chosen parser, whatever loop was named. Real
uvicorn on real sockets; the app reports which loop and protocol served it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import subprocess
import sys
import textwrap

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.procs import free_port

from bridge.config import load_settings
from bridge.server.runner import AppServer, peer_listener

BOUND = 30.0


async def whoami(request: Request) -> JSONResponse:
    """Which event loop and which uvicorn protocol serve this request, and the process's
    young-generation GC threshold and count of frozen objects."""
    loop = asyncio.get_running_loop()
    server: AppServer = request.app.state.server
    # uvicorn's protocol class under the bridge's read deadline (bridge/server/protocols.py)
    mro = server._server.config.http_protocol_class.__mro__
    protocol = next(c.__name__ for c in mro if c.__module__.startswith("uvicorn."))
    gc_state = {"young": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
    return JSONResponse({"loop": type(loop).__module__, "protocol": protocol, **gc_state})


def app() -> Starlette:
    return Starlette(routes=[Route("/whoami", whoami)])


@pytest.mark.parametrize(
    ("http", "protocol"), [("h11", "H11Protocol"), ("httptools", "HttpToolsProtocol")]
)
async def test_start_serves_in_the_running_loop_with_the_chosen_parser(http, protocol):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/whoami"
    # uvloop named, but start() serves in this (asyncio) loop: the demo's case.
    served = app()
    server = AppServer(
        served, sock=sock, log_level="warning", access_log=False, loop="uvloop", http=http,
        handle_signals=False, gc_young_threshold=12345,
    )  # fmt: skip
    served.state.server = server
    async with asyncio.timeout(BOUND):
        await server.start()
        try:
            async with httpx.AsyncClient() as client:
                answer = (await client.get(url)).json()
        finally:
            await server.close()
    assert answer["loop"] == type(asyncio.get_running_loop()).__module__
    assert answer["protocol"] == protocol
    assert answer["young"] != 12345  # serving inside someone's loop leaves their GC alone


_SERVE = textwrap.dedent(
    """
    import socket, sys
    sys.path[:0] = [sys.argv[3]]
    from test_runner import app
    from bridge.server.runner import AppServer
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until the server accepts them
    print(sock.getsockname()[1], flush=True)
    served = app()
    served.state.server = AppServer(
        served, sock=sock, log_level="warning", loop=sys.argv[1], http=sys.argv[2],
        gc_young_threshold=12345,
    )
    served.state.server.run()
    """
)


@pytest.mark.parametrize(("loop", "module"), [("asyncio", "asyncio"), ("uvloop", "uvloop")])
def test_run_serves_in_the_chosen_loop(loop, module, request):
    tests_dir = str(request.path.parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, loop, "h11", tests_dir],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with httpx.Client() as client:
            answer = client.get(f"http://127.0.0.1:{port}/whoami", timeout=BOUND).json()
    finally:
        proc.terminate()
        proc.wait(timeout=BOUND)
    assert answer["loop"].split(".")[0] == module
    assert answer["protocol"] == "H11Protocol"
    # The server's own process: once started, its start-up objects are frozen out of the
    # collector's scans and young collections are rarer (runner.tune_gc).
    assert answer["young"] == 12345 and answer["frozen"] > 1000


async def test_sigterm_hands_over_while_serving_then_stops_and_a_second_signal_stops_at_once():
    import signal

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/whoami"
    steps: list[str] = []
    handing_over, release = asyncio.Event(), asyncio.Event()

    async def hand_over() -> None:
        steps.append("hand-over")
        handing_over.set()
        await release.wait()

    served = app()
    server = AppServer(
        served, sock=sock, log_level="warning", access_log=False, handle_signals=False,
        on_stop=lambda: steps.append("drain"), hand_over=hand_over,
    )  # fmt: skip
    served.state.server = server
    async with asyncio.timeout(BOUND):
        await server.start()
        server._server.handle_exit(signal.SIGTERM, None)
        await handing_over.wait()
        async with httpx.AsyncClient() as client:  # still serving during the hand-over
            assert (await client.get(url)).status_code == 200
        assert steps == ["hand-over"] and not server._server.should_exit
        release.set()
        assert server.task is not None
        await server.task  # the stop follows the hand-over
    assert steps == ["hand-over", "drain"]

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    steps.clear()
    release.clear()
    handing_over.clear()
    served = app()
    server = AppServer(
        served, sock=sock, log_level="warning", access_log=False, handle_signals=False,
        on_stop=lambda: steps.append("drain"), hand_over=hand_over,
    )  # fmt: skip
    served.state.server = server
    async with asyncio.timeout(BOUND):
        await server.start()
        server._server.handle_exit(signal.SIGTERM, None)
        await handing_over.wait()
        server._server.handle_exit(signal.SIGTERM, None)  # impatient: stop now
        assert server.task is not None
        await server.task
        release.set()
        assert server._handing_over is not None
        await server._handing_over
    assert steps[:2] == ["hand-over", "drain"]


async def client_address(request: Request) -> JSONResponse:
    return JSONResponse({"client": request.client.host if request.client else None})


async def test_the_peer_listener_believes_no_forwarded_header_and_the_public_one_keeps_uvicorns():
    """A hop's caller is what its signature vouches for: an ``X-Forwarded-For`` from loopback
    (which uvicorn believes by default) changes nothing on the peer listener."""
    port = free_port()
    settings = load_settings(peers={"port": port})
    served = Starlette(routes=[Route("/who", client_address)])
    spoofed = {"x-forwarded-for": "203.0.113.9"}
    async with asyncio.timeout(BOUND), contextlib.AsyncExitStack() as stack:
        await peer_listener(settings, quiet=True, configure_logging=False)(served, stack)
        async with httpx.AsyncClient() as client:
            peer = (await client.get(f"http://127.0.0.1:{port}/who", headers=spoofed)).json()
    assert peer == {"client": "127.0.0.1"}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    public = AppServer(
        served, sock=sock, log_level="warning", access_log=False, handle_signals=False,
        configure_logging=False,
    )  # fmt: skip
    async with asyncio.timeout(BOUND):
        await public.start()
        try:
            async with httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/who"
                answer = (await client.get(url, headers=spoofed)).json()
        finally:
            await public.close()
    assert answer == {"client": "203.0.113.9"}  # uvicorn's default for a loopback proxy


async def test_a_websocket_upgrade_is_never_accepted():
    """uvicorn's ``ws="auto"`` accepts upgrades whenever a WebSocket library is installed; the
    bridge serves none, so its servers take none, whatever is installed beside them. (No
    WebSocket library is installed in the test environment, so the refused upgrade holds
    either way here: the setting is what the first assertion pins.)"""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    served = app()
    server = AppServer(
        served, sock=sock, log_level="warning", access_log=False, handle_signals=False,
        configure_logging=False,
    )  # fmt: skip
    assert server._server.config.ws == "none"
    served.state.server = server
    async with asyncio.timeout(BOUND):
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            writer.write(
                b"GET /whoami HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: upgrade\r\n"
                b"upgrade: websocket\r\nsec-websocket-version: 13\r\n"
                b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            )
            status = await reader.readline()
            writer.close()
        finally:
            await server.close()
    assert not status.startswith(b"HTTP/1.1 101"), status

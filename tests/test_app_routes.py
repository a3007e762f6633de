"""bridge.server.app: ``POST``/``GET /mcp`` are taken before starlette's router.

An open stream holds every layer that routed it for its whole life, so the stream requests go
straight to their endpoint behind starlette's server-error middleware. In-process (the app's
lifespan is not run, so the endpoints find no components: an unexpected exception, which is
what the server-error middleware answers).
"""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import httpx
import pytest

from bridge.config import load_settings
from bridge.server.app import create_app

SKIPPED = ("starlette/routing.py", "starlette/middleware/exceptions.py")


def client(*, raise_app_exceptions: bool) -> httpx.AsyncClient:
    app = create_app(load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_a_stream_request_reaches_its_endpoint_without_the_router(method):
    async with client(raise_app_exceptions=True) as http:
        with pytest.raises(RuntimeError, match="not started") as raised:
            await http.request(method, "/mcp", headers={"last-event-id": "x"}, content=b"{}")
    files = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(raised.value.__traceback__)]
    assert any(f.endswith("starlette/middleware/errors.py") for f in files)
    assert not [f for f in files if f.endswith(SKIPPED)]


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_an_unexpected_error_in_a_stream_request_is_still_a_500(method):
    async with client(raise_app_exceptions=False) as http:
        reply = await http.request(method, "/mcp", headers={"last-event-id": "x"}, content=b"{}")
    assert reply.status_code == 500


async def test_other_requests_and_methods_still_go_through_the_router():
    async with client(raise_app_exceptions=True) as http:
        assert (await http.put("/mcp")).status_code == 405
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/readyz")).status_code == 503  # no components: not ready


async def test_a_replica_whose_indexer_failed_is_not_ready_and_says_nothing_more() -> None:
    app = create_app(load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}))
    indexer = SimpleNamespace(failed=None)
    app.state.components = SimpleNamespace(indexer=indexer)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        assert (await http.get("/readyz")).status_code == 200
        indexer.failed = RuntimeError("the index topic 'secret-prefix.task-index' has no leader")
        answer = await http.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "partitions unavailable"}  # no topic names

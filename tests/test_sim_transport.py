"""simulation/transport.py: httpx to an ASGI app in process, with the body streamed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # simulation/ (dev tooling)
from simulation.transport import StreamingASGITransport


class Ticker:
    """An SSE app that sends one event per ``step.set()``, until ``stop``, and notes whether
    it saw the client go."""

    def __init__(self) -> None:
        self.step = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.request: dict[str, Any] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        self.request = {"path": scope["path"], "query": scope["query_string"], **message}
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        watcher = asyncio.create_task(self._watch(receive))
        try:
            for n in range(1000):
                if not await self._next_step():
                    return  # the client went (an SSE response races its sends against this)
                self.step.clear()
                body = f"data: {n}\n\n".encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except OSError:
            return  # the client went
        finally:
            watcher.cancel()

    async def _next_step(self) -> bool:
        stepped = asyncio.ensure_future(self.step.wait())
        gone = asyncio.ensure_future(self.disconnected.wait())
        await asyncio.wait({stepped, gone}, return_when=asyncio.FIRST_COMPLETED)
        stepped.cancel()
        gone.cancel()
        return not self.disconnected.is_set()

    async def _watch(self, receive: Any) -> None:
        if (await receive())["type"] == "http.disconnect":
            self.disconnected.set()


async def test_each_chunk_reaches_the_reader_before_the_response_ends() -> None:
    app = Ticker()
    async with httpx.AsyncClient(transport=StreamingASGITransport(app)) as http:
        async with asyncio.timeout(5):
            async with http.stream("POST", "http://r0.sim/mcp?x=1", content=b"{}") as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "text/event-stream"
                chunks = response.aiter_bytes()
                for n in range(3):
                    app.step.set()
                    assert await anext(chunks) == f"data: {n}\n\n".encode()
    assert app.request["path"] == "/mcp" and app.request["query"] == b"x=1"
    assert app.request["body"] == b"{}"


async def test_a_reader_that_leaves_early_is_seen_as_a_disconnect() -> None:
    app = Ticker()
    async with httpx.AsyncClient(transport=StreamingASGITransport(app)) as http:
        async with asyncio.timeout(5):
            async with http.stream("GET", "http://r0.sim/events") as response:
                app.step.set()
                assert await anext(response.aiter_bytes()) == b"data: 0\n\n"
            await app.disconnected.wait()


async def test_an_app_that_fails_before_answering_fails_the_request() -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async with httpx.AsyncClient(transport=StreamingASGITransport(broken)) as http:
        with pytest.raises(RuntimeError, match="boom"):
            await http.get("http://r0.sim/")


async def test_a_whole_body_is_read_as_usual() -> None:
    async def hello(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"hel", "more_body": True})
        await send({"type": "http.response.body", "body": b"lo"})

    async with httpx.AsyncClient(transport=StreamingASGITransport(hello)) as http:
        response = await http.get("http://r0.sim/")
    assert (response.status_code, response.content) == (201, b"hello")


async def test_an_app_that_fails_with_the_buffer_full_ends_the_reader_with_its_error() -> None:
    """The review's hang: with every slot of the buffer taken, the end had no room, and the
    reader waited for ever after the chunks it had."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(2):  # fills the buffer of 2
            await send({"type": "http.response.body", "body": b"x%d" % i, "more_body": True})
        raise RuntimeError("the app fails mid-response")

    got: list[bytes] = []
    async with httpx.AsyncClient(transport=StreamingASGITransport(app, buffer=2)) as http:
        async with asyncio.timeout(5):
            async with http.stream("GET", "http://r0.sim/events") as response:
                with pytest.raises(httpx.ReadError) as failed:
                    async for chunk in response.aiter_raw():
                        got.append(chunk)
    assert got == [b"x0", b"x1"]
    assert isinstance(failed.value.__cause__, RuntimeError)

"""An in-process HTTP transport that streams: httpx requests answered by an ASGI app.

``httpx.ASGITransport`` collects the whole response body before it returns, so a server-sent
event stream (which ends only when the task does) never returns at all, and a slow reader
never slows the server. This transport returns as soon as the app has sent its response
head, hands each body chunk to the reader as the app sends it, through a small bounded queue
(so a reader that stops reading stops the app's ``send``, as a full TCP window does), and
tells the app ``http.disconnect`` when the reader closes the response early.

It is how the simulation's replicas would reach each other's peer listeners and webhook
receivers with no socket: :class:`bridge.server.peers.Peers` and
:class:`bridge.events_extension.webhooks.WebhookSender` take a ``transport``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx

__all__ = ["StreamingASGITransport"]

Message = MutableMapping[str, Any]
App = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]

_END = b""  # queued after the last chunk (empty chunks are never queued)


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Answer each request by calling ``app``; ``buffer`` chunks may wait for the reader."""

    def __init__(
        self, app: App, *, client: tuple[str, int] = ("127.0.0.1", 50000), buffer: int = 16
    ) -> None:
        self.app = app
        self.client = client
        self.buffer = buffer

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange(self.app, self._scope(request), await request.aread(), self.buffer)
        status, headers = await exchange.start()
        return httpx.Response(status, headers=headers, stream=exchange, request=request)

    def _scope(self, request: httpx.Request) -> dict[str, Any]:
        url = request.url
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "server": (url.host, url.port or (443 if url.scheme == "https" else 80)),
            "client": self.client,
        }


class _Exchange(httpx.AsyncByteStream):
    """One request's run of the app, and its response body as a stream."""

    def __init__(self, app: App, scope: dict[str, Any], body: bytes, buffer: int) -> None:
        self._body = body
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue(buffer)
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._sent_request = False
        self._gone = asyncio.Event()
        self._task = asyncio.create_task(self._run(app, scope))

    async def start(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        return await self._head

    async def _run(self, app: App, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self._receive, self._send)
        except BaseException as exc:
            if not self._head.done():
                self._head.set_exception(exc)
            raise
        finally:
            if not self._head.done():
                self._head.set_exception(RuntimeError("the app sent no response"))

    async def _receive(self) -> Message:
        if not self._sent_request:
            self._sent_request = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            self._head.set_result((message["status"], headers))
        elif message["type"] == "http.response.body":
            if self._gone.is_set():
                raise OSError("the client disconnected")
            chunk = bytes(message.get("body", b""))
            if chunk:
                await self._chunks.put(chunk)  # waits while the reader is behind
            if not message.get("more_body", False):
                await self._chunks.put(_END)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next()) != _END:
            yield chunk
        if self._task.done() and not self._task.cancelled() and self._task.exception():
            raise httpx.ReadError("the app failed mid-response") from self._task.exception()

    async def _next(self) -> bytes:
        """The next chunk, or the end: the app's last message, or the app's run ending
        (failed, say) with nothing left queued. The end is never queued by the run itself: a
        full queue would have no room for it, and the reader would wait for ever."""
        while True:
            if not self._chunks.empty():
                return self._chunks.get_nowait()
            if self._task.done():
                return _END
            getter = asyncio.ensure_future(self._chunks.get())
            try:
                await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                getter.cancel()  # an item it had not yet taken stays queued
            if getter.done() and not getter.cancelled():
                return getter.result()

    async def aclose(self) -> None:
        """The reader is done: the app sees ``http.disconnect``, then has a moment to end."""
        self._gone.set()
        while not self._chunks.empty():  # unblock a send waiting for room
            self._chunks.get_nowait()
        if not self._task.done():
            await asyncio.wait({self._task}, timeout=1.0)
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

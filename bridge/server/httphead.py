"""A bound on the head of a request (request line and headers) under uvicorn's httptools parser.

uvicorn's h11 parser refuses a head over 16 KiB. Its httptools parser, the bridge's default
(``server_http``), has no bound at all, and gathers a URL or a header value that arrives in
pieces by concatenating bytes: time quadratic in its size, on the event loop (4 MiB sent in
16-byte pieces cost 19 s of CPU). :class:`BoundedHttpTools` is that parser with a bound: a
head still open past :data:`MAX_HEAD_BYTES` is answered 431 and the connection closed, so what
one head costs is bounded too. Only how a connection is read changes; the ASGI app sees the
same requests. ``bridge/server/runner.py`` hands it to uvicorn in place of ``httptools``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_HEAD_BYTES", "BoundedHttpTools", "http_protocol"]

log = logging.getLogger(__name__)

#: The largest head read: four times h11's bound, far above any real request's (a JWT of a few
#: KiB, the routing headers), far below where the concatenation costs (64 KiB in 16-byte
#: pieces: milliseconds).
MAX_HEAD_BYTES = 64 * 1024

_TOO_LARGE = b"request head too large"
_REFUSAL = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_TOO_LARGE)).encode() + b"\r\n"
    b"connection: close\r\n\r\n" + _TOO_LARGE
)


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a head over :data:`MAX_HEAD_BYTES` with 431.

    The head is counted from the chunk in which its request begins (a pipelined chunk may add
    the end of the request before: at most one read's worth, counted against the bound too).
    """

    _head_bytes: int | None = None  # bytes read of the open head; None when no head is open

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_bytes is None or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._head_bytes = None
        log.warning("refused a request whose head is over %d bytes", MAX_HEAD_BYTES)
        if self.cycle is None or self.cycle.response_complete:  # no response being written
            self.transport.write(_REFUSAL)
        self.transport.close()


def http_protocol(
    http: Literal["auto", "h11", "httptools"],
) -> Literal["h11"] | type[asyncio.Protocol]:
    """uvicorn's ``http`` argument for the setting: :class:`BoundedHttpTools` wherever uvicorn
    would take httptools (``auto`` does: it is a dependency), h11 (bounded itself) otherwise."""
    return "h11" if http == "h11" else BoundedHttpTools

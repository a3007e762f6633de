"""uvicorn's HTTP/1.1 protocols with a deadline on reading each request, and a bound on its head.

uvicorn (0.55) times out only an idle keep-alive connection, after a response. A connection
that sends nothing, or a request head or body a byte at a time (slowloris), is kept open for
ever, and httptools buffers a request head of any size. These subclasses of uvicorn's two
protocols add, per connection:

* a read deadline: a request must arrive whole (head and body) within ``read_timeout_s`` of the
  connection opening or of the request's first byte; past it the connection is closed, with a
  ``408`` when no response has begun. A request that has arrived whole (an open stream, a
  long-running call) is never timed out by this;
* a head bound: a request head past ``max_head_bytes`` is refused with ``431`` and the
  connection closed, however the head arrives: in pieces (the bytes are counted as they come,
  before the parser has a whole header to report) or in one read (the request line and headers
  are counted as the parser reports them, before the app sees them);
* one write per response: what the app sends in one turn of the event loop (uvicorn writes a
  response's head and its body separately) goes to the socket in one write
  (:class:`_BatchedWrites`), so a small answer costs one send (one TLS record) instead of two,
  and its reader one wake-up.

:func:`protocol_class` picks the parser like uvicorn's ``http`` setting and returns the class
to pass to ``uvicorn.Config(http=...)``; bridge/server/runner.py does. What this module does
not do: limit connections or requests per client (bridge/server/admission.py limits streams).
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, ClassVar, Literal

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["protocol_class"]

_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 22\r\nconnection: close\r\n\r\nrequest head too large"
)


class _ReadDeadline:
    """The timer shared by both protocols: armed while a request is arriving."""

    read_timeout_s: ClassVar[float]
    max_head_bytes: ClassVar[int]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any

    _deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # An app already running for this request owns the response: only the connection ends.
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_TIMEOUT)
        self.transport.close()


#: Held bytes past this are written at once: the transport's own buffer and its flow control
#: (uvicorn waits while the transport is paused) bound what a response holds, not this batch.
_BATCH_BYTES = 65536


class _BatchedWrites:
    """A transport whose writes within one turn of the event loop leave in one write.

    uvicorn writes a response's head when the app starts it and each body part as it comes:
    a JSON answer is two sends, two TLS records, and its reader wakes twice. Here the first
    write of a turn is held and a flush scheduled (``call_soon``: after the callback that
    wrote, before any I/O is polled); later writes of the same turn join it. A batch reaching
    :data:`_BATCH_BYTES` is written at once. ``close`` and ``write_eof`` write what is held
    first; ``abort`` drops it, as the transport drops its own buffer. Everything else is the
    transport's.
    """

    __slots__ = ("_held", "_held_bytes", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:
            self._held = [bytes(data)]
            self._held_bytes = len(data)
            self._loop.call_soon(self._flush)
        else:
            self._held.append(bytes(data))
            self._held_bytes += len(data)
        if self._held_bytes >= _BATCH_BYTES:
            self._flush()

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def _flush(self) -> None:
        held, self._held, self._held_bytes = self._held, None, 0
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._held_bytes = None, 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head past the bound."""


class _BoundedConnection(h11.Connection):
    """h11's connection refusing a request whose head is past ``max_head_bytes``.

    h11's ``max_incomplete_event_size`` bounds only a head still incomplete in its buffer: a
    whole head that came in one read is parsed at any size. Both cases end here as a
    ``RemoteProtocolError`` with h11's hint 431, which :class:`_H11` answers."""

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.head_too_large = False

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.head_too_large = exc.error_status_hint == 431
            raise
        if isinstance(event, h11.Request) and _h11_head_size(event) > self.max_head_bytes:
            self.head_too_large = True
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        return event


def _h11_head_size(request: h11.Request) -> int:
    """The bytes of a parsed head: what h11 kept of its request line and headers."""
    size = len(request.method) + len(request.target)
    return size + sum(len(name) + len(value) for name, value in request.headers)


def _batched(transport: asyncio.Transport) -> asyncio.Transport:
    """``transport`` behind :class:`_BatchedWrites` (typed as the transport it stands for)."""
    return _BatchedWrites(transport, asyncio.get_running_loop())  # type: ignore[return-value]


def _refuse_head(transport: asyncio.Transport) -> None:
    if not transport.is_closing():
        transport.write(_TOO_LARGE)
        transport.close()


class _H11(_ReadDeadline, H11Protocol):
    """h11: the head is bounded by :class:`_BoundedConnection`; the deadline follows h11's
    state of the peer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = self._bounded = _BoundedConnection(self.max_head_bytes)

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error with 400: a head past the bound gets its 431.
        if self._bounded.head_too_large:
            self._disarm()
            _refuse_head(self.transport)
        else:
            super().send_400_response(msg)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_batched(transport))
        self._arm()  # a connection must bring a request, not only hold a socket

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        arriving = state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0])
        if arriving:
            self._arm()
        else:
            self._disarm()


def _httptools_class() -> type[asyncio.Protocol]:
    # Imported only when chosen: httptools is optional for uvicorn.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _HttpTools(_ReadDeadline, HttpToolsProtocol):
        """httptools: the deadline spans message begin to message complete. The head is
        counted twice, each count a lower bound of its size: the bytes fed while it is still
        incomplete (httptools buffers a header of any length before reporting it), and the URL
        and headers as httptools reports them (a whole head in one read is reported at once)."""

        _head_bytes: int | None = None  # None: not inside a request head
        _head_parsed = 0
        _head_too_large = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_batched(transport))
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_bytes is None or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._head_bytes = None
                self._disarm()
                _refuse_head(self.transport)

        def send_400_response(self, msg: str) -> None:
            # A callback stopped the parser (uvicorn answers that with 400): the head is too large.
            if self._head_too_large:
                self._disarm()
                _refuse_head(self.transport)
            else:
                super().send_400_response(msg)

        def _count_parsed(self, size: int) -> None:
            self._head_parsed += size
            if self._head_parsed > self.max_head_bytes:
                self._head_too_large = True
                self._head_bytes = None
                raise _HeadTooLarge  # stops httptools before the app sees the head

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._head_parsed = 0
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._count_parsed(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._head_bytes is not None:  # not a trailer of a chunked body
                self._count_parsed(len(name) + len(value))
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_bytes = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

    return _HttpTools


def protocol_class(
    http: Literal["auto", "h11", "httptools"], *, read_timeout_s: float, max_head_bytes: int
) -> type[asyncio.Protocol]:
    """The protocol for ``uvicorn.Config(http=...)``: uvicorn's ``http`` choice (``auto`` is
    httptools when installed) with the read deadline and the head bound."""
    use_httptools = http == "httptools" or (
        http == "auto" and importlib.util.find_spec("httptools") is not None
    )
    base = _httptools_class() if use_httptools else _H11
    limits = {"read_timeout_s": read_timeout_s, "max_head_bytes": max_head_bytes}
    return type(base.__name__, (base,), limits)

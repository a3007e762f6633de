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
* a refusal (``408``, ``431``, or uvicorn's ``400`` for a malformed request) is written only
  while no answer is owed on the connection. An app still answering an earlier request (or
  this one) owns what is written next: a refusal then would be read as that answer, or land
  inside its body, so the connection just closes;
* one write per small answer: a response's head leaves with the first part of its body
  (uvicorn writes them apart) in one send (:class:`_BatchedWrites`): one TLS record instead
  of two, and one wake-up of its reader.

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
        self._refuse(_TIMEOUT)

    def _refuse(self, answer: bytes | None) -> None:
        """End the connection, with ``answer`` unless an answer is owed on it: an app still
        running for a request (this one, or one before it in a pipeline) owns what is written
        next, and ``answer`` would be read as that answer or be spliced into its body."""
        self._disarm()
        if self.transport.is_closing():
            return
        if answer is not None and not self._answer_owed():
            self.transport.write(answer)
        self.transport.close()

    def _answer_owed(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _refused_malformed(self, head_too_large: bool) -> bool:
        """Refuse a request its parser failed on (uvicorn answers every failure with 400): a
        head past the bound with 431, and with nothing while an answer is owed. False: no
        answer is owed, uvicorn's own 400 is the answer."""
        if head_too_large:
            self._refuse(_TOO_LARGE)
        elif self._answer_owed():
            self._refuse(None)
        else:
            return False
        return True


#: A body this large is written apart from the head it follows, not copied to join it.
_JOIN_BYTES = 65536


class _BatchedWrites:
    """A transport that sends a response's head with the first part of its body.

    uvicorn writes a response's head when the app starts it and each body part as it comes:
    a JSON answer was two sends, two TLS records, and its reader woke twice. The protocol
    calls :meth:`hold_next` when a request has arrived; the next write (the answer's head) is
    then held, and the write after it (the body) leaves with it in one send (an interim
    ``100 Continue`` before it leaves at once and is not that head). A head whose body does
    not follow in the same turn of the event loop (a stream that waits for its first event)
    leaves by itself at the end of that turn (``call_soon``). Every other write
    goes straight through: a stream's events are never delayed nor cost a callback. ``close``
    and ``write_eof`` send a held head first; ``abort`` and :meth:`lost` drop it, as the
    transport drops its own buffer. Everything else is the transport's.
    """

    __slots__ = ("_flush_handle", "_held", "_hold", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._hold = False
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def hold_next(self) -> None:
        """The next write is a response's head: hold it for its body."""
        self._hold = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        held = self._held
        if held is not None:  # the body after a held head: both in one send
            self._unhold()
            if len(data) < _JOIN_BYTES:
                self._transport.write(held + bytes(data))
                return
            self._transport.write(held)
        elif self._hold:
            if data[:10] == b"HTTP/1.1 1":  # 100 Continue (uvicorn's): the answer's head is next
                self._transport.write(data)
                return
            self._hold = False
            self._held = bytes(data)
            self._flush_handle = self._loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def _unhold(self) -> None:
        self._held = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def _flush(self) -> None:
        held = self._held
        self._unhold()
        if held is not None:
            # Even to a closing transport: one closed on its peer's EOF still sends what it
            # buffers and what it is given until the connection is lost, and this head's body
            # goes straight to it.
            self._transport.write(held)

    def lost(self) -> None:
        """The connection is lost: a held head goes with it (its transport takes no more
        writes; uvloop's raises)."""
        self._hold = False
        self._unhold()

    def get_write_buffer_size(self) -> int:
        held = len(self._held) if self._held is not None else 0
        return self._transport.get_write_buffer_size() + held

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._hold = False
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self.lost()
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


def _batched(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> asyncio.Transport:
    """``transport`` behind :class:`_BatchedWrites` (typed as the transport it stands for)."""
    return _BatchedWrites(transport, loop)  # type: ignore[return-value]


def _hold_next(transport: object) -> None:
    """Tell the connection's transport (:func:`_batched`) that an answer's head comes next."""
    if isinstance(transport, _BatchedWrites):
        transport.hold_next()


def _lost(transport: object) -> None:
    """Tell the connection's transport (:func:`_batched`) that the connection is lost."""
    if isinstance(transport, _BatchedWrites):
        transport.lost()


class _H11(_ReadDeadline, H11Protocol):
    """h11: the head is bounded by :class:`_BoundedConnection`; the deadline follows h11's
    state of the peer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = self._bounded = _BoundedConnection(self.max_head_bytes)

    def send_400_response(self, msg: str) -> None:
        if not self._refused_malformed(self._bounded.head_too_large):
            super().send_400_response(msg)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_batched(transport, self.loop))
        self._arm()  # a connection must bring a request, not only hold a socket

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        _lost(self.transport)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        _hold_next(self.transport)  # bytes came: what is written next may be an answer's head
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
            super().connection_made(_batched(transport, self.loop))
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            _lost(self.transport)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_bytes is None or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._head_bytes = None
                self._refuse(_TOO_LARGE)

        def send_400_response(self, msg: str) -> None:
            # _HeadTooLarge from a callback stopped the parser: uvicorn answers that with 400.
            if not self._refused_malformed(self._head_too_large):
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
            _hold_next(self.transport)  # the answer's head waits for its body
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

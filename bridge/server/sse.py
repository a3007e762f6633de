"""Server-Sent Events: the one module that writes ``text/event-stream`` text.

Where it sits: last on the stream path, between the stream hub (:mod:`bridge.server.streams`,
which hands each stream's events over in :class:`~bridge.log.records.Batch` es, after the
delivery rule) and the socket. It owns

- rendering a task event as its ``notifications/tasks/event`` text (:class:`Renderer`, the
  same JSON value as :func:`bridge.server.wire.notification`; a record's checked wire members
  spliced in as they are), and the texts rendered lately, shared by every stream
  (:class:`RecentTexts`);
- all SSE framing: ``id:``/``event:``/``data:`` lines (:func:`sse_event`, :func:`sse_events`),
  comments and keep-alives, the EventSource ``retry`` preamble, the last chunk of an expired
  stream;
- the response that writes them (:class:`SseResponse`: the MCP endpoint's streams, the
  Events push stream and ``subscriptions/listen``, the browser view's EventSource stream,
  and forwarded streams), and a tasks/stream's body (:func:`task_stream`).

No other module under ``bridge/`` frames SSE (``tests/test_layering.py`` checks it). It knows
no method's meaning: the handlers (:mod:`bridge.server.handlers`) open streams, the transport
(:mod:`bridge.server.http`) decides when a response is one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from starlette.responses import Response

from bridge import tracing
from bridge.envelope import Item, TaskEvent
from bridge.log.records import Batch
from bridge.server.admission import Ticket
from bridge.server.cursor import cursor_prefix
from bridge.server.errors import retry_after, wire_error
from bridge.server.wire import (
    RELATED_TASK_META,
    RpcError,
    dumps,
    error_response,
    result_response,
)
from bridge.vocabulary import TaskEventTypes

__all__ = [
    "CREDENTIAL_EXPIRED",
    "KEEP_ALIVE",
    "EventBatch",
    "Frame",
    "RecentTexts",
    "Renderer",
    "SseResponse",
    "Streamed",
    "chunk",
    "preamble",
    "renderer",
    "sse_event",
    "sse_events",
    "task_stream",
    "utf8",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Frame:
    """One SSE event: a JSON-RPC message with an optional ``id``; no message = keep-alive.

    ``data`` is the message already rendered as one line of JSON (the hot path), if given.
    A replay makes one per event: slots keep it small and quick to build.
    """

    message: dict[str, Any] | None
    event_id: str | None = None
    data: str | None = None


@dataclass(slots=True)
class EventBatch:
    """Notifications of one stream for one write, already rendered and framed as SSE events
    (:meth:`RecentTexts.frames`).

    What a stream yields per batch instead of a :class:`Frame` per event: a replay writes
    thousands of events a second, and an object per event (tracked by the garbage collector)
    cost more than rendering it.
    """

    text: str


@dataclass(slots=True)
class Streamed:
    """A response sent as ``text/event-stream``: each yielded item is one SSE event, or a
    batch of them, or bytes already framed here (slotted: an open stream holds one for its
    whole life)."""

    messages: AsyncIterator[dict[str, Any] | Frame | EventBatch | bytes]
    request_id: str | int | None = None
    #: Called once the response has ended, however it ended (even if it never started).
    on_close: Callable[[], None] | None = None


async def task_stream(
    batches: AsyncIterator[Batch[Item] | None],
    ticket: Ticket,
    request_id: str | int,
    texts: RecentTexts,
    prefix: str,
    draining: asyncio.Event,
) -> AsyncIterator[Frame | EventBatch]:
    """A tasks/stream's messages: each batch the hub delivers (:meth:`StreamHub.events
    <bridge.server.streams.StreamHub.events>`, ``wire=True``) rendered and framed for one
    write, a keep-alive for each idle tick, then the result, unless the stream was cancelled
    (MCP cancellation: no response), drained or moved (the client resumes elsewhere)."""
    task_id = ticket.task_id
    # Made for the first events: an idle stream (most open ones) holds neither.
    render: Renderer | None = None
    cursor = ""
    async for batch in batches:
        if batch is None:
            yield Frame(None)
            continue
        if render is None:
            render = renderer(task_id, prefix)
            cursor = cursor_prefix(request_id, task_id)
        traced = list(batch.pairs()) if tracing.enabled() else ()
        with tracing.deliver(task_id, traced):  # a span around this write, if traced
            yield EventBatch(texts.frames(task_id, cursor, batch, render))
        del batch, traced  # not held while the stream waits, maybe for hours
    if not ticket.cancelled and not ticket.moved and not draining.is_set():
        yield Frame(result_response(request_id, {"resultType": "complete"}))


# --- rendering: notifications/tasks/event ----------------------------------------------------


class RecentTexts:
    """The notification texts rendered lately, by (task id, seq), shared by every stream.

    An event fanned out live to N streams of its task, or replayed to N clients resuming it,
    is rendered once instead of N times: its text depends on the task, the seq and the event
    only (:func:`renderer`), and a committed event never changes. Bounded by count and by
    characters, the oldest text out first; a text above an eighth of the character bound is
    not kept, and a miss renders as before. The character bound is what keeps a burst of large
    events from being held here: a fan-out needs only the texts of the last moments.
    """

    __slots__ = ("_chars", "_limit", "_max_chars", "_texts")

    #: Batches up to this many events are kept (see :meth:`texts`).
    KEPT_BATCH = 256

    def __init__(self, limit: int = 4096, max_chars: int = 1 << 20) -> None:
        self._limit = limit
        self._max_chars = max_chars
        self._chars = 0
        # Evicted oldest first with popitem(last=False), O(1): a plain dict's first key, after
        # many deletions at its front, is found by skipping them (a 200,000-event replay spent
        # a fifth of its CPU there).
        self._texts: OrderedDict[tuple[str, int], str] = OrderedDict()

    def text(
        self,
        task_id: str,
        seq: int,
        event: Item,
        render: Callable[[int, Item], str],
    ) -> str:
        """The text of ``task_id``'s event ``seq``, from ``render`` (a :func:`renderer` of
        that task) unless rendered lately."""
        return self.texts(task_id, Batch([seq], [0], [event]), render)[0]

    def texts(
        self,
        task_id: str,
        batch: Batch[Item],
        render: Callable[[int, Item], str],
    ) -> list[str]:
        """:meth:`text` of each item of ``batch``, in one call.

        A batch of more than ``KEPT_BATCH`` events is read from the cache but not kept in it:
        it is a replay far behind the head, whose texts would push out the ones the live
        fan-out and a reconnect storm share, and keeping each cost more than rendering it.
        """
        texts = self._texts
        out: list[str] = []
        get, append = texts.get, out.append
        limit, max_chars = self._limit, self._max_chars
        largest = max_chars >> 3 if len(batch) <= self.KEPT_BATCH else -1
        chars = self._chars
        for seq, event in zip(batch.seqs, batch.items, strict=True):
            key = (task_id, seq)
            text = get(key)
            if text is None:
                text = render(seq, event)
                if len(text) <= largest:
                    chars += len(text)
                    texts[key] = text
                    while len(texts) > limit or chars > max_chars:
                        chars -= len(texts.popitem(last=False)[1])  # the oldest
            append(text)
        self._chars = chars
        return out

    def frames(self, task_id: str, cursor: str, batch: Batch[Item], render: Renderer) -> str:
        """The SSE events of ``batch`` for a stream whose event ids start with ``cursor``: the
        texts of :meth:`texts`, framed; except a replay's read far behind the head (more than
        ``KEPT_BATCH`` events, wire texts among them), which is rendered and framed in one go
        without the cache (:meth:`Renderer.frames`). A large batch of live events (a slow
        stream after a burst) still reads the texts other streams of its task rendered."""
        if len(batch) > self.KEPT_BATCH and not batch.events_only:
            return render.frames(cursor, batch)
        return sse_events(cursor, batch.seqs, self.texts(task_id, batch, render))

    @property
    def chars(self) -> int:
        """Characters of the texts kept (at most ``max_chars``)."""
        return self._chars


class Renderer:
    """Renders one task's notifications as single-line JSON (:func:`renderer` makes them).

    The same JSON value as ``dumps(notification(...))``; the parts fixed for the task (its id,
    the related-task ``_meta``) are serialised once instead of for every event, and so is each
    event type. An event that carries its payload and ``_meta`` as wire JSON text
    (:attr:`TaskEvent.payload_json`, set by the decoder, which validated it) is sent with that
    text as it is, not parsed and serialised again: a text with a duplicate key goes out as the
    producer wrote it (the bridge itself reads the last value, as most JSON parsers do). The
    related-task member is appended to such a ``_meta`` text unless the producer's ``_meta``
    has that key already: then the dict is written, with the bridge's value in its place.

    An event whose content cannot be written as JSON (the decoder refuses such records, so
    this is the last line of defence) goes out as a ``<prefix>.event.undecodable`` placeholder
    with its seq: one record can never fail a stream.

    :data:`~bridge.envelope.WireMembers` instead of an event are a replayed record's type and
    payload as checked wire JSON members (:meth:`bridge.log.records.RecordDecoder.wire_batch`,
    no ``_meta``): they go between the task id and the related-task ``_meta``, the same text
    its event would give.
    """

    __slots__ = (
        "_after_seq",
        "_after_task",
        "_plain_meta",
        "_related",
        "_related_member",
        "prefix",
        "task_id",
    )

    def __init__(self, task_id: str, prefix: str) -> None:
        self.task_id = task_id
        self.prefix = prefix
        self._after_seq = f',"taskId":{dumps(task_id)},"type":'
        self._after_task = f',"taskId":{dumps(task_id)},'
        self._related = {"taskId": task_id}
        self._related_member = f",{dumps(RELATED_TASK_META)}:{dumps(self._related)}}}"
        self._plain_meta = dumps({RELATED_TASK_META: self._related})

    def __call__(self, seq: int, event: Item) -> str:
        """The notification of ``event`` as the task's ``seq``: one line of JSON."""
        if not isinstance(event, TaskEvent):  # a replayed record's wire members, without _meta
            return (
                f'{_NOTIFICATION_HEAD}{seq}{self._after_task}{event},"_meta":{self._plain_meta}}}}}'
            )
        type_texts = _TYPE_TEXTS
        try:
            type_ = type_texts.get(event.type)
            if type_ is None:
                if len(type_texts) >= _TYPE_TEXTS_MAX:  # any producer picks types: bounded
                    type_texts.clear()
                type_ = type_texts[event.type] = dumps(event.type)
            payload = event.payload_json
            if payload is None:
                payload = dumps(event.payload)
            if not event.meta:
                meta = self._plain_meta
            elif event.meta_json is not None and RELATED_TASK_META not in event.meta:
                # A non-empty object's text ends with "}" (and perhaps whitespace).
                meta = event.meta_json.rstrip()[:-1] + self._related_member
            else:
                meta = dumps({**event.meta, RELATED_TASK_META: self._related})
        except (ValueError, TypeError, RecursionError):
            log.warning(
                "task %s seq %d: unencodable content sent as a placeholder", self.task_id, seq
            )
            meta, type_, payload = (
                self._plain_meta,
                dumps(TaskEventTypes.of(self.prefix).undecodable),
                _UNENCODABLE,
            )
        return f'{_NOTIFICATION_HEAD}{seq}{self._after_seq}{type_},"payload":{payload},"_meta":{meta}}}}}'

    def frames(self, cursor: str, batch: Batch[Item]) -> str:
        """The SSE events of ``batch`` (:func:`sse_events`' text), each rendered now: a wire
        text without a step of its own. The batch is a stream's, so its seqs are consecutive;
        its events (a few: a replay's batch is nearly all wire texts) are rendered one by one
        into their place. A replay writes hundreds of thousands of events a second: a
        formatted string per event was a tenth of its CPU.
        """
        n = len(batch)
        if not n:
            return ""
        first = batch.seqs[0]
        if batch.seqs[-1] != first + n - 1:  # not a stream's batch: one by one
            return sse_events(cursor, batch.seqs, [self(*pair) for pair in batch.pairs()])
        items = batch.items
        seqs = list(map(str, range(first, first + n)))
        # Seven pieces per event, the fixed ones repeated and the rest laid in by slices.
        data = f"\nevent: message\ndata: {_NOTIFICATION_HEAD}"
        end = f',"_meta":{self._plain_meta}}}}}\n\n'
        pieces: list[Any] = [f"id: {cursor}", None, data, None, self._after_task, None, end] * n
        pieces[1::7] = seqs
        pieces[3::7] = seqs
        pieces[5::7] = items
        for i in range(n) if batch.full is None else batch.full:  # events: each its own text
            text = self(first + i, items[i])
            pieces[7 * i + 2 : 7 * i + 7] = ("\nevent: message\ndata: ", text, "", "", "\n\n")
        return "".join(pieces)


@lru_cache(maxsize=4096)  # one per task, not per stream: making one serialises four JSON texts
def renderer(task_id: str, prefix: str) -> Renderer:
    """The task's :class:`Renderer`, shared by its streams."""
    return Renderer(task_id, prefix)


def sse_events(cursor: str, seqs: Sequence[int], texts: Sequence[str]) -> str:
    """SSE events, one per notification text: ``id`` the stream's ``cursor`` prefix and the
    seq, event type ``message``, the text as ``data`` (one line)."""
    return "".join(
        [
            f"id: {cursor}{seq}\nevent: message\ndata: {text}\n\n"
            for seq, text in zip(seqs, texts, strict=True)
        ]
    )


_NOTIFICATION_HEAD = '{"jsonrpc":"2.0","method":"notifications/tasks/event","params":{"seq":'
_UNENCODABLE = dumps({"reason": "unencodable", "error": "the content cannot be written as JSON"})
#: Event types as JSON, shared by every stream's renderer: replays repeat a few types many
#: times. Bounded (then it starts over), as any producer picks types.
_TYPE_TEXTS: dict[str, str] = {}
_TYPE_TEXTS_MAX = 1024


# --- framing and the response ----------------------------------------------------------


#: The headers of every SSE response (one list for all of them).
_SSE_HEADERS = [
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
]


#: The last chunk of a stream whose caller's credential expired: an SSE comment, so the
#: stream ends without a result (the client authenticates again and resumes with its cursor).
CREDENTIAL_EXPIRED = b": credential expired\n\n"
#: What an idle stream writes every keep-alive interval: an SSE comment.
KEEP_ALIVE = b": keep-alive\n\n"


class SseResponse(Response):
    """A ``text/event-stream`` response of a :class:`Streamed` outcome: its messages framed as
    SSE events, one write per item (a batch is one item), until they end, the client leaves,
    or the credential the stream was opened with expires (``expires``, epoch seconds: the
    stream then ends with ``expired_chunk`` instead of its next message, never with a result).

    It always runs ``on_close`` (the stream's admission slot is given back even when the client
    is gone before the first byte). Lean on purpose, as an idle stream holds one for hours:
    instead of starlette's ``StreamingResponse`` (an anyio task group and cancel scopes per
    response, and one more generator layer to frame bytes), the messages are sent from the
    request's own task; one small task waits for the client's ``http.disconnect`` and one
    timer waits for the expiry, either of which cancels the sending (a body write to a closed
    connection is dropped silently, so only the disconnect message tells an idle stream that
    its client left). Every long-lived response is one of these, so the expiry rule lives here
    once.
    """

    def __init__(
        self,
        outcome: Streamed,
        request_id: str | int | None,
        headers: Mapping[str, str] | None = None,
        *,
        expires: float | None = None,
        expired_chunk: bytes = CREDENTIAL_EXPIRED,
        status_code: int = 200,
    ) -> None:
        # Not Response.__init__: it would render a body and set a content-length.
        self.status_code = status_code
        self.background = None
        # The shared list unless a caller adds headers (never mutated: a fresh list then).
        self.raw_headers = _SSE_HEADERS if not headers else _with_headers(headers)
        self._outcome = outcome
        self._request_id = request_id
        self._expires = expires
        self._expired_chunk = expired_chunk

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task()
        assert task is not None  # ASGI apps run in a task
        self._task, self._receive = task, receive
        self._gone = self._ending = self._expired = False
        self._watch()
        messages = self._outcome.messages
        timer = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            if self._expires is not None:  # armed once the head is out: only the body is cut
                delay = self._expires - time.time()
                timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._expire)
            failed = False
            while not failed:
                # The messages are iterated here, not through a framing generator: one
                # suspended frame less per open stream.
                try:
                    data = chunk(await anext(messages))
                except StopAsyncIteration:
                    break
                except Exception as exc:  # it ends the messages: its error is the last event
                    error = wire_error(exc).error  # the table of every endpoint (it logs)
                    data, failed = _sse_error(self._request_id, error), True
                await send({"type": "http.response.body", "body": data, "more_body": True})
                del data  # written: an idle stream would hold its last write until the next
            self._ending = True  # from here a disconnect is the end itself, not a reason to stop
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not (self._gone or self._expired):
                raise  # the server's own cancellation: let it through
            task.uncancel()  # ours: the client left, or the credential expired
            if self._expired:  # the documented end: a comment (or the view's event), no result
                body = {"type": "http.response.body", "body": self._expired_chunk}
                await send({**body, "more_body": False})
        finally:
            if timer is not None:
                timer.cancel()
            self._waiting.cancel()
            try:
                await _aclose(messages)  # now, not when collected (a forwarded stream's upstream)
            finally:
                if self._outcome.on_close is not None:
                    self._outcome.on_close()

    def _expire(self) -> None:
        if self._ending or self._gone:
            return
        # From here the response ends itself: a disconnect now changes nothing.
        self._expired = self._ending = True
        self._task.cancel()

    def _watch(self) -> None:
        # A callback on the receive, not a watching coroutine: one frame less per stream.
        self._waiting = asyncio.ensure_future(self._receive())
        self._waiting.add_done_callback(self._received)

    def _received(self, waiting: asyncio.Future[Any]) -> None:
        if waiting.cancelled() or self._ending:
            return
        if waiting.exception() is None and waiting.result()["type"] != "http.disconnect":
            self._watch()  # the request body (already read), or nothing: only the end counts
            return
        self._gone = True  # the client left (or the server cannot tell us any more)
        self._task.cancel()


async def _aclose(messages: AsyncIterator[Any]) -> None:
    """Run the cleanup of a stream's messages that stopped early (a no-op once they ended)."""
    close = getattr(messages, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception:
        log.exception("cleaning up a streamed response failed")


def utf8(text: str) -> bytes:
    """UTF-8 for the wire. A lone surrogate can only stand inside a JSON string here, where
    ``backslashreplace`` writes it as the JSON escape ``\\udXXX``: one bad character never
    fails a stream (the decoder refuses such records; this is the last line of defence)."""
    return text.encode("utf-8", "backslashreplace")


def _sse_frame(frame: Frame) -> str:
    if frame.data is None and frame.message is None:
        return ": keep-alive\n\n"
    data = frame.data if frame.data is not None else dumps(frame.message or {})
    return sse_event(data, event="message", event_id=frame.event_id)


def sse_event(data: str, *, event: str | None = None, event_id: str | None = None) -> str:
    """One SSE event block; ``data`` is one line of JSON (no newline can split it)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    head += f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data}\n\n"


def preamble(retry_ms: int) -> bytes:
    """The first write of a plain EventSource stream: ``retry`` (how soon the browser
    reconnects) and a comment that makes the open visible at once."""
    return f"retry: {retry_ms}\n: open\n\n".encode()


def _with_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The SSE headers with ``headers`` added; a header named in both takes ``headers``' value."""
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    names = {name for name, _ in extra}
    return [h for h in _SSE_HEADERS if h[0] not in names] + extra


def chunk(item: dict[str, Any] | Frame | EventBatch | bytes) -> bytes:
    """One item of a :class:`Streamed` outcome as SSE bytes (a batch of events: all of them, one
    write; bytes are SSE already framed by their producer, as the plain EventSource endpoint
    frames its own)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, EventBatch):  # a stream's events, framed by its renderer
        return utf8(item.text)
    return utf8(_sse_frame(item if isinstance(item, Frame) else Frame(item)))


def _sse_error(request_id: str | int | None, error: RpcError) -> bytes:
    """A stream's last event for ``error``, answering ``request_id``; a retriable one also
    carries SSE's ``retry`` field (the wait ``Retry-After`` would say, in ms), which an
    EventSource reconnecting with ``Last-Event-ID`` honours."""
    frame = utf8(_sse_frame(Frame(error_response(request_id, error))))
    wait = retry_after(error.http_status, error).get("Retry-After")
    return frame if wait is None else b"retry: %d\n%s" % (int(wait) * 1000, frame)

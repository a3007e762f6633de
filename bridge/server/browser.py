"""The browser view of a task and its plain SSE endpoint, for clients without an MCP SDK.

Where it sits: beside the MCP endpoint (:mod:`bridge.server.http`), on the same components. A
caller with the MCP endpoint's credential mints a *view token* (``POST /view/token``); the page
(``/view/``, static files served by the bridge) and any ``EventSource`` use that token to read
one task: ``GET /view/tasks/{id}`` (its state, as tasks/get shows it) and
``GET /view/tasks/{id}/events`` (``text/event-stream``, resumed by ``Last-Event-ID``). The
stream is the StreamHub's, like tasks/stream: the same admission, the same cursor checks, the
same delivery rule; only the framing differs (plain SSE, no JSON-RPC). A request about a task
whose partition another replica owns is forwarded there in one signed hop, like ``/mcp``.

Why a token and not the bearer credential: ``EventSource`` cannot send headers, so the
credential must travel in the URL. A view token is the least a URL can leak: it names one
task and one principal, reads only, and expires in minutes (docs/browser.md has the whole
reasoning). The page receives it in the URL *fragment* (never sent to a server, so never in an
access log or a ``Referer``), and the bridge's own access log redacts it from the query.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol
from urllib.parse import quote, unquote_plus

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.keyring import PurposeKey
from bridge.server.admission import Caller, Ticket, connection_of
from bridge.server.errors import wire_error
from bridge.server.handlers import detailed_task
from bridge.server.hops import PeerIdentity, from_peer_listener
from bridge.server.http import McpHttp, relay
from bridge.server.routing import owner_unavailable_error, partition_moving_error
from bridge.server.sse import KEEP_ALIVE, SseResponse, Streamed, preamble, sse_event, utf8
from bridge.server.streams import StreamHub
from bridge.server.wire import (
    CLIENT_CAPS_META,
    EVENTS_GONE,
    MAX_SEQ,
    RpcError,
    dumps,
    tasks_capability,
)
from bridge.tasks.messages import iso_ms
from bridge.tasks.service import TaskNotFound, TaskService
from bridge.vocabulary import TaskEventTypes

__all__ = [
    "BadViewToken",
    "BrowserView",
    "ViewTokens",
    "redact_tokens",
]

log = logging.getLogger(__name__)

_TOKEN_VERSION = "vt1"
#: The query parameter that carries a view token (redacted from the access log).
TOKEN_PARAM = "token"
#: Where a query parameter may start or end in a log line: one character each, so splitting a
#: line on them is one linear pass whatever the line holds.
_PARAM_BOUNDARY = re.compile(r'[?&\s"]')
#: Digits of the largest seq: a longer Last-Event-ID or ``after`` is no seq.
_SEQ_DIGITS = len(str(MAX_SEQ))
#: The largest ``POST /view/token`` body read: a task id and nothing else.
_MINT_BODY_LIMIT = 4096

#: Headers of every view response: nothing cached, no Referer from the page, no sniffing, no
#: framing; the page may run only the bridge's own script and style (no inline code at all).
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
}

#: The static files of the page, by the name the page asks for, with their media type.
_STATIC = {
    "view.js": "text/javascript; charset=utf-8",
    "view.css": "text/css; charset=utf-8",
}


class BadViewToken(Exception):
    """A view token that is missing, malformed, forged or expired; the message is safe to show
    (it never echoes the token)."""


@dataclass(frozen=True, slots=True)
class ViewGrant:
    """What a valid view token grants: ``principal`` may view ``task_id`` until ``expires``."""

    principal: str
    task_id: str
    expires: int


class ViewTokens:
    """Mints and checks view tokens: ``vt1.<claims>.<mac>``, HMAC-SHA256 under a server key.

    The claims (base64url JSON ``[principal, taskId, expiry]``) are signed, not encrypted: a
    token shows the principal's name to whoever holds it, which is who it was given to.
    """

    def __init__(self, key: bytes, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        # Domain separation: the same secret may key other MACs (the peer hop); a view token
        # must never verify as anything else, nor anything else as a view token.
        self._key = PurposeKey(key, b"mcp-kafka-bridge view token")
        self.ttl_s = ttl_s
        self._clock = clock

    def __repr__(self) -> str:
        return "ViewTokens(<key>)"

    @classmethod
    def for_settings(cls, settings: Settings) -> ViewTokens:
        """The configured key; else the peer secret's (replicas accept each other's tokens);
        else a random key that lives as long as this process."""
        secret = settings.view.token_secret_value or settings.peers.secret_value
        key = secret.encode() if secret is not None else secrets.token_bytes(32)
        return cls(key, settings.view.token_ttl_s)

    def _mac(self, claims: str) -> str:
        digest = self._key.mac(claims.encode("ascii"))
        return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")

    def mint(self, principal: str, task_id: str) -> tuple[str, int]:
        """A token for ``principal`` viewing ``task_id``, and its expiry (epoch seconds)."""
        expires = int(self._clock()) + self.ttl_s
        raw = json.dumps([principal, task_id, expires], separators=(",", ":")).encode()
        claims = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        return f"{_TOKEN_VERSION}.{claims}.{self._mac(claims)}", expires

    def verify(self, token: str | None) -> ViewGrant:
        """The grant of a valid, unexpired token; :class:`BadViewToken` otherwise."""
        if not token:
            raise BadViewToken("missing view token")
        version, _, rest = token.partition(".")
        claims, _, mac = rest.partition(".")
        if version != _TOKEN_VERSION or not claims or not mac:
            raise BadViewToken("malformed view token")
        if not hmac.compare_digest(self._mac(claims), mac):
            raise BadViewToken("invalid view token")
        try:
            principal, task_id, expires = json.loads(
                base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4))
            )
        except (binascii.Error, ValueError, TypeError):
            raise BadViewToken("malformed view token") from None
        if not (
            isinstance(principal, str) and isinstance(task_id, str) and isinstance(expires, int)
        ):
            raise BadViewToken("malformed view token")
        if expires <= self._clock():
            raise BadViewToken("expired view token: mint a new one")
        return ViewGrant(principal, task_id, expires)


def redact_tokens(text: str) -> str:
    """``text`` with the value of every ``token`` query parameter replaced (for access log
    lines), one linear pass.

    A parameter's name is percent-decoded before it is compared, as the query parser that
    serves the request decodes it: ``?%74oken=...`` and ``?tok%65n=...`` carry a token too.
    Case is ignored (redacting too much is harmless).
    """
    out: list[str] = []
    start, before, redacting = 0, "", False
    for boundary in _PARAM_BOUNDARY.finditer(text):
        redacting = _put(out, before, text[start : boundary.start()], redacting)
        start, before = boundary.end(), boundary.group()
    _put(out, before, text[start:], redacting)
    return "".join(out)


def _put(out: list[str], before: str, piece: str, redacting: bool) -> bool:
    """Append ``before`` (a boundary character) and ``piece`` (the text up to the next one) to
    ``out``, a ``token`` parameter's value redacted; True while a redacted value goes on (only
    ``&``, whitespace and ``"`` end a value: a ``?`` inside one is part of it)."""
    if redacting and before == "?":
        return True
    out.append(before)
    name, equals, _ = piece.partition("=")
    if before in ("?", "&") and equals and unquote_plus(name).lower() == TOKEN_PARAM:
        out.append(f"{name}=[redacted]")
        return True
    out.append(piece)
    return False


class _RedactTokens(logging.Filter):
    """Rewrites uvicorn's access log records: their path argument holds the query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Every text with a query, not only those spelling "token": the name may be encoded.
        if isinstance(record.args, tuple) and any(
            isinstance(a, str) and "=" in a for a in record.args
        ):
            record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str) and "=" in record.msg:
            record.msg = redact_tokens(record.msg)
        return True


_REDACTOR = _RedactTokens()


def install_log_redaction() -> None:
    """Keep view tokens out of uvicorn's access log, whoever runs the app (idempotent)."""
    access = logging.getLogger("uvicorn.access")
    if _REDACTOR not in access.filters:
        access.addFilter(_REDACTOR)


def event_json(seq: int, event: TaskEvent, placeholder: str) -> str:
    """The ``data`` of a task event: ``{seq, type, payload, time}`` (a placeholder of the
    bridge's undecodable type when the content cannot be written as JSON)."""
    time_text = iso_ms(event.timestamp_ms)
    try:
        return dumps({"seq": seq, "type": event.type, "payload": event.payload, "time": time_text})
    except (ValueError, TypeError, RecursionError):
        payload = {"reason": "unencodable", "error": "the content cannot be written as JSON"}
        return dumps({"seq": seq, "type": placeholder, "payload": payload, "time": time_text})


class Served(Protocol):
    """What the view needs of the running bridge (the app's ``Components``)."""

    @property
    def service(self) -> TaskService: ...
    @property
    def hub(self) -> StreamHub: ...
    @property
    def endpoint(self) -> McpHttp: ...


def _problem(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=SECURITY_HEADERS)


def _refused(exc: BaseException, task_id: str | None = None) -> JSONResponse:
    """The view's answer to an error, as every endpoint answers it (bridge.server.errors): its
    transport status and ``Retry-After``, its message, ``reason`` and ``retryAfterMs``."""
    answer = wire_error(exc, task_id)
    data = answer.error.data if isinstance(answer.error.data, Mapping) else {}
    extra = {k: data[k] for k in ("reason", "retryAfterMs") if k in data}
    return JSONResponse(
        {"error": answer.error.message, "code": answer.error.code, **extra},
        status_code=answer.transport_status,
        headers={**SECURITY_HEADERS, **answer.headers},
    )


def _fault_event(exc: BaseException, task_id: str) -> bytes:
    """A started stream's last event for an error: ``gone`` for events_gone, else ``fault``."""
    answer = wire_error(exc, task_id)
    if answer.error.code == EVENTS_GONE:
        return utf8(sse_event(dumps(_gone_data(answer.error)), event="gone"))
    fault = {"code": answer.error.code, "message": answer.error.message, **_reason(answer.error)}
    return utf8(sse_event(dumps(fault), event="fault"))


#: The last event of a stream whose view token expired.
_EXPIRED_EVENT = sse_event(
    dumps({"message": "the view token expired: mint a new one"}), event="expired"
).encode()


class BrowserView:
    """The ``/view`` routes: the page, its static files, token minting, state and events."""

    def __init__(self, settings: Settings, running: Callable[[Request], Served]) -> None:
        self.settings = settings
        self.tokens = ViewTokens.for_settings(settings)
        self._running = running
        self._placeholder = TaskEventTypes.of(settings.tasks.event_type_prefix).undecodable
        install_log_redaction()

    def routes(self) -> list[Route]:
        if not self.settings.view.enabled:
            return []
        return [
            Route("/view/", self.page, methods=["GET"]),
            Route("/view/static/{name}", self.static, methods=["GET"]),
            Route("/view/token", self.mint, methods=["POST"]),
            Route("/view/tasks/{task_id}", self.state, methods=["GET"]),
            Route("/view/tasks/{task_id}/events", self.events, methods=["GET"]),
        ]

    # --- the page ------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return Response(
            _asset("view.html"), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS
        )

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        media = _STATIC.get(name)
        if media is None:
            return _problem(404, "no such file")
        return Response(_asset(name), media_type=media, headers=SECURITY_HEADERS)

    # --- minting -------------------------------------------------------------------------

    async def mint(self, request: Request) -> Response:
        """``POST /view/token`` ``{"taskId": ...}`` with the MCP endpoint's credential: a view
        token, once the caller may see the task (the same check as tasks/get)."""
        served = self._running(request)
        caller = served.endpoint._gate(request)  # the MCP endpoint's Host/Origin check and auth
        if isinstance(caller, Response):
            return caller
        body = await _small_body(request)
        task_id = _task_id_of(body)
        if task_id is None:
            return _problem(400, 'the body must be JSON {"taskId": "<task id>"}')
        try:
            await self._authorize(served, caller, task_id)
        except Exception as exc:
            return _refused(exc, task_id)
        token, expires = self.tokens.mint(caller.principal, task_id)
        fragment = f"task={quote(task_id, safe='')}&token={token}"
        return JSONResponse(
            {
                "token": token,
                "taskId": task_id,
                "expiresAt": iso_ms(expires * 1000),
                "viewPath": f"/view/#{fragment}",
            },
            headers=SECURITY_HEADERS,
        )

    async def _authorize(self, served: Served, caller: Caller, task_id: str) -> None:
        """TaskNotFound unless the caller may see the task, asked where the task lives."""
        endpoint = served.endpoint
        owner = await endpoint.routing.where(task_id) if endpoint.routing is not None else None
        if owner is None:
            await served.service.get(task_id, caller.principal)
            return
        if endpoint.peers is None:
            raise RuntimeError("a task at another replica, but no peer client")
        params = {"taskId": task_id, "_meta": {CLIENT_CAPS_META: tasks_capability()}}
        identity = PeerIdentity(caller.principal, caller.client)
        try:
            await endpoint.peers.call(owner, "tasks/get", params, identity)
        except RpcError as exc:
            if exc.http_status < 500:
                raise TaskNotFound() from None
            raise

    # --- who reads -----------------------------------------------------------------------

    def _reader(
        self, request: Request, served: Served, task_id: str, path: str
    ) -> Caller | Response:
        """The caller of a view GET: vouched for by a peer's signed hop, or by a view token for
        this task. 403 for a foreign Host/Origin, 401 for a bad token, 404 for a token of
        another task (as for a task the caller may not see)."""
        endpoint = served.endpoint
        if from_peer_listener(request.scope):  # a hop: only the signature, never a token
            return endpoint._hop(request, b"", path)
        if not endpoint._origin_allowed(request):  # the MCP endpoint's DNS-rebinding check
            return _problem(403, "forbidden host or origin")
        try:
            grant = self.tokens.verify(request.query_params.get(TOKEN_PARAM))
        except BadViewToken as exc:
            return _problem(401, str(exc))
        if grant.task_id != task_id:
            return _refused(TaskNotFound(), task_id)  # as for a task the caller may not see
        client = grant.principal
        if not endpoint.auth.authenticates:  # anonymous callers are told apart by address
            client = f"{grant.principal}@{request.client.host if request.client else 'unknown'}"
        # The token's expiry ends the stream it opens (the page then asks for a new link).
        return Caller(grant.principal, client, connection_of(request.scope), grant.expires)

    async def _forward(
        self, request: Request, served: Served, caller: Caller, path: str
    ) -> Response | None:
        """The owner's answer when another replica owns the task; None to serve here."""
        endpoint = served.endpoint
        task_id = request.path_params["task_id"]
        if endpoint.routing is None:
            return None
        hop = from_peer_listener(request.scope)
        try:
            owner = await endpoint.routing.where(task_id)
        except RpcError as exc:
            return _refused(exc, task_id)
        if owner is None:
            return None
        if hop or endpoint.peers is None:  # a hop is never forwarded again
            return _refused(partition_moving_error(task_id), task_id)
        # Counted with the MCP endpoint's hops under the label "view". The token is checked
        # here, not at the owner: its expiry ends the forwarded stream here.
        answer = await relay(
            endpoint.peers,
            endpoint.metrics,
            owner,
            "view",
            "GET",
            request.headers,
            b"",
            caller,
            path=path,
            extra_headers=SECURITY_HEADERS,
            expired_chunk=_EXPIRED_EVENT,
        )
        if answer is None:
            retry = endpoint.peers.retry_after_s(owner)
            return _refused(owner_unavailable_error(retry), task_id)
        return answer

    # --- state ---------------------------------------------------------------------------

    async def state(self, request: Request) -> Response:
        """``GET /view/tasks/{id}``: the task as tasks/get shows it (status, result, error)."""
        served = self._running(request)
        task_id = request.path_params["task_id"]
        caller = await self._here(
            request, served, task_id, f"/view/tasks/{quote(task_id, safe='')}"
        )
        if isinstance(caller, Response):
            return caller  # refused, or the owner replica's answer
        try:
            view = await served.service.get(task_id, caller.principal)
        except Exception as exc:
            return _refused(exc, task_id)
        return Response(
            utf8(dumps(detailed_task(view))),
            media_type="application/json",
            headers=SECURITY_HEADERS,
        )

    # --- events --------------------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        """``GET /view/tasks/{id}/events``: the task's events as plain SSE.

        The cursor is ``Last-Event-ID`` (the browser sends it on every reconnect), else the
        ``after`` query parameter, else none (from the earliest retained event).
        """
        served = self._running(request)
        task_id = request.path_params["task_id"]
        after = _cursor(request.headers.get("last-event-id"), request.query_params.get("after"))
        if isinstance(after, str):
            return _problem(400, after)
        path = f"/view/tasks/{quote(task_id, safe='')}/events"
        if after is not None:
            path += f"?after={after}"
        caller = await self._here(request, served, task_id, path)
        if isinstance(caller, Response):
            return caller  # refused, or the owner replica's answer
        return await self._open(served, caller, task_id, after)

    async def _here(
        self, request: Request, served: Served, task_id: str, path: str
    ) -> Caller | Response:
        """The reader of ``path`` when this replica serves the task; otherwise the answer:
        a refusal, or the owner's answer to the forwarded request."""
        caller = self._reader(request, served, task_id, path)
        if isinstance(caller, Response):
            return caller
        forwarded = await self._forward(request, served, caller, path)
        return caller if forwarded is None else forwarded

    async def _open(
        self, served: Served, caller: Caller, task_id: str, after: int | None
    ) -> Response:
        """Authorize, admit, check the cursor (tasks/stream's order), then stream."""
        hub = served.hub
        try:
            await served.service.get(task_id, caller.principal)  # as tasks/get
            ticket = hub.admit(caller, task_id, None)
        except Exception as exc:
            return _refused(exc, task_id)
        try:
            log_start = await hub.check_cursor(task_id, after)
        except BaseException as exc:
            hub.release(ticket)
            if isinstance(exc, RpcError) and exc.code == EVENTS_GONE:
                hub.count_gone()
                # An answer the EventSource can read (a 410 would only be a bare error to it).
                return self._sse(self._gone_only(exc), None)
            if isinstance(exc, Exception):
                return _refused(exc, task_id)
            raise
        body = self._stream(served, ticket, after, log_start)
        return self._sse(body, lambda: hub.release(ticket), caller.expires)

    def _sse(
        self,
        body: AsyncIterator[bytes],
        on_close: Callable[[], None] | None,
        expires: float | None = None,
        *,
        status_code: int = 200,
        headers: Mapping[str, str] = SECURITY_HEADERS,
    ) -> Response:
        """An SSE response of ``body``, ended by an ``expired`` event when the view token it
        was opened with expires (the page stops reconnecting and asks for a new link)."""
        return SseResponse(
            Streamed(body, None, on_close),
            None,
            headers=headers,
            expires=expires,
            expired_chunk=_EXPIRED_EVENT,
            status_code=status_code,
        )

    def _preamble(self) -> bytes:
        return preamble(self.settings.view.retry_ms)

    async def _gone_only(self, exc: RpcError) -> AsyncIterator[bytes]:
        yield self._preamble()
        yield utf8(sse_event(dumps(_gone_data(exc)), event="gone"))

    async def _stream(
        self, served: Served, ticket: Ticket, after: int | None, log_start: int | None
    ) -> AsyncIterator[bytes]:
        hub, task_id = served.hub, ticket.task_id
        yield self._preamble()
        try:
            async for batch in hub.events(ticket, after, log_start):
                if batch is None:
                    yield KEEP_ALIVE
                    continue
                yield utf8(
                    "".join(
                        sse_event(event_json(seq, event, self._placeholder), event_id=str(seq))
                        for seq, event in batch.pairs()
                    )
                )
        except Exception as exc:
            yield _fault_event(exc, task_id)
            return
        # Cancelled, drained or moved: end without the end event, so the browser reconnects
        # (with Last-Event-ID) here later or at the partition's new owner.
        if ticket.cancelled or ticket.moved or hub.draining.is_set():
            return
        try:
            view = await served.service.get(task_id, ticket.caller.principal)
        except TaskNotFound:
            end: dict[str, Any] = {"taskId": task_id, "status": "unknown"}
        except Exception as exc:  # moved a moment ago, Kafka not answering: the table's fault
            yield _fault_event(exc, task_id)
            return
        else:
            end = detailed_task(view)
        yield utf8(sse_event(dumps(end), event="end"))


def _gone_data(exc: RpcError) -> dict[str, Any]:
    data = exc.data if isinstance(exc.data, Mapping) else {}
    return {"earliestSeq": data.get("earliestSeq"), "message": exc.message}


def _reason(exc: RpcError) -> dict[str, Any]:
    data = exc.data if isinstance(exc.data, Mapping) else {}
    return {"reason": data["reason"]} if isinstance(data.get("reason"), str) else {}


def _cursor(last_event_id: str | None, after: str | None) -> int | str | None:
    """The stream's cursor (``Last-Event-ID`` wins: it is the browser's latest), or an error
    message for one that is not a seq."""
    for name, raw in (("Last-Event-ID", last_event_id), ("after", after)):
        if raw is None or (name == "Last-Event-ID" and not raw.strip()):
            continue  # an empty Last-Event-ID is the browser saying "no event yet"
        text = raw.strip()
        # The length first: int() of a long digit run is slow, and past 4300 digits raises.
        if (
            len(text) > _SEQ_DIGITS
            or not text.isascii()
            or not text.isdigit()
            or int(text) > MAX_SEQ
        ):
            return f"{name} must be a seq: an integer from 0 to {MAX_SEQ}"
        return int(text)
    return None


async def _small_body(request: Request) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MINT_BODY_LIMIT:
            return b""  # not a task id: refused as a malformed body
    return bytes(body)


def _task_id_of(body: bytes) -> str | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    task_id = message.get("taskId") if isinstance(message, dict) else None
    return task_id if isinstance(task_id, str) and task_id else None


def _asset(name: str) -> bytes:
    return resources.files("bridge.server").joinpath("static", name).read_bytes()

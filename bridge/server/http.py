"""The MCP endpoint's HTTP transport: ``POST /mcp``, the ``GET`` resume, and forwarding.

Per request: the gate (Host/Origin against DNS rebinding, then authentication → a
:class:`~bridge.server.admission.Caller`; on the peer listener instead, the signed hop of
:mod:`bridge.server.hops`, and nothing else), the body limit, classification
(:mod:`bridge.server.classify`), the handlers (:mod:`bridge.server.handlers`), and the response:
JSON, or ``text/event-stream`` (an :class:`~bridge.server.sse.SseResponse`: SSE is
:mod:`bridge.server.sse`'s alone). It knows no method's meaning; metrics are injected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from bridge.config import Settings
from bridge.metrics import Metrics
from bridge.server.admission import Caller, connection_of
from bridge.server.auth import Authenticator, Unauthorized
from bridge.server.classify import Inbound, Methods, Rejected, classify
from bridge.server.cursor import decode_cursor
from bridge.server.errors import WireError, retry_after, wire_error
from bridge.server.handlers import Call, MethodHandlers
from bridge.server.hops import REFUSED_HEADER, HopRefused, PeerIdentity, from_peer_listener
from bridge.server.peers import OwnerSuspected, Peers, routed_task_id
from bridge.server.routing import (
    Routing,
    owner_unavailable_error,
    partition_moving_error,
)
from bridge.server.sse import CREDENTIAL_EXPIRED, SseResponse, Streamed
from bridge.server.wire import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    RpcError,
    dumps,
    error_response,
    result_response,
)

__all__ = ["McpHttp", "RawEndpoint"]

log = logging.getLogger(__name__)

#: Forwarded streams being closed after their response ended unbegun (held: a task the loop
#: only references weakly could be collected before it has run).
_CLOSING: set[asyncio.Future[None]] = set()

_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_and_port(host: str) -> tuple[str, int | None] | None:
    """A ``Host`` header's name (lower case, an IPv6 address in brackets) and port (None when
    absent); None when it is malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host.partition("]")
        name += bracket
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
        rest = f":{port}"
    else:  # a name, or a bare IPv6 address (which has no port)
        name, rest = host, ""
    if not rest:
        return name, None
    port = rest.removeprefix(":")
    if not rest.startswith(":") or not (port.isascii() and port.isdigit()) or len(port) > 5:
        return None
    return name, int(port)


def _origin(origin: str) -> tuple[str, str, int] | None:
    """An http(s) origin as (scheme, host, port), the default port filled in; None for
    anything else ("null", not a URL, another scheme)."""
    try:
        url = urlsplit(origin.strip())
        scheme, host, port = url.scheme.lower(), (url.hostname or "").lower(), url.port
    except ValueError:  # an unclosed IPv6 bracket, a bad port
        return None
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


class RawEndpoint:
    """A route endpoint ``handler(request) -> response`` as a plain ASGI app.

    Starlette wraps a function endpoint per request in an exception wrapper and closures that
    an open stream holds for its whole life; as an ASGI app (starlette routes an object that is
    not a function to it as is) the request costs one :class:`Request`. Exceptions reach the
    middleware around it (the bridge's app puts its ``/mcp`` endpoints behind starlette's
    server-error middleware only: see ``bridge.server.app``).
    """

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        response = await self.handler(Request(scope, receive, send))
        await response(scope, receive, send)


async def relay(
    peers: Peers,
    metrics: Metrics,
    owner: str,
    label: str,
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    caller: Caller,
    *,
    path: str = "/mcp",
    extra_headers: Mapping[str, str] | None = None,
    expired_chunk: bytes = CREDENTIAL_EXPIRED,
) -> Response | None:
    """The one way a request is forwarded to its task's owner (the MCP endpoint's and the
    browser view's): one signed hop to ``owner``'s peer listener at ``path``, counted under
    ``label``, and its answer passed back as it comes; None when the owner could not be asked
    (the caller answers its own retriable refusal).

    A streamed answer is an :class:`SseResponse`, so the caller's credential ends the
    forwarded stream here (``expired_chunk`` then): the owner knows only the principal the
    hop vouches for. An owner that goes away mid-stream ends this stream too, without a
    result, so the client resumes with its cursor.
    """
    started = time.perf_counter()
    identity = PeerIdentity(caller.principal, caller.client)
    try:
        # A tool call's answer waits for the tool's result, and its progress stream writes
        # no keep-alive: its quiet is not a lost owner.
        tool_call = label == "tools/call"
        answer = await peers.forward(
            owner, method, headers, body, identity, path=path, tool_call=tool_call
        )
    except Exception as exc:
        metrics.forward(label, "unavailable", None)
        if not isinstance(exc, OwnerSuspected):  # that one was logged once, when suspected
            log.warning("forwarding %s to %s failed: %s", label, owner, type(exc).__name__)
        return None
    outcome = "ok" if answer.status < 500 else "error"
    metrics.forward(label, outcome, time.perf_counter() - started)
    passed = {**answer.headers, **(extra_headers or {})}
    if answer.content is not None:
        return Response(answer.content, status_code=answer.status, headers=passed)

    begun = False

    async def body_of() -> AsyncIterator[bytes]:
        nonlocal begun
        begun = True
        try:
            async for chunk in answer.body:
                yield chunk
        except Exception as exc:
            log.warning("the owner's answer to %s broke off: %s", label, type(exc).__name__)
        finally:
            await answer.close()

    def ended() -> None:
        # A response that never began its body (the client gone while its head waited to be
        # written) never ran body_of's ``finally``: the owner's stream is closed from here.
        if not begun:
            closing = asyncio.ensure_future(answer.close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)

    return SseResponse(
        Streamed(body_of(), on_close=ended),
        None,
        passed,
        expires=caller.expires,
        expired_chunk=expired_chunk,
        status_code=answer.status,
    )


class McpHttp:
    """Serves ``/mcp``: one instance per app."""

    def __init__(
        self,
        settings: Settings,
        auth: Authenticator,
        handlers: MethodHandlers,
        metrics: Metrics,
        on_cancelled: Callable[[str, str | int], Any],
        routing: Routing | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.settings = settings
        self.auth = auth
        self.handlers = handlers
        self.metrics = metrics
        self._on_cancelled = on_cancelled
        self.routing = routing
        self.peers = peers
        self._methods = Methods(modern=handlers.modern.keys(), legacy=handlers.legacy.keys())
        self._allowed_hosts = {h.lower() for h in settings.server.allowed_hosts} | _LOOPBACK
        if settings.server.host not in ("0.0.0.0", "::", ""):
            self._allowed_hosts.add(settings.server.host.lower())
        self._allowed_origins = {o for o in map(_origin, settings.server.allowed_origins) if o}

    def _origin_allowed(self, request: Request, *, configured: bool = True) -> bool:
        """The DNS-rebinding check: the ``Host`` names this server, and an ``Origin``, when
        sent, is this server itself (scheme, host and port) or, with ``configured``, one of
        ``server.allowed_origins``."""
        any_host = "*" in self._allowed_hosts
        if any_host and configured:
            return True  # every Host and Origin: the operator's explicit choice
        host = _host_and_port(request.headers.get("host", ""))
        if host is None or not (any_host or host[0] in self._allowed_hosts):
            return False
        origin = request.headers.get("origin")
        if origin is None:
            return True
        seen = _origin(origin)
        if seen is None:  # "null", not a URL, or no http(s) origin: never this server's
            return configured and origin in self.settings.server.allowed_origins
        if configured and seen in self._allowed_origins:
            return True
        scheme, origin_host, port = seen
        # Same origin: the scheme and port the request came in on, a name of this server.
        if scheme != request.scope.get("scheme") or port != (host[1] or _DEFAULT_PORTS[scheme]):
            return False
        names = {host[0]} if any_host else self._allowed_hosts
        return origin_host in names or f"[{origin_host}]" in names

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.server.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RpcError(INVALID_REQUEST, f"request body over {limit} bytes", http_status=413)
        # The ASGI messages themselves, not starlette's stream() generator: half the cost of a
        # small body, paid by every request (each stream open).
        # A bytearray: bytes += would copy the whole body per message, quadratic in a body
        # trickled in many small pieces.
        body = bytearray()
        while True:
            message = await request.receive()
            if message["type"] != "http.request":
                raise ClientDisconnect()
            body += message.get("body", b"")
            if len(body) > limit:
                raise RpcError(INVALID_REQUEST, f"request body over {limit} bytes", http_status=413)
            if not message.get("more_body", False):
                return bytes(body)

    def _gate(self, request: Request) -> Caller | Response:
        """Who is calling, or the 403/401 response that refuses the request."""
        if not self._origin_allowed(request):
            return JSONResponse({"error": "forbidden host or origin"}, status_code=403)
        try:
            identity = self.auth.identify(request)
        except Unauthorized as exc:
            return JSONResponse(
                {"error": str(exc)},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="mcp"'},
            )
        # Limits count an authenticated principal; anonymous callers are told apart by address.
        principal = client = identity.principal
        if not self.auth.authenticates:
            client = f"{principal}@{request.client.host if request.client else 'unknown'}"
        return Caller(principal, client, connection_of(request.scope), identity.expires)

    def admin_gate(self, request: Request) -> Caller | Response:
        """The gate of ``/admin/*``: ``/mcp``'s authentication, and no cross-site request at
        all (an admin action is never taken on a web page's behalf): an ``Origin`` must be this
        server's own, ``Sec-Fetch-Site`` (when sent) ``same-origin`` or ``none``."""
        fetched_from = request.headers.get("sec-fetch-site", "none").strip().lower()
        if fetched_from not in ("same-origin", "none") or not self._origin_allowed(
            request, configured=False
        ):
            return JSONResponse({"error": "cross-site request refused"}, status_code=403)
        return self._gate(request)

    def _hop(self, request: Request, body: bytes, path: str = "/mcp") -> Caller | Response:
        """A request on the peer listener: the caller its signature vouches for, or the
        refusal (401; 503 when it may pass later). Never Host/Origin or client credentials:
        the signature covers the destination and everything that decides the answer."""
        try:
            if self.peers is None:  # a replica that divides nothing takes no hops
                raise HopRefused("destination")
            identity = self.peers.auth.verify(request.method, path, request.headers, body)
        except HopRefused as exc:
            self.metrics.hop_refused(exc.reason)
            log.warning("refused a forwarded request (%s)", exc.reason)
            status = 503 if exc.retriable else 401
            refusal = {"error": str(exc), "reason": exc.reason}
            marked = {REFUSED_HEADER: exc.reason}  # the forwarding side maps it (peers.py)
            return JSONResponse(refusal, status_code=status, headers=marked)
        return Caller(identity.principal, identity.client, connection_of(request.scope))

    async def post(self, request: Request) -> Response:
        hop = from_peer_listener(request.scope)
        caller: Caller | Response | None = None if hop else self._gate(request)
        if isinstance(caller, Response):
            return caller
        started = time.perf_counter()
        method, request_id = "invalid", None
        try:
            body = await self._read_body(request)
            if caller is None:  # a hop: the signature says who the caller is
                caller = self._hop(request, body)
                if isinstance(caller, Response):
                    return caller
            inbound = classify(request.headers, body, self._methods)
            if inbound.is_notification:
                self._notification(caller, inbound)
                return Response(status_code=202)  # notifications need no answer
            method, request_id = inbound.rpc.method, inbound.rpc.id
            owner = await self._owner(routed_task_id(method, inbound.params), hop)
            if owner is not None:
                return await self._forward(request, body, caller, owner, method, request_id)
            call = Call(inbound.rpc, caller, inbound.legacy, inbound.params, request.headers)
            outcome = await self.handlers.dispatch(call)
        except Rejected as exc:
            return self._refuse(exc.method or method, exc.request_id, exc.error, started)
        except Exception as exc:  # the table of every endpoint (it logs what it maps)
            return self._refuse(method, request_id, wire_error(exc).error, started)
        self.metrics.rpc(method, "ok", time.perf_counter() - started)
        if isinstance(outcome, Streamed):
            return SseResponse(outcome, request_id, expires=caller.expires)
        return self._json(result_response(request_id, outcome), 200)

    async def _owner(self, task_id: str | None, hop: bool) -> str | None:
        """The owner's URL when the request must be forwarded; None to serve it here. A hop is
        never forwarded again: its partition moved twice, so the client is told to retry."""
        if task_id is None or self.routing is None:
            return None
        owner = await self.routing.where(task_id)
        if owner is not None and hop:
            raise partition_moving_error(task_id)
        return owner

    async def _forward(
        self,
        request: Request,
        body: bytes,
        caller: Caller,
        owner: str,
        method: str,
        request_id: str | int | None = None,
    ) -> Response:
        """One hop: send the request to the owner and pass its answer back as it comes; when
        the owner cannot be asked, the retriable error answers ``request_id``."""
        if self.peers is None:  # the app builds routing that divides only with peers
            raise RuntimeError("a request to forward, but no peer client")
        # A HEAD (starlette serves it on the GET route) goes as the GET it stands for: the
        # answer to a HEAD has a length and no body, which the hop's parser cannot know.
        verb = "GET" if request.method == "HEAD" else request.method
        answer = await relay(
            self.peers, self.metrics, owner, method, verb, request.headers, body, caller
        )
        if answer is None:  # answered at once, told how long the group needs to notice
            error = owner_unavailable_error(self.peers.retry_after_s(owner))
            return self._json(error_response(request_id, error), 503, error)
        return answer

    def _refuse(
        self, method: str, request_id: str | int | None, error: RpcError, started: float
    ) -> Response:
        self.metrics.rpc(method, error.code, time.perf_counter() - started)
        return self._json(error_response(request_id, error), error.http_status, error)

    def _refuse_transport(self, request_id: str | int | None, answer: WireError) -> Response:
        """A GET's refusal: the JSON-RPC error, with the transport's status (never 2xx)."""
        status = answer.transport_status
        return self._json(error_response(request_id, answer.error), status, answer.error)

    def _notification(self, caller: Caller, inbound: Inbound) -> None:
        """``notifications/cancelled`` ends the caller's stream of that request; others are
        accepted and ignored (this server has no use for them)."""
        if inbound.rpc.method != "notifications/cancelled":
            return
        request_id = inbound.params.get("requestId")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            self._on_cancelled(caller.client, request_id)

    @staticmethod
    def _json(message: dict[str, Any], status: int, error: RpcError | None = None) -> Response:
        return Response(
            dumps(message),
            status_code=status,
            media_type="application/json",
            headers=retry_after(status, error),
        )

    async def not_allowed(self, request: Request) -> Response:
        return Response(status_code=405, headers={"Allow": "POST"})

    async def get(self, request: Request) -> Response:
        """Transport-level resume: ``GET /mcp`` with ``Last-Event-ID`` continues a tasks/stream."""
        cursor = request.headers.get("last-event-id")
        if cursor is None:
            return Response(status_code=405, headers={"Allow": "POST"})
        hop = from_peer_listener(request.scope)
        caller = self._hop(request, b"") if hop else self._gate(request)
        if isinstance(caller, Response):
            return caller
        try:
            request_id, task_id, seq = decode_cursor(cursor.strip())
        except ValueError:
            error = RpcError(INVALID_PARAMS, "Last-Event-ID is not a stream cursor")
            return self._json(error_response(None, error), 400)
        try:
            owner = await self._owner(task_id, hop)
            if owner is None:
                outcome = await self.handlers.open_stream(caller, request_id, task_id, seq)
        except Exception as exc:  # the table of every endpoint, with the transport's statuses
            return self._refuse_transport(request_id, wire_error(exc, task_id))
        if owner is not None:
            return await self._forward(request, b"", caller, owner, "tasks/stream", request_id)
        return SseResponse(outcome, request_id, expires=caller.expires)

"""One hop to a partition's owner: which requests are about a task, and how they are forwarded.

Where it sits: between the HTTP gate (the caller is verified) and the handlers. With
``replicas.ownership = "group"`` each replica indexes only its share of the events partitions
(bridge.log.indexer); a request about a task whose partition another replica owns is sent to
that owner's peer listener, once, and its response (JSON, or the SSE body as it is written) is
passed back.

Every hop is signed (:class:`~bridge.server.hops.PeerAuth`: the destination, the request and
the verified principal, with a timestamp and a nonce); the owner believes the principal only
from a valid signature, on its peer listener only, and a forwarded request is never forwarded
again (a partition moving twice is answered with the retriable error instead). The peer
listener may serve TLS (:func:`client_tls`).

:meth:`Peers.call` is the other kind of hop: a request of this replica's own, made for a verified
caller (a listen reading a task's state at its owner, a webhook delivery reading events there),
signed the same way, whose JSON-RPC result comes back as a dict.

What it does not do: decide ownership (the group does), check owner URLs (bridge.server.routing
does), or know what a method means beyond the task id it names (:func:`routed_task_id`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from bridge.config import PeerSettings
from bridge.server.classify import NAME_PARAM
from bridge.server.hops import REFUSED_HEADER, SIGNED_HEADERS, PeerAuth, PeerIdentity
from bridge.server.peerconn import HopTransport, origin_of, request_head
from bridge.server.routing import owner_unavailable_error
from bridge.server.suspects import ProbeFailed, Suspects, refused
from bridge.server.wire import (
    CLIENT_CAPS_META,
    LATEST_VERSION,
    PROTOCOL_VERSION_META,
    RpcError,
    dumps,
)

__all__ = [
    "FORWARDED_HEADERS",
    "PEER_HEALTH_PATH",
    "OwnerRefusedHop",
    "OwnerSuspected",
    "Peers",
    "client_tls",
    "routed_task_id",
    "server_tls",
]

log = logging.getLogger(__name__)

#: The peer listener's unauthenticated health check: it also opens spare hop connections.
PEER_HEALTH_PATH = "/healthz"

#: Headers of the client's request that the owner needs: exactly the signed ones.
FORWARDED_HEADERS = SIGNED_HEADERS

#: Methods whose params name the task they are about.
_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel", "tasks/stream"})
_EVENTS_METHODS = frozenset({"events/poll", "events/stream", "events/subscribe"})


def routed_task_id(method: str, params: Mapping[str, Any]) -> str | None:
    """The task a request is about, when the owner of its partition must serve it; else None.

    tasks/* name it in ``taskId``; the Events methods in ``arguments.taskId`` (the task's own
    event stream); a tools/call retried with ``requestState`` names the task it waits for.
    """
    if method in _TASK_METHODS:
        value = params.get("taskId")
    elif method in _EVENTS_METHODS:
        arguments = params.get("arguments")
        value = arguments.get("taskId") if isinstance(arguments, Mapping) else None
    elif method == "tools/call":
        value = params.get("requestState")
    else:
        return None
    return value if isinstance(value, str) and value else None


class OwnerSuspected(Exception):
    """The owner could not be connected to a moment ago: not tried again yet (the client gets
    ``owner_unavailable`` at once, told to retry after ``retry_after_s``)."""

    def __init__(self, owner: str, retry_after_s: int = 1) -> None:
        super().__init__(f"the replica at {owner} was unreachable a moment ago")
        self.retry_after_s = retry_after_s


class OwnerRefusedHop(Exception):
    """The owner's peer listener refused the hop: our signature (another secret, a clock too
    far off, or an advertised URL that is not where the request went: a misconfiguration to
    fix), or for now (its nonce memory full). The client gets ``owner_unavailable``."""

    def __init__(self, owner: str, reason: str) -> None:
        super().__init__(f"the replica at {owner} refused the signed hop ({reason})")
        self.reason = reason


def _hop_refusal(status: int, headers: Mapping[str, str]) -> str | None:
    """The reason when an answer (``status``, ``headers`` looked up by lower-case name) is the
    peer listener refusing the hop, not the owner's answer: marked by :data:`REFUSED_HEADER`
    (a 401 without it comes from a replica older than the marker, whose listener answered 401
    for a refused hop only)."""
    reason: str | None = headers.get(REFUSED_HEADER)
    if reason is None and status == 401:
        reason = "unauthorized"
    return reason


_FORWARDED = {name.encode("ascii"): name for name in FORWARDED_HEADERS}


def _forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    """The first value of each of :data:`FORWARDED_HEADERS` the client sent: one pass over an
    ASGI request's headers (lower-case names), one lookup per name otherwise."""
    raw: list[tuple[bytes, bytes]] | None = getattr(headers, "raw", None)
    if raw is None:
        return {k: v for k in FORWARDED_HEADERS if (v := headers.get(k)) is not None}
    sent: dict[str, str] = {}
    for key, value in raw:
        name = _FORWARDED.get(key)
        if name is not None and name not in sent:
            sent[name] = value.decode("latin-1")
    return sent


#: The owner's answer headers passed back to the client.
_PASSED_HEADERS = frozenset({"content-type", "cache-control", "retry-after", "www-authenticate"})


class _Reply(Protocol):
    """The owner's answer as :meth:`Peers.forward` reads it: a lean
    :class:`~bridge.server.peerconn.Answer`, or an httpx response (:class:`_HttpxReply`)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def ended(self) -> bool: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _HttpxReply:
    """An httpx response read as a :class:`_Reply` (a client given for tests or a
    simulation, whose transport is not the lean one)."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers: Mapping[str, str] = response.headers

    @property
    def ended(self) -> bool:
        return self._response.is_closed  # read to its end (httpx closes it then)

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.aiter_raw()

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        finally:
            await self._response.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()


def client_tls(settings: PeerSettings) -> ssl.SSLContext | bool:
    """How a replica verifies the owner it forwards to: the peer CA (system CAs when unset)
    for an ``https`` peer listener, presenting its own certificate under mutual TLS."""
    if settings.scheme == "http":
        return True  # unused: no TLS to verify
    ca = str(settings.tls_ca_file) if settings.tls_ca_file is not None else None
    context = ssl.create_default_context(cafile=ca)
    if settings.tls_client_auth and settings.tls_cert_file and settings.tls_key_file:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


async def _nothing() -> AsyncIterator[bytes]:
    empty: tuple[bytes, ...] = ()
    for chunk in empty:  # an async generator that yields nothing
        yield chunk


async def _closed() -> None:
    """Closing an answer that was read whole: nothing left to release."""


@dataclass
class Forwarded:
    """The owner's answer: status, the headers worth passing back, and the body: whole
    (``content``) for a JSON answer, as it comes (``body``) for an SSE stream."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]
    close: Any
    content: bytes | None = None


def server_tls(settings: PeerSettings) -> dict[str, Any]:
    """uvicorn's TLS options of the peer listener (none for ``http``); under mutual TLS a
    client certificate signed by the peer CA is required."""
    if settings.tls_cert_file is None:
        return {}
    mutual = settings.tls_client_auth
    return {
        "ssl_certfile": str(settings.tls_cert_file),
        "ssl_keyfile": str(settings.tls_key_file),
        "ssl_ca_certs": str(settings.tls_ca_file) if mutual else None,
        "ssl_cert_reqs": ssl.CERT_REQUIRED if mutual else ssl.CERT_NONE,
    }


#: Owners remembered (when each last answered) before what no longer matters is forgotten
#: (suspects are bounded on their own: :data:`bridge.server.suspects.MAX_SUSPECTS`).
MAX_REMEMBERED_OWNERS = 64


class Peers:
    """The HTTP clients of the hops (per process): one pool for forwarded requests, whose
    streams hold a connection each for as long as they run, and one for this replica's own
    calls (:meth:`call`), so that long streams can never starve the short calls.

    ``max_streams`` bounds the forwarding pool (a replica serves at most that many streams, so
    it forwards at most that many); ``keep_alive_s`` is the peer listeners' keep-alive: an idle
    connection is dropped here before the owner would close it, never reused as it closes.

    An owner that could not be connected to (refused, or no answer within ``connect_s``) is
    *suspected* (:mod:`bridge.server.suspects`): a request for it fails at once
    (:class:`OwnerSuspected`) instead of each one waiting on a dead peer, until the ownership
    map changes (``generation``) or the background probe of the owner (its delay backed off up
    to ``suspect_s``; 0 turns suspicion off) reaches it again. ``session_s`` is the group's
    session timeout (what a client is told to wait); ``on_suspected`` and ``on_refusing`` (an
    owner whose port kept refusing, see :class:`~bridge.server.suspects.Suspects`) and
    ``on_answered`` (each answer of an owner, or of its probe) are wired at composition;
    ``refusal_wait_s``: how soon the crash fail-over drops a refusing owner (None: off).
    """

    def __init__(
        self,
        auth: PeerAuth,
        timeout_s: float = 30.0,
        tls: ssl.SSLContext | bool = True,
        *,
        max_streams: int = 10_000,
        keep_alive_s: float = 5.0,
        connect_s: float = 2.0,
        suspect_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
        session_s: float = 10.0,
        refusals: int = 3,
        refusal_window_s: float = 5.0,
        generation: Callable[[], int] = lambda: 0,
        on_suspected: Callable[[], object] = lambda: None,
        on_refusing: Callable[[str], object] = lambda url: None,
        on_answered: Callable[[str], object] = lambda url: None,
        refusal_wait_s: float | None = None,
        stream_idle_s: float | None = None,
        tool_answer_s: float = 0.0,
    ) -> None:
        """``transport``: where requests go instead of the network (a simulation's replicas,
        in process); None for real connections. ``stream_idle_s``: the longest wait for the
        next bytes of an owner's answer (an owner's stream writes a keep-alive when idle;
        None: no bound); ``tool_answer_s``: how much longer a forwarded tool call's first
        answer may take (``tasks.direct_result_timeout_s``: the owner answers with the
        result)."""
        self.auth = auth
        self._transport = transport
        #: A call's answer is one JSON body: bound all of it (a forward's stream is not).
        self._call_timeout = httpx.Timeout(timeout_s, connect=connect_s)
        idle_s = max(0.5, keep_alive_s - 1.0)
        self._suspect_s = suspect_s
        self._first_answer_s = timeout_s
        self._clock = clock
        #: Owner URL -> when it last answered: a failure of a request begun before that
        #: suspects no one (the owner was seen alive since).
        self._answered: dict[str, float] = {}
        self._on_answered = on_answered
        #: The owners not tried by requests now (bounded: MAX_SUSPECTS).
        self.suspects = Suspects(
            self._probe,
            clock=clock,
            session_s=session_s,
            probe_first_s=min(0.25, suspect_s),
            probe_max_s=suspect_s,
            refusals=refusals,
            refusal_window_s=refusal_window_s,
            generation=generation,
            on_suspected=on_suspected,
            on_refusing=on_refusing,
            refusal_wait_s=refusal_wait_s,
        )
        # No read timeout in the pool: a forwarded stream is quiet between keep-alives;
        # connecting, the owner's first answer and each wait for its next bytes (a few
        # keep-alive intervals: an owner whose host vanished sends no FIN) are bounded.
        self._connect_s = connect_s
        self._stream_idle_s = stream_idle_s
        self._tool_answer_s = tool_answer_s
        #: The forwarding pool's connections: forward() writes its requests there itself.
        self._hops = HopTransport(tls, max_connections=max_streams, max_idle=64, idle_s=idle_s)
        self._client = self._pool(
            # A full pool fails fast (the retriable answer), never a 30 s wait for a slot.
            httpx.Timeout(timeout_s, read=None, connect=connect_s, pool=connect_s),
            self._hops,
        )
        self._lean_client = self._client
        self._calls = self._pool(
            self._call_timeout, HopTransport(tls, max_connections=100, idle_s=idle_s)
        )
        #: Owners a spare connection is being opened to (at most one at a time each).
        self._warming: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    def _pool(self, timeout: httpx.Timeout, transport: HopTransport) -> httpx.AsyncClient:
        # The lean transport (bridge.server.peerconn), or the one given for the network.
        client = httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
            transport=self._transport or transport,
        )
        # httpx adds ``Accept: */*`` to a request without one: a signed header the forwarding
        # replica did not sign (it signs a header's absence too).
        del client.headers["accept"]
        return client

    async def close(self) -> None:
        self._closing = True  # no spare is started from here on
        for task in list(self._warming.values()):
            task.cancel()
        await asyncio.gather(*self._warming.values(), return_exceptions=True)
        await self.suspects.close()
        await self._client.aclose()
        await self._calls.aclose()

    def _check_reachable(self, base_url: str) -> None:
        """Raise :class:`OwnerSuspected` while ``base_url`` is suspected."""
        if self.suspects.is_suspected(base_url):
            raise OwnerSuspected(base_url, self.suspects.retry_after_s(base_url))

    def retry_after_s(self, base_url: str) -> int:
        """Whole seconds a client should wait before retrying a request ``base_url`` could not
        answer (the time left for the group to notice it, when suspected; else 1)."""
        return self.suspects.retry_after_s(base_url)

    def _unreachable(self, base_url: str, exc: BaseException, started: float) -> None:
        """Suspect ``base_url`` when ``exc`` says it could not be connected to, or accepted
        the connection and never answered (a request begun at ``started``, unless the owner
        has answered another request since)."""
        silent = isinstance(exc, TimeoutError)
        unconnected = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
        if started < self._answered.get(base_url, float("-inf")):
            return
        if (unconnected or silent) and self._suspect_s > 0:
            self.suspects.suspect(base_url, exc)

    async def _probe(self, base_url: str) -> None:
        """Reach ``base_url``'s peer listener once (its health check: any answer will do), or
        :class:`~bridge.server.suspects.ProbeFailed`; bounded by the calls' timeouts."""
        try:
            async with asyncio.timeout(self._first_answer_s):  # the whole answer, not each read
                await self._calls.get(f"{base_url}{PEER_HEALTH_PATH}", timeout=self._call_timeout)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise ProbeFailed(refused(exc)) from None
        self._answered[base_url] = self._clock()
        self._on_answered(base_url)

    def _seen_alive(self, base_url: str) -> None:
        """``base_url`` answered now. Owners come and go (a restarted pod may get a new URL),
        so what no longer matters is forgotten: an answer older than any request that can
        still fail (each is bounded by the first-answer bound)."""
        self._answered[base_url] = self._clock()
        self._on_answered(base_url)
        self.suspects.clear(base_url)
        if len(self._answered) > MAX_REMEMBERED_OWNERS:
            horizon = self._answered[base_url] - self._first_answer_s
            self._answered = {u: t for u, t in self._answered.items() if t >= horizon}

    def _spare(self, base_url: str) -> None:
        """Open a kept-alive connection to ``base_url`` off the critical path, after a
        forwarded stream's connection was dropped.

        A client usually leaves a stream before it ends (it has what it wanted, or it resumes
        later), and an HTTP/1.1 response cannot be abandoned without closing its connection:
        so every forwarded stream would pay a new TCP connect (and a TLS handshake) to the
        owner, on the time to its first event. A cheap request to the peer listener's
        ``/healthz`` leaves a connection in the pool for the next hop instead. At most one is
        in flight per owner; failures are ignored (the next hop connects as before).
        """
        if base_url in self._warming or self._closing:
            return
        task = asyncio.create_task(self._open_spare(base_url), name=f"peer-spare {base_url}")
        self._warming[base_url] = task
        task.add_done_callback(lambda _: self._warming.pop(base_url, None))

    async def spares_opened(self) -> None:
        """Wait until the spare connections being opened now are open (or failed)."""
        await asyncio.gather(*self._warming.values(), return_exceptions=True)

    async def _open_spare(self, base_url: str) -> None:
        started = self._clock()
        try:
            async with asyncio.timeout(self._first_answer_s):  # the whole answer, not each read
                await self._client.get(f"{base_url}{PEER_HEALTH_PATH}", timeout=self._call_timeout)
        except Exception as exc:  # a spare is an optimisation: the next hop connects itself
            self._unreachable(base_url, exc, started)
            log.debug("no spare connection to %s: %s", base_url, type(exc).__name__)

    async def forward(
        self,
        base_url: str,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        identity: PeerIdentity,
        path: str = "/mcp",
        *,
        tool_call: bool = False,
    ) -> Forwarded:
        """Send the request to the owner's peer listener at ``base_url`` (at ``path``:
        ``/mcp``, or a browser view's GET, whose query carries no credential); the body streams
        back. :class:`OwnerRefusedHop` when the owner's peer listener refused the hop.
        A streamed answer writes a keep-alive when idle, so each wait for its next bytes is
        bounded (``stream_idle_s``); not a ``tool_call``'s: its answer waits for the tool's
        result (``tool_answer_s`` more for the first answer) and its progress stream writes no
        keep-alive."""
        self._check_reachable(base_url)
        sent = _forwarded(headers)
        sent.update(self.auth.sign(base_url, method, path, sent, body, identity))
        started = self._clock()
        # The owner's first answer (the head of a stream, or a whole JSON answer) is bounded:
        # no read bound after a stream's head, so it may stay quiet between its keep-alives.
        bound = self._first_answer_s + (self._tool_answer_s if tool_call else 0.0)
        deadline = asyncio.get_running_loop().time() + bound
        try:
            async with asyncio.timeout_at(deadline):
                idle_s = None if tool_call else self._stream_idle_s
                reply = await self._send(base_url, method, path, sent, body, idle_s)
        except (httpx.HTTPError, TimeoutError) as exc:
            self._unreachable(base_url, exc, started)
            raise
        self._seen_alive(base_url)
        refusal = _hop_refusal(reply.status, reply.headers)
        if refusal is not None:  # never the client's answer: http.py maps it once
            await reply.aclose()
            log.warning("%s refused a signed hop (%s)", base_url, refusal)
            raise OwnerRefusedHop(base_url, refusal)
        passed = {k: v for k, v in reply.headers.items() if k.lower() in _PASSED_HEADERS}
        if "text/event-stream" not in reply.headers.get("content-type", ""):
            # A JSON answer is small and whole: passed back as the bytes it is, with its
            # length, never parsed here nor streamed chunk by chunk. Read within the first
            # answer's bound: nothing cancels a JSON request whose client has left.
            async with asyncio.timeout_at(deadline):
                content = await reply.read()
            return Forwarded(reply.status, passed, _nothing(), _closed, content)

        async def close() -> None:
            ended = reply.ended
            await reply.aclose()
            if not ended:  # its connection was dropped with it: prepare the next hop's
                self._spare(base_url)

        return Forwarded(reply.status, passed, reply.chunks(), close)

    async def _send(
        self,
        base_url: str,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        idle_s: float | None = None,
    ) -> _Reply:
        """One request to the owner: written straight to a kept-alive connection of the lean
        pool (no httpx request or response objects: the hop's CPU is the cluster's capacity),
        or through httpx when the forwarding client was replaced (tests, a simulation)."""
        if self._client is not self._lean_client or self._transport is not None:
            request = self._client.build_request(
                method, f"{base_url}{path}", headers=headers, content=body
            )
            return _HttpxReply(await self._client.send(request, stream=True))
        origin, host = origin_of(base_url)
        fields = [("host", host), *headers.items()]
        if body or method == "POST":
            fields.append(("content-length", str(len(body))))
        head = request_head(method, path, fields)
        return await self._hops.send(
            origin, head, body, connect_s=self._connect_s, body_read_s=idle_s
        )

    async def call(
        self,
        base_url: str,
        method: str,
        params: Mapping[str, Any],
        identity: PeerIdentity,
    ) -> dict[str, Any]:
        """One JSON-RPC request to the replica at ``base_url`` on behalf of ``identity``; its
        result. The owner's error is raised as :class:`RpcError` (with its HTTP status); an
        owner that does not answer, or not in JSON-RPC, is the retriable ``owner_unavailable``.

        ``params._meta`` may carry the client capabilities the request needs; the protocol
        version is added here.
        """
        given = params.get("_meta")
        meta = {CLIENT_CAPS_META: {}, **(given if isinstance(given, Mapping) else {})}
        meta[PROTOCOL_VERSION_META] = LATEST_VERSION
        sent = {**params, "_meta": meta}
        body = dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": sent}).encode()
        try:
            self._check_reachable(base_url)
        except OwnerSuspected as suspected:
            raise owner_unavailable_error(suspected.retry_after_s) from None  # logged once
        headers = _request_headers(method, sent)
        headers.update(self.auth.sign(base_url, "POST", "/mcp", headers, body, identity))
        started = self._clock()
        try:
            try:
                # The whole answer within the bound, not only each wait for its bytes.
                async with asyncio.timeout(self._first_answer_s):
                    reply = await self._calls.post(f"{base_url}/mcp", content=body, headers=headers)
            except (httpx.HTTPError, TimeoutError) as exc:
                self._unreachable(base_url, exc, started)
                raise
            self._seen_alive(base_url)
            if (
                refusal := _hop_refusal(reply.status_code, reply.headers)
            ) is not None:  # not the caller's credential
                raise _unavailable(method, base_url, f"the owner refused the hop ({refusal})")
            message = reply.json()
        except (httpx.HTTPError, ValueError, TimeoutError) as exc:
            retry = self.retry_after_s(base_url)  # the time left, when it is now suspected
            raise _unavailable(method, base_url, type(exc).__name__, retry) from None
        if not isinstance(message, dict):
            raise _unavailable(method, base_url, f"HTTP {reply.status_code}")
        if isinstance(message.get("result"), dict):
            return dict(message["result"])
        error = message.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("code"), int):
            raise _unavailable(method, base_url, f"HTTP {reply.status_code}")
        raise RpcError(
            error["code"],
            str(error.get("message", "")),
            error.get("data"),
            http_status=reply.status_code,
        )


def _request_headers(method: str, params: Mapping[str, Any]) -> dict[str, str]:
    """What a 2026-07-28 request carries besides its body: the routing headers."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": LATEST_VERSION,
        "mcp-method": method,
    }
    name = params.get(NAME_PARAM.get(method, ""))
    if isinstance(name, str):
        headers["mcp-name"] = _name_header(name)
    return headers


def _name_header(value: str) -> str:
    """``Mcp-Name`` as written, or in the ``=?base64?…?=`` form when it is not plain ASCII."""
    if value.isascii() and value.isprintable() and value == value.strip():
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def _unavailable(method: str, base_url: str, why: str, retry_after_s: int = 1) -> RpcError:
    log.warning("%s at %s did not answer: %s", method, base_url, why)
    return owner_unavailable_error(retry_after_s)

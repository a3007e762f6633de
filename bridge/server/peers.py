"""One hop to a partition's owner: which requests are about a task, and how they are forwarded.

Where it sits: between the HTTP gate (the caller is verified) and the handlers. With
``ownership = "group"`` each replica indexes only its share of the events partitions
(bridge.log.indexer); a request about a task whose partition another replica owns is sent to
that owner, once, and its response (JSON, or the SSE body as it is written) is passed back.

The hop is authenticated with the shared peer secret: the forwarding replica signs the verified
principal, the client key the limits count, a timestamp, the method, and the body (HMAC-SHA256,
:class:`PeerAuth`). The owner believes a principal only from a valid signature made within the
last minute; a client cannot forge one without the secret, and a forwarded request is never
forwarded again (a partition moving twice is answered with the retriable error instead).

:meth:`Peers.call` is the other kind of hop: a request of this replica's own, made for a verified
caller (a listen reading a task's state at its owner, a webhook delivery reading events there),
signed the same way, whose JSON-RPC result comes back as a dict.

What it does not do: decide ownership (the group does) or know what a method means beyond the
task id it names (:func:`routed_task_id`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from bridge.server.classify import NAME_PARAM
from bridge.server.routing import RETRY_AFTER_MS
from bridge.server.wire import (
    CLIENT_CAPS_META,
    INTERNAL_ERROR,
    LATEST_VERSION,
    PROTOCOL_VERSION_META,
    RpcError,
    dumps,
)

__all__ = [
    "FORWARDED_HEADERS",
    "PeerAuth",
    "PeerIdentity",
    "Peers",
    "hop_target",
    "routed_task_id",
]

log = logging.getLogger(__name__)

_PRINCIPAL = "x-bridge-peer-principal"
_CLIENT = "x-bridge-peer-client"
_TIME = "x-bridge-peer-time"
_SIGNATURE = "x-bridge-peer-signature"
#: Headers of the client's request that the owner needs (never Authorization or cookies: the
#: owner trusts the signed principal, and a credential must not travel further than needed).
FORWARDED_HEADERS = (
    "accept",
    "content-type",
    "last-event-id",
    "mcp-method",
    "mcp-name",
    "mcp-protocol-version",
    "mcp-session-id",
)
#: How old a signed hop may be (clock skew between replicas included).
_MAX_AGE_S = 60

#: Methods whose params name the task they are about.
_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel", "tasks/stream"})
_EVENTS_METHODS = frozenset({"events/poll", "events/stream", "events/subscribe"})


def hop_target(method: str, headers: Mapping[str, str], path: str = "/mcp") -> str:
    """What a hop's signature covers besides the body: the HTTP method, the path (with its
    query: the browser view's GETs name their task and cursor there), and the resume cursor
    of a ``GET`` (a header, so that it cannot be swapped under a valid signature)."""
    return f"{method} {path} {headers.get('last-event-id', '')}"


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


@dataclass(frozen=True)
class PeerIdentity:
    """Who a forwarded request is from, as the signature vouches."""

    principal: str
    client: str


class PeerAuth:
    """Signs and checks hops with the shared secret (never in a repr or a log)."""

    def __init__(self, secret: str, clock: Any = time.time) -> None:
        self._key = hashlib.sha256(b"mcp-kafka-bridge peer hop\0" + secret.encode()).digest()
        self._clock = clock

    def __repr__(self) -> str:
        return "PeerAuth(<secret>)"

    def _mac(self, stamp: str, principal: str, client: str, what: str, body: bytes) -> str:
        message = b"\n".join(s.encode("utf-8") for s in (stamp, principal, client, what))
        return hmac.new(self._key, message + b"\n" + body, hashlib.sha256).hexdigest()

    def sign(self, identity: PeerIdentity, what: str, body: bytes) -> dict[str, str]:
        """The headers that carry ``identity`` with the request ``what`` (method and target)."""
        stamp = str(int(self._clock()))
        mac = self._mac(stamp, identity.principal, identity.client, what, body)
        return {
            _PRINCIPAL: _header_safe(identity.principal),
            _CLIENT: _header_safe(identity.client),
            _TIME: stamp,
            _SIGNATURE: mac,
        }

    @staticmethod
    def is_hop(headers: Mapping[str, str]) -> bool:
        return _SIGNATURE in headers

    def verify(self, headers: Mapping[str, str], what: str, body: bytes) -> PeerIdentity | None:
        """The identity a valid, fresh signature vouches for; None otherwise."""
        try:
            stamp = headers[_TIME]
            principal = _header_value(headers[_PRINCIPAL])
            client = _header_value(headers[_CLIENT])
            signature = headers[_SIGNATURE]
            age = abs(self._clock() - int(stamp))
        except (KeyError, ValueError):
            return None
        if age > _MAX_AGE_S:
            return None
        expected = self._mac(stamp, principal, client, what, body)
        if not hmac.compare_digest(expected, signature):
            return None
        return PeerIdentity(principal, client)


def _header_safe(value: str) -> str:
    # A principal may hold any character (a JWT claim); percent-encode to stay a header value.
    from urllib.parse import quote

    return quote(value, safe="")


def _header_value(value: str) -> str:
    from urllib.parse import unquote

    return unquote(value, errors="strict")


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


class Peers:
    """The HTTP client of the hops (one connection pool per process)."""

    def __init__(self, auth: PeerAuth, timeout_s: float = 30.0) -> None:
        self.auth = auth
        #: A call's answer is one JSON body: bound all of it (a forward's stream is not).
        self._call_timeout = httpx.Timeout(timeout_s)
        # No read timeout: a forwarded stream is quiet between keep-alives for as long as the
        # owner's stream is; connecting and the owner's first answer are bounded.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, read=None),
            follow_redirects=False,
            trust_env=False,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def forward(
        self,
        base_url: str,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        identity: PeerIdentity,
        path: str = "/mcp",
    ) -> Forwarded:
        """Send the request to the owner at ``base_url`` (at ``path``: ``/mcp``, or a browser
        view's GET, whose query carries no credential); the body streams back."""
        sent = {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}
        sent.update(self.auth.sign(identity, hop_target(method, headers, path), body))
        request = self._client.build_request(
            method, f"{base_url}{path}", headers=sent, content=body
        )
        response = await self._client.send(request, stream=True)
        passed = {
            k: v
            for k, v in response.headers.items()
            if k.lower() in ("content-type", "cache-control", "retry-after", "www-authenticate")
        }
        if "text/event-stream" not in response.headers.get("content-type", ""):
            # A JSON answer is small and whole: passed back with its length, not streamed
            # chunk by chunk (which cost both replicas a chunked response).
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            return Forwarded(response.status_code, passed, _nothing(), _closed, content)
        return Forwarded(response.status_code, passed, response.aiter_raw(), response.aclose)

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
        headers = _request_headers(method, sent)
        headers.update(self.auth.sign(identity, hop_target("POST", {}), body))
        try:
            reply = await self._client.post(
                f"{base_url}/mcp", content=body, headers=headers, timeout=self._call_timeout
            )
            message = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise _unavailable(method, base_url, type(exc).__name__) from None
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


def _unavailable(method: str, base_url: str, why: str) -> RpcError:
    log.warning("%s at %s did not answer: %s", method, base_url, why)
    return RpcError(
        INTERNAL_ERROR,
        "The replica that owns this task did not answer; retry shortly",
        {"reason": "owner_unavailable", "retryAfterMs": RETRY_AFTER_MS},
        http_status=503,
    )

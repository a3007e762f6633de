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

What it does not do: decide ownership (the group does) or know what a method means beyond the
task id it names (:func:`routed_task_id`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

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


def hop_target(method: str, headers: Mapping[str, str]) -> str:
    """What a hop's signature covers besides the body: the HTTP method, and the resume cursor
    of a ``GET`` (a header, so that it cannot be swapped under a valid signature)."""
    return f"{method} /mcp {headers.get('last-event-id', '')}"


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


@dataclass
class Forwarded:
    """The owner's answer: status, the headers worth passing back, and the body as it comes."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]
    close: Any


class Peers:
    """The HTTP client of the hops (one connection pool per process)."""

    def __init__(self, auth: PeerAuth, timeout_s: float = 30.0) -> None:
        self.auth = auth
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
    ) -> Forwarded:
        """Send the request to the owner at ``base_url``; the body streams back."""
        sent = {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}
        sent.update(self.auth.sign(identity, hop_target(method, headers), body))
        request = self._client.build_request(method, f"{base_url}/mcp", headers=sent, content=body)
        response = await self._client.send(request, stream=True)
        passed = {
            k: v
            for k, v in response.headers.items()
            if k.lower() in ("content-type", "cache-control", "retry-after", "www-authenticate")
        }
        return Forwarded(response.status_code, passed, response.aiter_raw(), response.aclose)

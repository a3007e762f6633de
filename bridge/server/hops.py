"""The signed hop: how a replica vouches for its verified caller to the partition's owner.

Where it sits: the forwarding replica (bridge.server.peers) signs every request it sends to a
peer; the owner's peer listener (bridge.server.app ``create_peer_app``) checks the signature
before anything else, and believes the principal it carries. The public listener never looks
at these headers.

What is signed (HMAC-SHA256 under a key derived from the peer secret) is one canonical,
length-prefixed encoding of everything that decides the answer: the destination (the owner's
peer origin, so a hop sent to one replica is worthless at another), the HTTP method, the path
with its query, every forwarded header that reaches the handlers (present or absent), the
principal and the client key, the body's SHA-256, the timestamp and a random 128-bit nonce.
Each field is written as its 4-byte length then its bytes, so no value (a principal holding a
newline) can move bytes from one field to another. The owner accepts a timestamp within
``max_age_s`` of its clock and each nonce once (:class:`SeenNonces`).

What it does not do: send anything, or decide which requests are hops (the listener does).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import secrets
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import quote, unquote

from bridge.keyring import PurposeKey

__all__ = [
    "HOP_HEADERS",
    "REFUSED_HEADER",
    "SIGNED_HEADERS",
    "HopRefused",
    "PeerAuth",
    "PeerIdentity",
    "RefusalReason",
    "SeenNonces",
    "canonical",
    "from_peer_listener",
    "mark_peer_listener",
]

_PRINCIPAL = "x-bridge-peer-principal"
_CLIENT = "x-bridge-peer-client"
_TIME = "x-bridge-peer-time"
_NONCE = "x-bridge-peer-nonce"
_TO = "x-bridge-peer-to"
_SIGNATURE = "x-bridge-peer-signature"
#: Set on every refusal of the peer listener (its value the reason): what tells the forwarding
#: replica that the owner refused the hop itself, not answered the client's request.
REFUSED_HEADER = "x-bridge-peer-refused"
#: The headers a hop adds to the request it forwards.
HOP_HEADERS = (_PRINCIPAL, _CLIENT, _TIME, _NONCE, _TO, _SIGNATURE)
#: The client's headers a hop carries to the owner, each covered by the signature whether it
#: is present or not (never Authorization or cookies: the owner trusts the signed principal,
#: and a credential must not travel further than needed).
SIGNED_HEADERS = (
    "accept",
    "content-type",
    "last-event-id",
    "mcp-method",
    "mcp-name",
    "mcp-protocol-version",
    "mcp-session-id",
)
_DOMAIN = b"mcp-kafka-bridge peer hop v2"
#: The ASGI scope key the peer listener's app sets (no client can set a scope key).
_PEER_LISTENER = "mcp_bridge.peer_listener"
_NONCE_BYTES = 16

#: Why a hop was refused: the label values of ``bridge_peer_hops_refused_total``.
RefusalReason = Literal[
    "missing",  # no signature at all
    "malformed",  # a hop header missing, repeated or unreadable
    "destination",  # signed for another replica
    "signature",  # the MAC does not match (tampered, or another secret)
    "stale",  # the timestamp is outside the window
    "replay",  # the nonce was seen within the window
    "nonces_full",  # the nonce memory is full: refused rather than forgotten
    "owner_url",  # an owner URL from the group that is no peer listener of ours
]


class HopRefused(Exception):
    """A hop that is not believed, with the reason (a metric label; never a secret)."""

    def __init__(self, reason: RefusalReason) -> None:
        super().__init__(f"peer hop refused: {reason}")
        self.reason: RefusalReason = reason

    @property
    def retriable(self) -> bool:
        """Whether the same hop, signed again later, may pass (the nonce memory was full)."""
        return self.reason == "nonces_full"


@dataclass(frozen=True)
class PeerIdentity:
    """Who a forwarded request is from, as the signature vouches."""

    principal: str
    client: str


class Headers(Protocol):
    """What :meth:`PeerAuth.verify` reads of a request's headers (starlette's ``Headers``,
    whose ``raw`` list is read in one pass when it has one)."""

    def getlist(self, key: str) -> list[str]: ...


#: The headers :meth:`PeerAuth.verify` reads, by their lower-case wire names.
_READ = {name.encode("ascii"): name for name in (*HOP_HEADERS, *SIGNED_HEADERS)}


def _values(headers: Headers) -> dict[str, list[str]]:
    """Each header of the hop and each signed header: its values (one pass over an ASGI
    request's headers, whose names are lower case; one lookup per name otherwise)."""
    raw: list[tuple[bytes, bytes]] | None = getattr(headers, "raw", None)
    if raw is None:
        return {name: headers.getlist(name) for name in _READ.values()}
    found: dict[str, list[str]] = {name: [] for name in _READ.values()}
    for key, value in raw:
        name = _READ.get(key)
        if name is not None:
            found[name].append(value.decode("latin-1"))
    return found


def mark_peer_listener(scope: MutableMapping[str, Any]) -> None:
    """Mark a request as one that arrived on the peer listener (its app does, and only it)."""
    scope[_PEER_LISTENER] = True


def from_peer_listener(scope: Mapping[str, Any]) -> bool:
    """Whether the request arrived on the peer listener: only there is a hop believed."""
    return scope.get(_PEER_LISTENER) is True


def canonical(fields: Sequence[bytes]) -> bytes:
    """Each field as its length (4 bytes, big-endian) followed by its bytes: injective."""
    return b"".join(map(_field, fields))


def _field(value: bytes) -> bytes:
    """One field of :func:`canonical`."""
    return len(value).to_bytes(4, "big") + value


def _text(value: str) -> bytes:
    # surrogatepass: a principal from a JWT may hold a lone surrogate; still one-to-one.
    return value.encode("utf-8", "surrogatepass")


def _header_field(value: str | None) -> bytes:
    # Absent and empty are different requests: a presence byte tells them apart.
    return _ABSENT if value is None else _field(b"\x01" + _text(value))


# The constant fields of every hop's canonical encoding, encoded once (the same bytes).
_ABSENT = _field(b"\x00")
_DOMAIN_FIELD = _field(_DOMAIN)
_NAME_FIELDS = tuple((name, _field(name.encode("ascii"))) for name in SIGNED_HEADERS)


class SeenNonces:
    """The nonces of accepted hops until their timestamps leave the window: a replay is
    refused. Bounded: at ``capacity`` a new nonce is refused (never an old one forgotten, which
    would let its hop be replayed) until entries expire."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._expiry: dict[bytes, float] = {}
        self._by_expiry: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def add(self, nonce: bytes, expires: float, now: float) -> None:
        """Remember ``nonce`` until ``expires``; :class:`HopRefused` if it is remembered
        already (``replay``) or there is no room (``nonces_full``)."""
        self._forget_expired(now)
        if nonce in self._expiry:
            raise HopRefused("replay")
        if len(self._expiry) >= self.capacity:
            raise HopRefused("nonces_full")
        self._expiry[nonce] = expires
        heapq.heappush(self._by_expiry, (expires, nonce))

    def _forget_expired(self, now: float) -> None:
        heap = self._by_expiry
        while heap and heap[0][0] <= now:
            _, nonce = heapq.heappop(heap)
            del self._expiry[nonce]


class PeerAuth:
    """Signs hops for a destination, and checks the hops addressed to this replica.

    ``own_origin``: this replica's peer origin (``scheme://host:port``), which a hop to it
    must be signed for; None for a replica that only sends. The secret is never in a repr.
    """

    def __init__(
        self,
        secret: str,
        own_origin: str | None = None,
        *,
        max_age_s: float = 10.0,
        max_nonces: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = PurposeKey(secret.encode(), _DOMAIN)
        self.own_origin = own_origin
        self.max_age_s = max_age_s
        self._nonces = SeenNonces(max_nonces)
        self._clock = clock

    def __repr__(self) -> str:
        return f"PeerAuth(<secret>, own_origin={self.own_origin!r})"

    def _mac(
        self,
        destination: str,
        method: str,
        path: str,
        headers: Mapping[str, str | None],
        identity: PeerIdentity,
        body: bytes,
        stamp: str,
        nonce: bytes,
    ) -> str:
        # canonical() of the fields, its constant parts encoded once (a hop's CPU is capacity).
        parts = [_DOMAIN_FIELD, _field(_text(destination)), _field(_text(method))]
        parts.append(_field(_text(path)))
        for name, name_field in _NAME_FIELDS:
            parts += (name_field, _header_field(headers.get(name)))
        parts += (
            _field(_text(identity.principal)),
            _field(_text(identity.client)),
            _field(hashlib.sha256(body).digest()),
            _field(stamp.encode("ascii")),
            _field(nonce),
        )
        return self._key.mac(b"".join(parts)).hex()

    def sign(
        self,
        destination: str,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        identity: PeerIdentity,
    ) -> dict[str, str]:
        """The hop headers for a request to ``destination`` (the owner's peer origin) that
        carries exactly ``headers`` of :data:`SIGNED_HEADERS` and ``body``."""
        stamp = str(int(self._clock() * 1000))
        nonce = secrets.token_bytes(_NONCE_BYTES)
        present = {k.lower(): v for k, v in headers.items() if k.lower() in SIGNED_HEADERS}
        mac = self._mac(destination, method, path, present, identity, body, stamp, nonce)
        return {
            _PRINCIPAL: quote(identity.principal, safe="", errors="surrogatepass"),
            _CLIENT: quote(identity.client, safe="", errors="surrogatepass"),
            _TIME: stamp,
            _NONCE: base64.urlsafe_b64encode(nonce).decode("ascii").rstrip("="),
            _TO: destination,
            _SIGNATURE: mac,
        }

    def verify(self, method: str, path: str, headers: Headers, body: bytes) -> PeerIdentity:
        """The identity a hop to this replica vouches for; :class:`HopRefused` otherwise.

        Checked in this order: the hop headers (each exactly once), the destination, the
        signature, the timestamp, then the nonce (remembered only for a hop that passed all
        the rest, so nobody without the secret can fill the memory).
        """
        given = _values(headers)
        if not given[_SIGNATURE]:
            raise HopRefused("missing")
        if self.own_origin is None:
            raise HopRefused("destination")
        values = {name: _one(given[name]) for name in HOP_HEADERS}
        signed = {name: _optional(given[name]) for name in SIGNED_HEADERS}
        stamp = values[_TIME]
        if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 15):
            raise HopRefused("malformed")
        if not values[_SIGNATURE].isascii():  # compare_digest raises on non-ASCII str
            raise HopRefused("malformed")
        try:
            nonce = _nonce(values[_NONCE])
            identity = PeerIdentity(
                unquote(values[_PRINCIPAL], errors="surrogatepass"),
                unquote(values[_CLIENT], errors="surrogatepass"),
            )
        except (ValueError, binascii.Error):
            raise HopRefused("malformed") from None
        if values[_TO] != self.own_origin:
            raise HopRefused("destination")
        expected = self._mac(self.own_origin, method, path, signed, identity, body, stamp, nonce)
        if not hmac.compare_digest(expected, values[_SIGNATURE]):
            raise HopRefused("signature")
        now, sent = self._clock(), int(stamp) / 1000
        if abs(now - sent) > self.max_age_s:
            raise HopRefused("stale")
        self._nonces.add(nonce, sent + self.max_age_s, now)
        return identity


def _one(values: list[str]) -> str:
    if len(values) != 1:
        raise HopRefused("malformed")
    return values[0]


def _optional(values: list[str]) -> str | None:
    # A signed header given twice is ambiguous (which one would a handler read?): refused.
    if len(values) > 1:
        raise HopRefused("malformed")
    return values[0] if values else None


def _nonce(text: str) -> bytes:
    nonce = base64.urlsafe_b64decode(text + "==")  # 16 bytes are 22 characters, unpadded
    if len(text) != 22 or len(nonce) != _NONCE_BYTES:
        raise ValueError("not a nonce")
    return nonce

"""Webhook delivery of the Events extension (SEP-3415): sign, check the callback, POST once, judge.

Where it sits: a webhook subscription's delivery loop (wired elsewhere, with the subscriptions and
their durable positions) hands one body to :class:`WebhookSender`. This module signs it with
Standard Webhooks (the ``standardwebhooks`` library: no HMAC code of ours), resolves the callback
host at delivery time and refuses addresses that are not globally routable unless allowlisted,
POSTs once to the very address it checked (no second resolution, no redirects, https only), and
classifies the answer as the draft does. :class:`RetryPolicy` says how long to wait before the
next attempt and when to give up; :func:`deliver` runs that loop.

What it does not do: hold subscriptions, cursors or delivery status, or know JSON-RPC.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import hmac
import ipaddress
import json
import random
import secrets as tokens
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from bridge import strictjson

__all__ = [
    "MAX_ANSWER_BYTES",
    "SUBSCRIPTION_ID_HEADER",
    "AddressPolicy",
    "CallbackRefused",
    "InvalidSecret",
    "Outcome",
    "RetryPolicy",
    "Verdict",
    "WebhookSender",
    "check_secret",
    "classify_status",
    "control_message_id",
    "deliver",
    "is_forbidden_address",
    "signature_headers",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Resolves a host name (and port) to the addresses a connection could go to.
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

#: The one MCP-specific header: lets the receiver pick the secret before parsing the body.
SUBSCRIPTION_ID_HEADER = "X-MCP-Subscription-Id"
_SECRET_PREFIX = "whsec_"
_SECRET_BYTES = range(24, 65)
#: A challenge answer is a few dozen bytes; an endpoint cannot make us read more than this many
#: bytes off the wire (counted raw: nothing is ever decompressed).
MAX_ANSWER_BYTES = 4096


class InvalidSecret(ValueError):
    """A ``delivery.secret`` that is not ``whsec_`` + base64 of 24 to 64 bytes."""

    def __str__(self) -> str:
        return "the secret must be whsec_ followed by base64 of 24 to 64 bytes"


def check_secret(secret: str) -> str:
    """Return ``secret`` if it is a Standard Webhooks secret the draft accepts, else raise."""
    if not secret.startswith(_SECRET_PREFIX):
        raise InvalidSecret
    try:
        key = base64.b64decode(secret.removeprefix(_SECRET_PREFIX), validate=True)
    except binascii.Error as exc:
        raise InvalidSecret from exc
    if len(key) not in _SECRET_BYTES:
        raise InvalidSecret
    return secret


def signature_headers(
    msg_id: str, body: bytes, secrets: Sequence[str], now: datetime
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt, signed once per secret.

    During a rotation the draft asks for both the old and the new secret: the library signs
    with one secret, so each is signed separately and the ``v1,`` signatures are joined with
    spaces, as Standard Webhooks allows; a receiver accepts the body if any of them verifies.
    """
    if not secrets:
        raise ValueError("a delivery needs at least one secret")
    timestamp = int(now.timestamp())
    # The library signs floor(timestamp) of a UTC datetime: give it exactly the header's second.
    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    text = body.decode()
    signatures = " ".join(Webhook(secret).sign(msg_id, signed_at, text) for secret in secrets)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


def control_message_id(kind: str) -> str:
    """A ``webhook-id`` for a control envelope (``gap``, ``terminated``, ``verification``)."""
    return f"msg_{kind}_{tokens.token_hex(16)}"  # 128 random bits


class Verdict(enum.StrEnum):
    """What the caller does after one attempt."""

    #: 2xx: accepted; never send this body again.
    DELIVERED = "delivered"
    #: 429, 5xx, other non-2xx, timeouts, unreachable: try again per :class:`RetryPolicy`.
    RETRY = "retry"
    #: 410 (the receiver rejects this delivery on purpose) or 413 (the body is too large):
    #: give this delivery up, without retrying; the subscription itself is unaffected.
    ABANDON = "abandon"
    #: The callback failed the SSRF checks: nothing was sent, and retrying will not help.
    REFUSED = "refused"


@dataclass(frozen=True)
class Outcome:
    """One attempt, as the subscription's delivery status may report it.

    ``error`` is one of the draft's ``lastError`` categories (``connection_refused``,
    ``timeout``, ``tls_error``, ``http_4xx``, ``http_5xx``, ``challenge_failed``) or None on
    success: never the endpoint's own words, so that it cannot serve as a response oracle.
    """

    verdict: Verdict
    error: str | None = None
    status: int | None = None


def classify_status(status: int) -> Outcome:
    """Judge an HTTP status as the draft does: 2xx delivered, 410/413 abandoned, else retried.

    A 3xx is a failure like any non-2xx (redirects are never followed): the draft has no
    ``lastError`` category for it, and it is reported as ``http_4xx``, the endpoint's mistake.
    """
    if 200 <= status < 300:
        return Outcome(Verdict.DELIVERED, None, status)
    category = "http_5xx" if status >= 500 else "http_4xx"
    if status in (410, 413):
        return Outcome(Verdict.ABANDON, category, status)
    return Outcome(Verdict.RETRY, category, status)


class CallbackRefused(Exception):
    """The callback URL fails the SSRF checks; no connection was made."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, reason)
        self.url = url
        self.reason = reason

    def __str__(self) -> str:
        return f"webhook callback {self.url} refused: {self.reason}"


def is_forbidden_address(address: IPAddress) -> bool:
    """True unless ``address`` is globally routable (IANA special-purpose registries)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 reaches 127.0.0.1: judge the IPv4 address it carries.
        address = address.ipv4_mapped
    # is_global alone lets some multicast ranges through: check every flag explicitly.
    return (
        not address.is_global
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


@dataclass(frozen=True)
class AddressPolicy:
    """Which callback addresses are allowed: the global ones, plus an explicit allowlist.

    An allowlist entry is a host name (every address it resolves to is allowed) or a CIDR
    (``127.0.0.0/8``, ``::1/128``); it is how a test or a private deployment reaches loopback.
    """

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_allowlist(cls, entries: Iterable[str]) -> AddressPolicy:
        """Split an allowlist setting into host names and networks."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                hosts.add(entry.strip().lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def permits(self, host: str, address: IPAddress) -> bool:
        """Whether a connection to ``address`` (resolved from ``host``) is allowed."""
        if host.lower().rstrip(".") in self.hosts:
            return True
        if any(address in network for network in self.networks):
            return True
        return not is_forbidden_address(address)


async def resolve_host(host: str, port: int) -> list[IPAddress]:
    """The system resolver's addresses for ``host``, in its order of preference."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # An IPv6 sockaddr may carry a zone (fe80::1%eth0): the zone is not part of the address.
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def pin_address(url: httpx.URL, policy: AddressPolicy, resolver: Resolver) -> IPAddress:
    """The checked address to connect to for ``url``, or :class:`CallbackRefused`.

    Resolution happens here, at delivery time, and the caller connects to the returned
    address: a host that rebinds between the check and the connection gains nothing.
    """
    if url.scheme != "https":
        raise CallbackRefused(str(url), "only https callbacks are allowed")
    literal = _literal_address(url.host)
    port = url.port or 443
    candidates = [literal] if literal is not None else await resolver(url.host, port)
    for address in candidates:
        if policy.permits(url.host, address):
            return address
    raise CallbackRefused(str(url), "the host resolves only to non-global addresses")


def _failure_category(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return "tls_error"
        cause = cause.__cause__ or cause.__context__
    return "connection_refused"


class WebhookSender:
    """POSTs signed bodies to callback URLs, one attempt at a time, SSRF-hardened.

    Use as an async context manager. Connections are never reused: each attempt connects
    to the address it has just checked, with the URL's host name in ``Host`` and TLS SNI (the
    certificate is verified against that name), through no proxy.
    """

    def __init__(
        self,
        *,
        allowlist: Iterable[str] = (),
        ssl_context: ssl.SSLContext | None = None,
        timeout_seconds: float = 5.0,
        resolver: Resolver = resolve_host,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``resolver``: the DNS lookups; ``transport``: where requests go instead of the
        network (a simulation's receivers, in process); None for real connections."""
        self.policy = AddressPolicy.from_allowlist(allowlist)
        self._resolver = resolver
        self._timeout = timeout_seconds
        self._client = httpx.AsyncClient(
            verify=ssl_context or ssl.create_default_context(),
            timeout=timeout_seconds,
            follow_redirects=False,
            # A proxy from the environment would connect to the host name, not the pinned address.
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
            transport=transport,
        )

    async def __aenter__(self) -> WebhookSender:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._client.aclose()

    async def post(
        self, url: str, body: bytes, *, msg_id: str, subscription_id: str, secrets: Sequence[str]
    ) -> Outcome:
        """One delivery attempt of ``body`` (freshly signed: a retry gets a new timestamp)."""
        outcome, _ = await self._attempt(url, body, msg_id, subscription_id, secrets)
        return outcome

    async def verify_endpoint(
        self, url: str, *, subscription_id: str, secrets: Sequence[str]
    ) -> Outcome:
        """The draft's verification handshake: POST a challenge, expect it echoed in a 2xx.

        The endpoint answers ``{"challenge": "<nonce>"}``; a reachable endpoint that does not
        is ``challenge_failed``. The nonce is single-use: each call makes a new one.
        """
        nonce = tokens.token_urlsafe(32)
        body = json.dumps({"type": "verification", "challenge": nonce}, separators=(",", ":"))
        msg_id = control_message_id("verification")
        outcome, answer = await self._attempt(
            url, body.encode(), msg_id, subscription_id, secrets, read_answer=True
        )
        if outcome.verdict is not Verdict.DELIVERED:
            return outcome
        if _echoes(answer, nonce):
            return outcome
        return Outcome(Verdict.RETRY, "challenge_failed", outcome.status)

    async def _attempt(
        self,
        url: str,
        body: bytes,
        msg_id: str,
        subscription_id: str,
        secrets: Sequence[str],
        *,
        read_answer: bool = False,
    ) -> tuple[Outcome, bytes]:
        """One POST. Only a verification reads the answer; a delivery judges the status alone.

        The whole attempt, resolution included, has one deadline, ``timeout_seconds``: a per-read
        timeout alone would let an endpoint that drips one byte at a time hold it for hours.
        """
        try:
            async with asyncio.timeout(self._timeout):
                return await self._post(url, body, msg_id, subscription_id, secrets, read_answer)
        except TimeoutError:
            return Outcome(Verdict.RETRY, "timeout"), b""

    async def _post(
        self,
        url: str,
        body: bytes,
        msg_id: str,
        subscription_id: str,
        secrets: Sequence[str],
        read_answer: bool,
    ) -> tuple[Outcome, bytes]:
        target = httpx.URL(url)
        try:
            address = await pin_address(target, self.policy, self._resolver)
        except CallbackRefused:
            return Outcome(Verdict.REFUSED, "connection_refused"), b""
        except OSError:
            return Outcome(Verdict.RETRY, "connection_refused"), b""
        headers = {
            "Host": target.netloc.decode("ascii"),
            "Content-Type": "application/json",
            # httpx would decompress what it reads, before any cap: a 64 KiB gzip answer is
            # ~64 MiB. Ask for none; an encoded answer is not read at all (_raw_answer).
            "Accept-Encoding": "identity",
            SUBSCRIPTION_ID_HEADER: subscription_id,
            **signature_headers(msg_id, body, secrets, datetime.now(UTC)),
        }
        request = self._client.build_request(
            "POST",
            target.copy_with(host=str(address)),
            content=body,
            headers=headers,
            extensions={"sni_hostname": target.host},
        )
        try:
            response = await self._client.send(request, stream=True)
            try:
                answer = await _raw_answer(response, MAX_ANSWER_BYTES) if read_answer else b""
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            return Outcome(Verdict.RETRY, _failure_category(exc)), b""
        return classify_status(response.status_code), answer


async def _raw_answer(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of the body as sent, never decoded; empty if it is encoded.

    ``aiter_raw`` yields the transport's chunks (at most 64 KiB each) without decompressing
    them; an answer with a ``Content-Encoding`` other than identity was not asked for and
    cannot hold a readable echo, so it is not read at all.
    """
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        return b""
    answer = bytearray()
    async for chunk in response.aiter_raw():
        answer += chunk[: limit - len(answer)]
        if len(answer) >= limit:
            break
    return bytes(answer)


def _echoes(answer: bytes, nonce: str) -> bool:
    # The callback's text, so the strict parser: depth-checked (never a RecursionError), and
    # an unreadable answer is a failed challenge, nothing more.
    try:
        echoed = strictjson.loads(answer)
    except strictjson.NotWireJson:
        return False
    challenge = echoed.get("challenge") if isinstance(echoed, dict) else None
    return isinstance(challenge, str) and hmac.compare_digest(challenge.encode(), nonce.encode())


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts and in total time.

    The draft asks for a cap on both (its example: 3 to 5 attempts over at most 10 to 15
    minutes) and never retrying forever. Full jitter (a uniform draw below the exponential
    ceiling) spreads the retries of many subscriptions after a shared outage.
    """

    max_attempts: int = 5
    max_elapsed_seconds: float = 15 * 60
    base_delay_seconds: float = 5.0
    max_delay_seconds: float = 5 * 60

    def delay_after(
        self, attempts: int, elapsed_seconds: float, rng: random.Random
    ) -> float | None:
        """Seconds to wait before the next attempt, or None to give up.

        ``attempts`` is how many attempts were made so far (at least 1), ``elapsed_seconds``
        the time since the first one. A delay never reaches past the total-time bound.
        """
        remaining = self.max_elapsed_seconds - elapsed_seconds
        if attempts >= self.max_attempts or remaining <= 0:
            return None
        ceiling = min(self.max_delay_seconds, self.base_delay_seconds * 2 ** (attempts - 1))
        return min(rng.uniform(0, ceiling), remaining)


async def deliver(
    send: Callable[[], Awaitable[Outcome]],
    policy: RetryPolicy,
    *,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Attempt ``send`` until it is settled (anything but RETRY) or the policy gives up.

    Returns the last attempt's outcome: RETRY here means the retries were exhausted and the
    event is abandoned (recoverable by cursor replay, the log being durable).
    """
    draw = rng or random.Random()
    started = clock()
    attempts = 0
    while True:
        outcome = await send()
        attempts += 1
        if outcome.verdict is not Verdict.RETRY:
            return outcome
        delay = policy.delay_after(attempts, clock() - started, draw)
        if delay is None:
            return outcome
        await sleep(delay)

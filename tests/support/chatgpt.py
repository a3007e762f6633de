"""A client that behaves as ChatGPT's MCP Events integration does, for the ``chatgpt`` profile.

What it does, and where each behaviour is written down (docs/events.md, "Connecting ChatGPT"):

* discovers over the 2026-07-28 wire (``server/discover``) and wants a top-level
  ``capabilities.events: {}``;
* subscribes to an event type with ``delivery: {mode: "webhook", url, secret}``, a ``whsec_``
  secret of 32 random bytes that it never rotates, ``cursor: null`` and no ``ttlMs``;
* refreshes each subscription (the same request again) at about 73% of the time from the
  answer to ``refreshBefore``, retrying while the server does not answer;
* receives on an HTTPS endpoint (a real listener, :func:`support.https.serving`): it answers
  the verification challenge, checks every Standard Webhooks signature with its secret,
  refuses bodies over 256 KiB (``413``), expects one event per request with ``webhook-id`` the
  ``eventId``, deduplicates on ``webhook-id`` and answers at once (well within its timeout);
* knows no ``events/poll``, ``events/stream``, ``gap`` or ``terminated``: a control envelope is
  recorded as unexpected.

Nothing here sleeps to synchronise a test: the refresh schedule is the client's behaviour, and
tests wait on what the receiver records (:func:`support.waits.wait_until`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import trustme
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from .https import serving
from .mcp import call
from .waits import BOUND

__all__ = [
    "MAX_BODY",
    "REFRESH_FRACTION",
    "ChatGpt",
    "Delivery",
    "Receiver",
    "chatgpt_receiver",
    "refresh_at",
]

#: ChatGPT's bound on one webhook request body (256 KiB).
MAX_BODY = 256 * 1024
#: When ChatGPT refreshes: at about this share of the time granted (observed by a server tested
#: with it; not in OpenAI's guide).
REFRESH_FRACTION = 0.73
#: How often a refresh the server did not answer is tried again.
RETRY_S = 0.5


def refresh_at(issued_s: float, refresh_before: str) -> float:
    """The epoch second a subscription answered at ``issued_s`` is refreshed at."""
    deadline = datetime.fromisoformat(refresh_before.replace("Z", "+00:00")).timestamp()
    return issued_s + REFRESH_FRACTION * max(deadline - issued_s, 0.0)


@dataclass(frozen=True)
class Delivery:
    """One event the receiver accepted (the first time its ``webhook-id`` came)."""

    path: str
    headers: dict[str, str]
    message: dict[str, Any]
    size: int


@dataclass
class Receiver:
    """The HTTPS endpoint: every subscription's secret by path, what arrived, what was wrong."""

    port: int = 0
    secrets: dict[str, str] = field(default_factory=dict)
    events: list[Delivery] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    challenges: list[str] = field(default_factory=list)
    #: Paths whose challenge is not echoed (a receiver that fails verification).
    silent: set[str] = field(default_factory=set)
    #: What ChatGPT would not accept: bad signatures, control envelopes, oversized bodies.
    refused: list[str] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}/chatgpt/{path}"

    def to(self, path: str) -> list[dict[str, Any]]:
        """The messages accepted on ``path``, in arrival order, each once."""
        with self._lock:
            return [d.message for d in self.events if d.path == f"/chatgpt/{path}"]

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """What ChatGPT's receiver answers (runs on the listener's threads)."""
        name = path.rsplit("/", 1)[-1]
        if len(body) > MAX_BODY:
            return self._refuse(413, f"{name}: body of {len(body)} bytes")
        secret = self.secrets.get(name)
        if secret is None:
            return self._refuse(410, f"{name}: no subscription")
        try:
            message = Webhook(secret).verify(body, headers)
        except WebhookVerificationError:
            return self._refuse(401, f"{name}: bad signature")
        if message.get("type") == "verification":
            self.challenges.append(name)
            if name in self.silent:
                return 200, b"{}"
            return 200, json.dumps({"challenge": message["challenge"]}).encode()
        if "type" in message:  # gap, terminated: not in ChatGPT's wire
            return self._refuse(400, f"{name}: control envelope {message['type']}")
        webhook_id = headers.get("webhook-id", "")
        if webhook_id != message.get("eventId"):
            return self._refuse(400, f"{name}: webhook-id is not the eventId")
        with self._lock:
            if webhook_id in self._seen:
                self.duplicates.append(webhook_id)  # at least once: ignored, as ChatGPT does
                return 200, b""
            self._seen.add(webhook_id)
            self.events.append(Delivery(path, headers, message, len(body)))
        return 200, b""

    def _refuse(self, status: int, why: str) -> tuple[int, bytes]:
        self.refused.append(why)
        return status, b""


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status, answer = receiver.answer(self.path, dict(self.headers.items()), body)
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def chatgpt_receiver(ca: trustme.CA) -> Iterator[Receiver]:
    """A :class:`Receiver` listening over HTTPS on 127.0.0.1 (a ``localhost`` certificate)."""
    receiver = Receiver()
    with serving(_handler(receiver), ca) as receiver.port:
        yield receiver


def new_secret() -> str:
    """A secret as ChatGPT makes one: ``whsec_`` and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass
class _Subscription:
    params: dict[str, Any]
    answer: dict[str, Any]
    issued_s: float
    refreshes: int = 0


class ChatGpt:
    """The client side: discovery, subscriptions and their refreshes (see the module docstring).

    Use as ``async with ChatGpt(url, token, receiver) as chatgpt``: leaving stops the refreshes.
    """

    def __init__(self, url: str, token: str, receiver: Receiver) -> None:
        self.url = url
        self.receiver = receiver
        self.http = httpx.AsyncClient(timeout=BOUND, headers={"Authorization": f"Bearer {token}"})
        self.subscriptions: dict[str, _Subscription] = {}
        self._refreshers: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ChatGpt:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._refreshers:
            task.cancel()
        await asyncio.gather(*self._refreshers, return_exceptions=True)
        await self.http.aclose()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request over the 2026-07-28 wire; the whole response message."""
        return await call(self.http, self.url, method, params, caps={})

    async def discover(self) -> dict[str, Any]:
        """``server/discover``'s capabilities (the test checks what ChatGPT wants of them)."""
        message = await self.request("server/discover")
        return dict(message["result"]["capabilities"])

    async def subscribe(self, path: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Subscribe as ChatGPT does, deliveries to ``path``; the response message. A
        subscription answered with a result is refreshed at 73% of its time from then on."""
        secret = self.receiver.secrets.setdefault(path, new_secret())
        params = {
            "name": name,
            "arguments": arguments,
            "delivery": {"mode": "webhook", "url": self.receiver.url(path), "secret": secret},
            "cursor": None,
        }
        issued = time.time()
        message = await self.request("events/subscribe", params)
        if "result" in message:
            self.subscriptions[path] = _Subscription(params, message["result"], issued)
            self._refreshers.append(asyncio.create_task(self._refreshing(path)))
        return message

    async def unsubscribe(self, path: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        params = {
            "name": name,
            "arguments": arguments,
            "delivery": {"url": self.receiver.url(path)},
        }
        return await self.request("events/unsubscribe", params)

    def refreshes(self, path: str) -> int:
        return self.subscriptions[path].refreshes

    async def _refreshing(self, path: str) -> None:
        """Refresh at 73% of each grant, for as long as the client runs (its schedule)."""
        sub = self.subscriptions[path]
        while True:
            due = refresh_at(sub.issued_s, sub.answer["refreshBefore"])
            await asyncio.sleep(max(due - time.time(), 0.0))  # the schedule, not a sync point
            sub.answer, sub.issued_s = await self._retried(sub.params)
            sub.refreshes += 1

    async def _retried(self, params: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The refresh and when it was sent, tried again while the server does not answer it
        (a restart under way)."""
        while True:
            issued = time.time()
            with contextlib.suppress(httpx.HTTPError):
                message = await self.request("events/subscribe", params)
                if "result" in message:
                    return dict(message["result"]), issued
            await asyncio.sleep(RETRY_S)  # the client's retry cadence

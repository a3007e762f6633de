"""The sleeping agent's webhook receiver: a small HTTPS endpoint that wakes the agent.

Where it sits: the bridge's webhook delivery (``events/subscribe``, Standard Webhooks
signatures) POSTs ``<prefix>.task.updated`` occurrences here; :class:`WebhookReceiver` checks
each signature with the ``standardwebhooks`` library, echoes the verification challenge, and
when a task reaches a status the agent must act on (it ended) calls ``wake`` once per
``webhook-id`` (delivery is at least once). :func:`serve_https` serves a receiver on loopback
with a throwaway certificate (:func:`throwaway_tls`); the bridge trusts its CA through
``webhooks.ca_file`` and reaches loopback through ``webhooks.allowlist``.

What it does not do: start processes itself (``wake`` is the caller's), or trust anything a
body says before its signature verified.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

__all__ = [
    "Answer",
    "Delivery",
    "ReceiverTls",
    "Wake",
    "WebhookReceiver",
    "serve_https",
    "throwaway_tls",
]

#: A task.updated body is a few hundred bytes; a bigger one is refused before it is read.
MAX_BODY_BYTES = 64 * 1024
#: The statuses after which the agent has something to do: read the outcome.
ENDED = frozenset({"completed", "failed", "cancelled"})
#: The loopback address the receiver listens on (and its certificate names).
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Wake:
    """What the receiver tells the agent when it starts it: which task, up to where, why."""

    task_id: str
    seq: int
    status: str


@dataclass(frozen=True)
class Delivery:
    """One POST as the receiver judged it (kept for the narration and the checks)."""

    at: float  # time.monotonic() of arrival
    webhook_id: str
    verified: bool
    kind: str  # "verification", "event", a control envelope's type, or "refused"
    status: int  # the HTTP status answered
    wake: Wake | None = None  # the wake-up it caused, if any
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    body: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class Answer:
    """The HTTP answer to one POST."""

    status: int
    body: bytes = b""


class WebhookReceiver:
    """Verifies and judges webhook POSTs; ``wake`` is called once per waking event."""

    def __init__(
        self, secret: str, wake: Callable[[Wake], None], *, wakes_on: frozenset[str] = ENDED
    ) -> None:
        self._webhook = Webhook(secret)
        self._wake = wake
        self.wakes_on = wakes_on
        self.deliveries: list[Delivery] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # the HTTP server runs one thread per request

    def handle(self, headers: Mapping[str, str], body: bytes) -> Answer:
        """Judge one POST: 401 unless its signature verifies, else the challenge's echo or 204."""
        webhook_id = _header(headers, "webhook-id")
        try:
            message = self._webhook.verify(body, dict(headers))
        except WebhookVerificationError:
            return self._record(headers, body, webhook_id, False, "refused", Answer(401))
        if not isinstance(message, dict):
            return self._record(headers, body, webhook_id, True, "not-an-object", Answer(400))
        if message.get("type") == "verification":
            echo = json.dumps({"challenge": message.get("challenge")}).encode()
            return self._record(headers, body, webhook_id, True, "verification", Answer(200, echo))
        kind = str(message.get("type", "event"))
        with self._lock:
            first = webhook_id not in self._seen
            self._seen.add(webhook_id)
        wake = self._waking(message) if kind == "event" and first else None
        answer = self._record(headers, body, webhook_id, True, kind, Answer(204), wake)
        if wake is not None:
            self._wake(wake)
        return answer

    def _waking(self, message: dict[str, Any]) -> Wake | None:
        data = message.get("data")
        if not isinstance(data, dict) or data.get("status") not in self.wakes_on:
            return None
        task_id, seq = data.get("taskId"), data.get("seq")
        if not isinstance(task_id, str) or not isinstance(seq, int):
            return None
        return Wake(task_id, seq, str(data["status"]))

    def _record(
        self,
        headers: Mapping[str, str],
        body: bytes,
        webhook_id: str,
        verified: bool,
        kind: str,
        answer: Answer,
        wake: Wake | None = None,
    ) -> Answer:
        delivery = Delivery(
            time.monotonic(), webhook_id, verified, kind, answer.status, wake, dict(headers), body
        )
        with self._lock:
            self.deliveries.append(delivery)
        return answer


def _header(headers: Mapping[str, str], name: str) -> str:
    """A header by its lower-case ``name``: HTTP header names are case-insensitive."""
    return next((value for key, value in headers.items() if key.lower() == name), "")


# --- TLS and serving ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceiverTls:
    """A throwaway CA (its PEM file, for the bridge's ``webhooks.ca_file``) and the receiver's
    certificate for 127.0.0.1 and localhost."""

    ca_file: Path
    server: ssl.SSLContext


def throwaway_tls(directory: Path) -> ReceiverTls:
    """A new CA and server certificate, made now (nothing outlives the run): the CA's PEM goes
    to ``directory``; the server key only into the returned context (trustme loads it through a
    temporary file that it deletes at once)."""
    ca = trustme.CA(organization_name="bridge demo receiver (throwaway)")
    ca_file = directory / "receiver-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(LOOPBACK, "localhost").configure_cert(context)
    return ReceiverTls(ca_file, context)


def _handler(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(Answer(413))
                return
            body = self.rfile.read(length)
            self._answer(receiver.handle(dict(self.headers.items()), body))

        def _answer(self, answer: Answer) -> None:
            self.send_response(answer.status)
            if answer.body:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the demo narrates deliveries itself

    return Handler


@contextlib.contextmanager
def serve_https(receiver: WebhookReceiver, tls: ReceiverTls, path: str = "/agent") -> Iterator[str]:
    """Serve ``receiver`` over HTTPS on 127.0.0.1 (a free port) in a thread; yields its URL."""
    server = ThreadingHTTPServer((LOOPBACK, 0), _handler(receiver))
    server.socket = tls.server.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="demo-receiver", daemon=True)
    thread.start()
    try:
        yield f"https://{LOOPBACK}:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)

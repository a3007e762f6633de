"""Webhook delivery (bridge.events_extension.webhooks): signatures, SSRF refusals, outcomes, retries.

Deliveries go over real HTTPS to a receiver on 127.0.0.1 (a trustme certificate for
``localhost``), allowlisted by CIDR; refusals are checked against listeners that must see
nothing. The retry schedule is pure and checked with a seeded generator and a fake clock.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import ipaddress
import json
import random
import ssl
import threading
import tracemalloc
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler

import pytest
import trustme
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from support.https import serving

from bridge.events_extension.webhooks import (
    MAX_ANSWER_BYTES,
    SUBSCRIPTION_ID_HEADER,
    InvalidSecret,
    Outcome,
    RetryPolicy,
    Verdict,
    WebhookSender,
    check_secret,
    classify_status,
    control_message_id,
    deliver,
    is_forbidden_address,
    signature_headers,
)

OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"n" * 32).decode()
BODY = b'{"eventId":"evt_1","name":"x.y","timestamp":"2026-01-01T00:00:00Z","data":{}}'
LOOPBACK = ["127.0.0.1/32"]


# --- signing ----------------------------------------------------------------------------------


def test_a_delivery_signed_during_a_rotation_verifies_with_either_secret() -> None:
    headers = signature_headers("evt_1", BODY, [OLD_SECRET, NEW_SECRET], datetime.now(UTC))
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (OLD_SECRET, NEW_SECRET):
        assert Webhook(secret).verify(BODY, headers) == json.loads(BODY)


def test_a_signature_fails_when_the_body_is_altered() -> None:
    headers = signature_headers("evt_1", BODY, [OLD_SECRET], datetime.now(UTC))
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD_SECRET).verify(BODY.replace(b"evt_1", b"evt_2"), headers)


def test_a_signature_fails_when_the_timestamp_is_altered() -> None:
    headers = signature_headers("evt_1", BODY, [OLD_SECRET], datetime.now(UTC))
    headers["webhook-timestamp"] = str(int(headers["webhook-timestamp"]) - 1)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD_SECRET).verify(BODY, headers)


def test_a_signature_fails_under_another_secret() -> None:
    headers = signature_headers("evt_1", BODY, [OLD_SECRET], datetime.now(UTC))
    with pytest.raises(WebhookVerificationError):
        Webhook(NEW_SECRET).verify(BODY, headers)


def test_a_stale_signature_is_refused_by_the_receivers_freshness_window() -> None:
    headers = signature_headers("evt_1", BODY, [OLD_SECRET], datetime.now(UTC) - timedelta(hours=1))
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD_SECRET).verify(BODY, headers)


@pytest.mark.parametrize(
    "secret",
    [
        "no-prefix" + base64.b64encode(b"k" * 32).decode(),
        "whsec_" + base64.b64encode(b"k" * 23).decode(),
        "whsec_" + base64.b64encode(b"k" * 65).decode(),
        "whsec_not base64!",
    ],
)
def test_a_secret_that_is_not_whsec_and_24_to_64_bytes_is_refused(secret: str) -> None:
    with pytest.raises(InvalidSecret):
        check_secret(secret)


def test_a_standard_webhooks_secret_is_accepted() -> None:
    assert check_secret(OLD_SECRET) == OLD_SECRET


# --- classification and addresses (pure) ------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, Outcome(Verdict.DELIVERED, None, 200)),
        (204, Outcome(Verdict.DELIVERED, None, 204)),
        (410, Outcome(Verdict.ABANDON, "http_4xx", 410)),
        (413, Outcome(Verdict.ABANDON, "http_4xx", 413)),
        (429, Outcome(Verdict.RETRY, "http_4xx", 429)),
        (400, Outcome(Verdict.RETRY, "http_4xx", 400)),
        (307, Outcome(Verdict.RETRY, "http_4xx", 307)),
        (500, Outcome(Verdict.RETRY, "http_5xx", 500)),
        (503, Outcome(Verdict.RETRY, "http_5xx", 503)),
    ],
)
def test_an_http_status_is_judged_as_the_draft_says(status: int, expected: Outcome) -> None:
    assert classify_status(status) == expected


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "127.0.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "100.64.0.1",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
    ],
)
def test_a_non_global_address_is_forbidden(address: str) -> None:
    assert is_forbidden_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]
)
def test_a_global_address_is_allowed(address: str) -> None:
    assert not is_forbidden_address(ipaddress.ip_address(address))


# --- real receivers ----------------------------------------------------------------------------


@dataclass
class Receiver:
    """A local HTTP(S) listener that records what reaches it and answers as told."""

    port: int
    scheme: str
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    status: int = 200
    location: str | None = None
    echo_challenge: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    hold: bool = False
    #: An answer body and headers of the test's own (a gzip bomb), instead of the echo.
    answer: bytes | None = None
    answer_headers: dict[str, str] = field(default_factory=dict)
    gzip_answer: bool = False
    #: Answer 200 at once, then the body one byte every 0.2 s until released.
    drip: bool = False

    @property
    def url(self) -> str:
        return f"{self.scheme}://localhost:{self.port}/hooks/one"


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            receiver.received.append((dict(self.headers.items()), body))
            if receiver.drip:
                self._drip()
                return
            if receiver.hold:
                receiver.release.wait(10)
            answer = b""
            if receiver.echo_challenge:
                answer = json.dumps({"challenge": json.loads(body)["challenge"]}).encode()
            if receiver.answer is not None:
                answer = receiver.answer
            if receiver.gzip_answer:
                answer = gzip.compress(answer)
                receiver.answer_headers["Content-Encoding"] = "gzip"
            self.send_response(receiver.status)
            if receiver.location:
                self.send_header("Location", receiver.location)
            for name, value in receiver.answer_headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def _drip(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(MAX_ANSWER_BYTES))
            self.end_headers()
            with contextlib.suppress(OSError):  # the sender hangs up at its deadline
                while not receiver.release.wait(0.2):  # the drip's pace, not a synchronisation
                    self.wfile.write(b" ")
                    self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def _serve(receiver_scheme: str, ca: trustme.CA) -> Iterator[Receiver]:
    receiver = Receiver(port=0, scheme=receiver_scheme)
    tls = ca if receiver_scheme == "https" else None
    with serving(_handler(receiver), tls, ("localhost", "receiver.invalid")) as receiver.port:
        try:
            yield receiver
        finally:
            receiver.release.set()  # a held request must not keep the server from stopping


@pytest.fixture
def receiver(ca: trustme.CA) -> Iterator[Receiver]:
    yield from _serve("https", ca)


@pytest.fixture
def other_receiver(ca: trustme.CA) -> Iterator[Receiver]:
    yield from _serve("https", ca)


@pytest.fixture
def plain_receiver(ca: trustme.CA) -> Iterator[Receiver]:
    yield from _serve("http", ca)


async def _post(sender: WebhookSender, url: str, secrets: list[str] | None = None) -> Outcome:
    return await sender.post(
        url, BODY, msg_id="evt_1", subscription_id="sub_1", secrets=secrets or [OLD_SECRET]
    )


async def test_an_allowlisted_https_receiver_gets_a_signed_delivery(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome = await _post(sender, receiver.url, [OLD_SECRET, NEW_SECRET])
    assert outcome == Outcome(Verdict.DELIVERED, None, 200)
    [(headers, body)] = receiver.received
    assert body == BODY
    assert headers[SUBSCRIPTION_ID_HEADER] == "sub_1"
    assert headers["Host"] == f"localhost:{receiver.port}"
    assert headers["Content-Type"] == "application/json"
    for secret in (OLD_SECRET, NEW_SECRET):
        Webhook(secret).verify(body, headers)


async def test_a_410_abandons_the_delivery_and_a_503_asks_for_a_retry(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        receiver.status = 410
        gone = await _post(sender, receiver.url)
        receiver.status = 503
        unavailable = await _post(sender, receiver.url)
    assert gone == Outcome(Verdict.ABANDON, "http_4xx", 410)
    assert unavailable == Outcome(Verdict.RETRY, "http_5xx", 503)
    assert len(receiver.received) == 2


async def test_a_receiver_that_does_not_answer_in_time_is_a_timeout_to_retry(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    receiver.hold = True
    async with WebhookSender(
        allowlist=LOOPBACK, ssl_context=client_tls, timeout_seconds=0.5
    ) as sender:
        outcome = await _post(sender, receiver.url)
    assert outcome == Outcome(Verdict.RETRY, "timeout")


async def test_a_certificate_the_sender_does_not_trust_is_a_tls_error(receiver: Receiver) -> None:
    async with WebhookSender(allowlist=LOOPBACK) as sender:
        outcome = await _post(sender, receiver.url)
    assert outcome == Outcome(Verdict.RETRY, "tls_error")
    assert receiver.received == []


async def test_a_redirect_is_not_followed(
    receiver: Receiver, other_receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    receiver.status = 307
    receiver.location = other_receiver.url
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome = await _post(sender, receiver.url)
    assert outcome == Outcome(Verdict.RETRY, "http_4xx", 307)
    assert len(receiver.received) == 1
    assert other_receiver.received == []


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_loopback_is_refused_without_an_allowlist(
    receiver: Receiver, client_tls: ssl.SSLContext, host: str
) -> None:
    async with WebhookSender(ssl_context=client_tls) as sender:
        outcome = await _post(sender, f"https://{host}:{receiver.port}/hooks/one")
    assert outcome == Outcome(Verdict.REFUSED, "connection_refused")
    assert receiver.received == []


async def test_an_http_callback_is_refused_even_when_allowlisted(plain_receiver: Receiver) -> None:
    async with WebhookSender(allowlist=LOOPBACK) as sender:
        outcome = await _post(sender, plain_receiver.url)
    assert outcome == Outcome(Verdict.REFUSED, "connection_refused")
    assert plain_receiver.received == []


@pytest.mark.parametrize("address", ["10.0.0.7", "192.168.0.7", "169.254.169.254", "fe80::7"])
async def test_a_host_resolving_to_a_private_or_link_local_address_is_refused(
    address: str,
) -> None:
    resolved: list[str] = []

    async def resolver(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        resolved.append(host)
        return [ipaddress.ip_address(address)]

    async with WebhookSender(resolver=resolver) as sender:
        outcome = await _post(sender, "https://hooks.example.com/one")
        literal = await _post(
            sender, f"https://[{address}]/one" if ":" in address else f"https://{address}/one"
        )
    assert outcome == literal == Outcome(Verdict.REFUSED, "connection_refused")
    assert resolved == ["hooks.example.com"]


async def test_a_name_rebound_to_loopback_at_delivery_time_reaches_no_listener(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    async def rebinding(
        host: str, port: int
    ) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        return [ipaddress.ip_address("127.0.0.1")]

    async with WebhookSender(ssl_context=client_tls, resolver=rebinding) as sender:
        outcome = await _post(sender, f"https://hooks.example.com:{receiver.port}/one")
    assert outcome.verdict is Verdict.REFUSED
    assert receiver.received == []


async def test_the_sender_connects_to_the_address_it_checked_with_the_name_in_host_and_sni(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    # receiver.invalid resolves nowhere but through this resolver: a second resolution
    # (connecting by name) could not reach the receiver, and a wrong SNI would fail TLS.
    async def resolver(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        return [ipaddress.ip_address("127.0.0.1")]

    async with WebhookSender(
        allowlist=LOOPBACK, ssl_context=client_tls, resolver=resolver
    ) as sender:
        outcome = await _post(sender, f"https://receiver.invalid:{receiver.port}/one")
    assert outcome == Outcome(Verdict.DELIVERED, None, 200)
    [(headers, _)] = receiver.received
    assert headers["Host"] == f"receiver.invalid:{receiver.port}"


async def test_an_endpoint_that_echoes_the_challenge_is_verified(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    receiver.echo_challenge = True
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome = await sender.verify_endpoint(
            receiver.url, subscription_id="sub_1", secrets=[OLD_SECRET]
        )
    assert outcome == Outcome(Verdict.DELIVERED, None, 200)
    [(headers, body)] = receiver.received
    envelope = Webhook(OLD_SECRET).verify(body, headers)
    assert envelope["type"] == "verification"
    assert headers["webhook-id"].startswith("msg_verification_")


async def test_an_endpoint_that_answers_2xx_without_the_challenge_fails_verification(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome = await sender.verify_endpoint(
            receiver.url, subscription_id="sub_1", secrets=[OLD_SECRET]
        )
    assert outcome == Outcome(Verdict.RETRY, "challenge_failed", 200)


@pytest.mark.parametrize(
    "answer", [b"[" * 4096, b"{" * 4096, b'{"challenge": ' + b"[" * 4000, b"\xff\xfe{", b"nul"]
)
async def test_an_unreadable_or_deeply_nested_answer_is_a_failed_challenge(
    receiver: Receiver, client_tls: ssl.SSLContext, answer: bytes
) -> None:
    # Review F5: json.loads raised RecursionError on "[" * 4096, out through events/subscribe.
    receiver.answer = answer
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome = await sender.verify_endpoint(
            receiver.url, subscription_id="s", secrets=[OLD_SECRET]
        )
    assert outcome == Outcome(Verdict.RETRY, "challenge_failed", 200)


#: 64 MiB of zeros gzipped: 64 KiB on the wire, the review's bomb.
BOMB = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9)
#: What the bomb may cost the sender: the transport's chunks, never the decoded 64 MiB.
BOMB_BUDGET_BYTES = 2 * 1024 * 1024


async def _peak_bytes_allocated(attempt: Awaitable[Outcome]) -> tuple[Outcome, int]:
    """``attempt``'s outcome, and the most memory Python held for it at once (tracemalloc)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        outcome = await attempt
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, peak


async def test_a_gzip_bomb_answer_to_a_challenge_is_never_decompressed(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    assert len(BOMB) < 128 * 1024
    receiver.answer, receiver.answer_headers = BOMB, {"Content-Encoding": "gzip"}
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        verifying = sender.verify_endpoint(receiver.url, subscription_id="s", secrets=[OLD_SECRET])
        outcome, peak = await _peak_bytes_allocated(verifying)
    assert outcome == Outcome(Verdict.RETRY, "challenge_failed", 200)
    assert peak < BOMB_BUDGET_BYTES, f"{peak} bytes held for a {len(BOMB)}-byte answer"


async def test_a_gzip_bomb_answer_to_a_delivery_is_never_decompressed(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    receiver.answer, receiver.answer_headers = BOMB, {"Content-Encoding": "gzip"}
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome, peak = await _peak_bytes_allocated(_post(sender, receiver.url))
    assert outcome == Outcome(Verdict.DELIVERED, None, 200)
    assert peak < BOMB_BUDGET_BYTES, f"{peak} bytes held for a {len(BOMB)}-byte answer"


async def test_the_sender_asks_for_identity_encoding_and_ignores_an_encoded_echo(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    # A valid echo, gzipped anyway: it was not asked for, so it is not read (nor decoded).
    receiver.echo_challenge, receiver.gzip_answer = True, True
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        outcome = await sender.verify_endpoint(
            receiver.url, subscription_id="s", secrets=[OLD_SECRET]
        )
    [(headers, _)] = receiver.received
    assert headers["Accept-Encoding"] == "identity"
    assert outcome == Outcome(Verdict.RETRY, "challenge_failed", 200)


async def test_an_answer_longer_than_the_cap_is_read_up_to_the_cap_only(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    receiver.answer = b" " * (8 * 1024 * 1024)  # whitespace: no echo, 8 MiB of it
    async with WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls) as sender:
        verifying = sender.verify_endpoint(receiver.url, subscription_id="s", secrets=[OLD_SECRET])
        outcome, peak = await _peak_bytes_allocated(verifying)
    assert outcome == Outcome(Verdict.RETRY, "challenge_failed", 200)
    assert peak < BOMB_BUDGET_BYTES, f"{peak} bytes held for an 8 MiB answer"


async def test_an_answer_dripped_a_byte_at_a_time_ends_at_the_attempts_deadline(
    receiver: Receiver, client_tls: ssl.SSLContext
) -> None:
    # Each byte comes well within the per-read timeout: only a deadline on the whole attempt
    # ends it (else 4 KiB at 5 bytes a second would hold the subscribe for 14 minutes).
    receiver.drip = True
    sender = WebhookSender(allowlist=LOOPBACK, ssl_context=client_tls, timeout_seconds=1.0)
    async with sender:
        outcome = await sender.verify_endpoint(
            receiver.url, subscription_id="s", secrets=[OLD_SECRET]
        )
    assert outcome == Outcome(Verdict.RETRY, "timeout")


# --- the retry schedule (pure) ----------------------------------------------------------------


def test_backoff_gives_up_after_the_attempt_bound() -> None:
    policy = RetryPolicy(max_attempts=3)
    rng = random.Random(1)
    assert policy.delay_after(1, 0.0, rng) is not None
    assert policy.delay_after(2, 0.0, rng) is not None
    assert policy.delay_after(3, 0.0, rng) is None


def test_backoff_never_waits_past_the_total_time_bound() -> None:
    policy = RetryPolicy(max_attempts=100, max_elapsed_seconds=60, base_delay_seconds=50)
    rng = random.Random(2)
    for elapsed in (0.0, 30.0, 59.0):
        for attempts in range(1, 10):
            delay = policy.delay_after(attempts, elapsed, rng)
            assert delay is not None
            assert elapsed + delay <= 60
    assert policy.delay_after(1, 60.0, rng) is None


def test_backoff_is_full_jitter_below_an_exponential_capped_ceiling() -> None:
    policy = RetryPolicy(
        max_attempts=100, max_elapsed_seconds=1e9, base_delay_seconds=1, max_delay_seconds=8
    )
    rng = random.Random(3)
    for attempts, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (9, 8)]:
        delays = [policy.delay_after(attempts, 0.0, rng) for _ in range(500)]
        assert all(d is not None and 0 <= d <= ceiling for d in delays)
        # Full jitter: the draws spread over the whole range, not bunched at the ceiling.
        assert min(d for d in delays if d is not None) < ceiling * 0.1
        assert max(d for d in delays if d is not None) > ceiling * 0.9


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def _deliver(outcomes: list[Outcome], policy: RetryPolicy, fake: FakeTime) -> Outcome:
    pending = iter(outcomes)

    async def send() -> Outcome:
        return next(pending)

    return await deliver(send, policy, rng=random.Random(4), sleep=fake.sleep, clock=fake.clock)


async def test_delivery_retries_until_the_receiver_accepts() -> None:
    fake = FakeTime()
    retry = Outcome(Verdict.RETRY, "http_5xx", 503)
    done = Outcome(Verdict.DELIVERED, None, 200)
    assert await _deliver([retry, retry, done], RetryPolicy(), fake) == done
    assert len(fake.sleeps) == 2


async def test_delivery_stops_at_the_attempt_bound_and_never_retries_an_abandon() -> None:
    fake = FakeTime()
    retry = Outcome(Verdict.RETRY, "timeout")
    assert await _deliver([retry] * 10, RetryPolicy(max_attempts=4), fake) == retry
    assert len(fake.sleeps) == 3
    gone = Outcome(Verdict.ABANDON, "http_4xx", 410)
    assert await _deliver([gone, retry], RetryPolicy(), FakeTime()) == gone


def test_a_control_message_id_carries_128_random_bits() -> None:
    ids = {control_message_id("gap") for _ in range(64)}
    assert len(ids) == 64
    assert all(len(i.removeprefix("msg_gap_")) == 32 for i in ids)  # 16 random bytes, hex

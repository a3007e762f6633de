"""Hops between replicas: served on the peer listener only, signed over everything that decides
the answer, each accepted once, addressed to one replica, over TLS when configured.

In-process, no broker: the MCP endpoint over fakes of the task service (a task ``t1`` of
alice's), behind the public app and behind the peer listener's app (``peer_app``), and
:class:`~bridge.server.hops.PeerAuth` and the owner URL rule on their own. The TLS hop runs a
real peer listener (uvicorn, certificates made for the test) and sends through ``Peers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import httpx
import pytest
import trustme
from starlette.applications import Starlette
from starlette.routing import Route
from support.layout import merged
from support.mcp import request
from support.procs import free_port
from test_listen import FakeStreams, FakeTasks

from bridge.config import Settings, load_settings
from bridge.keyring import PurposeKey
from bridge.metrics import HOP_REFUSAL_REASONS, Metrics
from bridge.server.app import peer_app
from bridge.server.auth import Authenticator
from bridge.server.cursor import encode_cursor
from bridge.server.handlers import MethodHandlers
from bridge.server.hops import (
    HopRefused,
    PeerAuth,
    PeerIdentity,
    RefusalReason,
    SeenNonces,
    canonical,
)
from bridge.server.http import McpHttp, RawEndpoint
from bridge.server.peers import MAX_REMEMBERED_OWNERS, OwnerSuspected, Peers, client_tls
from bridge.server.routing import Routing
from bridge.server.runner import peer_listener
from bridge.server.suspects import MAX_SUSPECTS, ProbeFailed
from bridge.server.wire import CLIENT_CAPS_META, RpcError, tasks_capability

SECRET = "s" * 40
TOKENS = {"tok-alice": "alice"}
HERE = "http://127.0.0.1:18081"
ALICE = PeerIdentity("alice", "alice")


def group_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "tool_packs": [],
        "replicas": {"ownership": "group"},
        "peers": {"port": 18081, "advertised_url": HERE, "secret": SECRET},
        "auth": {"mode": "bearer", "tokens": TOKENS},
    }
    return load_settings(**merged(values, overrides))


class Replica:
    """The MCP endpoint of one replica (fakes behind it), as the public app and the peer app."""

    def __init__(self, settings: Settings, auth: PeerAuth | None = None) -> None:
        tasks = FakeTasks()
        tasks.add("t1", "alice")
        handlers = MethodHandlers(settings, tasks, [], FakeStreams(), [])
        self.metrics = Metrics()
        self.auth = auth or PeerAuth(SECRET, HERE)
        self.endpoint = McpHttp(
            settings,
            Authenticator(settings.auth),
            handlers,
            self.metrics,
            on_cancelled=lambda client, request_id: None,
            peers=Peers(self.auth),
        )
        post, get = RawEndpoint(self.endpoint.post), RawEndpoint(self.endpoint.get)
        self.public = Starlette(
            routes=[Route("/mcp", post, methods=["POST"]), Route("/mcp", get, methods=["GET"])]
        )
        self.peer = peer_app(settings, lambda: SimpleNamespace(endpoint=self.endpoint))  # type: ignore[arg-type,return-value]

    def refused(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "bridge_peer_hops_refused_total", {"reason": reason}
        )
        return value or 0.0


def forwarding_endpoint(settings: Settings, peers: Peers, routing: Any) -> McpHttp:
    """A public ``/mcp`` endpoint with no task of its own: whatever ``routing`` names an owner
    for is forwarded through ``peers``."""
    return McpHttp(
        settings,
        Authenticator(settings.auth),
        MethodHandlers(settings, FakeTasks(), [], FakeStreams(), []),
        Metrics(),
        on_cancelled=lambda client, request_id: None,
        routing=routing,
        peers=peers,
    )


def tasks_get(task_id: str = "t1") -> tuple[dict[str, str], bytes]:
    headers, body = request("tasks/get", {"taskId": task_id})
    return {k.lower(): v for k, v in headers.items()}, json.dumps(body).encode()


def signed(
    auth: PeerAuth,
    headers: dict[str, str],
    body: bytes,
    *,
    to: str = HERE,
    who: PeerIdentity = ALICE,
) -> dict[str, str]:
    return {**headers, **auth.sign(to, "POST", "/mcp", headers, body, who)}


async def post(app: Any, headers: dict[str, str], body: bytes) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return await http.post("/mcp", content=body, headers=headers)


def answer_of(reply: httpx.Response) -> dict[str, Any]:
    message = reply.json()
    assert isinstance(message, dict)
    return message


# --- the public listener never honours a hop --------------------------------------------------


async def test_peer_headers_on_the_public_port_are_ignored_and_the_client_authenticated() -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    forged = {
        **headers,
        "authorization": "Bearer tok-alice",
        "x-bridge-peer-principal": "mallory",
        "x-bridge-peer-client": "mallory",
        "x-bridge-peer-time": "1",
        "x-bridge-peer-signature": "0" * 64,
    }
    reply = await post(replica.public, forged, body)
    assert reply.status_code == 200, reply.text  # served to alice, her token; no hop refusal
    assert answer_of(reply)["result"]["taskId"] == "t1"


async def test_a_valid_hop_on_the_public_port_does_not_bypass_authentication() -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    reply = await post(replica.public, signed(replica.auth, headers, body), body)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"].startswith("Bearer")
    # The same hop on the peer listener is believed (its nonce was not consumed above).
    reply = await post(replica.peer, signed(replica.auth, headers, body), body)
    assert reply.status_code == 200 and answer_of(reply)["result"]["taskId"] == "t1"


async def test_a_request_without_a_hop_on_the_peer_listener_is_refused_even_with_a_token() -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    reply = await post(replica.peer, {**headers, "authorization": "Bearer tok-alice"}, body)
    assert reply.status_code == 401 and reply.json()["reason"] == "missing"
    assert replica.refused("missing") == 1


async def test_the_peer_listener_serves_the_hop_endpoints_only_and_a_view_get_needs_a_hop() -> None:
    replica = Replica(group_settings())
    transport = httpx.ASGITransport(app=replica.peer)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        # Besides the hops, an empty health answer: no state, nothing for a stranger.
        health = await http.get("/healthz")
        assert (health.status_code, health.content) == (204, b"")
        assert (await http.post("/healthz")).status_code == 405
        for method, path in [
            ("GET", "/metrics"),
            ("POST", "/view/token"),
            ("GET", "/view/"),
            ("POST", "/admin/indexer/pause"),
        ]:
            assert (await http.request(method, path)).status_code == 404, path
        view = await http.get("/view/tasks/t1", params={"token": "anything"})
    assert view.status_code == 401 and view.json()["reason"] == "missing"


# --- the peer listener: replay, destination, tampering ----------------------------------------


async def test_a_replayed_hop_is_refused_and_counted() -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    hop = signed(replica.auth, headers, body)
    first = await post(replica.peer, hop, body)
    assert first.status_code == 200
    again = await post(replica.peer, hop, body)
    assert again.status_code == 401 and again.json()["reason"] == "replay"
    assert replica.refused("replay") == 1


async def test_a_hop_signed_for_another_replica_is_refused() -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    elsewhere = signed(replica.auth, headers, body, to="http://127.0.0.2:18081")
    reply = await post(replica.peer, elsewhere, body)
    assert reply.status_code == 401 and reply.json()["reason"] == "destination"
    # Rewriting the destination header does not help: the MAC covers the real destination.
    rewritten = {**elsewhere, "x-bridge-peer-to": HERE}
    reply = await post(replica.peer, rewritten, body)
    assert reply.status_code == 401 and reply.json()["reason"] == "signature"
    assert replica.refused("destination") == 1 and replica.refused("signature") == 1


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda h, b: ({**h, "mcp-name": "t2"}, b), id="mcp-name"),
        pytest.param(lambda h, b: ({**h, "accept": "application/json"}, b), id="accept"),
        pytest.param(
            lambda h, b: ({**h, "mcp-protocol-version": "2025-11-25"}, b), id="protocol-version"
        ),
        pytest.param(lambda h, b: ({**h, "last-event-id": "x"}, b), id="added-header"),
        pytest.param(
            lambda h, b: ({k: v for k, v in h.items() if k != "content-type"}, b),
            id="removed-header",
        ),
        pytest.param(lambda h, b: (h, b.replace(b'"t1"', b'"t2"')), id="body"),
        pytest.param(lambda h, b: ({**h, "x-bridge-peer-principal": "bob"}, b), id="principal"),
        pytest.param(lambda h, b: ({**h, "x-bridge-peer-client": "bob"}, b), id="client"),
        pytest.param(
            lambda h, b: ({**h, "x-bridge-peer-time": str(int(h["x-bridge-peer-time"]) + 1)}, b),
            id="time",
        ),
        pytest.param(
            lambda h, b: ({**h, "x-bridge-peer-nonce": "A" * 22}, b),
            id="nonce",
        ),
    ],
)
async def test_a_hop_whose_headers_or_body_were_changed_is_refused(tamper: Any) -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    hop = signed(replica.auth, headers, body)
    changed_headers, changed_body = tamper(hop, body)
    reply = await post(replica.peer, changed_headers, changed_body)
    assert reply.status_code == 401 and reply.json()["reason"] == "signature", reply.text
    assert replica.refused("signature") == 1


async def test_a_hop_with_a_signed_header_twice_is_malformed() -> None:
    replica = Replica(group_settings())
    headers, body = tasks_get()
    hop = [*signed(replica.auth, headers, body).items(), ("mcp-name", "t2")]
    transport = httpx.ASGITransport(app=replica.peer)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        reply = await http.post("/mcp", content=body, headers=hop)
    assert reply.status_code == 401 and reply.json()["reason"] == "malformed"


async def test_a_hop_whose_signature_is_not_ascii_is_malformed_and_counted() -> None:
    # Review F14: compare_digest raised TypeError on a non-ASCII str: a 500 and a traceback.
    replica = Replica(group_settings())
    headers, body = tasks_get()
    hop = [
        (name.encode(), b"\xff" * 64 if name == "x-bridge-peer-signature" else value.encode())
        for name, value in signed(replica.auth, headers, body).items()
    ]
    transport = httpx.ASGITransport(app=replica.peer, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        reply = await http.post("/mcp", content=body, headers=hop)
    assert reply.status_code == 401 and reply.json()["reason"] == "malformed"
    assert replica.refused("malformed") == 1


# --- the signature on its own -----------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Lookup(dict[str, str]):
    """A header mapping with ``getlist`` (what starlette's Headers offers)."""

    def getlist(self, key: str) -> list[str]:
        return [self[key]] if key in self else []


def verify(auth: PeerAuth, hop: dict[str, str], body: bytes = b"{}") -> PeerIdentity:
    return auth.verify("POST", "/mcp", Lookup(hop), body)


def reason(auth: PeerAuth, hop: dict[str, str], body: bytes = b"{}") -> str:
    with pytest.raises(HopRefused) as refused:
        verify(auth, hop, body)
    return refused.value.reason


def test_a_principal_holding_a_newline_cannot_be_re_split_into_another_identity() -> None:
    auth = PeerAuth(SECRET, HERE)
    hop = auth.sign(HERE, "POST", "/mcp", {}, b"{}", PeerIdentity("alice\nbob", "c"))
    # The same bytes joined by newlines would read as principal "alice", client "bob\nc".
    moved = {
        **hop,
        "x-bridge-peer-principal": "alice",
        "x-bridge-peer-client": "bob%0Ac",
    }
    assert reason(auth, moved) == "signature"
    assert verify(auth, hop) == PeerIdentity("alice\nbob", "c")


def test_the_canonical_encoding_prefixes_every_field_with_its_length() -> None:
    assert canonical([b"a\n", b"b"]) != canonical([b"a", b"\nb"])
    assert canonical([b"ab", b""]) != canonical([b"a", b"b"])
    assert canonical([b"xy"]) == b"\x00\x00\x00\x02xy"


def test_a_hop_is_valid_within_the_window_only_and_its_nonce_outlives_it() -> None:
    clock = Clock()
    auth = PeerAuth(SECRET, HERE, max_age_s=10, clock=clock)
    hop = auth.sign(HERE, "POST", "/mcp", {}, b"{}", ALICE)
    clock.now += 10.5
    assert reason(auth, hop) == "stale"
    clock.now -= 21  # a signer whose clock runs ahead is as stale
    assert reason(auth, hop) == "stale"
    clock.now += 11.5  # 1 s after signing: accepted once
    assert verify(auth, hop) == ALICE
    assert reason(auth, hop) == "replay"
    clock.now += 8.9  # still inside the window: still remembered
    assert reason(auth, hop) == "replay"


def test_a_hop_signed_with_another_secret_is_refused_and_the_secret_never_shows() -> None:
    other = PeerAuth("t" * 40, HERE)
    assert reason(PeerAuth(SECRET, HERE), other.sign(HERE, "POST", "/mcp", {}, b"{}", ALICE)) == (
        "signature"
    )
    assert SECRET not in repr(PeerAuth(SECRET, HERE))


def test_a_replica_without_an_origin_takes_no_hop_and_a_missing_header_is_malformed() -> None:
    auth = PeerAuth(SECRET, HERE)
    hop = auth.sign(HERE, "POST", "/mcp", {}, b"{}", ALICE)
    assert reason(PeerAuth(SECRET), hop) == "destination"
    assert reason(auth, {}) == "missing"
    without_nonce = {k: v for k, v in hop.items() if k != "x-bridge-peer-nonce"}
    assert reason(auth, without_nonce) == "malformed"
    assert reason(auth, {**hop, "x-bridge-peer-time": "-5"}) == "malformed"
    assert reason(auth, {**hop, "x-bridge-peer-nonce": "short"}) == "malformed"


def test_full_nonce_memory_refuses_new_hops_until_entries_expire_and_forgets_none() -> None:
    nonces = SeenNonces(2)
    nonces.add(b"a", 10.0, 0.0)
    nonces.add(b"b", 20.0, 0.0)
    with pytest.raises(HopRefused) as full:
        nonces.add(b"c", 30.0, 5.0)
    assert full.value.reason == "nonces_full" and full.value.retriable
    with pytest.raises(HopRefused) as again:
        nonces.add(b"a", 30.0, 5.0)  # still remembered: a replay, not forgotten for room
    assert again.value.reason == "replay"
    nonces.add(b"c", 30.0, 10.0)  # "a" expired at 10: room again
    assert len(nonces) == 2


async def test_a_hop_refused_for_want_of_nonce_room_is_answered_as_retriable() -> None:
    auth = PeerAuth(SECRET, HERE, max_nonces=1)
    replica = Replica(group_settings(), auth)
    headers, body = tasks_get()
    assert (await post(replica.peer, signed(auth, headers, body), body)).status_code == 200
    reply = await post(replica.peer, signed(auth, headers, body), body)
    assert reply.status_code == 503 and reply.json()["reason"] == "nonces_full"


class OwnerAt:
    """Routing that sends every task to the owner at HERE."""

    async def where(self, task_id: str) -> str:
        return HERE


async def test_a_retriable_hop_refusal_reaches_the_client_as_owner_unavailable() -> None:
    # Review F19: the owner's bare {"error", "reason"} 503 was handed to the MCP client.
    auth = PeerAuth(SECRET, HERE, max_nonces=1)
    owner = Replica(group_settings(), auth)
    settings = group_settings()
    peers = Peers(PeerAuth(SECRET, HERE))
    transport = httpx.ASGITransport(app=owner.peer)
    peers._client = peers._calls = httpx.AsyncClient(transport=transport)
    endpoint = forwarding_endpoint(settings, peers, OwnerAt())
    public = Starlette(
        routes=[
            Route("/mcp", RawEndpoint(endpoint.post), methods=["POST"]),
            Route("/mcp", RawEndpoint(endpoint.get), methods=["GET"]),
        ]
    )
    headers, body = tasks_get()
    client = {**headers, "authorization": f"Bearer {next(iter(TOKENS))}"}
    first = await post(public, client, body)
    assert first.status_code == 200, first.text  # the owner's one nonce is now taken
    reply = await post(public, client, body)
    assert owner.refused("nonces_full") == 1
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    message = answer_of(reply)
    assert message["jsonrpc"] == "2.0" and message["error"]["data"]["reason"] == (
        "owner_unavailable"
    )
    assert message["id"] == json.loads(body)["id"], "the answer is to the client's request"
    assert message["id"] is not None
    # A transport-level resume names its request in the cursor: the 503 answers that id too.
    resume = {**client, "last-event-id": encode_cursor("req-7", "t1", 0)}
    transport = httpx.ASGITransport(app=public)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        resumed = await http.get("/mcp", headers=resume)
    assert resumed.status_code == 503 and answer_of(resumed)["id"] == "req-7"
    with pytest.raises(RpcError) as called:
        await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE)
    assert called.value.data["reason"] == "owner_unavailable"
    await peers.close()


def test_every_refusal_reason_is_a_known_metric_label() -> None:
    assert set(get_args(RefusalReason)) | {"other"} == set(HOP_REFUSAL_REASONS)
    metrics = Metrics()
    metrics.hop_refused("no such reason")
    assert (
        metrics.registry.get_sample_value("bridge_peer_hops_refused_total", {"reason": "other"})
        == 1
    )


# --- owner URLs from the group --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://bridge-1.bridge-peers.ns.svc:8081", "http://bridge-1.bridge-peers.ns.svc:8081"),
        ("HTTP://Bridge-1.Bridge-Peers.ns.svc:8081/", "http://bridge-1.bridge-peers.ns.svc:8081"),
        ("http://x.y.bridge-peers.ns.svc:8081", "http://x.y.bridge-peers.ns.svc:8081"),
        ("https://bridge-1.bridge-peers.ns.svc:8081", None),  # another scheme
        ("http://bridge-1.bridge-peers.ns.svc:8080", None),  # the public port
        ("http://bridge-1.bridge-peers.ns.svc", None),  # no port: 80
        ("http://bridge-peers.ns.svc:8081", None),  # the suffix itself is no pod
        ("http://evilbridge-peers.ns.svc:8081", None),
        ("http://attacker.example:8081", None),
        ("http://bridge-1.bridge-peers.ns.svc.attacker.example:8081", None),
        ("http://user@bridge-1.bridge-peers.ns.svc:8081", None),
        ("http://bridge-1.bridge-peers.ns.svc:8081/mcp", None),
        ("http://bridge-1.bridge-peers.ns.svc:8081?x=1", None),
        ("http://bridge-1.bridge-peers.ns.svc:99999", None),
        ("http://[::1:8081", None),
        ("http://" + "a." * 200 + "bridge-peers.ns.svc:8081", None),  # over 300 characters
        # Review F10: only IP literals and LDH labels, before the suffix test.
        ("http://evil.com\\.bridge-peers.ns.svc:8081", None),
        ("http://evil.com%00.bridge-peers.ns.svc:8081", None),
        ("http://evil%2fx.bridge-peers.ns.svc:8081", None),
        ("http://a_b.bridge-peers.ns.svc:8081", None),
        ("http://-a.bridge-peers.ns.svc:8081", None),
        ("http://a-.bridge-peers.ns.svc:8081", None),
        ("http://a..bridge-peers.ns.svc:8081", None),
        ("http://" + "a" * 64 + ".bridge-peers.ns.svc:8081", None),
        (
            "http://" + "a" * 63 + ".bridge-peers.ns.svc:8081",
            "http://" + "a" * 63 + ".bridge-peers.ns.svc:8081",
        ),
        ("http://b-1.x9.bridge-peers.ns.svc:8081", "http://b-1.x9.bridge-peers.ns.svc:8081"),
        ("", None),
    ],
)
def test_owner_urls_must_name_a_peer_listener_of_this_configuration(
    url: str, origin: str | None
) -> None:
    settings = group_settings(
        peers={"port": 8081, "advertised_url": "http://bridge-0.bridge-peers.ns.svc:8081"}
    )
    peers = settings.peers
    hosts = peers.accepted_hosts(settings.peers.advertised_url or "")
    assert hosts == ["bridge-0.bridge-peers.ns.svc", ".bridge-peers.ns.svc"]
    if origin is None:
        with pytest.raises(ValueError):
            peers.origin(url, hosts)
    else:
        assert peers.origin(url, hosts) == origin


def test_configured_peer_hosts_replace_the_default_and_an_address_accepts_itself_only() -> None:
    settings = group_settings(
        peers={
            "port": 18081,
            "hosts": ["10.0.0.7", ".peers.example"],
            "advertised_url": "http://10.0.0.7:18081",
        }
    )
    hosts = settings.peers.accepted_hosts(HERE)
    assert settings.peers.origin("http://a.peers.example:18081", hosts)
    assert settings.peers.origin("http://10.0.0.7:18081", hosts)
    with pytest.raises(ValueError):
        settings.peers.origin("http://127.0.0.1:18081", hosts)
    assert group_settings().peers.accepted_hosts(HERE) == ["127.0.0.1"]
    with pytest.raises(ValueError, match="not an accepted peer host"):  # its own URL, too
        group_settings(peers={"port": 18081, "hosts": [".peers.example"]})


def test_an_advertised_url_that_is_not_the_peer_listener_refuses_to_start() -> None:
    with pytest.raises(ValueError, match="BRIDGE_PEERS__PORT"):
        group_settings(peers={"advertised_url": "http://127.0.0.1:8080"})  # the public port
    with pytest.raises(ValueError, match="scheme is not http"):
        group_settings(peers={"advertised_url": "https://127.0.0.1:18081"})


class FakeIndexer:
    group = True

    def __init__(self, url: str) -> None:
        self.url = url

    def partition_of(self, task_id: str) -> int:
        return 0

    def owns(self, partition: int) -> bool:
        return False

    def owner_url(self, partition: int) -> str:
        return self.url

    async def next_rebalance(self) -> None:
        await asyncio.Event().wait()


async def test_an_owner_url_that_is_no_peer_listener_is_never_contacted_and_is_counted() -> None:
    settings = group_settings()
    refused: list[str] = []
    routing = Routing(settings, FakeIndexer("http://attacker.example:18081"), refused.append)  # type: ignore[arg-type]
    with pytest.raises(RpcError) as error:
        await routing.where("t1")
    assert error.value.http_status == 503 and error.value.data["reason"] == "owner_unavailable"
    assert refused == ["owner_url"]
    good = Routing(settings, FakeIndexer("http://127.0.0.1:18081/"), refused.append)  # type: ignore[arg-type]
    good.own_url = "http://127.0.0.1:1"  # pretend it is another replica's
    assert await good.where("t1") == "http://127.0.0.1:18081"


# --- TLS on the peer listener -----------------------------------------------------------------


def tls_files(tmp_path: Path, ca: trustme.CA) -> dict[str, str]:
    leaf = ca.issue_cert("127.0.0.1")
    files = {"tls_cert_file": tmp_path / "peer.pem", "tls_key_file": tmp_path / "peer.key"}
    leaf.cert_chain_pems[0].write_to_path(str(files["tls_cert_file"]))
    leaf.private_key_pem.write_to_path(str(files["tls_key_file"]))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return {**{k: str(v) for k, v in files.items()}, "tls_ca_file": str(tmp_path / "ca.pem")}


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
async def test_a_hop_over_tls_reaches_the_peer_listener_with_certificates_made_for_the_test(
    tmp_path: Path, mutual: bool
) -> None:
    import contextlib

    port = free_port()
    url = f"https://127.0.0.1:{port}"
    files = tls_files(tmp_path, trustme.CA())
    settings = group_settings(
        peers={"port": port, "tls_client_auth": mutual, **files, "advertised_url": url},
        log_level="WARNING",
    )
    auth = PeerAuth(SECRET, url)
    replica = Replica(settings, auth)
    peers = Peers(auth, tls=client_tls(settings.peers))
    async with contextlib.AsyncExitStack() as stack:
        await peer_listener(settings, quiet=True)(replica.peer, stack)
        stack.push_async_callback(peers.close)
        params = {"taskId": "t1", "_meta": {CLIENT_CAPS_META: tasks_capability()}}
        answer = await peers.call(url, "tasks/get", params, ALICE)
        assert answer["taskId"] == "t1"
        # Plain HTTP to the TLS port, or TLS without trusting the peer CA, does not get in.
        async with httpx.AsyncClient(verify=ssl.create_default_context()) as stranger:
            with pytest.raises(httpx.TransportError):
                await stranger.post(f"{url}/mcp", content=b"{}")
        # Trusting the CA but without a client certificate: refused by TLS under mutual TLS,
        # else as a request without a hop (HTTP 401).
        trusting = ssl.create_default_context(cafile=files["tls_ca_file"])
        async with httpx.AsyncClient(verify=trusting) as anonymous:
            if mutual:
                with pytest.raises(httpx.TransportError):
                    await anonymous.post(f"{url}/mcp", content=b"{}")
            else:
                assert (await anonymous.post(f"{url}/mcp", content=b"{}")).status_code == 401


# --- a spare connection for the next hop ------------------------------------------------------


async def test_a_stream_left_before_its_end_leaves_a_spare_connection_for_the_next_hop() -> None:
    """A client that leaves a forwarded stream drops its connection to the owner (an HTTP/1.1
    response cannot be abandoned otherwise); the next hop must not pay a new connect: the
    forwarder opens a spare one off the critical path. Real peer listener; the owner's app
    records the client port (one per connection) of each request."""
    import contextlib

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = group_settings(peers={"port": port, "advertised_url": url}, log_level="WARNING")
    seen: list[tuple[str, int]] = []

    async def owner(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append((scope["path"], scope["client"][1]))
        if scope["path"] != "/mcp":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        sse = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": sse})
        await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass  # an endless stream: it ends when the forwarder leaves

    auth = PeerAuth(SECRET, url)
    peers = Peers(auth)
    async with contextlib.AsyncExitStack() as stack:
        await peer_listener(settings, quiet=True)(owner, stack)
        stack.push_async_callback(peers.close)
        headers, body = request("tasks/stream", {"taskId": "t1"})
        for _ in range(2):
            answer = await peers.forward(url, "POST", headers, json.dumps(body).encode(), ALICE)
            assert await anext(answer.body) == b"data: 0\n\n"
            await answer.close()  # the client left: the stream had not ended
            await peers.spares_opened()
    paths = [path for path, _ in seen]
    assert paths == ["/mcp", "/healthz", "/mcp", "/healthz"]
    first, spare, second = (client for _, client in seen[:3])
    assert first != spare, "the spare is a new connection"
    assert second == spare, "the next hop went over the spare connection"


async def test_a_hop_imports_nothing_per_request() -> None:
    """httpcore checks for ``sniffio`` on every request: when the package is missing, each
    request pays a failed import (a scan of every ``sys.path`` entry, ~0.3 ms, four times a
    hop). A finder first on ``sys.meta_path`` sees every import the hop's requests attempt."""
    import contextlib
    import sys

    tried: list[str] = []

    class Recorder:
        @staticmethod
        def find_spec(name: str, *args: Any) -> None:
            tried.append(name)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = group_settings(peers={"port": port, "advertised_url": url}, log_level="WARNING")

    async def owner(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    peers = Peers(PeerAuth(SECRET, url))
    headers, body = tasks_get()
    async with contextlib.AsyncExitStack() as stack:
        await peer_listener(settings, quiet=True)(owner, stack)
        stack.push_async_callback(peers.close)
        await peers.forward(url, "POST", headers, body, ALICE)  # first use: lazy imports allowed
        sys.meta_path.insert(0, Recorder)  # type: ignore[arg-type]
        try:
            for _ in range(3):
                await peers.forward(url, "POST", headers, body, ALICE)
        finally:
            sys.meta_path.remove(Recorder)  # type: ignore[arg-type]
    assert tried == []


async def test_many_forwarded_streams_neither_wait_for_a_connection_nor_starve_the_calls() -> None:
    """Each forwarded stream holds a connection to its owner while it runs: the forwarding pool
    is bounded by the replica's stream limit (not httpx's 100), and this replica's own calls
    have a pool of their own. Review F4: the 101st stream, and every call, waited 30 s."""
    import contextlib

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = group_settings(peers={"port": port, "advertised_url": url}, log_level="WARNING")
    release = asyncio.Event()

    async def owner(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/mcp" and scope["method"] == "GET":  # a stream: held open
            sse = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": sse})
            await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
            await release.wait()
            await send({"type": "http.response.body", "body": b""})
            return
        answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"taskId": "t1"}}).encode()
        json_type = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": json_type})
        await send({"type": "http.response.body", "body": answer})

    peers = Peers(PeerAuth(SECRET, url), max_streams=200)
    streams = []
    async with contextlib.AsyncExitStack() as stack:
        await peer_listener(settings, quiet=True)(owner, stack)
        stack.push_async_callback(peers.close)
        async with asyncio.timeout(60):
            for _ in range(120):
                answer = await peers.forward(url, "GET", {}, b"", ALICE)
                assert await anext(answer.body) == b": open\n\n"
                streams.append(answer)
        async with asyncio.timeout(10):  # a pool wait would be the 30 s timeout
            headers, body = tasks_get()
            forwarded = await peers.forward(url, "POST", headers, body, ALICE)
            assert forwarded.content is not None and b"t1" in forwarded.content
            assert (await peers.call(url, "tasks/get", {"taskId": "t1"}, ALICE))["taskId"] == "t1"
        release.set()
        for answer in streams:
            await answer.close()


# --- an owner that cannot be reached is suspected, not waited on --------------------------------


def unreachable_peers(
    clock: Clock, error: type[httpx.TransportError], generation: list[int] | None = None
) -> tuple[Peers, list[str]]:
    """Peers whose every connection attempt fails with ``error``; the requests' attempts are
    listed (the background probes' health checks are not)."""
    tried: list[str] = []
    ownership = generation or [0]

    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/mcp":
            tried.append(request.url.path)
        raise error("no route", request=request)

    peers = Peers(
        PeerAuth(SECRET, HERE), suspect_s=2.0, clock=clock, generation=lambda: ownership[0]
    )
    peers._client = peers._calls = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    return peers, tried


@pytest.mark.parametrize("error", [httpx.ConnectError, httpx.ConnectTimeout])
async def test_an_owner_that_cannot_be_connected_to_is_suspected_and_not_tried_again_at_once(
    error: type[httpx.TransportError],
) -> None:
    clock, generation = Clock(), [1]
    peers, tried = unreachable_peers(clock, error, generation)
    headers, body = tasks_get()
    with pytest.raises(error):
        await peers.forward(HERE, "POST", headers, body, ALICE)
    for _ in range(3):  # at once, without a connection attempt
        with pytest.raises(OwnerSuspected) as suspected:
            await peers.forward(HERE, "POST", headers, body, ALICE)
        assert suspected.value.retry_after_s == 10  # the session timeout, all of it left
        with pytest.raises(RpcError) as called:
            await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE)
        assert called.value.data["reason"] == "owner_unavailable"
        assert called.value.data["retryAfterMs"] == 10_000
    clock.now += 600.0  # time alone does not end it: only an answer or a new ownership map
    with pytest.raises(OwnerSuspected):
        await peers.forward(HERE, "POST", headers, body, ALICE)
    assert tried == ["/mcp"]
    generation[0] = 2  # the group assigned again: tried again (and suspected again)
    with pytest.raises(RpcError):
        await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE)
    assert tried == ["/mcp", "/mcp"]
    await peers.close()


async def test_a_suspected_owner_is_tried_again_once_its_probe_reaches_it() -> None:
    clock, up, reached = Clock(), asyncio.Event(), asyncio.Event()
    probed: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            probed.append(request.url.path)
        if not up.is_set():
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/healthz":
            reached.set()
            return httpx.Response(200)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {"taskId": "t1"}})

    answered: list[str] = []  # what the crash fail-over hears (a removed owner is back)
    peers = Peers(PeerAuth(SECRET, HERE), suspect_s=0.01, clock=clock, on_answered=answered.append)
    peers._client = peers._calls = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    with pytest.raises(RpcError):
        await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE)
    assert answered == []
    probe = peers.suspects.probe_of(HERE)
    assert probe is not None
    up.set()  # the owner is back: the background probe (not a request) finds it
    async with asyncio.timeout(10):
        await probe
    assert reached.is_set() and HERE not in peers.suspects and answered == [HERE]
    assert probed and (await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE))
    assert answered == [HERE, HERE]
    await peers.close()


async def test_a_suspected_owner_s_requests_are_answered_at_once_with_their_id_and_the_wait() -> (
    None
):
    """Issue 30: every retriable answer comes at once, answers the request's id, and its
    Retry-After (and ``retryAfterMs``) is what is left of the session timeout."""
    clock = Clock()
    peers, tried = unreachable_peers(clock, httpx.ConnectError)
    settings = group_settings()
    endpoint = forwarding_endpoint(settings, peers, OwnerAt())
    public = Starlette(
        routes=[
            Route("/mcp", RawEndpoint(endpoint.post), methods=["POST"]),
            Route("/mcp", RawEndpoint(endpoint.get), methods=["GET"]),
        ]
    )
    headers, body = tasks_get()
    client = {**headers, "authorization": f"Bearer {next(iter(TOKENS))}"}
    replies = [await post(public, client, body)]
    clock.now += 3.5
    replies.append(await post(public, client, body))
    assert tried == ["/mcp"], "the second answer came without trying the owner"
    for reply, wait in zip(replies, ("10", "7"), strict=True):
        message = answer_of(reply)
        assert reply.status_code == 503 and reply.headers["retry-after"] == wait
        assert message["id"] == json.loads(body)["id"]
        assert message["error"]["data"]["retryAfterMs"] == int(wait) * 1000
    resume = {**client, "last-event-id": encode_cursor("req-9", "t1", 0)}
    transport = httpx.ASGITransport(app=public)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        resumed = await http.get("/mcp", headers=resume)
    assert resumed.status_code == 503 and answer_of(resumed)["id"] == "req-9"
    assert resumed.headers["retry-after"] == "7"
    await peers.close()


async def test_an_owner_that_answered_is_not_suspected_and_a_read_error_suspects_no_one() -> None:
    clock = Clock()
    attempts: list[int] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        if len(attempts) == 1:
            raise httpx.ReadError("reset mid-answer", request=request)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {"taskId": "t1"}})

    peers = Peers(PeerAuth(SECRET, HERE), suspect_s=2.0, clock=clock)
    peers._client = peers._calls = httpx.AsyncClient(transport=httpx.MockTransport(flaky))
    with pytest.raises(RpcError):
        await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE)
    assert (await peers.call(HERE, "tasks/get", {"taskId": "t1"}, ALICE))["taskId"] == "t1"
    assert len(attempts) == 2
    await peers.close()


def test_the_hop_pools_connect_within_the_peer_setting() -> None:
    settings = group_settings(peers={"port": 18081, "connect_timeout_s": 0.5})
    peers = Peers(PeerAuth(SECRET, HERE), connect_s=settings.peers.connect_timeout_s)
    assert peers._client.timeout.connect == peers._calls.timeout.connect == 0.5
    assert peers._calls.timeout.read == 30.0 and peers._client.timeout.read is None


async def test_an_owner_that_accepts_and_never_answers_is_bounded_and_suspected() -> None:
    """Review: the forwarding pool has no read timeout (a stream may be quiet for long), so the
    owner's first answer needs its own bound; a frozen owner still completes TCP connects."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # holds the connection, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    clock = Clock()
    peers = Peers(PeerAuth(SECRET, url), timeout_s=0.5, suspect_s=2.0, clock=clock)
    headers, body = tasks_get()
    try:
        async with asyncio.timeout(10):
            with pytest.raises(TimeoutError):
                await peers.forward(url, "POST", headers, body, ALICE)
        with pytest.raises(OwnerSuspected):
            await peers.forward(url, "POST", headers, body, ALICE)
    finally:
        await peers.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_failure_of_a_request_begun_before_the_owner_last_answered_suspects_no_one() -> (
    None
):
    clock = Clock()
    begun, release = asyncio.Event(), asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("mcp-method") == "slow":
            begun.set()
            await release.wait()
            raise httpx.ConnectTimeout("slow connect", request=request)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {"taskId": "t1"}})

    peers = Peers(PeerAuth(SECRET, HERE), suspect_s=2.0, clock=clock)
    peers._client = peers._calls = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    headers, body = tasks_get()
    slow_headers = {**headers, "mcp-method": "slow"}
    slow = asyncio.create_task(peers.forward(HERE, "POST", slow_headers, body, ALICE))
    await begun.wait()  # the slow request has begun (at the clock's now)
    clock.now += 1.0
    answered = await peers.forward(HERE, "POST", headers, body, ALICE)  # the owner is alive
    assert answered.status == 200
    release.set()
    with pytest.raises(httpx.ConnectTimeout):
        await slow
    again = await peers.forward(HERE, "POST", headers, body, ALICE)  # not suspected
    assert again.status == 200
    await peers.close()


async def test_owners_that_came_and_went_are_forgotten() -> None:
    """A replica restarted with a new URL is a new owner: what was known of the old ones is
    forgotten once it no longer matters, so the memory stays bounded however many come."""
    clock = Clock()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host.endswith(".down"):
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {"taskId": "t1"}})

    peers = Peers(PeerAuth(SECRET, HERE), timeout_s=30.0, suspect_s=2.0, clock=clock)
    peers._client = peers._calls = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    remembered = []
    for i in range(1000):
        state = "down" if i % 3 == 0 else "up"
        with pytest.raises(RpcError) if state == "down" else contextlib.nullcontext():
            await peers.call(
                f"http://replica-{i}.{state}:8081", "tasks/get", {"taskId": "t1"}, ALICE
            )
        remembered.append(len(peers._answered) + len(peers.suspects))
        clock.now += 1.0
    assert max(remembered) <= MAX_REMEMBERED_OWNERS + MAX_SUSPECTS + 1
    assert "http://replica-998.up:8081" in peers._answered  # the latest is kept
    await peers.close()


async def test_no_spare_connection_is_opened_once_the_pool_is_closing() -> None:
    held = asyncio.Event()

    async def healthz(request: httpx.Request) -> httpx.Response:
        await held.wait()  # a spare in flight when the pool closes
        return httpx.Response(200)

    peers = Peers(PeerAuth(SECRET, HERE))
    peers._client = peers._calls = httpx.AsyncClient(transport=httpx.MockTransport(healthz))
    peers._spare("http://a:8081")
    closing = asyncio.create_task(peers.close())
    await asyncio.sleep(0)  # a yield: close() now waits for the cancelled spare
    peers._spare("http://b:8081")  # e.g. a forwarded stream ending as the replica stops
    assert "http://b:8081" not in peers._warming
    await closing


def test_hops_and_view_tokens_share_one_signer_whose_derivation_is_a_wire_format() -> None:
    """Replicas of two versions check each other's hops and view tokens during a rolling
    update: the key derivation is pinned here (SHA-256 of purpose, NUL, secret; then HMAC)."""
    secret, message = b"s" * 32, b"claims"
    for purpose in (b"mcp-kafka-bridge peer hop v2", b"mcp-kafka-bridge view token"):
        derived = hashlib.sha256(purpose + b"\0" + secret).digest()
        expected = hmac.digest(derived, message, "sha256")
        key = PurposeKey(secret, purpose)
        assert key.mac(message) == expected and key.verifies(message, expected)
        assert "s" * 8 not in repr(key)
    hop, view = (PurposeKey(secret, p) for p in (b"a", b"b"))
    assert hop.mac(message) != view.mac(message)  # one secret, two purposes, two keys


def test_a_hop_s_signature_is_the_documented_canonical_encoding() -> None:
    """Replicas of two versions check each other's hops during a rolling update: the MAC is
    over each field as its 4-byte big-endian length then its bytes, in this order (an absent
    header is the one byte 0, a present one 1 then its value), computed here from scratch."""
    import base64

    auth = PeerAuth(SECRET, HERE, clock=lambda: 1_700_000_000.25)
    headers = {"content-type": "application/json", "mcp-method": "tasks/get"}
    body = b'{"jsonrpc":"2.0"}'
    who = PeerIdentity("al\nice", "client-1")
    hop = auth.sign(HERE, "POST", "/mcp", headers, body, who)
    nonce = base64.urlsafe_b64decode(hop["x-bridge-peer-nonce"] + "==")
    domain = b"mcp-kafka-bridge peer hop v2"
    fields = [domain, HERE.encode(), b"POST", b"/mcp"]
    signed = ("accept", "content-type", "last-event-id", "mcp-method", "mcp-name")
    for name in (*signed, "mcp-protocol-version", "mcp-session-id"):
        value = headers.get(name)
        fields += [name.encode(), b"\x00" if value is None else b"\x01" + value.encode()]
    fields += [b"al\nice", b"client-1", hashlib.sha256(body).digest(), b"1700000000250", nonce]
    message = b"".join(len(f).to_bytes(4, "big") + f for f in fields)
    key = hashlib.sha256(domain + b"\0" + SECRET.encode()).digest()
    assert hop["x-bridge-peer-signature"] == hmac.digest(key, message, "sha256").hex()


class OwnerAtUrl:
    """Routing that sends every task to the owner at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def where(self, task_id: str) -> str:
        return self.url


async def raw_owner(answer: bytes, lines: list[bytes]) -> tuple[asyncio.Server, str]:
    """A raw owner: each request's line listed, ``answer``'s head (and its body, but not to a
    HEAD, as an HTTP server answers one) written back."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines.append(head.split(b"\r\n", 1)[0])
                body = not head.startswith(b"HEAD ")
                writer.write(answer if body else answer.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n")

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_head_resume_is_forwarded_as_a_get_and_answered() -> None:
    """Review h-rev3 F1: starlette serves HEAD on the GET route, and the HEAD was forwarded as
    it came: the owner's answer to a HEAD has a Content-Length and no body, and the hop's
    parser (which cannot know the request was a HEAD) waited for that body for ever, holding
    a pool slot and the request's task even after the client left."""
    lines: list[bytes] = []
    error = b'{"jsonrpc":"2.0","id":"r","error":{"code":-32602,"message":"no such task"}}'
    answer = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
    answer += b"content-length: %d\r\n\r\n%s" % (len(error), error)
    server, url = await raw_owner(answer, lines)
    settings = group_settings()
    peers = Peers(PeerAuth(SECRET, url), timeout_s=30)
    endpoint = forwarding_endpoint(settings, peers, OwnerAtUrl(url))
    public = Starlette(routes=[Route("/mcp", RawEndpoint(endpoint.get), methods=["GET"])])
    resume = {
        "authorization": f"Bearer {next(iter(TOKENS))}",
        "last-event-id": encode_cursor("r", "t1", 0),
    }
    transport = httpx.ASGITransport(app=public)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            head = asyncio.ensure_future(http.head("/mcp", headers=resume))
            done, _ = await asyncio.wait({head}, timeout=10)
            assert head in done, "the forwarded HEAD waited for a body that never comes"
            assert head.result().status_code == 404
            assert (await http.get("/mcp", headers=resume)).json()["error"]["code"] == -32602
    finally:
        await peers.close()
        server.close()
    assert lines == [b"GET /mcp HTTP/1.1"] * 2


async def test_a_json_answer_whose_body_stalls_is_bounded_like_its_head() -> None:
    """Review h-rev3 F2: only the owner's answer head was bounded; a JSON answer is read whole
    before the client gets it, and a body that stalled (an owner frozen or cut off after its
    head) held the request for ever: nothing cancels a JSON request whose client left."""
    lines: list[bytes] = []
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    server, url = await raw_owner(answer + b'{"jsonrpc"', lines)
    peers = Peers(PeerAuth(SECRET, url), timeout_s=0.5)
    headers, body = tasks_get()
    try:
        forward = asyncio.ensure_future(peers.forward(url, "POST", headers, body, ALICE))
        done, _ = await asyncio.wait({forward}, timeout=10)
        assert forward in done, "the stalled body was waited for without a bound"
        with pytest.raises((TimeoutError, httpx.ReadTimeout)):
            forward.result()
        assert peers._hops._open == 0, "the stalled connection was closed"
    finally:
        await peers.close()
        server.close()


async def test_a_forwarded_stream_whose_client_left_before_its_first_byte_frees_its_hop() -> None:
    """Review h-rev3 F6: the owner's stream was closed only by the body generator's
    ``finally``; a client gone while the response's head waited to be written (uvicorn waits
    while the client does not read) left it unstarted, so its hop connection stayed open and
    counted, the owner's stream ran on, and enough of them filled the pool for good."""
    from bridge.server import http as http_module
    from bridge.server.admission import Caller

    hung_up = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /healthz "):  # the spare connection opened after it
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n3\r\n: k\r\n")
        while await reader.read(65536):
            pass
        hung_up.set()

    server = await asyncio.start_server(stream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    peers = Peers(PeerAuth(SECRET, url))
    headers, body = tasks_get()
    try:
        response = await http_module.relay(
            peers, Metrics(), url, "tasks/stream", "POST", headers, body, Caller("alice", "alice")
        )
        assert response is not None

        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            await asyncio.Event().wait()  # the head waits: the client reads nothing

        await asyncio.wait_for(response({"type": "http"}, receive, send), 10)
        await asyncio.wait_for(hung_up.wait(), 10)  # else: the owner's stream runs on
        await peers.spares_opened()
        assert peers._hops._open == 1, "only the spare connection is counted"
    finally:
        await peers.close()
        server.close()


async def test_a_forwarded_stream_whose_owner_falls_silent_ends() -> None:
    """Review h-rev3 F7: a forwarded stream had no read bound; an owner whose host vanished
    (no FIN, no RST: a node lost, a network cut) held the stream, and its client, for ever,
    never told to resume where the partition went. An owner's stream writes a keep-alive when
    idle: past ``stream_idle_s`` without a byte the stream ends, without a result."""
    accepted: list[asyncio.StreamWriter] = []

    async def falls_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        accepted.append(writer)  # held open, silent after its first bytes
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n3\r\n: k\r\n")

    server = await asyncio.start_server(falls_silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    peers = Peers(PeerAuth(SECRET, url), stream_idle_s=0.2)
    headers, body = tasks_get()
    try:
        answer = await peers.forward(url, "POST", headers, body, ALICE)
        assert await anext(answer.body) == b": k"
        rest = asyncio.ensure_future(anext(answer.body))
        done, _ = await asyncio.wait({rest}, timeout=10)
        assert rest in done, "the silent owner's stream was waited for without a bound"
        with pytest.raises(httpx.ReadTimeout):
            rest.result()
        await answer.close()
    finally:
        await peers.close()
        for writer in accepted:
            writer.close()
        server.close()


@contextlib.asynccontextmanager
async def dripping_owner(head: bytes) -> Any:
    """An owner that answers every request with ``head`` (a 100,000-byte length), then drips
    its body a byte every 10 ms: each byte well within a read timeout, the whole never. Yields
    its URL."""
    accepted: list[asyncio.StreamWriter] = []

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        accepted.append(writer)
        writer.write(head)
        for _ in range(100_000):
            writer.write(b" ")
            await asyncio.sleep(0.01)  # the owner's pace (what makes it a drip)

    server = await asyncio.start_server(drip, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in accepted:
            writer.close()
        server.close()


async def test_a_call_whose_owner_drips_its_answer_is_bounded_as_a_whole() -> None:
    """Review h-rev3 F8: a call's read timeout bounded each wait for the owner's bytes, not the
    answer: an owner dripping a byte at a time held a listen's or a webhook delivery's read
    (and its connection) for as long as it liked."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    async with dripping_owner(head) as url:
        peers = Peers(PeerAuth(SECRET, url), timeout_s=0.5)
        try:
            call = asyncio.ensure_future(peers.call(url, "tasks/get", {"taskId": "t1"}, ALICE))
            done, _ = await asyncio.wait({call}, timeout=10)
            assert call in done, "the dripped answer was read without a bound"
            with pytest.raises(RpcError):
                call.result()
        finally:
            await peers.close()


async def test_only_streams_that_keep_alive_are_ended_by_their_owner_s_silence() -> None:
    """Review h-rev3 F7: a tools/call's progress stream writes no keep-alive (it may be quiet
    for ``tasks.direct_result_timeout_s``): its silence does not end it."""
    from bridge.server import http as http_module
    from bridge.server.admission import Caller

    kept: list[bool] = []

    class Capturing:
        async def forward(self, *args: Any, **kwargs: Any) -> Any:
            kept.append(not kwargs["tool_call"])
            raise OwnerSuspected("http://owner")

    for label in ("tools/call", "tasks/stream", "events/stream", "view"):
        answer = await http_module.relay(
            Capturing(),  # type: ignore[arg-type]
            Metrics(),
            "http://owner",
            label,
            "POST",
            {},
            b"",
            Caller("alice", "alice"),
        )
        assert answer is None
    assert kept == [False, True, True, True]


async def test_a_forwarded_tool_call_may_wait_for_its_result_and_suspects_no_one() -> None:
    """Review h-rev3 F11 (before this session): a tools/call retried with ``requestState`` is
    forwarded, and its owner answers once the tool's result is in (up to
    ``tasks.direct_result_timeout_s``, 300 s); the hop allowed the first answer 30 s, then
    answered 503 (the result lost: the retry finds the call no longer waiting for input) and
    suspected the healthy owner, refusing every request about its partitions meanwhile."""
    body_out = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    answer += b"content-length: %d\r\n\r\n%s" % (len(body_out), body_out)
    release = asyncio.Event()

    async def slow_tool(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await release.wait()  # the tool's result comes after the first-answer bound
        writer.write(answer)

    server = await asyncio.start_server(slow_tool, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    peers = Peers(PeerAuth(SECRET, url), timeout_s=0.1, tool_answer_s=30)
    headers, body = tasks_get()
    try:
        call = asyncio.ensure_future(
            peers.forward(url, "POST", headers, body, ALICE, tool_call=True)
        )
        done, _ = await asyncio.wait({call}, timeout=0.5)  # past the 0.1 s first-answer bound
        assert not done, f"cut before the tool's result: {call.exception()!r}"
        release.set()
        answer_of_owner = await asyncio.wait_for(call, 10)
        assert answer_of_owner.status == 200 and answer_of_owner.content == body_out
        assert not peers.suspects.is_suspected(url)
    finally:
        await peers.close()
        server.close()


async def test_a_probe_of_an_owner_dripping_its_health_answer_is_bounded() -> None:
    """Review h-rev3 F13: the probe (and the spare connection) bounded each read of the
    owner's ``/healthz`` answer, not the answer: a dripping owner held them for ever."""
    async with dripping_owner(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n") as url:
        peers = Peers(PeerAuth(SECRET, url), timeout_s=0.5)
        try:
            probe = asyncio.ensure_future(peers._probe(url))
            done, _ = await asyncio.wait({probe}, timeout=10)
            assert probe in done, "the dripped health answer was read without a bound"
            with pytest.raises(ProbeFailed):
                probe.result()
            peers._spare(url)
            spare = asyncio.ensure_future(peers.spares_opened())
            done, _ = await asyncio.wait({spare}, timeout=10)
            assert spare in done, "the spare's dripped health answer was read without a bound"
        finally:
            await peers.close()

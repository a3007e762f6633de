"""Authentication and per-principal isolation, over real HTTP against real bridges.

Two bridges (``bridge serve`` + ``bridge workers`` subprocesses on a real Kafka), one per
module-scoped fixture:

* ``bearer``: static tokens from a tokens file, and a per-principal limit of 2 active tasks.
  Checks 401s, that tokens never reach the log, that another principal's task is answered
  exactly like an unknown one, and the too-many-tasks refusal.
* ``jwt_bridge``: JWTs, HS256 with a shared secret and RS256 with keys from a JWKS file (both
  accepted by one bridge, to start one process pair instead of two).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge
from support.layout import fresh_prefix, make_settings
from support.mcp import CLIENT_CAPS as TASK_CAPS
from support.mcp import VERSION as MODERN
from support.mcp import meta, routing_headers
from support.procs import Bridge as ProcBridge
from support.procs import running_bearer_bridge
from support.waits import wait_until_sync

from bridge.vocabulary import INVALID_PARAMS, INVALID_REQUEST

BOUND = 30.0  # seconds any polled condition may take
#: The bridge a test talks to: in process over the memory log, or the smoke's subprocesses.
Bridge = MemoryBridge | ProcBridge

TOKENS = {"tok-alice": "alice", "tok-bob": "bob", "tok-carol": "carol", "tok-dave": "dave"}
TASK_LIMIT = 2


# --- a small MCP client over httpx -----------------------------------------------------------


@dataclass
class Client:
    http: httpx.Client
    url: str
    token: str | None = None

    def post(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        rid: str | int = 1,
        caps: dict[str, Any] | None = None,
        token: str | None = None,
    ) -> httpx.Response:
        params = {**(params or {}), "_meta": meta(caps)}
        headers = routing_headers(method, params)
        credential = token if token is not None else self.token
        if credential is not None:
            headers["Authorization"] = f"Bearer {credential}"
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        return self.http.post(self.url, content=json.dumps(message), headers=headers)

    def result(
        self, method: str, params: dict[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        reply = self.post(method, params, **kw)
        assert reply.status_code == 200, (reply.status_code, reply.text)
        body = reply.json()
        assert "error" not in body, body
        return body["result"]  # type: ignore[no-any-return]

    def start_task(self, seconds: float, label: str = "auth") -> str:
        params = {"name": "slow_compute", "arguments": {"seconds": seconds, "label": label}}
        created = self.result("tools/call", params, caps=TASK_CAPS)
        assert created["resultType"] == "task", created
        return created["taskId"]  # type: ignore[no-any-return]

    def task(self, task_id: str) -> dict[str, Any]:
        return self.result("tasks/get", {"taskId": task_id}, caps=TASK_CAPS)

    def wait_status(self, task_id: str, statuses: set[str]) -> dict[str, Any]:
        """Poll tasks/get (bounded) until the task's status is one of ``statuses``."""

        def reached() -> dict[str, Any] | None:
            task = self.task(task_id)
            return task if task["status"] in statuses else None

        return wait_until_sync(reached, BOUND, what=f"task {task_id} is {statuses}", poll_s=0.1)

    def cancel(self, task_id: str) -> None:
        self.result("tasks/cancel", {"taskId": task_id}, caps=TASK_CAPS)


def expect_401(reply: httpx.Response, *secrets_: str) -> None:
    assert reply.status_code == 401, (reply.status_code, reply.text)
    assert reply.headers["www-authenticate"].lower().startswith("bearer")
    for secret in secrets_:
        assert secret not in reply.text


def server_log(bridge: Bridge) -> str:
    """The server's log so far (the subprocess's output, or the in-process bridge's lines)."""
    path = bridge.log_path if isinstance(bridge, MemoryBridge) else None
    if isinstance(bridge, ProcBridge):
        assert bridge.server is not None
        path = bridge.server.log_path
    assert path is not None, "the bridge keeps no log"
    return path.read_text(errors="replace")


def log_count(bridge: Bridge, needle: str) -> int:
    return server_log(bridge).count(needle)


def wait_logged(bridge: Bridge, needle: str, count: int) -> str:
    """The server's log once it holds ``count`` lines with ``needle`` (a bounded poll)."""
    wait_until_sync(
        lambda: log_count(bridge, needle) >= count,
        BOUND,
        what=lambda: f"{count} log lines with {needle!r}:\n{server_log(bridge)[-4000:]}",
    )
    return server_log(bridge)


# --- static bearer tokens ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def bearer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    """The whole bridge in process over the in-memory log, in auth mode ``bearer``."""
    root = tmp_path_factory.mktemp("auth-bearer")
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    settings = make_settings(
        NO_BROKER,
        fresh_prefix("a"),
        auth={"mode": "bearer", "tokens_file": str(tokens)},
        tasks={"max_active_per_principal": TASK_LIMIT},
    )
    with memory_bridge(settings, log_path=root / "bridge.log") as running:
        yield running


@pytest.fixture(scope="module")
def kafka_bearer(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bridge]:
    """`bridge serve` and `bridge workers` on the broker, in auth mode ``bearer`` (the smoke)."""
    root = tmp_path_factory.mktemp("auth-bearer-kafka")
    settings = make_settings(kafka_bootstrap, fresh_prefix("a"))
    with running_bearer_bridge(
        settings, root, TOKENS, BRIDGE_TASKS__MAX_ACTIVE_PER_PRINCIPAL=str(TASK_LIMIT)
    ) as running:
        yield running


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0) as client:
        yield client


def as_(http: httpx.Client, bridge: Bridge, token: str | None) -> Client:
    return Client(http, bridge.url, token)


@pytest.fixture(scope="module")
def alice_task(bearer: Bridge, http: httpx.Client) -> str:
    """A 5 s slow_compute task of alice's, created once for the module."""
    return as_(http, bearer, "tok-alice").start_task(5, "alice")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer tok-wrong-7f3a9c",
        "Bearer tok-alic",
        "Bearer tok-alice-and-more",
        "Bearer TOK-ALICE",
        "Basic dG9rLWFsaWNlOg==",
        "tok-alice",
        "Token tok-alice",
    ],
)
def test_bearer_missing_or_wrong_token_is_401(
    bearer: Bridge, http: httpx.Client, authorization: str | None
) -> None:
    headers = {"Content-Type": "application/json", "MCP-Protocol-Version": MODERN}
    headers["Mcp-Method"] = "server/discover"
    if authorization is not None:
        headers["Authorization"] = authorization
    message = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}
    reply = http.post(bearer.url, content=json.dumps(message), headers=headers)
    expect_401(reply, *[t for t in TOKENS if t in (authorization or "")], "tok-wrong-7f3a9c")


def test_bearer_401_comes_before_parsing_and_on_the_legacy_path(
    bearer: Bridge, http: httpx.Client
) -> None:
    expect_401(http.post(bearer.url, content=b"{not json", headers={"Authorization": "Bearer x"}))
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25"},
    }
    expect_401(http.post(bearer.url, json=body))
    ok = http.post(bearer.url, json=body, headers={"Authorization": "Bearer tok-bob"})
    assert ok.status_code == 200 and ok.json()["result"]["protocolVersion"] == "2025-11-25"


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_bearer_valid_token_is_accepted(bearer: Bridge, http: httpx.Client, scheme: str) -> None:
    headers = {"Authorization": f"{scheme} tok-alice"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    reply = http.post(bearer.url, json=body, headers=headers)
    assert reply.status_code == 200 and reply.json()["result"] == {}


def test_owner_sees_own_task(bearer: Bridge, http: httpx.Client, alice_task: str) -> None:
    task = as_(http, bearer, "tok-alice").task(alice_task)
    assert task["taskId"] == alice_task
    assert task["status"] in ("working", "completed")


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_foreign_task_is_answered_like_an_unknown_one(
    bearer: Bridge, http: httpx.Client, alice_task: str, method: str
) -> None:
    bob = as_(http, bearer, "tok-bob")
    unknown = secrets.token_urlsafe(24)  # the same shape as a real task id
    assert len(unknown) == len(alice_task)
    extra: dict[str, Any] = {"inputResponses": {"x": {}}} if method == "tasks/update" else {}
    foreign = bob.post(method, {"taskId": alice_task, **extra}, rid="same", caps=TASK_CAPS)
    missing = bob.post(method, {"taskId": unknown, **extra}, rid="same", caps=TASK_CAPS)
    assert foreign.status_code == missing.status_code == 200
    assert foreign.json() == missing.json()
    error = foreign.json()["error"]
    assert error["code"] == INVALID_PARAMS
    assert "alice" not in foreign.text and alice_task not in foreign.text


def test_task_limit_per_principal(bearer: Bridge, http: httpx.Client) -> None:
    carol = as_(http, bearer, "tok-carol")
    dave = as_(http, bearer, "tok-dave")
    first = carol.start_task(60, "carol-1")
    second = carol.start_task(60, "carol-2")
    params = {"name": "slow_compute", "arguments": {"seconds": 60, "label": "carol-3"}}
    refused = carol.post("tools/call", params, rid="third", caps=TASK_CAPS)
    assert refused.status_code == 429, refused.text
    body = refused.json()
    assert body["id"] == "third"
    error = body["error"]
    assert error["code"] == INVALID_REQUEST
    assert error["data"] == {"reason": "too_many_tasks", "limit": TASK_LIMIT}
    assert "too many active tasks" in error["message"]
    # a direct (non-task) call of the same principal is a job too, and is refused the same way
    direct = carol.post("tools/call", params, rid="direct")
    assert (
        direct.status_code == 429 and direct.json()["error"]["data"]["reason"] == "too_many_tasks"
    )
    # another principal is not affected
    dave_task = dave.start_task(60, "dave")
    # a finished task frees its slot
    carol.cancel(first)
    carol.wait_status(first, {"cancelled"})
    third = carol.start_task(60, "carol-3")
    for task_id in (second, third):
        carol.cancel(task_id)
    dave.cancel(dave_task)


def test_bob_did_not_cancel_alices_task(
    bearer: Bridge, http: httpx.Client, alice_task: str
) -> None:
    """Runs after bob's tasks/cancel on alice's task: it still runs to completion."""
    task = as_(http, bearer, "tok-alice").wait_status(alice_task, {"completed", "cancelled"})
    assert task["status"] == "completed", task
    assert task["result"]["content"][0]["text"] == "Computed alice in 5s"


def test_foreign_and_unknown_ids_take_alike_long(bearer: Bridge, http: httpx.Client) -> None:
    alice = as_(http, bearer, "tok-alice")
    bob = as_(http, bearer, "tok-bob")
    task_id = alice.start_task(30, "timing")

    def median_ms(task_ids: list[str]) -> float:
        took = []
        for tid in task_ids:
            started = time.perf_counter()
            reply = bob.post("tasks/get", {"taskId": tid}, caps=TASK_CAPS)
            took.append(time.perf_counter() - started)
            assert reply.json()["error"]["code"] == INVALID_PARAMS
        return sorted(took)[len(took) // 2] * 1000

    try:
        foreign = median_ms([task_id] * 11)
        unknown = median_ms([secrets.token_urlsafe(24) for _ in range(11)])
    finally:
        alice.cancel(task_id)
    # today: foreign ~3 ms, unknown ~100 ms; equal treatment would put them within a factor 3
    assert foreign > unknown / 3, (foreign, unknown)


def test_tokens_never_reach_the_log(bearer: Bridge, http: httpx.Client) -> None:
    """Every token, good and bad, went over the wire above; none is in the server's log."""
    needle = '"POST /mcp HTTP/1.1" 401'
    before = log_count(bearer, needle)
    expect_401(http.post(bearer.url, json={}, headers={"Authorization": "Bearer tok-wrong-7f3a9c"}))
    log = wait_logged(bearer, needle, before + 1)
    for token in [*TOKENS, "tok-wrong-7f3a9c", "dG9rLWFsaWNlOg=="]:
        assert token not in log, f"{token} leaked into the bridge log"


# --- JWT: HS256 and RS256 ---------------------------------------------------------------------

HS_SECRET = f"hs256-secret-{secrets.token_hex(16)}"
KID = "test-key-1"
AUDIENCE = "mcp-kafka-bridge-tests"
ISSUER = "https://issuer.test/"


@dataclass
class Keys:
    private: rsa.RSAPrivateKey
    other: rsa.RSAPrivateKey  # not in the JWKS

    @property
    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def write_jwks(path: Path, key: rsa.RSAPrivateKey) -> None:
    jwk = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    jwk.update(kid=KID, alg="RS256", use="sig")
    path.write_text(json.dumps({"keys": [jwk]}))


@pytest.fixture(scope="module")
def jwt_bridge(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Iterator[Bridge]:
    """The whole bridge in process over the in-memory log, in auth mode ``jwt``."""
    root = tmp_path_factory.mktemp("auth-jwt")
    jwks = root / "jwks.json"
    write_jwks(jwks, keys.private)
    auth = {
        "mode": "jwt",
        "jwt_algorithms": ["HS256", "RS256"],
        "jwt_secret": HS_SECRET,
        "jwks_file": str(jwks),
        "jwt_audience": AUDIENCE,
        "jwt_issuer": ISSUER,
    }
    settings = make_settings(NO_BROKER, fresh_prefix("j"), auth=auth)
    with memory_bridge(settings, log_path=root / "bridge.log") as running:
        yield running


def claims(
    sub: str | None = "alice", *, exp_in: float | None = 300, **extra: Any
) -> dict[str, Any]:
    now = int(time.time())
    out: dict[str, Any] = {"iat": now, "aud": AUDIENCE, "iss": ISSUER, **extra}
    out = {k: v for k, v in out.items() if v is not None}  # aud=None: a token without one
    if sub is not None:
        out["sub"] = sub
    if exp_in is not None:
        out["exp"] = now + int(exp_in)
    return out


def hs256(payload: dict[str, Any], secret: str = HS_SECRET) -> str:
    return jwt.encode(payload, secret, algorithm="HS256")


def rs256(payload: dict[str, Any], key: rsa.RSAPrivateKey, kid: str | None = KID) -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(payload, key, algorithm="RS256", headers=headers)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def raw_token(header: Any, payload: Any, signature: bytes = b"signature") -> str:
    """A token with any header and payload JSON, and a meaningless signature."""
    parts = (json.dumps(header).encode(), json.dumps(payload).encode(), signature)
    return ".".join(b64url(part) for part in parts)


def forge_hs256(payload: dict[str, Any], key: bytes) -> str:
    """An HS256 token signed with arbitrary key bytes (PyJWT refuses PEM keys for HMAC)."""

    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(payload).encode())
    signature = hmac.new(key, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64url(signature)}"


def discover(http: httpx.Client, bridge: Bridge, token: str) -> httpx.Response:
    return Client(http, bridge.url, token).post("server/discover", rid="d")


def test_jwt_hs256_valid_token(jwt_bridge: Bridge, http: httpx.Client) -> None:
    reply = discover(http, jwt_bridge, hs256(claims()))
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["resultType"] == "complete"


def test_jwt_rs256_valid_token(jwt_bridge: Bridge, http: httpx.Client, keys: Keys) -> None:
    reply = discover(http, jwt_bridge, rs256(claims(), keys.private))
    assert reply.status_code == 200, reply.text
    # without a kid the (single) JWKS key is used
    assert discover(http, jwt_bridge, rs256(claims(), keys.private, kid=None)).status_code == 200


def _none_token() -> str:
    return jwt.encode(claims(), "", algorithm="none")


def _tampered(keys: Keys) -> str:
    header, _, signature = hs256(claims("bob")).split(".")
    body = b64url(json.dumps(claims("alice")).encode())
    return f"{header}.{body}.{signature}"


BAD_TOKENS: dict[str, Callable[[Keys], str]] = {
    "hs256-expired": lambda keys: hs256(claims(exp_in=-600)),
    "hs256-no-exp": lambda keys: hs256(claims(exp_in=None)),
    "hs256-not-yet-valid": lambda keys: hs256(claims(nbf=int(time.time()) + 600)),
    "hs256-wrong-secret": lambda keys: hs256(claims(), "not-the-secret-" + "x" * 32),
    "hs256-tampered-payload": _tampered,
    "hs256-no-sub": lambda keys: hs256(claims(sub=None)),
    "hs256-another-api": lambda keys: hs256(claims(aud="another-api")),
    "hs256-no-aud": lambda keys: hs256(claims(aud=None)),
    "hs256-another-issuer": lambda keys: hs256(claims(iss="https://other.test/")),
    "hs256-no-iss": lambda keys: hs256(claims(iss=None)),
    "rs256-another-api": lambda keys: rs256(claims(aud="another-api"), keys.private),
    "hs256-empty-sub": lambda keys: hs256(claims(sub="")),
    "hs512": lambda keys: jwt.encode(
        claims(), HS_SECRET + "-longer-for-hs512" * 4, algorithm="HS512"
    ),
    "alg-none": lambda keys: _none_token(),
    "alg-none-signed-looking": lambda keys: _none_token() + "c2lnbmF0dXJl",
    "rs256-other-key": lambda keys: rs256(claims(), keys.other),
    "rs256-other-key-no-kid": lambda keys: rs256(claims(), keys.other, kid=None),
    "rs256-unknown-kid": lambda keys: rs256(claims(), keys.private, kid="no-such-key"),
    "rs256-expired": lambda keys: rs256(claims(exp_in=-600), keys.private),
    "hs256-signed-with-the-public-key": lambda keys: forge_hs256(claims(), keys.public_pem),
    "garbage": lambda keys: "not.a.jwt",
    "kid-not-a-string": lambda keys: raw_token({"alg": "RS256", "kid": ["x"]}, claims()),
    "alg-not-a-string": lambda keys: raw_token({"alg": ["HS256"]}, claims()),
    "payload-not-an-object": lambda keys: raw_token({"alg": "HS256"}, ["sub", "alice"]),
    "one-segment": lambda keys: "eyJhbGciOiJIUzI1NiJ9",
}


@pytest.mark.parametrize("kind", list(BAD_TOKENS))
def test_jwt_bad_token_is_401(
    jwt_bridge: Bridge, http: httpx.Client, keys: Keys, kind: str
) -> None:
    token = BAD_TOKENS[kind](keys)
    expect_401(discover(http, jwt_bridge, token), token, HS_SECRET)


def test_jwt_principal_is_the_sub_claim(jwt_bridge: Bridge, http: httpx.Client, keys: Keys) -> None:
    """A task made with an HS256 token for alice is alice's under an RS256 token too, and not
    carol's under either."""
    alice_hs = Client(http, jwt_bridge.url, hs256(claims("alice")))
    alice_rs = Client(http, jwt_bridge.url, rs256(claims("alice"), keys.private))
    carol_hs = Client(http, jwt_bridge.url, hs256(claims("carol")))
    task_id = alice_hs.start_task(0, "jwt")
    assert alice_rs.wait_status(task_id, {"completed"})["taskId"] == task_id
    foreign = carol_hs.post("tasks/get", {"taskId": task_id}, caps=TASK_CAPS)
    missing = carol_hs.post("tasks/get", {"taskId": secrets.token_urlsafe(24)}, caps=TASK_CAPS)
    assert foreign.json() == missing.json()
    assert foreign.json()["error"]["code"] == INVALID_PARAMS


def test_jwt_tokens_and_secret_never_reach_the_log(
    jwt_bridge: Bridge, http: httpx.Client, keys: Keys
) -> None:
    needle = '"POST /mcp HTTP/1.1" 401'
    before = log_count(jwt_bridge, needle)
    bad = hs256(claims(exp_in=-600))
    expect_401(discover(http, jwt_bridge, bad))
    good = hs256(claims())
    assert discover(http, jwt_bridge, good).status_code == 200
    log = wait_logged(jwt_bridge, needle, before + 1)
    assert HS_SECRET not in log
    for token in (bad, good):
        assert token not in log and token.split(".")[2] not in log


# --- the same gate on the broker (an end-to-end smoke) ----------------------------------------


@pytest.mark.kafka
def test_on_the_broker_tokens_gate_tasks_and_stay_out_of_the_log(
    kafka_bearer: ProcBridge, http: httpx.Client
) -> None:
    """A few of the bearer checks above against `bridge serve` and `bridge workers` on
    Kafka (every other one runs on the in-memory log)."""
    test_bearer_missing_or_wrong_token_is_401(kafka_bearer, http, "Bearer tok-wrong-7f3a9c")
    task_id = as_(http, kafka_bearer, "tok-alice").start_task(0, "smoke")
    test_owner_sees_own_task(kafka_bearer, http, task_id)
    test_foreign_task_is_answered_like_an_unknown_one(kafka_bearer, http, task_id, "tasks/get")
    test_tokens_never_reach_the_log(kafka_bearer, http)

"""Authentication settings refused at start, and the JWT checks, without Kafka.

Mode jwt needs an audience and an issuer and checks both in every token; an HS256 key is at
least 32 bytes; a JWKS key that is not an RS256 key is skipped with a warning at start (a token
naming it is a 401, not a 500); mode none is refused on an address beyond loopback unless
``auth.allow_unauthenticated`` confirms it, and then a warning says so at start.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.requests import Request

from bridge.cli import main
from bridge.config import Settings, load_settings
from bridge.server.app import create_app
from bridge.server.auth import Authenticator, Unauthorized

AUDIENCE = "mcp-kafka-bridge"
ISSUER = "https://auth.example.com/"
SECRET = "s" * 32
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def _settings(**auth: Any) -> Settings:
    return load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}, auth=auth)


def _jwt_settings(**auth: Any) -> Settings:
    base = {
        "mode": "jwt",
        "jwt_algorithms": ["HS256"],
        "jwt_secret": SECRET,
        "jwt_audience": AUDIENCE,
        "jwt_issuer": ISSUER,
    }
    return _settings(**{**base, **auth})


def _request(token: str) -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": headers})


def _claims(**extra: Any) -> dict[str, Any]:
    claims = {"sub": "alice", "exp": int(time.time()) + 300, "aud": AUDIENCE, "iss": ISSUER}
    return {k: v for k, v in {**claims, **extra}.items() if v is not None}


# --- jwt: audience and issuer ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ({"jwt_audience": None}, "BRIDGE_AUTH__JWT_AUDIENCE"),
        ({"jwt_issuer": None}, "BRIDGE_AUTH__JWT_ISSUER"),
        ({"jwt_audience": " "}, "BRIDGE_AUTH__JWT_AUDIENCE"),
        ({"jwt_issuer": ""}, "BRIDGE_AUTH__JWT_ISSUER"),
    ],
)
def test_jwt_mode_without_audience_or_issuer_refuses_to_start(
    missing: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        _jwt_settings(**missing)


def test_audience_and_issuer_are_not_needed_in_the_other_modes() -> None:
    assert _settings(mode="none").auth.jwt_audience is None
    assert _settings(mode="bearer", tokens={"t" * 20: "alice"}).auth.mode == "bearer"


@pytest.mark.parametrize(
    ("kind", "claims"),
    [
        ("another API's audience", {"aud": "another-api"}),
        ("no audience", {"aud": None}),
        ("another issuer", {"iss": "https://other.example.com/"}),
        ("no issuer", {"iss": None}),
        ("an audience list without ours", {"aud": ["a", "b"]}),
    ],
)
def test_a_token_for_another_api_or_issuer_is_refused(kind: str, claims: dict[str, Any]) -> None:
    auth = Authenticator(_jwt_settings().auth)
    token = jwt.encode(_claims(**claims), SECRET, algorithm="HS256")
    with pytest.raises(Unauthorized):
        auth.principal(_request(token))


def test_a_token_for_this_api_and_issuer_is_accepted() -> None:
    auth = Authenticator(_jwt_settings().auth)
    for audience in (AUDIENCE, ["another-api", AUDIENCE]):
        token = jwt.encode(_claims(aud=audience), SECRET, algorithm="HS256")
        assert auth.principal(_request(token)) == "alice"


# --- jwt: the HS256 key ------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["short", "s" * 31, "é" * 15])  # "é" * 15 is 30 bytes
def test_an_hs256_key_shorter_than_32_bytes_refuses_to_start(secret: str) -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        _jwt_settings(jwt_secret=secret)


def test_an_hs256_key_of_32_bytes_is_accepted_and_never_echoed() -> None:
    assert _jwt_settings(jwt_secret="é" * 16).auth.jwt_secret is not None  # 32 bytes
    with pytest.raises(ValueError) as refused:
        _jwt_settings(jwt_secret="tiny-secret-value")
    assert "tiny-secret-value" not in str(refused.value)


# --- jwt: JWKS keys of another type ------------------------------------------------------------


def _jwk(key: Any, kid: str, **extra: Any) -> dict[str, Any]:
    algorithm = jwt.algorithms.RSAAlgorithm if kid.startswith("rs") else jwt.algorithms.ECAlgorithm
    return {**json.loads(algorithm.to_jwk(key.public_key())), "kid": kid, **extra}


def _rs256_settings(tmp_path: Path, keys: list[dict[str, Any]]) -> Settings:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": keys}))
    return _jwt_settings(jwt_algorithms=["RS256"], jwt_secret=None, jwks_file=str(jwks))


def test_a_jwks_key_of_another_type_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = [
        _jwk(EC_KEY, "ec-1"),
        {"kty": "oct", "k": "c2VjcmV0", "kid": "oct-1"},
        {"kty": "no-such-type", "kid": "odd-1"},
        _jwk(RSA_KEY, "rs-enc", use="enc"),
        _jwk(RSA_KEY, "rs-1"),
    ]
    with caplog.at_level(logging.WARNING, logger="bridge.server.auth"):
        auth = Authenticator(_rs256_settings(tmp_path, keys).auth)
    skipped = " ".join(r.getMessage() for r in caplog.records)
    for kid in ("ec-1", "oct-1", "odd-1", "rs-enc"):
        assert f"JWKS key {kid} skipped" in skipped
    # A token naming the EC key is refused like any bad token: 401, not a TypeError (a 500).
    forged = jwt.encode(_claims(), RSA_KEY, algorithm="RS256", headers={"kid": "ec-1"})
    with pytest.raises(Unauthorized):
        auth.principal(_request(forged))
    good = jwt.encode(_claims(), RSA_KEY, algorithm="RS256", headers={"kid": "rs-1"})
    assert auth.principal(_request(good)) == "alice"


def test_a_jwks_without_an_rs256_key_refuses_to_start(tmp_path: Path) -> None:
    settings = _rs256_settings(tmp_path, [_jwk(EC_KEY, "ec-1")])
    with pytest.raises(ValueError, match="no RS256 key"):
        Authenticator(settings.auth)


# --- mode none beyond loopback -----------------------------------------------------------------


def _none_on(host: str, **auth: Any) -> Settings:
    return load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        server={"host": host},
        auth={"mode": "none", **auth},
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "bridge.example.com", ""])
def test_mode_none_beyond_loopback_refuses_to_start(host: str) -> None:
    with pytest.raises(ValueError, match="BRIDGE_AUTH__ALLOW_UNAUTHENTICATED=true"):
        create_app(_none_on(host))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_mode_none_on_loopback_starts_without_a_warning(
    host: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bridge.server.auth"):
        create_app(_none_on(host))
    assert not caplog.records


def test_mode_none_beyond_loopback_when_allowed_starts_with_a_loud_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="bridge.server.auth"):
        create_app(_none_on("0.0.0.0", allow_unauthenticated=True))
    (record,) = caplog.records
    assert "AUTHENTICATION IS OFF" in record.getMessage()


def test_an_authenticating_mode_may_listen_anywhere() -> None:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        server={"host": "0.0.0.0"},
        auth={"mode": "bearer", "tokens": {"t" * 20: "alice"}},
    )
    create_app(settings)


def test_bridge_serve_refuses_before_it_reaches_kafka(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("BRIDGE_AUTH__MODE", "BRIDGE_AUTH__ALLOW_UNAUTHENTICATED", "BRIDGE_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    # An address nothing listens on: reaching Kafka would fail differently (and slowly).
    monkeypatch.setenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "BRIDGE_AUTH__MODE=none on '0.0.0.0'" in error
    assert "BRIDGE_AUTH__ALLOW_UNAUTHENTICATED=true" in error

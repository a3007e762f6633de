"""Secured Kafka on the client side (bridge.kafka.security), in-process and without a broker.

The options every client gets (TLS context, SASL credentials, OAUTHBEARER token sources) and
that no secret shows in them; the OIDC client-credentials provider against a real local token
endpoint (http.server in a thread) on an injected clock; and the one-line explanations of
refused TLS handshakes, met for real against a local TLS server with trustme certificates.
The same failures against a secured broker, and SASL logins, are tests/test_kafka_acls.py's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import socketserver
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote_plus

import pytest
import trustme
from aiokafka.errors import SaslAuthenticationFailed
from cryptography.hazmat.primitives import serialization

from bridge.cli import KafkaUnavailable, main, require_kafka
from bridge.config import KafkaSaslSettings, Settings, load_settings
from bridge.kafka import clients
from bridge.kafka.clients import (
    admin_client,
    check_credentials,
    committed_consumer,
    idempotent_producer,
    plain_producer,
    transactional_producer,
)
from bridge.kafka.security import (
    ClientCredentialsTokenProvider,
    FileTokenProvider,
    KafkaSecurityError,
    client_security_options,
    explain_connect_failure,
    token_provider,
)

SECRET = "s3cr:t/+ä"  # characters RFC 6749 section 2.3.1 form-encodes before Basic auth


def sasl_settings(**sasl: Any) -> Settings:
    return load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9093", "security_protocol": "SASL_SSL", "sasl": sasl}
    )


def written(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- options ---------------------------------------------------------------------------------


def test_plaintext_clients_get_the_protocol_and_nothing_else() -> None:
    assert client_security_options(load_settings()) == {"security_protocol": "PLAINTEXT"}


def test_scram_options_carry_the_password_that_prints_as_asterisks(tmp_path: Path) -> None:
    settings = sasl_settings(mechanism="SCRAM-SHA-512", username="svc", password=SECRET)
    options = client_security_options(settings)
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "svc"
    assert options["sasl_plain_password"] == SECRET
    assert options["sasl_plain_password"].encode() == SECRET.encode()  # what SCRAM hashes
    assert "\0".join(["svc", options["sasl_plain_password"]]) == f"svc\0{SECRET}"  # PLAIN
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    for text in (repr(options), str(options), repr(settings), str(settings)):
        assert SECRET not in text
    assert "**********" in repr(options)


def test_a_password_file_wins_and_is_read_again_for_each_client(tmp_path: Path) -> None:
    secret_file = written(tmp_path / "password", "first\n")
    settings = sasl_settings(
        mechanism="PLAIN", username="svc", password="inline", password_file=secret_file
    )
    assert client_security_options(settings)["sasl_plain_password"] == "first"
    written(secret_file, "rotated")  # a Kubernetes Secret updated in place
    assert client_security_options(settings)["sasl_plain_password"] == "rotated"
    secret_file.unlink()
    with pytest.raises(KafkaSecurityError, match="BRIDGE_KAFKA__SASL__PASSWORD_FILE"):
        client_security_options(settings)


async def test_every_client_factory_builds_its_client_with_the_security_options() -> None:
    settings = sasl_settings(mechanism="SCRAM-SHA-256", username="svc", password=SECRET)
    producers = [
        idempotent_producer(settings),
        transactional_producer(settings, "t"),
        plain_producer(settings),
    ]
    consumer, admin = committed_consumer(settings), admin_client(settings)
    # aiokafka's inner client: what every connection is made with (none is made here).
    for client in [*(p.client for p in producers), consumer._client, admin._client]:
        assert client._security_protocol == "SASL_SSL"
        assert client._sasl_mechanism == "SCRAM-SHA-256"
        assert client._sasl_plain_password == SECRET
        assert isinstance(client._ssl_context, ssl.SSLContext)
    for producer in producers:
        await producer.stop()
    await consumer.stop()
    await admin.close()


def test_no_module_of_the_bridge_builds_a_kafka_client_past_the_factories() -> None:
    """Every client goes through clients._common, so none misses the security options."""
    bridge_dir = Path(clients.__file__).parent.parent
    constructors = ("AIOKafkaProducer(", "AIOKafkaConsumer(", "AIOKafkaAdminClient(")
    offenders = [
        path.relative_to(bridge_dir.parent)
        for path in bridge_dir.rglob("*.py")
        if path != Path(clients.__file__)
        if any(name in path.read_text(encoding="utf-8") for name in constructors)
    ]
    assert offenders == []


# --- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def tls_settings(ca_file: Path | None, **tls: Any) -> Settings:
    return load_settings(
        kafka={
            "bootstrap_servers": "127.0.0.1:9093",
            "security_protocol": "SSL",
            "tls": {"ca_file": ca_file, **tls},
        }
    )


def pem(tmp_path: Path, name: str, blob: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(blob)
    return path


def test_hostnames_are_checked_unless_turned_off(tmp_path: Path, ca: trustme.CA) -> None:
    ca_file = pem(tmp_path, "ca.pem", ca.cert_pem.bytes())
    checked = client_security_options(tls_settings(ca_file))["ssl_context"]
    assert checked.check_hostname and checked.verify_mode == ssl.CERT_REQUIRED
    unchecked = client_security_options(tls_settings(ca_file, check_hostname=False))
    assert unchecked["ssl_context"].check_hostname is False
    assert unchecked["ssl_context"].verify_mode == ssl.CERT_REQUIRED  # the chain still is


def test_an_encrypted_client_key_loads_with_its_password_and_a_wrong_one_is_one_clear_error(
    tmp_path: Path, ca: trustme.CA
) -> None:
    leaf = ca.issue_cert("bridge-client")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(SECRET.encode()),
    )
    files = {
        "ca_file": pem(tmp_path, "ca.pem", ca.cert_pem.bytes()),
        "cert_file": pem(tmp_path, "cert.pem", leaf.cert_chain_pems[0].bytes()),
        "key_file": pem(tmp_path, "key.pem", encrypted),
    }
    password_file = written(tmp_path / "key-password", SECRET + "\n")
    good = tls_settings(**files, key_password_file=password_file)  # type: ignore[arg-type]
    assert isinstance(client_security_options(good)["ssl_context"], ssl.SSLContext)
    for wrong in ({"key_password": "nope"}, {}):  # a wrong or a missing password
        settings = tls_settings(**files, **wrong)  # type: ignore[arg-type]
        with pytest.raises(KafkaSecurityError) as refused:
            client_security_options(settings)
        assert "BRIDGE_KAFKA__TLS__KEY_PASSWORD" in str(refused.value)
        assert str(files["key_file"]) in str(refused.value)


def test_a_ca_file_that_is_not_pem_is_one_clear_error(tmp_path: Path) -> None:
    settings = tls_settings(written(tmp_path / "ca.pem", "not a certificate"))
    with pytest.raises(KafkaSecurityError, match="BRIDGE_KAFKA__TLS__CA_FILE must hold PEM"):
        client_security_options(settings)


@dataclass
class TlsServer:
    port: int
    ca_file: Path


@pytest.fixture
def tls_server(
    tmp_path: Path, ca: trustme.CA, request: pytest.FixtureRequest
) -> Iterator[TlsServer]:
    """A TLS listener (in a thread) whose certificate is ``request.param``'s (names, not_after):
    it completes or fails the handshake, then hangs up."""
    names, not_after = request.param
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names, not_after=not_after).configure_cert(context)

    class HandshakeThenHangUp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with contextlib.suppress(OSError):  # the client refusing the certificate included
                context.wrap_socket(self.request, server_side=True).close()

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), HandshakeThenHangUp) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield TlsServer(server.server_address[1], pem(tmp_path, "ca.pem", ca.cert_pem.bytes()))
        finally:
            server.shutdown()


async def refusal(settings: Settings) -> str:
    with pytest.raises(Exception) as failed:  # what it raised is checked below
        await asyncio.wait_for(check_credentials(settings, timeout_s=5.0), 10.0)
    explained = explain_connect_failure(failed.value, settings)
    assert explained is not None, repr(failed.value)
    assert "\n" not in explained
    return explained


def secured(server: TlsServer, ca_file: Path | None, host: str = "127.0.0.1") -> Settings:
    return load_settings(
        kafka={
            "bootstrap_servers": f"{host}:{server.port}",
            "security_protocol": "SSL",
            "tls": {"ca_file": ca_file},
        }
    )


NOW = datetime.datetime.now(datetime.UTC)
VALID = (("localhost", "127.0.0.1"), NOW + datetime.timedelta(days=1))
EXPIRED = (("localhost", "127.0.0.1"), NOW - datetime.timedelta(days=1))
LOCALHOST_ONLY = (("localhost",), NOW + datetime.timedelta(days=1))


@pytest.mark.parametrize("tls_server", [VALID], indirect=True)
async def test_a_broker_certificate_from_another_ca_is_one_line_naming_the_ca_setting(
    tls_server: TlsServer, tmp_path: Path
) -> None:
    other = pem(tmp_path, "other-ca.pem", trustme.CA().cert_pem.bytes())
    line = await refusal(secured(tls_server, other))
    assert "is not trusted" in line and "BRIDGE_KAFKA__TLS__CA_FILE" in line and str(other) in line
    line = await refusal(secured(tls_server, None))
    assert "is not trusted" in line and "the system's CAs" in line


@pytest.mark.parametrize("tls_server", [EXPIRED], indirect=True)
async def test_an_expired_broker_certificate_is_one_line_saying_so(tls_server: TlsServer) -> None:
    line = await refusal(secured(tls_server, tls_server.ca_file))
    assert "not valid now" in line and "expired" in line


@pytest.mark.parametrize("tls_server", [LOCALHOST_ONLY], indirect=True)
async def test_an_address_the_certificate_does_not_name_is_one_line_naming_the_settings(
    tls_server: TlsServer,
) -> None:
    line = await refusal(secured(tls_server, tls_server.ca_file))
    assert "does not name the host" in line
    assert "BRIDGE_KAFKA__BOOTSTRAP_SERVERS" in line and "BRIDGE_KAFKA__TLS__CHECK_HOSTNAME" in line


@pytest.mark.parametrize("tls_server", [LOCALHOST_ONLY], indirect=True)
async def test_a_trusted_certificate_for_the_name_connected_to_passes_the_handshake(
    tls_server: TlsServer,
) -> None:
    # The server hangs up after the handshake: what fails is no longer TLS.
    line = await refusal(secured(tls_server, tls_server.ca_file, host="localhost"))
    assert "closed the connection" in line and "certificate" not in line


@pytest.mark.parametrize("tls_server", [EXPIRED], indirect=True)
def test_the_cli_preflight_reports_a_refused_handshake_as_one_kafka_unavailable_line(
    tls_server: TlsServer,
) -> None:
    with pytest.raises(KafkaUnavailable, match=r"TLS certificate of Kafka at .* is not valid now"):
        require_kafka(secured(tls_server, tls_server.ca_file))


def test_unusable_settings_are_one_line_naming_the_command_and_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BRIDGE_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__MECHANISM", "PLAIN")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__PASSWORD", SECRET)
    assert main(["topics", "create"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "bridge topics create: bad settings: kafka.sasl: BRIDGE_KAFKA__SASL__MECHANISM=PLAIN "
        "needs BRIDGE_KAFKA__SASL__USERNAME"
    )


def test_a_refused_sasl_login_is_one_line_naming_the_user_and_the_settings() -> None:
    settings = load_settings(
        kafka={
            "bootstrap_servers": "kafka:9093",
            "security_protocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "svc", "password": SECRET},
        }
    )
    broker_said = "Authentication failed during authentication due to invalid credentials"
    line = explain_connect_failure(SaslAuthenticationFailed(broker_said), settings)
    assert line is not None
    assert "refused the SCRAM-SHA-512 login of user 'svc'" in line and broker_said in line
    assert "BRIDGE_KAFKA__SASL__PASSWORD" in line and SECRET not in line
    assert explain_connect_failure(ValueError("unrelated"), settings) is None


# --- OAUTHBEARER -----------------------------------------------------------------------------


async def test_the_token_file_is_read_again_after_it_changes(tmp_path: Path) -> None:
    token_file = written(tmp_path / "token", "first-token\n")
    provider = FileTokenProvider(token_file)
    assert await provider.token() == "first-token"
    replacement = written(tmp_path / "token.new", "second-token")
    replacement.replace(token_file)  # how a projected Kubernetes token is swapped
    assert await provider.token() == "second-token"
    written(token_file, "")
    with pytest.raises(KafkaSecurityError, match="is empty"):
        await provider.token()
    assert "token" not in repr(provider).replace(str(token_file), "")


@dataclass
class TokenEndpoint:
    """A local OAuth token endpoint: answers from ``answers`` (the last one repeats)."""

    url: str
    answers: list[tuple[int, dict[str, Any]]]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def issue(self, token: str, expires_in: float = 100) -> None:
        self.answers.append((200, {"access_token": token, "expires_in": expires_in}))

    def fail(self, status: int, **body: Any) -> None:
        self.answers.append((status, body))


@pytest.fixture
def token_endpoint() -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint("", [])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            endpoint.requests.append(
                {"form": parse_qs(body), "authorization": self.headers.get("Authorization")}
            )
            status, answer = (
                endpoint.answers.pop(0) if len(endpoint.answers) > 1 else endpoint.answers[0]
            )
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            return None

    with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        endpoint.url = f"http://127.0.0.1:{server.server_address[1]}/oauth2/token"
        try:
            yield endpoint
        finally:
            server.shutdown()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def oauth(endpoint: TokenEndpoint, **extra: Any) -> KafkaSaslSettings:
    return KafkaSaslSettings(
        mechanism="OAUTHBEARER",
        oauth_token_endpoint=endpoint.url,
        oauth_client_id="bridge client",
        oauth_client_secret=SECRET,
        **extra,
    )


async def test_a_token_is_fetched_with_the_client_credentials_grant_and_basic_auth(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.issue("token-1")
    provider = ClientCredentialsTokenProvider(oauth(token_endpoint, oauth_scope="kafka"))
    assert await provider.token() == "token-1"
    [sent] = token_endpoint.requests
    assert sent["form"] == {"grant_type": ["client_credentials"], "scope": ["kafka"]}
    scheme, encoded = sent["authorization"].split()
    user, password = base64.b64decode(encoded).decode().split(":")
    assert scheme == "Basic" and user == "bridge+client"  # form-encoded, then Basic
    assert unquote_plus(user) == "bridge client" and unquote_plus(password) == SECRET
    assert SECRET not in repr(provider) and "token-1" not in repr(provider)


async def test_client_secret_post_sends_the_credentials_in_the_form(
    token_endpoint: TokenEndpoint, tmp_path: Path
) -> None:
    token_endpoint.issue("token-1")
    sasl = oauth(
        token_endpoint,
        oauth_client_auth="client_secret_post",
        oauth_client_secret_file=written(tmp_path / "secret", "from-file\n"),
    )
    assert await ClientCredentialsTokenProvider(sasl).token() == "token-1"
    [sent] = token_endpoint.requests
    assert sent["authorization"] is None
    assert sent["form"]["client_id"] == ["bridge client"]
    assert sent["form"]["client_secret"] == ["from-file"]  # the file wins over the inline secret


async def test_the_token_is_reused_until_80_percent_of_its_life_then_refreshed(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.issue("token-1", expires_in=100)
    token_endpoint.issue("token-2", expires_in=100)
    clock = Clock()
    provider = ClientCredentialsTokenProvider(oauth(token_endpoint), clock=clock)
    assert await provider.token() == "token-1"
    clock.now += 79
    assert await provider.token() == "token-1"
    assert len(token_endpoint.requests) == 1
    clock.now += 2
    assert await provider.token() == "token-2"
    assert len(token_endpoint.requests) == 2


async def test_concurrent_connections_wait_for_one_token_request(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.issue("token-1")
    provider = ClientCredentialsTokenProvider(oauth(token_endpoint))
    tokens = await asyncio.gather(*(provider.token() for _ in range(8)))
    assert set(tokens) == {"token-1"}
    assert len(token_endpoint.requests) == 1


async def test_a_failed_refresh_keeps_the_valid_token_and_is_retried_with_backoff(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.issue("token-1", expires_in=100)  # refresh at 80 s, usable until 90 s
    token_endpoint.fail(503)
    token_endpoint.fail(503)
    token_endpoint.issue("token-2", expires_in=100)
    clock = Clock()
    provider = ClientCredentialsTokenProvider(oauth(token_endpoint), clock=clock)
    assert await provider.token() == "token-1"
    clock.now += 80  # refresh due: the 503 keeps token-1, next try in 1 s
    assert await provider.token() == "token-1"
    clock.now += 0.5
    assert await provider.token() == "token-1"
    assert len(token_endpoint.requests) == 2  # backing off: no request
    clock.now += 0.6  # 81.1 s: the second try fails too, next in 2 s
    assert await provider.token() == "token-1"
    clock.now += 1.0
    assert await provider.token() == "token-1"
    assert len(token_endpoint.requests) == 3
    clock.now += 1.1  # 83.2 s: the endpoint is back
    assert await provider.token() == "token-2"
    assert len(token_endpoint.requests) == 4


async def test_no_usable_token_and_a_failing_endpoint_is_an_error(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.issue("token-1", expires_in=100)
    token_endpoint.fail(503)
    clock = Clock()
    provider = ClientCredentialsTokenProvider(oauth(token_endpoint), clock=clock)
    assert await provider.token() == "token-1"
    clock.now += 90  # the last 10 s of its life: not presented any more
    with pytest.raises(KafkaSecurityError, match="failed \\(HTTP 503\\)"):
        await provider.token()


async def test_a_401_from_the_token_endpoint_is_one_clear_error_naming_the_settings(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.fail(401, error="invalid_client", error_description="Bad\nclient secret")
    provider = ClientCredentialsTokenProvider(oauth(token_endpoint))
    with pytest.raises(KafkaSecurityError) as refused:
        await provider.token()
    line = str(refused.value)
    assert "refused client 'bridge client' (HTTP 401: invalid_client: Bad client secret)" in line
    assert "BRIDGE_KAFKA__SASL__OAUTH_CLIENT_SECRET" in line and token_endpoint.url in line
    assert SECRET not in line and "\n" not in line


async def test_an_unreachable_token_endpoint_is_one_clear_error() -> None:
    sasl = KafkaSaslSettings(
        mechanism="OAUTHBEARER",
        oauth_token_endpoint="http://127.0.0.1:1/token",
        oauth_client_id="bridge",
        oauth_client_secret=SECRET,
    )
    with pytest.raises(KafkaSecurityError, match="cannot reach the OAuth token endpoint"):
        await ClientCredentialsTokenProvider(sasl).token()


def test_clients_of_one_process_share_the_token_of_an_endpoint(
    token_endpoint: TokenEndpoint, tmp_path: Path
) -> None:
    sasl = oauth(token_endpoint)
    assert token_provider(sasl) is token_provider(sasl.model_copy())
    assert token_provider(sasl) is not token_provider(oauth(token_endpoint, oauth_scope="other"))
    from_file = sasl.model_copy(
        update={"oauth_token_endpoint": None, "oauth_token_file": written(tmp_path / "t", "x")}
    )
    assert isinstance(token_provider(from_file), FileTokenProvider)
    settings = sasl_settings(
        mechanism="OAUTHBEARER",
        oauth_token_endpoint=token_endpoint.url,
        oauth_client_id="bridge client",
        oauth_client_secret=SECRET,
    )
    options = client_security_options(settings)
    assert options["sasl_oauth_token_provider"] is token_provider(settings.kafka.sasl)
    assert SECRET not in repr(options)

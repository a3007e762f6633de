"""Kafka client security: the TLS context, SASL credentials and OAuth tokens of every client.

:func:`client_security_options` is merged into the options of every producer, consumer and
admin client by ``bridge.kafka.clients._common``, so one function decides how the bridge
authenticates. Secrets are read here, each time a client is built (a rotated Kubernetes Secret
reaches the next client), and never logged: the password in the options prints as
``'**********'``, tokens are kept out of every ``repr``. :func:`explain_connect_failure` turns
what a refused handshake raises into one line naming the setting to look at; the CLI calls it at
its edge. This module opens no Kafka connection and knows nothing of topics or ACLs.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import httpx
from aiokafka.abc import AbstractTokenProvider
from aiokafka.errors import (
    AuthenticationFailedError,
    BrokerResponseError,
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from bridge.config import KafkaSaslSettings, KafkaTlsSettings, Settings, env_name

__all__ = [
    "ClientCredentialsTokenProvider",
    "FileTokenProvider",
    "KafkaSecurityError",
    "basic_credentials",
    "client_security_options",
    "explain_connect_failure",
    "ssl_context",
    "token_provider",
]

log = logging.getLogger(__name__)

#: A token is refreshed once this fraction of its lifetime has passed.
REFRESH_AT_FRACTION = 0.8
#: A token is not presented in the last this-many seconds of its life (at most a tenth of it):
#: the broker checks expiry after the request travelled, on a clock that may run ahead.
EXPIRY_MARGIN_S = 30.0
#: The lifetime assumed when the token endpoint gives no ``expires_in`` (RFC 6749 makes it
#: optional): short, so an unknown expiry costs a few requests rather than a rejected token.
DEFAULT_TOKEN_LIFETIME_S = 300.0
#: Backoff between failed refreshes while the current token is still usable: doubling up to a cap.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
#: Bound of one request to the token endpoint.
TOKEN_HTTP_TIMEOUT_S = 10.0

_TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
_SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


class KafkaSecurityError(AuthenticationFailedError):  # type: ignore[misc]
    """TLS material or credentials for Kafka cannot be used; the message names the setting.

    An aiokafka ``AuthenticationFailedError``: a running client that meets it while reconnecting
    (say, the token endpoint is down) logs it like any refused handshake and tries again later.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "Kafka security settings cannot be used"


class _Redacted(str):
    """A secret aiokafka needs as ``str``: it encodes as itself and prints as asterisks."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'**********'"


# --- options ---------------------------------------------------------------------------------


def client_security_options(settings: Settings) -> dict[str, Any]:
    """The aiokafka options (protocol, TLS context, SASL) every client of ``settings`` gets."""
    protocol = settings.kafka.security_protocol
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in _TLS_PROTOCOLS:
        options["ssl_context"] = ssl_context(settings.kafka.tls)
    if protocol in _SASL_PROTOCOLS:
        options.update(_sasl_options(settings.kafka.sasl))
    return options


def ssl_context(tls: KafkaTlsSettings) -> ssl.SSLContext:
    """A client TLS context: ``ca_file`` (else the system CAs), hostname checks, mTLS key pair."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise KafkaSecurityError(
            f"cannot load the CA file {tls.ca_file} ({_reason(exc)}): "
            f"{env_name('kafka', 'tls', 'ca_file')} must hold PEM certificates"
        ) from exc
    context.check_hostname = tls.check_hostname
    if tls.cert_file is not None and tls.key_file is not None:
        _load_key_pair(context, tls, tls.cert_file, tls.key_file)
    return context


def _load_key_pair(context: ssl.SSLContext, tls: KafkaTlsSettings, cert: Path, key: Path) -> None:
    try:
        password = tls.key_password_value() or ""
        # A callable, never None: without a password OpenSSL would prompt on the terminal.
        context.load_cert_chain(cert, key, password=lambda: password)
    except (OSError, ssl.SSLError) as exc:
        raise KafkaSecurityError(
            f"cannot load the client certificate {cert} with the key {key} "
            f"({_reason(exc)}): check {env_name('kafka', 'tls', 'cert_file')}, "
            f"{env_name('kafka', 'tls', 'key_file')} and {env_name('kafka', 'tls', 'key_password')}"
            "(_FILE) for an encrypted key"
        ) from exc


def _sasl_options(sasl: KafkaSaslSettings) -> dict[str, Any]:
    if sasl.mechanism is None:  # the settings refuse this; kept for settings built unvalidated
        raise KafkaSecurityError(f"a SASL protocol needs {env_name('kafka', 'sasl', 'mechanism')}")
    if sasl.mechanism == "OAUTHBEARER":
        return {"sasl_mechanism": sasl.mechanism, "sasl_oauth_token_provider": token_provider(sasl)}
    try:
        password = sasl.password_value()
    except OSError as exc:
        raise KafkaSecurityError(
            f"cannot read {sasl.password_file} ({_reason(exc)}): check "
            f"{env_name('kafka', 'sasl', 'password_file')}"
        ) from exc
    return {
        "sasl_mechanism": sasl.mechanism,
        "sasl_plain_username": sasl.username,
        "sasl_plain_password": None if password is None else _Redacted(password),
    }


def token_provider(sasl: KafkaSaslSettings) -> AbstractTokenProvider:
    """The OAUTHBEARER token source of ``sasl``; one per endpoint and client, shared by clients."""
    if sasl.oauth_token_file is not None:
        return FileTokenProvider(sasl.oauth_token_file)
    key = (
        sasl.oauth_token_endpoint,
        sasl.oauth_client_id,
        sasl.oauth_client_secret,
        sasl.oauth_client_secret_file,
        sasl.oauth_scope,
        sasl.oauth_client_auth,
    )
    # Every client of the process shares one token instead of asking the endpoint for its own.
    provider = _shared_providers.get(key)
    if provider is None:
        provider = _shared_providers[key] = ClientCredentialsTokenProvider(sasl)
    return provider


_shared_providers: dict[tuple[object, ...], ClientCredentialsTokenProvider] = {}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, BrokerResponseError):  # its str() is the connection's repr
        return f"{exc.message}: {exc.description}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# --- OAUTHBEARER tokens ----------------------------------------------------------------------


class FileTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """A bearer token read from a file on every new connection, so a rotated token is used.

    aiokafka asks for a token only when it opens a connection, so reading the (small) file
    each time costs little and never serves a token the file no longer holds.
    """

    def __init__(self, path: Path) -> None:
        self._path = path

    def __repr__(self) -> str:
        return f"FileTokenProvider({str(self._path)!r})"

    async def token(self) -> str:
        """The file's token (surrounding whitespace removed)."""
        return await asyncio.to_thread(self._read)

    def _read(self) -> str:
        setting = env_name("kafka", "sasl", "oauth_token_file")
        try:
            token = self._path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KafkaSecurityError(
                f"cannot read the OAuth token file {self._path} ({_reason(exc)}): check {setting}"
            ) from exc
        if not token:
            raise KafkaSecurityError(f"the OAuth token file {self._path} is empty ({setting})")
        return token


@dataclass(frozen=True)
class _Token:
    value: str = field(repr=False)
    refresh_at: float
    usable_until: float

    @classmethod
    def issued(cls, value: str, at: float, lifetime_s: float) -> _Token:
        margin = min(EXPIRY_MARGIN_S, lifetime_s / 10)
        return cls(value, at + lifetime_s * REFRESH_AT_FRACTION, at + lifetime_s - margin)


class ClientCredentialsTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """A token from an OIDC endpoint (OAuth 2.0 client-credentials grant), renewed before expiry.

    The token is fetched on the first connection and again once :data:`REFRESH_AT_FRACTION` of
    its lifetime has passed. A refresh that fails while the current token is still usable keeps
    that token and is retried with backoff; with no usable token left, the failure is raised
    (a :class:`KafkaSecurityError` naming the endpoint and the HTTP status). The client secret
    is read on each request, so a rotated ``oauth_client_secret_file`` is used at the next one.
    """

    def __init__(
        self, sasl: KafkaSaslSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if sasl.oauth_token_endpoint is None or sasl.oauth_client_id is None:
            raise KafkaSecurityError(
                f"{env_name('kafka', 'sasl', 'oauth_token_endpoint')} and "
                f"{env_name('kafka', 'sasl', 'oauth_client_id')} are needed for a token"
            )
        self._sasl = sasl
        self._endpoint = sasl.oauth_token_endpoint
        self._client_id = sasl.oauth_client_id
        self._clock = clock
        self._current: _Token | None = None
        self._failures = 0
        self._retry_at = 0.0
        # One lock per event loop: a lock is bound to the loop that first waits on it, and the
        # CLI runs its pre-flight and its command in different loops.
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"ClientCredentialsTokenProvider({self._endpoint!r}, client_id={self._client_id!r})"

    async def token(self) -> str:
        """A usable access token; concurrent connections wait for one request to the endpoint."""
        async with self._lock():
            now = self._clock()
            current = self._current
            if current is not None and self._keeps(current, now):
                return current.value
            return await self._renew(current, now)

    def _keeps(self, current: _Token, now: float) -> bool:
        # Before its refresh time, or backing off after a failed refresh: either way only while
        # the token is still usable.
        return now < current.usable_until and (now < current.refresh_at or now < self._retry_at)

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    async def _renew(self, current: _Token | None, now: float) -> str:
        try:
            self._current = await self._fetch()
        except KafkaSecurityError as exc:
            if current is None or now >= current.usable_until:
                raise
            self._failures += 1
            delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self._failures - 1))
            self._retry_at = now + delay
            log.warning(
                "refreshing the Kafka OAuth token failed (%s); the current token stays in use "
                "for %.0f s more, next try in %.0f s",
                exc,
                current.usable_until - now,
                delay,
            )
            return current.value
        self._failures = 0
        self._retry_at = 0.0
        return self._current.value

    async def _fetch(self) -> _Token:
        started = self._clock()  # the lifetime counts from the request, not the answer
        form, headers = self._request()
        try:
            async with httpx.AsyncClient(timeout=TOKEN_HTTP_TIMEOUT_S) as http:
                response = await http.post(self._endpoint, data=form, headers=headers)
        except httpx.HTTPError as exc:
            raise KafkaSecurityError(
                f"cannot reach the OAuth token endpoint {self._endpoint} "
                f"({type(exc).__name__}: {exc}); check "
                f"{env_name('kafka', 'sasl', 'oauth_token_endpoint')}"
            ) from exc
        value, lifetime_s = self._parse(response)
        return _Token.issued(value, started, lifetime_s)

    def _request(self) -> tuple[dict[str, str], dict[str, str]]:
        try:
            secret = self._sasl.client_secret_value() or ""
        except OSError as exc:
            raise KafkaSecurityError(
                f"cannot read {self._sasl.oauth_client_secret_file} ({_reason(exc)}): check "
                f"{env_name('kafka', 'sasl', 'oauth_client_secret_file')}"
            ) from exc
        form = {"grant_type": "client_credentials"}
        if self._sasl.oauth_scope:
            form["scope"] = self._sasl.oauth_scope
        headers = {"Accept": "application/json"}
        if self._sasl.oauth_client_auth == "client_secret_post":
            form.update(client_id=self._client_id, client_secret=secret)
        else:
            headers["Authorization"] = basic_credentials(self._client_id, secret)
        return form, headers

    def _parse(self, response: httpx.Response) -> tuple[str, float]:
        if response.status_code != 200:
            raise KafkaSecurityError(self._refusal(response))
        try:
            body = response.json()
            value = body["access_token"]
            lifetime_s = float(body.get("expires_in", DEFAULT_TOKEN_LIFETIME_S))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KafkaSecurityError(
                f"the OAuth token endpoint {self._endpoint} answered without an access_token "
                f"({type(exc).__name__}); check {env_name('kafka', 'sasl', 'oauth_token_endpoint')}"
            ) from exc
        if not isinstance(value, str) or not value or lifetime_s <= 0:
            raise KafkaSecurityError(
                f"the OAuth token endpoint {self._endpoint} answered with an empty or expired token"
            )
        return value, lifetime_s

    def _refusal(self, response: httpx.Response) -> str:
        status = f"HTTP {response.status_code}{_oauth_error(response)}"
        if 400 <= response.status_code < 500:
            return (
                f"the OAuth token endpoint {self._endpoint} refused client {self._client_id!r} "
                f"({status}): check {env_name('kafka', 'sasl', 'oauth_client_id')}, "
                f"{env_name('kafka', 'sasl', 'oauth_client_secret')}(_FILE), "
                f"{env_name('kafka', 'sasl', 'oauth_scope')} and "
                f"{env_name('kafka', 'sasl', 'oauth_client_auth')}"
            )
        return f"the OAuth token endpoint {self._endpoint} failed ({status})"


def basic_credentials(client_id: str, secret: str) -> str:
    """The ``Authorization`` value of RFC 6749 section 2.3.1: both parts form-encoded first."""
    pair = f"{quote_plus(client_id)}:{quote_plus(secret)}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def _oauth_error(response: httpx.Response) -> str:
    # Only the two fields RFC 6749 section 5.2 defines, on one line: the rest of a body is
    # whatever the server chose to say.
    try:
        body = response.json()
        parts = [str(body[name]) for name in ("error", "error_description") if body.get(name)]
    except (ValueError, AttributeError):
        return ""
    text = " ".join(": ".join(parts).split())
    return f": {text[:200]}" if text else ""


# --- failures --------------------------------------------------------------------------------

# OpenSSL's X509_V_ERR_* codes behind ssl.SSLCertVerificationError.verify_code.
_CERT_NOT_YET_VALID, _CERT_EXPIRED = 9, 10
_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH = 62, 64


def explain_connect_failure(exc: BaseException, settings: Settings) -> str | None:
    """One line saying what failed in a TLS handshake or SASL login and which setting to check.

    ``None`` when ``exc`` is not a security failure (the caller keeps its own message).
    """
    at = f"Kafka at {settings.kafka.bootstrap_servers}"
    if isinstance(exc, KafkaSecurityError):
        return str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _explain_certificate(exc, at, settings)
    if isinstance(exc, ssl.SSLError):
        return _explain_handshake(exc, at, settings)
    if isinstance(exc, SaslAuthenticationFailed | UnsupportedSaslMechanismError):
        return _explain_login(exc, at, settings)
    if isinstance(exc, IllegalSaslStateError | KafkaConnectionError | ConnectionError):
        return (
            f"{at} closed the connection while this client set up "
            f"{settings.kafka.security_protocol} ({_reason(exc)}): check that "
            f"{env_name('kafka', 'security_protocol')}={settings.kafka.security_protocol} matches "
            "the listener"
        )
    return None


def _explain_certificate(exc: ssl.SSLCertVerificationError, at: str, settings: Settings) -> str:
    why = exc.verify_message or _reason(exc)
    if exc.verify_code in (_CERT_EXPIRED, _CERT_NOT_YET_VALID):
        return (
            f"the TLS certificate of {at} is not valid now ({why}): the broker's certificate "
            "must be renewed (or this machine's clock is wrong)"
        )
    if exc.verify_code in (_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH):
        return (
            f"the TLS certificate of {at} does not name the host connected to ({why}): use an "
            f"address the certificate lists in {env_name('kafka', 'bootstrap_servers')} (for "
            f"development only, {env_name('kafka', 'tls', 'check_hostname')}=false)"
        )
    trusted = settings.kafka.tls.ca_file or "the system's CAs"
    return (
        f"the TLS certificate of {at} is not trusted ({why}): set "
        f"{env_name('kafka', 'tls', 'ca_file')} to the CA that signed it (now {trusted})"
    )


def _explain_handshake(exc: ssl.SSLError, at: str, settings: Settings) -> str:
    reason = _reason(exc)
    if "ALERT" in reason and ("CERTIFICATE" in reason or "UNKNOWN_CA" in reason):
        return (
            f"{at} refused this client's TLS certificate ({reason}): check "
            f"{env_name('kafka', 'tls', 'cert_file')} and {env_name('kafka', 'tls', 'key_file')} "
            "(signed by a CA the broker trusts, not expired)"
        )
    return (
        f"the TLS handshake with {at} failed ({reason}): check that "
        f"{env_name('kafka', 'security_protocol')}={settings.kafka.security_protocol} matches the "
        "listener (PLAINTEXT and SASL_PLAINTEXT listeners do not speak TLS)"
    )


def _explain_login(exc: Exception, at: str, settings: Settings) -> str:
    sasl = settings.kafka.sasl
    said = str(exc.args[0]) if exc.args else type(exc).__name__
    if isinstance(exc, UnsupportedSaslMechanismError):
        mechanism = env_name("kafka", "sasl", "mechanism")
        return f"{at} does not offer {sasl.mechanism} ({said}): check {mechanism}"
    if sasl.mechanism == "OAUTHBEARER":
        source = "oauth_token_file" if sasl.oauth_token_file else "oauth_token_endpoint"
        return f"{at} refused the OAuth token ({said}): check {env_name('kafka', 'sasl', source)}"
    return (
        f"{at} refused the {sasl.mechanism} login of user {sasl.username!r} ({said}): check "
        f"{env_name('kafka', 'sasl', 'username')} and {env_name('kafka', 'sasl', 'password')}(_FILE)"
    )

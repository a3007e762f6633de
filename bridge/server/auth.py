"""Authentication: from an HTTP request to a principal name (or a 401).

Modes: ``none`` (everyone is ``anonymous``), ``bearer`` (static tokens, compared in constant
time), ``jwt`` (PyJWT; HS256 with a shared secret of at least 32 bytes, RS256 with the RSA keys
of a JWKS file; every token's ``exp``, ``aud`` and ``iss`` are required and checked). Tokens and
secrets are never logged; errors say what is wrong without echoing the credential.

A verified credential is an :class:`Identity`: the principal, and when the credential expires
(a JWT's ``exp``; a static token's ``auth.bearer_ttl_s`` after it was presented, when set), so
that a long-lived stream opened with it ends then (``bridge.server.http.SseResponse``).

Mode ``none`` is for loopback: :func:`check_exposure` refuses it on any other address unless
``auth.allow_unauthenticated`` says it is meant (behind an authenticating gateway).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt
from starlette.requests import Request

from bridge.config import AuthSettings, Settings, env_name

__all__ = [
    "Authenticator",
    "Identity",
    "Unauthorized",
    "check_exposure",
    "unauthenticated_exposure",
]

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"


class Unauthorized(Exception):
    """No valid credential; the message is safe to show."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified caller: its principal, and when its credential expires (epoch seconds;
    None: it does not)."""

    principal: str
    expires: float | None = None


class Authenticator:
    """Turns a request's ``Authorization`` header into a principal."""

    def __init__(self, settings: AuthSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._tokens: list[tuple[bytes, str]] = []
        self._keys: dict[str, Any] = {}
        if settings.mode == "bearer":
            tokens = dict(settings.tokens)
            if settings.tokens_file is not None:
                tokens.update(_load_json(settings.tokens_file, "tokens file"))
            if not tokens:
                raise ValueError("auth mode 'bearer' needs auth.tokens or auth.tokens_file")
            self._tokens = [(token.encode(), str(principal)) for token, principal in tokens.items()]
        elif settings.mode == "jwt":
            if "HS256" in settings.jwt_algorithms and settings.jwt_secret is None:
                raise ValueError("auth.jwt_algorithms has HS256 but auth.jwt_secret is not set")
            if "RS256" in settings.jwt_algorithms:
                if settings.jwks_file is None:
                    raise ValueError("auth.jwt_algorithms has RS256 but auth.jwks_file is not set")
                self._keys = _rsa_keys(_load_json(settings.jwks_file, "JWKS file"))

    @property
    def authenticates(self) -> bool:
        """False in mode ``none``, where every caller is the same ``anonymous`` principal."""
        return self.settings.mode != "none"

    def principal(self, request: Request) -> str:
        """The verified principal of ``request`` (:class:`Unauthorized` if none)."""
        return self.identify(request).principal

    def identify(self, request: Request) -> Identity:
        """The verified caller of ``request`` and its credential's expiry."""
        if self.settings.mode == "none":
            return Identity(ANONYMOUS)
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise Unauthorized("missing bearer token")
        credential = credential.strip()
        if self.settings.mode == "bearer":
            ttl = self.settings.bearer_ttl_s
            expires = None if ttl is None else self._clock() + ttl
            return Identity(self._static(credential), expires)
        return self._jwt(credential)

    def _static(self, credential: str) -> str:
        given = credential.encode()
        found = None
        for token, principal in self._tokens:  # no early exit: constant time per token
            if hmac.compare_digest(token, given):
                found = principal
        if found is None:
            raise Unauthorized("invalid bearer token")
        return found

    def _jwt(self, credential: str) -> Identity:
        s = self.settings
        try:
            header = jwt.get_unverified_header(credential)
            algorithm = header.get("alg")
            if algorithm not in s.jwt_algorithms:
                raise Unauthorized("token algorithm not accepted")
            if algorithm == "HS256":
                if s.jwt_secret is None:  # refused at start-up; never HMAC with another key
                    raise Unauthorized("token algorithm not accepted")
                key: Any = s.jwt_secret.get_secret_value()
            else:
                kid = header.get("kid")
                key = self._keys.get(kid) if kid else next(iter(self._keys.values()), None)
                if key is None:
                    raise Unauthorized("token signed with an unknown key")
            # aud and iss are required settings in this mode (AuthSettings), and required and
            # checked in every token: one the same issuer minted for another API is refused.
            claims = jwt.decode(
                credential,
                key,
                algorithms=[algorithm],
                audience=s.jwt_audience,
                issuer=s.jwt_issuer,
                options={"require": ["exp", "aud", "iss"], "verify_aud": True, "verify_iss": True},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token ({type(exc).__name__})") from None
        principal = claims.get(s.jwt_principal_claim)
        if not isinstance(principal, str) or not principal:
            raise Unauthorized(f"token has no {s.jwt_principal_claim!r} claim")
        return Identity(principal, float(claims["exp"]))  # "exp" is required and checked


def _rsa_keys(jwks: dict[str, Any]) -> dict[str, Any]:
    """The RS256 verification keys of a JWKS, by key id; any other key is skipped with a
    warning at start, so that no token naming it can reach a verifier of the wrong type."""
    entries = jwks.get("keys")
    if not isinstance(entries, list):
        raise ValueError('the JWKS file must hold {"keys": [...]}')
    keys: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        kid = entry.get("kid") if isinstance(entry, dict) else None
        name = kid if isinstance(kid, str) else f"key{i}"
        try:
            if not isinstance(entry, dict):
                raise TypeError("not an object")
            key = jwt.PyJWK(entry)
        except (jwt.PyJWTError, KeyError, TypeError, ValueError) as exc:
            log.warning("JWKS key %s skipped: unusable (%s)", name, type(exc).__name__)
            continue
        if key.key_type != "RSA" or entry.get("alg", "RS256") != "RS256":
            log.warning("JWKS key %s skipped: %s, not an RS256 key", name, key.key_type)
            continue
        if entry.get("use", "sig") != "sig":
            log.warning("JWKS key %s skipped: its use is not sig", name)
            continue
        keys[name] = key.key
    if not keys:
        raise ValueError("the JWKS file has no RS256 key (RSA, use sig)")
    return keys


def _load_json(path: Any, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the {what} {path}: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the {what} {path} must hold a JSON object")
    return data


def unauthenticated_exposure(settings: Settings) -> str | None:
    """Why serving with these settings would take unauthenticated calls from other hosts
    (mode ``none`` on an address other than loopback, without the opt-in), else None."""
    if settings.auth.mode != "none" or settings.auth.allow_unauthenticated:
        return None
    if _is_loopback(settings.server.host):
        return None
    return (
        f"{env_name('auth', 'mode')}=none on {settings.server.host!r} would serve every caller "
        f"who reaches the port as one principal: set {env_name('auth', 'mode')}=jwt or bearer, "
        f"bind loopback ({env_name('server', 'host')}=127.0.0.1), or confirm with "
        f"{env_name('auth', 'allow_unauthenticated')}=true (only behind an authenticating gateway)"
    )


def check_exposure(settings: Settings) -> None:
    """Refuse what :func:`unauthenticated_exposure` describes (``ValueError``); when it was
    allowed explicitly, say so loudly at every start."""
    problem = unauthenticated_exposure(settings)
    if problem is not None:
        raise ValueError(problem)
    auth = settings.auth
    if auth.mode == "none" and not _is_loopback(settings.server.host):
        log.warning(
            "AUTHENTICATION IS OFF on %s:%d (%s=true): every caller who reaches this port is "
            "the one principal %r and may read and cancel every task; only behind a gateway "
            "that authenticates",
            settings.server.host,
            settings.server.port,
            env_name("auth", "allow_unauthenticated"),
            ANONYMOUS,
        )


def _is_loopback(host: str) -> bool:
    # A name other than localhost is not resolved here: it counts as reachable from elsewhere.
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

"""Authentication: from an HTTP request to a principal name (or a 401).

Modes: ``none`` (everyone is ``anonymous``), ``bearer`` (static tokens, compared in constant
time), ``jwt`` (PyJWT; HS256 with a shared secret, RS256 with keys from a JWKS file). Tokens and
secrets are never logged; errors say what is wrong without echoing the credential.

A verified credential is an :class:`Identity`: the principal, and when the credential expires
(a JWT's ``exp``; a static token's ``auth.bearer_ttl_s`` after it was presented, when set), so
that a long-lived stream opened with it ends then (``bridge.server.http.SseResponse``).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt
from starlette.requests import Request

from bridge.config import AuthSettings

__all__ = ["Authenticator", "Identity", "Unauthorized"]

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
                jwks = jwt.PyJWKSet.from_dict(_load_json(settings.jwks_file, "JWKS file"))
                self._keys = {key.key_id or f"key{i}": key.key for i, key in enumerate(jwks.keys)}

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
            claims = jwt.decode(
                credential,
                key,
                algorithms=[algorithm],
                audience=s.jwt_audience,
                issuer=s.jwt_issuer,
                options={"require": ["exp"], "verify_aud": s.jwt_audience is not None},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token ({type(exc).__name__})") from None
        principal = claims.get(s.jwt_principal_claim)
        if not isinstance(principal, str) or not principal:
            raise Unauthorized(f"token has no {s.jwt_principal_claim!r} claim")
        return Identity(principal, float(claims["exp"]))  # "exp" is required and checked


def _load_json(path: Any, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the {what} {path}: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the {what} {path} must hold a JSON object")
    return data

"""A keyring of named HMAC-SHA256 keys: the first signs, every one verifies.

Where it sits: a foundation (it imports nothing of the bridge), used by the settings to refuse
an unusable keyring at load and by :mod:`bridge.log.identity` to sign and verify task
identities. It never logs and never shows key material (no repr of it).

The text form (a file, or a setting): one ``<key id> <base64 key>`` per line, the signing key
first, then older keys that still verify; blank lines and ``#`` comments are skipped. Key ids
are 1-32 of ``[A-Za-z0-9_-]``; keys have at least 32 bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "IDENTITY_HEADER",
    "Keyring",
    "KeyringError",
    "PurposeKey",
    "new_keyring_text",
    "parse_keyring",
]

_VERSION = "v1"
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_MIN_KEY_BYTES = 32
#: A header longer than any this version writes is not looked at (v1 . 32 . 43 characters).
_MAX_HEADER = 96
#: The record header a signature travels in (see :mod:`bridge.log.identity`).
IDENTITY_HEADER = "mcpbridge-identity"


class KeyringError(ValueError):
    """A keyring that cannot be used; the message names the setting and never the key."""


class Keyring:
    """Named HMAC keys: the first signs, all verify. Holds key material: no repr of it."""

    __slots__ = ("_keys", "current")

    def __init__(self, keys: Iterable[tuple[str, bytes]]) -> None:
        pairs = list(keys)
        if not pairs:
            raise KeyringError("a keyring needs at least one key")
        self._keys: dict[str, bytes] = {}
        for key_id, secret in pairs:
            if not _KEY_ID.fullmatch(key_id):
                raise KeyringError(f"key id {key_id[:40]!r} is not 1-32 of [A-Za-z0-9_-]")
            if len(secret) < _MIN_KEY_BYTES:
                raise KeyringError(f"key {key_id!r} has fewer than {_MIN_KEY_BYTES} bytes")
            if key_id in self._keys:
                raise KeyringError(f"key id {key_id!r} is listed twice")
            self._keys[key_id] = secret
        #: The id of the key that signs.
        self.current = pairs[0][0]

    def __repr__(self) -> str:
        return f"Keyring(current={self.current!r}, ids={list(self._keys)!r})"

    @property
    def key_ids(self) -> list[str]:
        return list(self._keys)

    def sign(self, message: bytes) -> bytes:
        """The header value for ``message`` under the current key."""
        mac = hmac.digest(self._keys[self.current], message, "sha256")
        tag = base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")
        return f"{_VERSION}.{self.current}.{tag}".encode("ascii")

    def verify(self, message: bytes, header: bytes | None) -> bool:
        """True when ``header`` is a valid signature of ``message`` by any key of the ring."""
        if header is None or len(header) > _MAX_HEADER:
            return False
        parts = header.split(b".")
        if len(parts) != 3 or parts[0] != _VERSION.encode("ascii"):
            return False
        key = self._keys.get(parts[1].decode("ascii", "replace"))
        if key is None:
            return False
        try:
            tag = base64.urlsafe_b64decode(parts[2] + b"=" * (-len(parts[2]) % 4))
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(hmac.digest(key, message, "sha256"), tag)

    def signature_of(self, message: bytes, headers: Any) -> bool:
        """:meth:`verify` with the record's headers (the last identity header counts)."""
        found: bytes | None = None
        for name, value in headers or ():
            if name == IDENTITY_HEADER:
                found = value
        return self.verify(message, found)


class PurposeKey:
    """HMAC-SHA256 under a key derived from a secret for one purpose: the one signer of the
    peer hops and the view tokens. The same secret may key both; domain separation (the
    purpose is hashed in) means a MAC of one purpose never verifies as the other's. The
    derivation (SHA-256 of purpose, NUL, secret) is a wire format: replicas of different
    versions check each other's MACs during a rolling update. Holds key material: no repr of it.
    """

    __slots__ = ("_key", "purpose")

    def __init__(self, secret: bytes, purpose: bytes) -> None:
        self.purpose = purpose
        self._key = hashlib.sha256(purpose + b"\0" + secret).digest()

    def __repr__(self) -> str:
        return f"PurposeKey(<secret>, purpose={self.purpose!r})"

    def mac(self, message: bytes) -> bytes:
        return hmac.digest(self._key, message, "sha256")

    def verifies(self, message: bytes, tag: bytes) -> bool:
        """True when ``tag`` is the MAC of ``message`` (compared in constant time)."""
        return hmac.compare_digest(self.mac(message), tag)


def parse_keyring(text: str) -> Keyring:
    """A keyring from its text: one ``<key id> <base64 key>`` per line, the signing key first;
    blank lines and ``#`` comments are skipped."""
    pairs: list[tuple[str, bytes]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise KeyringError(f"keyring line {number}: expected '<key id> <base64 key>'")
        try:
            secret = base64.b64decode(fields[1], validate=True)
        except (binascii.Error, ValueError):
            raise KeyringError(f"keyring line {number}: the key is not base64") from None
        pairs.append((fields[0], secret))
    return Keyring(pairs)


def new_keyring_text(key_id: str = "k1") -> str:
    """A keyring file's text holding one new random 256-bit key."""
    return f"{key_id} {base64.b64encode(os.urandom(32)).decode('ascii')}\n"

"""Secrets at rest: envelope encryption (AES-256-GCM) under keys kept outside Kafka.

Where it sits: the webhook subscriptions registry (:mod:`bridge.events_extension.registry`) seals each
record's signing secrets with :class:`Sealer` before it writes them to Kafka, and opens them as
it reads the topic. Whoever reads the topic (a broker's disk, a consumer with READ, a backup)
sees ciphertext; the keys live in a file mounted from a secret store, or behind a KMS.

Envelope: every sealing draws a fresh 256-bit data key, encrypts the plaintext with it
(AES-256-GCM, 96-bit random nonce), and has a :class:`KeyProvider` wrap the data key under its
current key-encryption key. The sealed form names the key id, so a record sealed under a
previous key opens as long as the provider still holds that key: rotation never orphans a
record. Both layers take the same associated data (the caller's ``context``, e.g. the
subscription id), so a ciphertext moved to another record does not open.

Providers: :class:`KeyRing`, a key file (``{"current": id, "keys": {id: base64 of 32 bytes}}``).
A KMS provider implements the same two coroutines (``wrap`` and ``unwrap`` are its Encrypt and
Decrypt calls with ``context`` as the encryption context) and needs nothing else to change.

Nothing here logs, and no repr shows a key or a plaintext.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["KeyFileError", "KeyProvider", "KeyRing", "SealError", "Sealed", "Sealer"]

#: The one algorithm of both layers; named in every sealed form so a later one can coexist.
ALGORITHM = "A256GCM"
_KEY_BYTES = 32
_NONCE_BYTES = 12

#: A sealed value as stored (JSON-ready): algorithm, key id, wrapped data key, nonce, ciphertext.
Sealed = dict[str, str]


class SealError(Exception):
    """A sealed value does not open: unknown key id, altered, or another record's context."""


class KeyFileError(ValueError):
    """The key file is missing or malformed (its content is never shown)."""


class KeyProvider(Protocol):
    """Wraps data keys under a key-encryption key it holds, and unwraps them again."""

    async def wrap(self, data_key: bytes, context: bytes) -> tuple[str, bytes]:
        """``(key id, wrapped data key)`` under the current key."""
        ...

    async def unwrap(self, key_id: str, wrapped: bytes, context: bytes) -> bytes:
        """The data key; :class:`SealError` when ``key_id`` is unknown or the blob is altered."""
        ...


def _aes_seal(key: bytes, plaintext: bytes, context: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, context)


def _aes_open(key: bytes, blob: bytes, context: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], context)
    except (InvalidTag, ValueError):
        raise SealError("the sealed value does not open under its key and context") from None


@dataclass(frozen=True)
class KeyRing:
    """The key-file provider: key-encryption keys by id, one of them current.

    Rotation: add a new key, make it ``current``, keep the previous ones until nothing sealed
    under them is still read (docs/events.md, "Secrets at rest").
    """

    current: str
    keys: Mapping[str, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise KeyFileError("the key file's current key id is not among its keys")
        if any(len(key) != _KEY_BYTES for key in self.keys.values()):
            raise KeyFileError("every key in the key file must be base64 of 32 bytes")

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        """Read a key file; :class:`KeyFileError` naming only the path when it is unusable."""
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise KeyFileError(f"{path}: cannot read the key file ({exc.strerror})") from None
        try:
            document = json.loads(text)
            keys = {
                str(kid): base64.b64decode(text, validate=True)
                for kid, text in document["keys"].items()
            }
            return cls(str(document["current"]), keys)
        except KeyFileError as exc:
            raise KeyFileError(f"{path}: {exc}") from None
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
            raise KeyFileError(
                f'{path}: not a key file ({{"current": id, "keys": {{id: base64 of 32 bytes}}}})'
            ) from None

    @classmethod
    def with_new_key(cls, path: Path) -> KeyRing:
        """Add a fresh key to the file at ``path`` (created if absent) and make it current.

        The file is replaced atomically and readable by its owner only; the older keys stay,
        so what they sealed still opens.
        """
        ring = cls.load(path) if path.exists() else None
        kid = f"k{datetime.now(UTC):%Y%m%d%H%M%S}-{secrets.token_hex(2)}"
        keys = {**(ring.keys if ring else {}), kid: AESGCM.generate_key(bit_length=256)}
        fresh = cls(kid, keys)
        fresh._write(path)
        return fresh

    def _write(self, path: Path) -> None:
        document = {
            "current": self.current,
            "keys": {kid: base64.b64encode(key).decode() for kid, key in self.keys.items()},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(document, out, indent=2)
        staging.replace(path)

    async def wrap(self, data_key: bytes, context: bytes) -> tuple[str, bytes]:
        return self.current, _aes_seal(self.keys[self.current], data_key, context)

    async def unwrap(self, key_id: str, wrapped: bytes, context: bytes) -> bytes:
        key = self.keys.get(key_id)
        if key is None:
            raise SealError("the sealed value names a key the key file does not hold")
        return _aes_open(key, wrapped, context)


class Sealer:
    """Seals and opens byte strings with a fresh data key each, wrapped by ``provider``."""

    def __init__(self, provider: KeyProvider) -> None:
        self.provider = provider

    def __repr__(self) -> str:
        return f"Sealer({type(self.provider).__name__})"

    async def seal(self, plaintext: bytes, context: bytes) -> Sealed:
        """``plaintext`` encrypted for storage; it opens only with the same ``context``."""
        data_key = AESGCM.generate_key(bit_length=256)
        key_id, wrapped = await self.provider.wrap(data_key, context)
        return {
            "alg": ALGORITHM,
            "kid": key_id,
            "dek": _b64(wrapped),
            "ct": _b64(_aes_seal(data_key, plaintext, context)),
        }

    async def open(self, sealed: Mapping[str, Any], context: bytes) -> bytes:
        """The plaintext of a :meth:`seal` result; :class:`SealError` for anything else."""
        try:
            if sealed["alg"] != ALGORITHM:
                raise SealError("the sealed value uses an unknown algorithm")
            key_id, wrapped, blob = str(sealed["kid"]), _unb64(sealed["dek"]), _unb64(sealed["ct"])
        except (KeyError, TypeError):
            raise SealError("the sealed value is malformed") from None
        data_key = await self.provider.unwrap(key_id, wrapped, context)
        return _aes_open(data_key, blob, context)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise SealError("the sealed value is malformed")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SealError("the sealed value is malformed") from None

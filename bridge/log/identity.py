"""Authenticated task identities: who may define a task, and how the index knows.

A task is defined by its ``task.created`` record (seq 0): the owner digest, creation time,
ttl, poll interval and tool in it decide who may read and steer the task. Anyone with WRITE on
the events topic can write a record of that type, so the bridge signs the identity it writes
and the index takes an identity only from a signed record (or from one a documented upgrade
rule honours, :meth:`bridge.log.seqindex.PartitionIndex.apply`).

The signature is an HMAC-SHA256 carried in the record header :data:`IDENTITY_HEADER` as
``v1.<key id>.<base64url MAC>``, over a canonical, length-prefixed encoding of the identity
(:func:`identity_message`): the event type, the task id (the record key) and the identity
fields as the index keeps them, plus the tool. Pipelines never hold the key: they keep
appending ordinary events, and a ``task.created`` they write defines nothing.

Keys come from a :class:`Keyring`: the first key signs, every key verifies, so a rotation
(add the new key first, keep the old one listed) never orphans a task created before it. Where
the keyring comes from (:func:`load_keyring`): ``identity.keys_file`` or ``identity.keys``;
else, with replicas (``ownership = "group"``), a key derived from the peer secret every
replica already shares; else (one process, development) a key file made once in
``identity.dev_keys_file``. Key material is never logged and has no repr.

What it does not do: decide which records the index honours (the seq index does), or read
Kafka.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bridge.config import Settings, env_name
from bridge.envelope import TaskEvent
from bridge.log.seqindex import TaskIdentity

__all__ = [
    "IDENTITY_HEADER",
    "Keyring",
    "KeyringError",
    "identity_message",
    "is_signed",
    "load_keyring",
    "parse_keyring",
]

log = logging.getLogger(__name__)

#: The record header that carries a ``task.created`` record's signature.
IDENTITY_HEADER = "mcpbridge-identity"
_VERSION = "v1"
_DOMAIN = b"mcp-kafka-bridge task identity v1"
#: Key ids: short, and free of the header's separator.
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_MIN_KEY_BYTES = 32
#: A header longer than any this version writes is not looked at (v1 . 32 . 43 characters).
_MAX_HEADER = 96
#: The lengths of the event type, task id and tool, ahead of them.
_LENGTHS = struct.Struct(">III")
#: The owner's two halves, created_ms, ttl_ms (-1: unlimited), poll_ms.
_NUMBERS = struct.Struct(">QQqqq")
_LOW64 = (1 << 64) - 1
#: The key id of the key derived from the peer secret.
PEER_KEY_ID = "peer"


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


def identity_message(event_type: str, task_id: str, identity: TaskIdentity, tool: Any) -> bytes:
    """The signed bytes: the strings length-prefixed, the numbers fixed-width, so no two
    identities share an encoding. :class:`struct.error` for a number out of range (no
    signature can then cover it)."""
    type_, task, tool_ = (
        event_type.encode("utf-8"),
        task_id.encode("utf-8"),
        (tool if isinstance(tool, str) else "").encode("utf-8"),
    )
    owner = identity.owner
    numbers = _NUMBERS.pack(
        owner >> 64, owner & _LOW64, identity.created_ms, identity.ttl_ms, identity.poll_ms
    )
    lengths = _LENGTHS.pack(len(type_), len(task), len(tool_))
    return b"".join((_DOMAIN, lengths, type_, task, tool_, numbers))


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


def load_keyring(settings: Settings) -> Keyring:
    """The keyring this process signs and verifies task identities with (see the module doc).

    :class:`KeyringError` names the setting to fix when the configured one cannot be used.
    """
    text = settings.identity.keyring_text()
    if text is not None:
        try:
            return parse_keyring(text)
        except KeyringError as exc:
            raise KeyringError(f"{env_name('identity', 'keys_file')}: {exc}") from None
    peer = settings.peer_secret_value
    if settings.ownership == "group" and peer:
        derived = hmac.digest(peer.encode("utf-8"), _DOMAIN, "sha256")
        return Keyring([(PEER_KEY_ID, derived)])
    return _dev_keyring(settings.identity.dev_keys_file)


def _dev_keyring(path: Path) -> Keyring:
    """One process without a configured keyring: a key made once in ``path`` (0600)."""
    path = path.expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise KeyringError(_no_key_message(path, exc)) from None
    else:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(new_keyring_text("dev"))
        log.warning(
            "no task identity keyring configured: made a development key in %s; set %s for "
            "production (docs/operations.md, 'Task identity keys')",
            path,
            env_name("identity", "keys_file"),
        )
    try:
        return parse_keyring(path.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError, KeyringError) as exc:
        raise KeyringError(_no_key_message(path, exc)) from None


def _no_key_message(path: Path, exc: BaseException) -> str:
    return (
        f"no task identity keyring is configured and the development key file {path} cannot "
        f"be used ({type(exc).__name__}); set {env_name('identity', 'keys_file')} (a file of "
        f"'<key id> <base64 key>' lines) or {env_name('identity', 'keys')}"
    )


def is_signed(
    keyring: Keyring,
    task_id: str,
    event: TaskEvent | None,
    identity: TaskIdentity | None,
    headers: Any,
) -> bool:
    """Whether a ``task.created`` record's headers carry a valid signature of its identity."""
    if event is None or identity is None:
        return False
    try:
        message = identity_message(event.type, task_id, identity, event.payload.get("tool"))
    except struct.error:  # a number past 64 bits: nothing the bridge writes, nothing it signed
        return False
    return keyring.signature_of(message, headers)

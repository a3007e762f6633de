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
else, with replicas (``replicas.ownership = "group"``), a key derived from the peer secret every
replica already shares; else (one process, development) a key file made once in
``identity.dev_keys_file``. Key material is never logged and has no repr.

What it does not do: decide which records the index honours (the seq index does), or read
Kafka.
"""

from __future__ import annotations

import hmac
import logging
import os
import struct
from pathlib import Path
from typing import Any

from bridge.config import Settings, env_name
from bridge.envelope import TaskEvent
from bridge.keyring import IDENTITY_HEADER, Keyring, KeyringError, new_keyring_text, parse_keyring
from bridge.log.seqindex import TaskIdentity

__all__ = [
    "IDENTITY_HEADER",
    "Keyring",
    "KeyringError",
    "identity_message",
    "is_signed",
    "keyring_env",
    "load_keyring",
    "parse_keyring",
]

log = logging.getLogger(__name__)

_DOMAIN = b"mcp-kafka-bridge task identity v1"
#: The lengths of the event type, task id and tool, ahead of them.
_LENGTHS = struct.Struct(">III")
#: The owner's two halves, created_ms, ttl_ms (-1: unlimited), poll_ms.
_NUMBERS = struct.Struct(">QQqqq")
_LOW64 = (1 << 64) - 1
#: The key id of the key derived from the peer secret.
PEER_KEY_ID = "peer"


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
    peer = settings.peers.secret_value
    if settings.replicas.ownership == "group" and peer:
        derived = hmac.digest(peer.encode("utf-8"), _DOMAIN, "sha256")
        return Keyring([(PEER_KEY_ID, derived)])
    return _dev_keyring(settings.identity.dev_keys_file)


def _dev_keyring(path: Path) -> Keyring:
    """One process without a configured keyring: a key made once in ``path`` (0600)."""
    path = path.expanduser()
    try:
        if _make_key_file(path):
            log.warning(
                "no task identity keyring configured: made a development key in %s; set %s "
                "for production (docs/operations.md, 'Task identity keys')",
                path,
                env_name("identity", "keys_file"),
            )
        return parse_keyring(path.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError, KeyringError) as exc:
        raise KeyringError(_no_key_message(path, exc)) from None


def _make_key_file(path: Path) -> bool:
    """Make ``path`` with a new key unless it exists; True when this call made it.

    Written aside, then linked into place: processes starting together never read a file
    still being written, and exactly one of them makes it.
    """
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    aside = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(new_keyring_text("dev"))
        os.link(aside, path)
    except FileExistsError:
        return False
    finally:
        aside.unlink(missing_ok=True)
    return True


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


def keyring_env(settings: Settings) -> dict[str, str]:
    """Environment variables that give a child ``bridge`` process this process's keyring,
    whatever its own ownership mode (harnesses that start replicas beside a publisher)."""
    identity = settings.identity
    if identity.keys_file is not None:
        return {env_name("identity", "keys_file"): str(identity.keys_file)}
    if identity.keys is not None:
        return {env_name("identity", "keys"): identity.keys.get_secret_value()}
    if settings.replicas.ownership == "group" and settings.peers.secret_value:
        return {}  # a child given the same peer secret derives the same key
    path = identity.dev_keys_file.expanduser()
    _dev_keyring(path)  # made now if it is not there yet
    return {env_name("identity", "keys_file"): str(path)}

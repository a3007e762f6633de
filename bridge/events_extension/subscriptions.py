"""Webhook subscriptions of the Events extension (SEP-3415) as data: identity, TTL, records, merge.

Where it sits: ``events/subscribe`` (any replica) builds a :class:`Subscription` and writes it to
the compacted ``<prefix>.event-subscriptions`` topic under its id; the replica that owns the
record's partition delivers it and writes it back with its delivered cursor and delivery status
(:mod:`bridge.events_extension.delivery`); every replica keeps the latest state of every subscription in
a :class:`SubscriptionTable` (:mod:`bridge.events_extension.registry` feeds it from the topic).

Two writers may race on one key: a refresh (new TTL, new secret) from the replica that served
it, and a write-back (cursor, status) from the owner. A record therefore carries two revisions,
and :func:`merge` takes the *definition* from the record with the newer ``refreshed_ms`` and the
*delivery state* from the one with the higher ``delivery_rev``: replicas converge whatever the
order, and a refresh is never undone by a delivery. A write-back that lands after the
subscription's tombstone (a zombie) carries a definition no newer than the deleted one and is
ignored.

Secrets: a record holds the callback's signing secrets, because a replica that takes the
partition over must sign with them, but only sealed (:mod:`bridge.sealing`, by the registry):
:meth:`Subscription.to_record` takes the sealed form, and :func:`parse_record` hands the sealed
form back for the registry to open. A version 1 record (written by bridges before secrets were
sealed) holds them in clear; it is still read, and :attr:`StoredRecord.sealed` says which it
was so that the owner can rewrite it sealed. Secrets never appear in a ``repr`` (nor do the
principal, the URL or the arguments); this module logs nothing.

Pure: no Kafka, no HTTP, no JSON-RPC.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import rfc8785

from bridge.events_extension.cursor import BadCursor, decode_task

__all__ = [
    "BadRecord",
    "DeliveryStatus",
    "NotCanonical",
    "StoredRecord",
    "Subscription",
    "SubscriptionTable",
    "TtlPolicy",
    "merge",
    "parse_record",
    "secrets_context",
    "secrets_of",
    "subscription_id",
]

_K = TypeVar("_K")

#: Version 1: secrets in clear (until 8fd441c); version 2: secrets sealed.
_CLEAR_VERSION = 1
_VERSION = 2


class BadRecord(ValueError):
    """A subscriptions-topic record this version cannot read (its content is never shown)."""


class NotCanonical(ValueError):
    """Arguments that have no canonical JSON form (RFC 8785): an integer beyond what a JSON
    number holds exactly (2**53), a lone surrogate. The value is never shown."""

    def __init__(self) -> None:
        super().__init__(
            "arguments hold a value without a canonical JSON form (RFC 8785): an integer "
            "beyond 2**53 - 1 or a lone surrogate"
        )


def subscription_id(principal: str, url: str, name: str, arguments: dict[str, Any]) -> str:
    """The SEP's deterministic id over ``(principal, url, name, arguments)``: 128 bits of a
    SHA-256 of their canonical JSON, RFC 8785 (JCS), so that arguments equal as JSON values
    are one key (``1`` and ``1.0``, ``1e2`` and ``100``, members in any order)."""
    try:
        key = rfc8785.dumps([principal, url, name, arguments])
    except rfc8785.CanonicalizationError:
        raise NotCanonical() from None
    return "sub_" + hashlib.sha256(key).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class TtlPolicy:
    """What the server grants: the suggestion clamped into ``[min_ms, max_ms]``."""

    default_ms: int
    min_ms: int
    max_ms: int

    def grant(self, suggested_ms: int | None, *, given: bool) -> int:
        """The granted TTL. ``given`` False: no ``ttlMs`` (the default); ``None``: a request for
        no expiry, answered with the longest finite grant (this server never grants none)."""
        if not given:
            return self.default_ms
        if suggested_ms is None:
            return self.max_ms
        return min(max(suggested_ms, self.min_ms), self.max_ms)


@dataclass(frozen=True, slots=True)
class DeliveryStatus:
    """How delivery to the callback goes; ``last_error`` is one of the draft's categories."""

    last_delivery_ms: int | None = None
    last_error: str | None = None
    failed_since_ms: int | None = None
    consecutive_failures: int = 0
    #: When the owner suspended delivery after repeated failures; a later refresh resumes it.
    suspended_ms: int | None = None

    def succeeded(self, now_ms: int) -> DeliveryStatus:
        """A delivery went through: the failure streak ends (``failedSince`` goes), while
        ``lastError`` stays the last error seen, so an operator who looks a moment after a
        given-up event still sees why it was given up."""
        return DeliveryStatus(last_delivery_ms=now_ms, last_error=self.last_error)

    def failed(self, error: str | None, now_ms: int, *, suspend_after: int) -> DeliveryStatus:
        """One delivery given up (retries exhausted, or refused); suspended at the threshold."""
        failures = self.consecutive_failures + 1
        return dataclasses.replace(
            self,
            last_error=error,
            failed_since_ms=self.failed_since_ms or now_ms,
            consecutive_failures=failures,
            suspended_ms=now_ms if failures >= suspend_after else self.suspended_ms,
        )

    def suspended(self, now_ms: int) -> DeliveryStatus:
        return dataclasses.replace(self, suspended_ms=now_ms)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One webhook subscription: its definition (from subscribe) and its delivery state."""

    id: str
    name: str
    principal: str = field(repr=False)
    arguments: dict[str, Any] = field(repr=False)
    url: str = field(repr=False)
    #: Signing secrets, newest first; the older ones sign until ``previous_until_ms``.
    secrets: tuple[str, ...] = field(repr=False)
    previous_until_ms: int
    expires_ms: int
    #: The definition's revision: the time of the subscribe (or refresh) that wrote it.
    refreshed_ms: int
    #: Delivered (or abandoned) up to here: the safe-to-persist watermark.
    cursor: str | None
    #: Events older than this are skipped by the first delivery read (the subscribe's maxAgeMs).
    floor_ms: int | None
    #: The delivery state's revision, raised by every write-back of the owner.
    delivery_rev: int
    status: DeliveryStatus = DeliveryStatus()

    def signing_secrets(self, now_ms: int) -> list[str]:
        """The secrets a delivery is signed with now (both during a rotation's grace window)."""
        if now_ms < self.previous_until_ms:
            return list(self.secrets)
        return list(self.secrets[:1])

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.expires_ms

    @property
    def active(self) -> bool:
        """False while suspended: a refresh after the suspension makes it active again."""
        suspended = self.status.suspended_ms
        return suspended is None or suspended < self.refreshed_ms

    def refreshed(self, secret: str, expires_ms: int, now_ms: int, grace_ms: int) -> Subscription:
        """The idempotent upsert of a refresh: new TTL, the secret replaced (the old one signs
        for ``grace_ms`` more), delivery state kept."""
        rotated = secret != self.secrets[0]
        return dataclasses.replace(
            self,
            secrets=(secret, self.secrets[0]) if rotated else self.secrets,
            previous_until_ms=now_ms + grace_ms if rotated else self.previous_until_ms,
            expires_ms=expires_ms,
            refreshed_ms=max(now_ms, self.refreshed_ms + 1),
        )

    def delivered(
        self, cursor: str | None, status: DeliveryStatus, *, floor_ms: int | None = None
    ) -> Subscription:
        """The owner's write-back: a new watermark and status, one delivery revision later."""
        return dataclasses.replace(
            self,
            cursor=cursor,
            status=status,
            floor_ms=floor_ms,
            delivery_rev=self.delivery_rev + 1,
        )

    def secrets_plaintext(self) -> bytes:
        """What the registry seals: the secrets, newest first, as a JSON array."""
        return json.dumps(list(self.secrets), separators=(",", ":")).encode("ascii")

    def to_record(self, sealed_secrets: Mapping[str, str]) -> bytes:
        """The record value: JSON, with ``sealed_secrets`` (:meth:`secrets_plaintext` sealed
        under :func:`secrets_context`) in place of the secrets."""
        body = {
            "v": _VERSION,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "secrets": dict(sealed_secrets),
            "status": dataclasses.asdict(self.status),
        }
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def secrets_context(sub_id: str) -> bytes:
    """The associated data of a subscription's sealed secrets: they open under its id only."""
    return b"mcp-kafka-bridge/webhook-secrets\x00" + sub_id.encode("utf-8")


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record value parsed, its secrets still as stored: sealed (version 2) or in clear."""

    fields: dict[str, Any] = field(repr=False)
    #: The sealed secrets of a version 2 record; None for a version 1 (clear) record.
    sealed: dict[str, str] | None
    clear: tuple[str, ...] = field(default=(), repr=False)

    @property
    def id(self) -> str:
        return str(self.fields["id"])

    def subscription(self, secrets: tuple[str, ...]) -> Subscription:
        """The subscription, given its secrets (opened, or :attr:`clear`)."""
        try:
            if not secrets or not all(isinstance(s, str) for s in secrets):
                raise ValueError("no secrets")
            return Subscription(**self.fields, secrets=secrets)
        except (ValueError, TypeError) as exc:
            raise BadRecord(f"unreadable subscription record ({type(exc).__name__})") from None


def parse_record(value: bytes) -> StoredRecord:
    """Parse a record value of either version; :class:`BadRecord` for anything else."""
    try:
        body = json.loads(value)
        version = body.pop("v", None) if isinstance(body, dict) else None
        if version not in (_CLEAR_VERSION, _VERSION):
            raise BadRecord("unknown subscription record version")
        secrets = body.pop("secrets")
        body["status"] = DeliveryStatus(**body["status"])
        if not isinstance(body["id"], str):
            raise TypeError("id")
        if version == _CLEAR_VERSION:
            if not isinstance(secrets, list):
                raise TypeError("secrets")
            return StoredRecord(body, None, tuple(secrets))
        if not isinstance(secrets, dict):
            raise TypeError("secrets")
        return StoredRecord(body, {str(k): str(v) for k, v in secrets.items()})
    except (ValueError, TypeError, KeyError) as exc:
        raise BadRecord(f"unreadable subscription record ({type(exc).__name__})") from None


def secrets_of(plaintext: bytes) -> tuple[str, ...]:
    """The secrets from an opened :meth:`Subscription.secrets_plaintext`."""
    try:
        secrets = json.loads(plaintext)
    except ValueError:
        raise BadRecord("unreadable sealed secrets") from None
    if not isinstance(secrets, list) or not all(isinstance(s, str) for s in secrets):
        raise BadRecord("unreadable sealed secrets")
    return tuple(secrets)


def merge(old: Subscription | None, new: Subscription) -> Subscription:
    """The state after ``new`` when ``old`` was known: definition by ``refreshed_ms``, delivery
    state by ``delivery_rev`` (ties go to ``new``, the later record)."""
    if old is None:
        return new
    definition = new if new.refreshed_ms >= old.refreshed_ms else old
    delivery = new if new.delivery_rev >= old.delivery_rev else old
    return dataclasses.replace(
        definition,
        cursor=delivery.cursor,
        floor_ms=delivery.floor_ms,
        delivery_rev=delivery.delivery_rev,
        status=delivery.status,
    )


class SubscriptionTable:
    """The latest merged state of every subscription, by id, with its partition."""

    def __init__(self) -> None:
        self._subs: dict[str, Subscription] = {}
        self._partition: dict[str, int] = {}
        #: The definition revision each deleted id had: older records after it are zombies.
        self._deleted: dict[str, int] = {}
        #: The ids held per principal, and per (principal, url): each subscribe asks both, and
        #: must not scan every subscription. Kept in step by :meth:`apply`, the one writer.
        self._by_principal: dict[str, set[str]] = {}
        self._by_target: dict[tuple[str, str], set[str]] = {}

    def apply(self, partition: int, key: str, sub: Subscription | None) -> bool:
        """Apply one record (None: a tombstone); True when the state of ``key`` changed.
        Raises :class:`BadRecord`."""
        if sub is None:
            gone = self._subs.pop(key, None)
            if gone is not None:
                self._unindex(gone)
                self._deleted[key] = max(gone.refreshed_ms, self._deleted.get(key, 0))
            return gone is not None
        if sub.id != key:
            raise BadRecord("a subscription record under another id's key")
        if sub.refreshed_ms <= self._deleted.get(key, -1):
            return False  # a write-back that raced the tombstone
        before = self._subs.get(key)
        self._subs[key] = merged = merge(before, sub)
        self._partition[key] = partition
        if before is not None:
            self._unindex(before)
        self._index(merged)
        return merged != before

    def _index(self, sub: Subscription) -> None:
        self._by_principal.setdefault(sub.principal, set()).add(sub.id)
        self._by_target.setdefault((sub.principal, sub.url), set()).add(sub.id)

    def _unindex(self, sub: Subscription) -> None:
        _drop(self._by_principal, sub.principal, sub.id)
        _drop(self._by_target, (sub.principal, sub.url), sub.id)

    def get(self, sub_id: str) -> Subscription | None:
        return self._subs.get(sub_id)

    def task_positions(self, now_ms: int) -> list[tuple[str, int]]:
        """``(task id, last delivered seq)`` of every live subscription to a task's events
        whose cursor says where it is (a copy: the view may change meanwhile); what
        retention must not pass, like an open stream's position."""
        found = []
        for sub in list(self._subs.values()):
            task_id = sub.arguments.get("taskId")
            if sub.cursor is None or not isinstance(task_id, str) or sub.expired(now_ms):
                continue
            try:
                found.append((task_id, decode_task(sub.cursor, task_id)))
            except BadCursor:
                continue  # not a task event cursor (another source's subscription)
        return found

    def live(self, sub_id: str, now_ms: int) -> Subscription | None:
        """The subscription unless it is unknown or expired (the owner tombstones it soon)."""
        sub = self._subs.get(sub_id)
        return sub if sub is not None and not sub.expired(now_ms) else None

    def deleted_rev(self, sub_id: str) -> int:
        """A new definition of ``sub_id`` must be newer than this to outlive its tombstone."""
        return self._deleted.get(sub_id, 0)

    def count_live(self, principal: str, now_ms: int) -> int:
        """The unexpired subscriptions of ``principal`` (a scan of its own only)."""
        ids = self._by_principal.get(principal, ())
        return sum(1 for i in ids if not self._subs[i].expired(now_ms))

    def verified(self, principal: str, url: str, now_ms: int) -> bool:
        """Whether ``principal`` proved ``url``'s consent already: every stored subscription
        passed the challenge, so a live one to the same URL stands for it (the draft caches
        verification per principal and URL)."""
        ids = self._by_target.get((principal, url), ())
        return any(not self._subs[i].expired(now_ms) for i in ids)

    def partition_of(self, sub_id: str) -> int | None:
        return self._partition.get(sub_id)

    def in_partitions(self, partitions: Iterable[int]) -> list[str]:
        wanted = set(partitions)
        return [sid for sid in self._subs if self._partition.get(sid) in wanted]


def _drop(index: dict[_K, set[str]], key: _K, sub_id: str) -> None:
    """Remove ``sub_id`` under ``key``, and the key once empty (the index holds no husks)."""
    ids = index.get(key)
    if ids is not None:
        ids.discard(sub_id)
        if not ids:
            del index[key]

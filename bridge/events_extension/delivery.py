"""Webhook delivery loops: read a subscription's events after its cursor, POST them, write back.

Where it sits: the replica that owns a partition of the subscriptions topic
(:class:`~bridge.events_extension.registry.PartitionOwnership`) runs one :class:`SubscriptionDelivery`
per subscription of that partition (:class:`WebhookDeliveries` starts and stops them). A loop
reads occurrences after the subscription's cursor through an injected :class:`Poll` (the
``events/poll`` path of the event source, so authorization is re-checked at every read), POSTs
each one in order with :func:`~bridge.events_extension.webhooks.deliver` (signed, SSRF-checked, retried
with backoff), and writes the subscription back with the new cursor and delivery status after
each delivered or abandoned event: a restart, or another replica taking the partition over,
continues from there (at least once; the receiver deduplicates on ``eventId``).

Events are delivered one at a time, so the cursor in each body (the event's own position) is a
safe watermark: everything before it was acknowledged or given up. A quiet subscription polls
every ``poll_interval_s``, and at once after a refresh or when a read returned ``hasMore``.

The client's profile (:mod:`bridge.server.profile`) reaches a loop as plain values: whether
``gap`` and ``terminated`` envelopes are sent (:attr:`DeliveryPolicy.control_envelopes`), the
largest body sent (:attr:`DeliveryPolicy.max_body_bytes`), and the :class:`Shape` that makes each
event's body (the occurrence as is, unless the profile fits it to the client).

What it does not do: know JSON-RPC (a subscription that may no longer be served is reported by
the poll function as :class:`Revoked`, with the error object for the ``terminated`` envelope).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from bridge.component import Component, cancel_and_wait
from bridge.config import Settings
from bridge.events_extension.occurrences import Occurrence, PollBatch
from bridge.events_extension.registry import PartitionOwnership, SubscriptionRegistry
from bridge.events_extension.subscriptions import DeliveryStatus, Subscription
from bridge.events_extension.throttle import VerificationThrottle
from bridge.events_extension.webhooks import (
    Outcome,
    RetryPolicy,
    Verdict,
    WebhookSender,
    control_message_id,
    deliver,
)
from bridge.kafka.port import Log
from bridge.sealing import Sealer

__all__ = [
    "DeliveryPolicy",
    "Poll",
    "Revoked",
    "Shape",
    "SubscriptionDelivery",
    "VerificationThrottled",
    "WebhookDeliveries",
    "WebhookService",
    "as_is",
]

log = logging.getLogger(__name__)


class Poll(Protocol):
    """Occurrences after ``cursor`` for ``principal``'s subscription (``events/poll``'s rule).

    Raises :class:`Revoked` when the subscription may no longer be served (the event type is
    gone, the principal lost access); any other exception is a read failure to retry.
    """

    async def __call__(
        self,
        principal: str,
        name: str,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
        max_events: int,
    ) -> PollBatch: ...


class Revoked(Exception):
    """The subscription ends; ``error`` is the ``{code, message, data?}`` to tell the endpoint."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "revoked"))
        self.error = error


class Shape(Protocol):
    """The message a delivery of ``occurrence`` POSTs for ``sub``; ``before`` is the
    subscription's cursor before the occurrence (where a read of it alone starts)."""

    async def __call__(
        self, sub: Subscription, occurrence: Occurrence, before: str | None
    ) -> dict[str, Any]: ...


async def as_is(sub: Subscription, occurrence: Occurrence, before: str | None) -> dict[str, Any]:
    """The SEP's body: the ``EventOccurrence`` with its own cursor."""
    return occurrence.wire(with_cursor=True)


class Sender(Protocol):
    """What a loop needs of :class:`~bridge.events_extension.webhooks.WebhookSender`."""

    async def post(
        self, url: str, body: bytes, *, msg_id: str, subscription_id: str, secrets: list[str]
    ) -> Outcome: ...


class Store(Protocol):
    """What a loop needs of :class:`~bridge.events_extension.registry.SubscriptionRegistry`."""

    def current(self, sub_id: str) -> Subscription | None: ...

    async def put(self, sub: Subscription) -> None: ...

    async def delete(self, sub_id: str) -> None: ...


@dataclass(frozen=True)
class DeliveryPolicy:
    """How the loops behave (from the ``webhook_*`` settings)."""

    retry: RetryPolicy
    poll_interval_s: float
    suspend_after: int
    max_events: int = 100
    #: Send ``gap`` and ``terminated`` envelopes (a client that has none gets neither: a
    #: revoked subscription just ends, a gap is passed over).
    control_envelopes: bool = True
    #: The largest body POSTed; a larger one is never sent (abandoned as a 413 would be, with
    #: ``lastError`` ``too_large``, logged and counted).
    max_body_bytes: int | None = None

    @classmethod
    def of(
        cls,
        settings: Settings,
        *,
        control_envelopes: bool = True,
        max_body_bytes: int | None = None,
    ) -> DeliveryPolicy:
        retry = RetryPolicy(
            max_attempts=settings.webhooks.max_attempts,
            max_elapsed_seconds=settings.webhooks.max_retry_s,
            base_delay_seconds=settings.webhooks.backoff_base_s,
            max_delay_seconds=settings.webhooks.backoff_max_s,
        )
        return cls(
            retry,
            settings.webhooks.poll_interval_s,
            settings.webhooks.suspend_after_failures,
            control_envelopes=control_envelopes,
            max_body_bytes=max_body_bytes,
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _body(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class SubscriptionDelivery:
    """The delivery loop of one subscription (see the module docstring)."""

    def __init__(
        self,
        sub_id: str,
        store: Store,
        poll: Poll,
        sender: Sender,
        policy: DeliveryPolicy,
        *,
        shape: Shape = as_is,
        now_ms: Callable[[], int] = _now_ms,
        on_too_large: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_too_large`` counts the events whose body stays over the policy's bound."""
        self.sub_id = sub_id
        self.store = store
        self.poll = poll
        self.sender = sender
        self.policy = policy
        self.shape = shape
        self.now_ms = now_ms
        self.on_too_large = on_too_large
        #: Set when the subscription changed (a refresh): look again without waiting.
        self.nudge = asyncio.Event()

    async def run(self) -> None:
        """Deliver until the subscription ends (unsubscribed, expired, revoked) or the task is
        cancelled (the partition moved, the process stops)."""
        while True:
            self.nudge.clear()
            sub = self.store.current(self.sub_id)
            if sub is None:
                return
            if sub.expired(self.now_ms()):
                await self.store.delete(sub.id)
                return
            try:
                more = await self._step(sub)
            except Revoked as revoked:
                await self._terminate(sub, revoked.error)
                return
            except Exception as exc:  # Kafka or the source failed: try again later
                log.warning("webhook %s: delivery step failed (%s)", sub.id, type(exc).__name__)
                more = False
            if not more:
                await self._idle()

    async def _idle(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.policy.poll_interval_s):
                await self.nudge.wait()

    async def _step(self, sub: Subscription) -> bool:
        """One read and its deliveries; True when more events are waiting."""
        if not sub.active:
            return False  # suspended: a refresh (which nudges) resumes it
        if sub.status.suspended_ms is not None:
            sub = await self._write(
                sub.delivered(sub.cursor, _resumed(sub.status), floor_ms=sub.floor_ms)
            )
        floor = sub.floor_ms
        max_age = None if floor is None else max(self.now_ms() - floor, 0)
        batch = await self.poll(
            sub.principal, sub.name, sub.arguments, sub.cursor, max_age, self.policy.max_events
        )
        before = sub.cursor
        for occurrence in batch.events:
            if not await self._deliver_one(sub, occurrence, before):
                return False
            before = occurrence.cursor
        latest = self.store.current(self.sub_id)
        if latest is None or not latest.active:
            return False
        if batch.truncated and self.policy.control_envelopes:
            await self._control(latest, {"type": "gap", "cursor": batch.cursor})
        if batch.cursor != latest.cursor or latest.floor_ms is not None:
            await self._write(latest.delivered(batch.cursor, latest.status))
        return batch.has_more

    async def _deliver_one(
        self, read: Subscription, occurrence: Occurrence, before: str | None
    ) -> bool:
        """POST one event (retried); write the outcome back. False: stop this batch."""
        body = _body(await self.shape(read, occurrence, before))
        limit = self.policy.max_body_bytes
        if limit is not None and len(body) > limit:
            # Never sent: the receiver would refuse it (413), so it is abandoned alike, but
            # said apart from a receiver's answer (none was asked).
            log.warning(
                "webhook %s: event %s not sent: its body is %d bytes, over %d even reduced",
                read.id,
                occurrence.event_id,
                len(body),
                limit,
            )
            self.on_too_large()
            return await self._settle(occurrence, Outcome(Verdict.ABANDON, "too_large"))

        async def attempt() -> Outcome:
            sub = self.store.current(self.sub_id)
            if sub is None:  # unsubscribed meanwhile: nothing to send, nothing to retry
                return Outcome(Verdict.ABANDON)
            return await self.sender.post(
                sub.url,
                body,
                msg_id=occurrence.event_id,
                subscription_id=sub.id,
                secrets=sub.signing_secrets(self.now_ms()),
            )

        return await self._settle(occurrence, await deliver(attempt, self.policy.retry))

    async def _settle(self, occurrence: Occurrence, outcome: Outcome) -> bool:
        """Write back what became of ``occurrence``. False: stop this batch."""
        sub = self.store.current(self.sub_id)
        if sub is None:
            return False
        now = self.now_ms()
        if outcome.verdict is Verdict.REFUSED:
            # The callback resolves to a forbidden address now: nothing was sent, and every
            # later event would be refused alike. Keep the cursor; wait for a refresh.
            status = sub.status.failed(outcome.error, now, suspend_after=1)
            await self._write(sub.delivered(sub.cursor, status, floor_ms=sub.floor_ms))
            log.warning("webhook %s: callback refused at delivery; suspended", sub.id)
            return False
        await self._write(sub.delivered(occurrence.cursor, self._judged(sub.status, outcome, now)))
        return sub.active

    def _judged(self, status: DeliveryStatus, outcome: Outcome, now: int) -> DeliveryStatus:
        if outcome.verdict is Verdict.DELIVERED:
            return status.succeeded(now)
        if outcome.verdict is Verdict.ABANDON:
            # 410/413: the receiver's own decision about this event, not a failing endpoint.
            return DeliveryStatus(
                last_delivery_ms=status.last_delivery_ms,
                last_error=outcome.error,
                failed_since_ms=status.failed_since_ms,
                consecutive_failures=status.consecutive_failures,
                suspended_ms=status.suspended_ms,
            )
        return status.failed(outcome.error, now, suspend_after=self.policy.suspend_after)

    async def _write(self, sub: Subscription) -> Subscription:
        await self.store.put(sub)
        return self.store.current(self.sub_id) or sub

    async def _control(self, sub: Subscription, message: dict[str, Any]) -> Outcome:
        """A signed control envelope (``gap``, ``terminated``), retried like an event."""
        body = _body(message)
        msg_id = control_message_id(str(message["type"]))
        secrets = sub.signing_secrets(self.now_ms())

        async def attempt() -> Outcome:
            return await self.sender.post(
                sub.url, body, msg_id=msg_id, subscription_id=sub.id, secrets=secrets
            )

        return await deliver(attempt, self.policy.retry)

    async def _terminate(self, sub: Subscription, error: dict[str, Any]) -> None:
        """The draft's webhook termination: a ``terminated`` envelope, then the tombstone."""
        log.info("webhook %s: terminated (%s)", sub.id, error.get("code"))
        if self.policy.control_envelopes:
            await self._control(sub, {"type": "terminated", "error": error})
        await self.store.delete(sub.id)


def _resumed(status: DeliveryStatus) -> DeliveryStatus:
    """A refresh after a suspension: failures forgotten, the last error still reported."""
    return DeliveryStatus(last_delivery_ms=status.last_delivery_ms, last_error=status.last_error)


class WebhookDeliveries:
    """The delivery loops of the partitions this replica owns."""

    def __init__(self, make: Callable[[str], SubscriptionDelivery], registry: SubscriptionRegistry):
        self.make = make
        self.registry = registry
        self._ready: set[int] = set()
        self._owned: set[int] = set()
        self._loops: dict[str, tuple[SubscriptionDelivery, asyncio.Task[None]]] = {}
        self._starting: set[asyncio.Task[None]] = set()

    async def assigned(self, partitions: list[int]) -> None:
        """Restore the partitions' latest records, then deliver their subscriptions (in the
        background: a rebalance callback must not wait on Kafka reads)."""
        self._owned |= set(partitions)
        task = asyncio.create_task(self._take(partitions), name="webhook-partitions")
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _take(self, partitions: list[int]) -> None:
        try:
            await self.registry.caught_up(partitions)
        except Exception as exc:
            log.error("webhook partitions %s not restored (%s)", partitions, type(exc).__name__)
            return
        owned = [p for p in partitions if p in self._owned]
        self._ready |= set(owned)
        for sub_id in self.registry.table.in_partitions(owned):
            self._ensure(sub_id)
        log.info("webhook delivery: partitions %s owned", owned)
        await self._reseal(owned)

    async def _reseal(self, partitions: list[int]) -> None:
        """Seal the secrets of subscriptions written before sealing (the upgrade path)."""
        try:
            rewritten = await self.registry.reseal(partitions)
        except Exception as exc:  # the next assignment tries again; delivery goes on meanwhile
            log.error("webhook secrets not resealed (%s)", type(exc).__name__)
            return
        if rewritten:
            log.info("webhook subscriptions stored in clear, now sealed: %d", rewritten)

    async def revoked(self, partitions: list[int]) -> None:
        """Stop delivering ``partitions`` before the group hands them to another replica."""
        gone = set(partitions)
        self._owned -= gone
        self._ready -= gone
        table = self.registry.table
        stopping = [
            task for sub_id, (_, task) in self._loops.items() if table.partition_of(sub_id) in gone
        ]
        await cancel_and_wait(*stopping)

    def changed(self, sub_id: str) -> None:
        """A record of ``sub_id`` was applied: wake its loop, stop it, or start one."""
        running = self._loops.get(sub_id)
        if self.registry.table.get(sub_id) is None:
            if running is not None:
                running[1].cancel()  # unsubscribed: not even a retry in flight goes on
            return
        if running is not None:
            running[0].nudge.set()
        elif self.registry.table.partition_of(sub_id) in self._ready:
            self._ensure(sub_id)

    def _ensure(self, sub_id: str) -> None:
        if sub_id in self._loops:
            return
        loop = self.make(sub_id)
        task = asyncio.create_task(loop.run(), name="webhook-delivery")
        self._loops[sub_id] = (loop, task)
        task.add_done_callback(lambda done: self._ended(sub_id, done))

    def _ended(self, sub_id: str, task: asyncio.Task[None]) -> None:
        if self._loops.get(sub_id, (None, None))[1] is task:
            del self._loops[sub_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook %s: delivery loop failed", sub_id, exc_info=task.exception())

    async def stop(self) -> None:
        await cancel_and_wait(*self._starting, *(task for _, task in self._loops.values()))


class VerificationThrottled(Exception):
    """Too many verification challenges from one principal to one callback host lately."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(retry_after_s)
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"webhook verification throttled; retry in {self.retry_after_s:.1f} s"


class WebhookService(Component):
    """Webhook subscriptions in one process: the sender, the registry (every replica's view of
    the subscriptions topic), the delivery group and the loops of the partitions it owns."""

    def __init__(
        self,
        settings: Settings,
        poll: Poll,
        sealer: Sealer,
        *,
        now_ms: Callable[[], int] = _now_ms,
        on_throttled: Callable[[], None] = lambda: None,
        on_too_large: Callable[[], None] = lambda: None,
        policy: DeliveryPolicy | None = None,
        shape: Shape = as_is,
        log: Log | None = None,
    ):
        """``policy``: the loops' (from the settings when None); ``shape``: each event's body;
        ``on_too_large``: counts events never sent for their size; ``log``: the log the
        subscriptions topic is on (None: the Kafka cluster of ``settings``)."""
        self.settings = settings
        self.poll = poll
        self.now_ms = now_ms
        self.policy = policy or DeliveryPolicy.of(settings)
        self.shape = shape
        self.sender = WebhookSender(
            allowlist=settings.webhooks.allowlist,
            ssl_context=_callback_tls(settings),
            timeout_seconds=settings.webhooks.timeout_s,
        )
        #: Verification challenges per principal and per (principal, callback host).
        self.verifications = VerificationThrottle(
            settings.webhooks.verify_per_minute / 60,
            settings.webhooks.verify_burst,
            principal_rate_per_s=settings.webhooks.verify_principal_per_minute / 60,
            principal_burst=settings.webhooks.verify_principal_burst,
        )
        self.on_throttled = on_throttled
        self.on_too_large = on_too_large
        self.registry = SubscriptionRegistry(settings, sealer, log=log)
        self.deliveries = WebhookDeliveries(self._delivery, self.registry)
        self.registry.on_change = self.deliveries.changed
        self.ownership = PartitionOwnership(
            settings, assigned=self.deliveries.assigned, revoked=self.deliveries.revoked, log=log
        )

    def current(self, sub_id: str) -> Subscription | None:
        return self.registry.table.get(sub_id)

    async def put(self, sub: Subscription) -> None:
        await self.registry.put(sub)

    async def delete(self, sub_id: str) -> None:
        await self.registry.delete(sub_id)

    async def verify(self, principal: str, url: str, sub_id: str, secret: str) -> Outcome:
        """The draft's challenge before delivery to an unverified (principal, url) starts.

        A live subscription of ``principal`` to ``url`` stands for a verification (a refresh
        never sends one). Otherwise one token of the principal's bucket and of its (principal,
        callback host) bucket is spent first, or :class:`VerificationThrottled`: nothing is sent.
        """
        if self.registry.table.verified(principal, url, self.now_ms()):
            return Outcome(Verdict.DELIVERED)
        wait = self.verifications.take(principal, httpx.URL(url).host)
        if wait is not None:
            self.on_throttled()
            raise VerificationThrottled(wait)
        return await self.sender.verify_endpoint(url, subscription_id=sub_id, secrets=[secret])

    def _delivery(self, sub_id: str) -> SubscriptionDelivery:
        return SubscriptionDelivery(
            sub_id,
            self,
            self.poll,
            self.sender,
            self.policy,
            shape=self.shape,
            now_ms=self.now_ms,
            on_too_large=self.on_too_large,
        )

    async def start(self) -> None:
        await self.registry.start()
        await self.ownership.start()

    async def stop(self) -> None:
        await self.ownership.stop()
        await self.deliveries.stop()
        await self.registry.stop()
        await self.sender.__aexit__(None, None, None)


def _callback_tls(settings: Settings) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if settings.webhooks.ca_file is not None:
        context.load_verify_locations(cafile=str(settings.webhooks.ca_file))
    return context

"""The webhook subscriptions topic: writes, every replica's view of it, and who delivers what.

``<prefix>.event-subscriptions`` is compacted; key = subscription id, value = the subscription
(:mod:`bridge.mcpevents.subscriptions`), a tombstone when it ends.

* :class:`SubscriptionRegistry`: every replica reads the whole (small) topic from the beginning
  and keeps tailing it into a :class:`~bridge.mcpevents.subscriptions.SubscriptionTable`, so any
  replica can answer ``events/subscribe`` (idempotent upsert, per-principal limits, the
  verification cache) and a write is answered only once the writer's own view has applied it.
* :class:`PartitionOwnership`: a consumer group (``<prefix>.webhooks``) over the same topic, used
  only for its assignment: the replica assigned a partition delivers that partition's
  subscriptions. Its partitions stay paused (the view reads the records); on assignment the
  owner first catches its view up with the partition's end, on revocation it stops delivering
  before the group moves on. One process alone gets every partition.

Secrets at rest: :meth:`SubscriptionRegistry.put` seals a record's signing secrets
(:class:`~bridge.sealing.Sealer`, bound to the subscription id) and the view opens them as it
reads. A record written before secrets were sealed (version 1, clear) is read only during an upgrade
from 0.1 (``upgrade.from``, or ``upgrade.clear_subscriptions`` in its second step: see
:class:`~bridge.config.UpgradeSettings`), else skipped: anyone who may write the topic could
otherwise add a subscription of any principal to a URL of theirs. Its id is kept in
:attr:`SubscriptionRegistry.unsealed` until a later record of it is sealed, and the owner of its
partition rewrites it (:meth:`SubscriptionRegistry.reseal`) when it takes the partition. Every
record's id must be the one its principal, URL, name and arguments make. A record that does not
open (a key the key file no longer holds, another record's
ciphertext) is skipped like any unreadable record.

During a rolling upgrade from 0.1 (``upgrade.from``) replicas of 8fd441c read this topic too,
and skip what they cannot parse (keeping their older copy). So records are then written as
8fd441c writes them, in clear, and nothing is resealed, until the upgrade's second step.

No HTTP and no JSON-RPC here; the record contents (secrets) are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable

from bridge.component import Component, NotStarted, cancel_and_wait
from bridge.config import Settings
from bridge.kafka.acls import webhook_group
from bridge.kafka.clients import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    TopicPartition,
    committed_consumer,
    idempotent_producer,
)
from bridge.kafka.topics import topic_partition_ids
from bridge.mcpevents.subscriptions import (
    BadRecord,
    NotCanonical,
    Subscription,
    SubscriptionTable,
    parse_record,
    secrets_context,
    secrets_of,
    subscription_id,
)
from bridge.sealing import Sealer, SealError

__all__ = ["PartitionOwnership", "SubscriptionRegistry"]

log = logging.getLogger(__name__)

#: How long a write may wait for the writer's own view to apply it.
APPLY_TIMEOUT_S = 30.0


class SubscriptionRegistry(Component):
    """The subscriptions topic as a table that every replica holds (see the module docstring)."""

    def __init__(self, settings: Settings, sealer: Sealer) -> None:
        self.settings = settings
        self.sealer = sealer
        self.topic = settings.topics.subscriptions
        self.table = SubscriptionTable()
        #: Ids whose latest record holds its secrets in clear (written before sealing).
        self.unsealed: set[str] = set()
        #: Set once the view holds everything the topic held at start.
        self.restored = asyncio.Event()
        #: Called with a subscription id whenever its state changed (added, updated, deleted).
        self.on_change: Callable[[str], None] = lambda sub_id: None
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tail: asyncio.Task[None] | None = None
        self._positions: dict[int, int] = {}
        self._progress = asyncio.Condition()

    async def start(self) -> None:
        partitions = await topic_partition_ids(self.settings, self.topic)
        self._producer = idempotent_producer(self.settings, role="webhooks")
        await self._producer.start()
        self._consumer = committed_consumer(self.settings, role="webhooks-view")
        await self._consumer.start()
        tps = [TopicPartition(self.topic, p) for p in partitions]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._positions = {p: -1 for p in partitions}
        self._tail = asyncio.create_task(self._run(tps), name="webhook-subscriptions-view")
        self._tail.add_done_callback(_log_crash)

    async def stop(self) -> None:
        if self._tail is not None:
            await cancel_and_wait(self._tail)
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()

    async def put(self, sub: Subscription) -> None:
        """Write ``sub``, its secrets sealed, and return once this replica's view applied it.

        During an upgrade from 0.1 the record is written as 8fd441c writes it (in clear)."""
        if self.settings.upgrade.legacy:
            await self._write(sub.id, clear_record(sub))
            return
        context = secrets_context(sub.id)
        sealed = await self.sealer.seal(sub.secrets_plaintext(), context)
        await self._write(sub.id, sub.to_record(sealed))

    async def reseal(self, partitions: Iterable[int]) -> int:
        """Rewrite, sealed, the subscriptions of ``partitions`` still stored in clear; how many.

        The state written is the state held, so a racing refresh or write-back merges with it
        as with any write (same revisions: ties go to the later record, which is equal).
        None during an upgrade from 0.1: 8fd441c's replicas could not read the sealed record.
        """
        rewritten = 0
        if self.settings.upgrade.legacy:
            return rewritten
        for sub_id in self.table.in_partitions(partitions):
            sub = self.table.get(sub_id)
            if sub is not None and sub_id in self.unsealed:
                await self.put(sub)
                rewritten += 1
        return rewritten

    async def delete(self, sub_id: str) -> None:
        """Tombstone ``sub_id`` (unsubscribe, expiry, termination)."""
        await self._write(sub_id, None)

    async def _write(self, key: str, value: bytes | None) -> None:
        if self._producer is None:
            raise NotStarted("the subscription registry")
        sent = await self._producer.send_and_wait(self.topic, value, key=key.encode())
        await self._reached({sent.partition: sent.offset + 1})

    async def caught_up(self, partitions: Iterable[int]) -> None:
        """Return once the view has read ``partitions`` up to their current end."""
        if self._consumer is None:
            raise NotStarted("the subscription registry")
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = await self._consumer.end_offsets(tps)
        await self._reached({tp.partition: end for tp, end in ends.items()})

    async def _reached(self, targets: dict[int, int]) -> None:
        def done() -> bool:
            return all(self._positions.get(p, -1) >= end for p, end in targets.items())

        async with asyncio.timeout(APPLY_TIMEOUT_S), self._progress:
            await self._progress.wait_for(done)

    async def _run(self, tps: list[TopicPartition]) -> None:
        consumer = self._consumer
        assert consumer is not None
        ends = await consumer.end_offsets(tps)
        restore = {tp.partition: end for tp, end in ends.items()}
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    await self._apply(tp.partition, record.offset, record.key, record.value)
            positions = {tp.partition: await consumer.position(tp) for tp in tps}
            async with self._progress:
                self._positions = positions
                self._progress.notify_all()
            if not self.restored.is_set() and all(positions[p] >= e for p, e in restore.items()):
                self.restored.set()
                log.info(
                    "webhook subscriptions restored: %d", len(self.table.in_partitions(positions))
                )

    async def _apply(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> None:
        if key is None:
            log.warning("subscriptions topic: a record without a key at %d/%d", partition, offset)
            return
        sub_id = key.decode("utf-8", "replace")
        try:
            if value is None:
                self.unsealed.discard(sub_id)
            sub = None if value is None else await self._opened(sub_id, value)
            changed = self.table.apply(partition, sub_id, sub)
        except (BadRecord, SealError) as bad:
            log.warning("subscriptions topic: skipping %d/%d: %s", partition, offset, bad)
            return
        if changed:
            self.on_change(sub_id)

    async def _opened(self, sub_id: str, value: bytes) -> Subscription:
        """The subscription of a record value, its secrets opened (or read in clear, only
        during an upgrade from 0.1). Its id must be the one its fields make: the sealed
        secrets are bound to the id, so a record re-targeted at another principal or URL
        does not open, and a clear one is refused."""
        stored = parse_record(value)
        if stored.id != sub_id:
            raise BadRecord("a subscription record under another id's key")
        if stored.sealed is None and not self.settings.upgrade.reads_clear_subscriptions:
            raise BadRecord("a subscription record in clear outside an upgrade from 0.1")
        sub = stored.subscription(stored.clear) if stored.sealed is None else None
        if sub is None:
            assert stored.sealed is not None
            plaintext = await self.sealer.open(stored.sealed, secrets_context(sub_id))
            sub = stored.subscription(secrets_of(plaintext))
        _check_id(sub)
        if stored.sealed is None:
            self.unsealed.add(sub_id)
        else:
            self.unsealed.discard(sub_id)
        return sub


def _check_id(sub: Subscription) -> None:
    """BadRecord unless ``sub.id`` is the id of its principal, URL, name and arguments."""
    try:
        made = subscription_id(sub.principal, sub.url, sub.name, sub.arguments)
    except NotCanonical:
        made = None
    if made != sub.id:
        raise BadRecord("a subscription record whose fields do not make its id")


def clear_record(sub: Subscription) -> bytes:
    """``sub`` as 8fd441c writes a record (version 1, secrets in clear), for the span of a
    rolling upgrade from it only."""
    body = {
        "v": 1,
        **{f.name: getattr(sub, f.name) for f in dataclasses.fields(sub)},
        "secrets": list(sub.secrets),
        "status": dataclasses.asdict(sub.status),
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("webhook subscriptions view stopped", exc_info=task.exception())


Partitions = Callable[[list[int]], Awaitable[None]]


class PartitionOwnership(Component):
    """Membership of the webhook delivery group: ``assigned`` and ``revoked`` are told which
    partitions of the subscriptions topic this replica delivers (see the module docstring)."""

    def __init__(self, settings: Settings, *, assigned: Partitions, revoked: Partitions) -> None:
        self.settings = settings
        self.assigned = assigned
        self.revoked = revoked
        self._consumer: AIOKafkaConsumer | None = None
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # The records are read by the view: this consumer only drives the group protocol, so
        # it never commits and starts at the end (it reads nothing; its partitions are paused).
        self._consumer = committed_consumer(
            self.settings,
            role="webhooks",
            group_id=webhook_group(self.settings.topics),
            auto_offset_reset="latest",
            enable_auto_commit=False,
        )
        self._consumer.subscribe([self.settings.topics.subscriptions], listener=_Listener(self))
        await self._consumer.start()
        self._loop = asyncio.create_task(self._run(), name="webhook-ownership")
        self._loop.add_done_callback(_log_crash)

    async def stop(self) -> None:
        if self._loop is not None:
            await cancel_and_wait(self._loop)
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()  # leaves the group: the others take over at once

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            await self._consumer.getmany(timeout_ms=1000)  # heartbeats, rebalances

    async def _on_assigned(self, tps: list[TopicPartition]) -> None:
        if self._consumer is not None and tps:
            self._consumer.pause(*tps)
        await self.assigned(sorted(tp.partition for tp in tps))

    async def _on_revoked(self, tps: list[TopicPartition]) -> None:
        await self.revoked(sorted(tp.partition for tp in tps))


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: PartitionOwnership) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.owner._on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.owner._on_assigned(list(assigned))

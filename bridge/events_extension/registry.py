"""The webhook subscriptions topic: writes, every replica's view of it, and who delivers what.

``<prefix>.event-subscriptions`` is compacted; key = subscription id, value = the subscription
(:mod:`bridge.events_extension.subscriptions`), a tombstone when it ends.

Where it sits: above the log port (:class:`~bridge.kafka.port.Log`, the broker's or the
in-memory one, given by the composition), below the webhook service
(:mod:`bridge.events_extension.delivery`). Everything Kafka-shaped is the port's: the writes its
idempotent producer, the restore :func:`bridge.log.restore.read_to_end`, the live view a port
:class:`~bridge.kafka.port.Tail`, the delivery group a port group member.

* :class:`SubscriptionRegistry`: every replica reads the whole (small) topic from the beginning
  (the restore, up to the ends taken at start, applied poll by poll: the topic's uncompacted
  history is never held) and then tails it on into a
  :class:`~bridge.events_extension.subscriptions.SubscriptionTable`, so any
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
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from bridge.component import Component, NotStarted, cancel_and_wait
from bridge.config import Settings
from bridge.events_extension.subscriptions import (
    BadRecord,
    NotCanonical,
    Subscription,
    SubscriptionTable,
    parse_record,
    secrets_context,
    secrets_of,
    subscription_id,
)
from bridge.kafka.acls import webhook_group
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import (
    GroupTail,
    Log,
    LogError,
    LogRecord,
    OffsetOutOfRange,
    Polled,
    Producer,
    Tail,
    TopicPart,
)
from bridge.log.restore import read_to_end
from bridge.sealing import Sealer, SealError

__all__ = ["PartitionOwnership", "SubscriptionRegistry", "clear_record"]

log = logging.getLogger(__name__)

#: How long a write may wait for the writer's own view to apply it.
APPLY_TIMEOUT_S = 30.0

#: How long one poll of the view's tail, or of the delivery group, waits for something.
POLL_S = 1.0

#: The most records one poll of the view hands over (what the view holds beyond its table).
VIEW_POLL_RECORDS = 500

#: How long the view waits before it polls again after a failed poll, or restarts.
RETRY_S = 1.0


class SubscriptionRegistry(Component):
    """The subscriptions topic as a table that every replica holds (see the module docstring).

    ``log``: the log the topic is on (None: the Kafka cluster of ``settings``, opened at
    start and closed at stop)."""

    def __init__(self, settings: Settings, sealer: Sealer, *, log: Log | None = None) -> None:
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
        self._log = log
        self._own_log: KafkaLog | None = None
        self._producer: Producer | None = None
        self._view: asyncio.Task[None] | None = None
        #: The view's position in each partition (-1 until restored): what it has applied.
        self._positions: dict[int, int] = {}
        #: Why the view stopped, once it has: writers then wait no more.
        self._ended: str | None = None
        #: The view's retry cadence after a failed poll or restart (tests shorten it).
        self.retry_s = RETRY_S
        self._progress = asyncio.Condition()

    async def start(self) -> None:
        if self._log is None:
            self._own_log = KafkaLog(self.settings, pool_size=1, role="webhooks-view")
            self._log = self._own_log
        partitions = await self._log.partitions(self.topic)
        producer = self._log.producer(role="webhooks")
        await producer.start()
        self._producer = producer
        self._positions = {p: -1 for p in partitions}
        self._ended = None
        self._view = asyncio.create_task(
            self._run(self._log, partitions), name="webhook-subscriptions-view"
        )
        self._view.add_done_callback(_log_crash)

    async def stop(self) -> None:
        await cancel_and_wait(self._view)
        if self._producer is not None:
            await self._producer.close()
            self._producer = None
        if self._own_log is not None:
            await self._own_log.close()
            self._own_log = self._log = None

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
        sent = await self._producer.send(self.topic, value, key=key.encode())
        await self._reached({sent.partition: sent.offset + 1})

    async def caught_up(self, partitions: Iterable[int]) -> None:
        """Return once the view has read ``partitions`` up to their current end."""
        if self._log is None:
            raise NotStarted("the subscription registry")
        ends = await self._log.log_ends(self._parts(partitions))
        await self._reached({part.partition: end for part, end in ends.items()})

    async def _reached(self, targets: Mapping[int, int]) -> None:
        """Wait (bounded) until the view has applied ``targets``; a view that stopped or
        failed meanwhile ends the wait with a retriable :class:`LogError`."""

        def done() -> bool:
            if self._ended is not None:
                raise LogError(f"the webhook subscriptions view {self._ended}", retriable=True)
            return all(self._positions.get(p, -1) >= end for p, end in targets.items())

        async with asyncio.timeout(APPLY_TIMEOUT_S), self._progress:
            await self._progress.wait_for(done)

    def _parts(self, partitions: Iterable[int]) -> list[TopicPart]:
        return [TopicPart(self.topic, p) for p in sorted(set(partitions))]

    async def _run(self, port: Log, partitions: list[int]) -> None:
        """The view: the topic restored up to its ends at start (the one compacted-topic
        restore, applied record by record), then tailed on from there. A view that fails is
        restarted from what it had applied (as the Events live tails are), so one broker
        hiccup does not leave writers answered "retry" for ever."""
        parts = self._parts(partitions)
        try:
            while True:
                try:
                    if not self.restored.is_set():
                        await self._restore(port, parts)
                    await self._follow(port, parts)
                except Exception as exc:  # the log failed: read on from what was applied
                    log.warning(
                        "webhook subscriptions view failed (%s); restarting", type(exc).__name__
                    )
                await asyncio.sleep(self.retry_s)  # the retry cadence, not synchronisation
        finally:
            # Writers waiting for the view are told now, not at their timeout.
            self._ended = "stopped"
            async with self._progress:
                self._progress.notify_all()

    async def _restore(self, port: Log, parts: list[TopicPart]) -> None:
        """Apply every record up to the ends taken now, in offset order within each partition,
        as it is read: what is held is the table and one poll, never the topic's history (its
        active segment is not compacted, and write-backs add a record each). A restore run
        again after a failure skips what the first one applied."""
        ends = await port.log_ends(parts)

        async def apply(record: LogRecord) -> None:
            if record.offset < self._positions.get(record.partition, -1):
                return  # applied before the restart
            await self._apply(record.partition, record.offset, record.key, record.value)
            self._positions[record.partition] = record.offset + 1

        await read_to_end(port, parts, apply, role="webhooks-view", max_records=VIEW_POLL_RECORDS)
        await self._advance({part.partition: end for part, end in ends.items()})
        self.restored.set()
        held = self.table.in_partitions(part.partition for part in parts)
        log.info("webhook subscriptions restored: %d", len(held))

    async def _follow(self, port: Log, parts: list[TopicPart]) -> None:
        """Tail ``parts`` on from the view's positions, applying each poll as it comes."""
        starts = await port.log_starts(parts)
        at = {part: max(self._positions.get(part.partition, -1), starts[part]) for part in parts}
        async with port.tail("webhooks-view") as tail:
            tail.assign(at)
            await self._advance({part.partition: offset for part, offset in at.items()})
            while True:
                polled = await self._poll(port, tail)
                for part, records in polled.records.items():
                    for record in records:
                        await self._apply(part.partition, record.offset, record.key, record.value)
                await self._advance({part.partition: at for part, at in polled.positions.items()})

    async def _poll(self, port: Log, tail: Tail) -> Polled:
        """One poll of the view's tail, riding out what asking again may cure."""
        while True:
            try:
                return await tail.poll(POLL_S, VIEW_POLL_RECORDS)
            except OffsetOutOfRange as gone:  # the log start passed the view: read on from it
                starts = await port.log_starts(gone.parts)
                log.warning("subscriptions topic: the view reads on from the log start %s", starts)
                for part, start in starts.items():
                    tail.reposition(part, start)
            except LogError as exc:
                if not exc.retriable:
                    raise
                log.warning("subscriptions topic: a poll failed (%s); polling again", exc.kind)
                await asyncio.sleep(self.retry_s)  # the retry cadence, not synchronisation

    async def _advance(self, positions: Mapping[int, int]) -> None:
        async with self._progress:
            self._positions.update(positions)
            self._progress.notify_all()

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
        log.error("%s stopped", task.get_name(), exc_info=task.exception())


Partitions = Callable[[list[int]], Awaitable[None]]


class PartitionOwnership(Component):
    """Membership of the webhook delivery group: ``assigned`` and ``revoked`` are told which
    partitions of the subscriptions topic this replica delivers (see the module docstring).

    A member of the port's group (:meth:`~bridge.kafka.port.Log.group_tail`), as the indexer
    and the workers are. ``log``: as for :class:`SubscriptionRegistry`."""

    def __init__(
        self,
        settings: Settings,
        *,
        assigned: Partitions,
        revoked: Partitions,
        log: Log | None = None,
    ) -> None:
        self.settings = settings
        self.assigned = assigned
        self.revoked = revoked
        self._log = log
        self._own_log: KafkaLog | None = None
        self._member: GroupTail | None = None
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._log is None:
            self._own_log = KafkaLog(self.settings, pool_size=1, role="webhooks")
            self._log = self._own_log
        topics = self.settings.topics
        # The records are read by the view: this member only takes part in the group, so it
        # never commits and starts at the end (it reads nothing; its partitions are paused).
        member = self._log.group_tail(
            webhook_group(topics),
            [topics.subscriptions],
            _Listener(self),
            reset="latest",
            role="webhooks",
        )
        self._member = member  # before joining: the listener pauses what it is assigned
        await member.start()
        self._loop = asyncio.create_task(self._run(member), name="webhook-ownership")
        self._loop.add_done_callback(_log_crash)

    async def stop(self) -> None:
        await cancel_and_wait(self._loop)
        if self._member is not None:
            await self._member.close()  # leaves the group: the others take over at once
            self._member = None
        if self._own_log is not None:
            await self._own_log.close()
            self._own_log = self._log = None

    async def _run(self, member: GroupTail) -> None:
        while True:
            await member.poll(POLL_S)  # heartbeats and rebalances: the listener runs inside

    async def _on_assigned(self, parts: frozenset[TopicPart]) -> None:
        if self._member is not None and parts:
            self._member.pause(*parts)
        await self.assigned(sorted(part.partition for part in parts))

    async def _on_revoked(self, parts: frozenset[TopicPart]) -> None:
        await self.revoked(sorted(part.partition for part in parts))


class _Listener:
    """The delivery group's callbacks (a port :class:`~bridge.kafka.port.GroupListener`)."""

    def __init__(self, owner: PartitionOwnership) -> None:
        self.owner = owner

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        await self.owner._on_revoked(parts)

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        await self.owner._on_assigned(parts)

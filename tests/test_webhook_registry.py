"""The webhook subscriptions registry and the delivery group over the in-memory log (no broker).

The registry (bridge.events_extension.registry) reads and writes its compacted topic through the log
port only, so its rules run here on :class:`~bridge.kafka.memory.MemoryLog`: the restore of
what the topic held (records of every version the previous releases wrote), the live view, a
write answered once the writer's own view applied it, closure, retention passing the view, and
the division of the partitions among the replicas' delivery group members. The end-to-end paths
on the broker stay in tests/test_webhook_subscriptions.py and tests/test_events_replicas.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from support.inmemory import NO_BROKER, memory_log
from support.layout import fresh_prefix, make_settings
from support.subscriptions import NAME, SECRET, subscription
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.events_extension import registry as registry_module
from bridge.events_extension.registry import PartitionOwnership, SubscriptionRegistry, clear_record
from bridge.events_extension.subscriptions import Subscription, secrets_context, subscription_id
from bridge.kafka.acls import webhook_group
from bridge.kafka.clients import partition_for_key
from bridge.kafka.memory import MemoryLog, MemoryTail
from bridge.kafka.port import LogError, Polled, TopicPart
from bridge.sealing import KeyRing, Sealed, Sealer

KEYS = KeyRing("k1", {"k1": b"k" * 32})


def _settings(**upgrade: Any) -> Settings:
    settings = make_settings(NO_BROKER, fresh_prefix())
    return settings.model_copy(update={"upgrade": settings.upgrade.model_copy(update=upgrade)})


def _sub(n: int, **changes: Any) -> Subscription:
    """Subscription ``n``, its id the one its fields make."""
    url = f"https://example.com/hooks/{n}"
    sub_id = subscription_id("ann", url, NAME, {"taskId": "t"})
    return subscription(id=sub_id, url=url, **changes)


async def _sealed(sub: Subscription) -> bytes:
    """``sub``'s record as this version writes it (its secrets sealed)."""
    sealed = await Sealer(KEYS).seal(sub.secrets_plaintext(), secrets_context(sub.id))
    return sub.to_record(sealed)


async def _write(log: MemoryLog, settings: Settings, key: str | None, value: bytes | None) -> int:
    """A record another replica (or release) wrote; its partition."""
    producer = log.producer()
    encoded = None if key is None else key.encode()
    return (await producer.send(settings.topics.subscriptions, value, key=encoded)).partition


def _partition_of(settings: Settings, sub: Subscription) -> int:
    return partition_for_key(sub.id.encode(), settings.topics.partitions)


def _partitions(settings: Settings) -> list[int]:
    return list(range(settings.topics.partitions))


async def test_the_view_restores_what_the_topic_held_and_follows_what_is_written() -> None:
    settings = _settings()
    log = memory_log(settings)
    kept, ended = _sub(1), _sub(2)
    await _write(log, settings, kept.id, await _sealed(kept))
    await _write(log, settings, ended.id, await _sealed(ended))
    await _write(log, settings, ended.id, None)  # unsubscribed
    await _write(log, settings, None, await _sealed(kept))  # no key: skipped
    await _write(log, settings, _sub(3).id, b"not a record")  # unreadable: skipped
    registry = SubscriptionRegistry(settings, Sealer(KEYS), log=log)
    changed: list[str] = []
    registry.on_change = changed.append
    async with registry:
        async with asyncio.timeout(BOUND):
            await registry.restored.wait()
        assert registry.table.get(kept.id) == kept
        assert registry.table.get(ended.id) is None and registry.table.get(_sub(3).id) is None
        added = _sub(4)
        await registry.put(added)  # answered once this replica's view applied it
        assert registry.table.get(added.id) == added and added.id not in registry.unsealed
        await _write(log, settings, kept.id, None)  # another replica's unsubscribe
        await registry.caught_up(_partitions(settings))
        assert registry.table.get(kept.id) is None
    assert Counter(changed) == {kept.id: 2, ended.id: 2, added.id: 1}


@pytest.mark.parametrize("upgrading", [{}, {"from_": "0.1"}, {"clear_subscriptions": True}])
async def test_a_record_in_clear_of_0_1_restores_only_during_the_upgrade_and_is_resealed_after(
    upgrading: dict[str, Any],
) -> None:
    """8fd441c's records (version 1, secrets in clear) as they sit in the topic: read during
    the upgrade's two steps (a rolling restart loses no subscription), skipped outside it; in
    step 2 the owner of their partition rewrites them sealed, in step 1 nothing is resealed."""
    settings = _settings(**upgrading)
    log = memory_log(settings)
    old = _sub(1)
    partition = await _write(log, settings, old.id, clear_record(old))
    async with SubscriptionRegistry(settings, Sealer(KEYS), log=log) as registry:
        async with asyncio.timeout(BOUND):
            await registry.restored.wait()
        if not upgrading:
            assert registry.table.get(old.id) is None
            return
        assert registry.table.get(old.id) == old and registry.unsealed == {old.id}
        resealed = await registry.reseal([partition])
        latest = (await log.fetch(TopicPart(settings.topics.subscriptions, partition), 0)).records
    value = latest[-1].value
    assert value is not None
    if "from_" in upgrading:  # step 1: 0.1's replicas still read the topic
        assert resealed == 0 and len(latest) == 1 and json.loads(value)["v"] == 1
    else:
        assert resealed == 1 and len(latest) == 2 and json.loads(value)["v"] == 2
        assert SECRET.removeprefix("whsec_").encode() not in value


class _Gate(Sealer):
    """A sealer whose ``open`` waits until the test lets it go: the view stands still there."""

    def __init__(self) -> None:
        super().__init__(KEYS)
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    async def open(self, sealed: Sealed, context: bytes) -> bytes:
        self.entered.set()
        await self.go.wait()
        return await super().open(sealed, context)


async def test_a_write_waiting_for_the_view_is_answered_when_the_registry_stops() -> None:
    settings = _settings()
    log = memory_log(settings)
    gate = _Gate()
    registry = SubscriptionRegistry(settings, gate, log=log)
    await registry.start()
    async with asyncio.timeout(BOUND):
        await registry.restored.wait()
        await _write(log, settings, _sub(1).id, await _sealed(_sub(1)))
        await gate.entered.wait()  # the view is held up opening that record
        part = TopicPart(settings.topics.subscriptions, _partition_of(settings, _sub(2)))
        before = (await log.log_ends([part]))[part]
        writing = asyncio.create_task(registry.put(_sub(2)))

        async def written() -> bool:  # then the write waits for the view, with no step between
            return (await log.log_ends([part]))[part] > before

        await wait_until(written, what="the write reached the log")
        await registry.stop()
        with pytest.raises(LogError, match="view stopped") as told:
            await writing
    assert told.value.retriable


async def test_the_view_reads_on_from_the_log_start_when_retention_passed_it() -> None:
    settings = _settings()
    log = memory_log(settings)
    gate = _Gate()
    async with SubscriptionRegistry(settings, gate, log=log) as registry:
        async with asyncio.timeout(BOUND):
            await registry.restored.wait()
            first = _sub(1)
            partition = await _write(log, settings, first.id, await _sealed(first))
            await gate.entered.wait()  # the view read the record and is opening it
            part = TopicPart(settings.topics.subscriptions, partition)
            producer = log.producer()
            for _ in range(2):  # records the view has not read, then retention passes them
                await producer.send(part.topic, None, key=b"gone", partition=partition)
            await log.delete_records_before(part, (await log.log_ends([part]))[part])
            gate.go.set()
        later = _sub(2)
        await registry.put(later)  # answered: the view went on from the log start
        assert registry.table.get(later.id) == later and registry.table.get(first.id) == first


class _Replica:
    """One replica's delivery group member and the partitions it was told it delivers."""

    def __init__(self, settings: Settings, log: MemoryLog, changed: asyncio.Event) -> None:
        self.owned: set[int] = set()
        self.changed = changed
        self.member = PartitionOwnership(
            settings, assigned=self.assigned, revoked=self.revoked, log=log
        )

    async def assigned(self, partitions: list[int]) -> None:
        self.owned |= set(partitions)
        self.changed.set()

    async def revoked(self, partitions: list[int]) -> None:
        self.owned -= set(partitions)
        self.changed.set()


async def test_the_delivery_group_divides_the_partitions_and_a_leaver_s_go_to_the_others() -> None:
    settings = _settings()
    log = memory_log(settings)
    every = set(_partitions(settings))
    changed = asyncio.Event()
    one, two = _Replica(settings, log, changed), _Replica(settings, log, changed)

    def divided() -> bool:
        shares = [one.owned, two.owned]
        return one.owned | two.owned == every and not one.owned & two.owned and all(shares)

    def alone() -> bool:
        return one.owned == every

    await one.member.start()
    try:
        await wait_until(alone, what="one replica delivers every partition", wakeup=changed)
        await two.member.start()
        try:
            await wait_until(divided, what="two replicas divide the partitions", wakeup=changed)
        finally:
            await two.member.stop()  # leaves the group: the other takes its partitions at once
        await wait_until(alone, what="the leaver's partitions taken over", wakeup=changed)
        group = log.group(webhook_group(settings.topics))
        assert not group.committed  # the group only divides the partitions: nothing committed
    finally:
        await one.member.stop()


async def test_a_record_written_while_the_view_restores_is_read_by_its_tail() -> None:
    settings = _settings()
    log = memory_log(settings)
    kept, later = _sub(1), _sub(2)
    await _write(log, settings, kept.id, await _sealed(kept))
    gate = _Gate()
    async with SubscriptionRegistry(settings, gate, log=log) as registry:
        async with asyncio.timeout(BOUND):
            await gate.entered.wait()  # the restore is applying what it read
            await _write(log, settings, kept.id, None)
            await _write(log, settings, later.id, await _sealed(later))
            gate.go.set()
            await registry.restored.wait()
        await registry.caught_up(_partitions(settings))
        assert registry.table.get(kept.id) is None and registry.table.get(later.id) == later


class _Counted(Sealer):
    """A sealer that notes, at each record it opens, how many records the view's polls had
    handed over by then."""

    def __init__(self, polled: list[int]) -> None:
        super().__init__(KEYS)
        self.polled = polled
        self.seen: list[int] = []

    async def open(self, sealed: Sealed, context: bytes) -> bytes:
        self.seen.append(sum(self.polled))
        return await super().open(sealed, context)


async def test_the_restore_applies_each_poll_as_it_comes_and_an_unreadable_latest_keeps_the_older(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The topic's active segment is not compacted and every write-back adds a record: the
    restore holds one poll beyond the table, not the topic's history."""
    settings = _settings()
    log = memory_log(settings)
    versions = [_sub(1, refreshed_ms=100 + n) for n in range(30)]  # superseded, one key
    for version in versions:
        await _write(log, settings, version.id, await _sealed(version))
    await _write(log, settings, versions[-1].id, b"not a record")  # the latest is unreadable
    polled: list[int] = []
    poll = MemoryTail.poll

    async def counted(tail: MemoryTail, timeout_s: float, max_records: int | None = None) -> Polled:
        got = await poll(tail, timeout_s, max_records)
        polled.append(sum(map(len, got.records.values())))
        return got

    monkeypatch.setattr(MemoryTail, "poll", counted)
    monkeypatch.setattr(registry_module, "VIEW_POLL_RECORDS", 4)
    sealer = _Counted(polled)
    async with SubscriptionRegistry(settings, sealer, log=log) as registry:
        async with asyncio.timeout(BOUND):
            await registry.restored.wait()
        assert registry.table.get(versions[0].id) == versions[-1]  # the older copy is kept
    assert len(sealer.seen) == len(versions) and max(polled) <= 4
    assert sealer.seen[0] <= 4  # the first record was applied before the rest was read


@pytest.mark.parametrize("retriable", [True, False])
async def test_the_view_outlives_a_failed_poll(
    monkeypatch: pytest.MonkeyPatch, retriable: bool
) -> None:
    """A retriable error: polled again; any other: the view restarts from what it applied.
    Either way writes are answered after it and the view task goes on."""
    settings = _settings()
    log = memory_log(settings)
    before = _sub(1)
    await _write(log, settings, before.id, await _sealed(before))
    poll, failed = MemoryTail.poll, asyncio.Event()

    async def flaky(tail: MemoryTail, timeout_s: float, max_records: int | None = None) -> Polled:
        if not failed.is_set():
            failed.set()
            raise LogError("a broker restarted", retriable=retriable)
        return await poll(tail, timeout_s, max_records)

    monkeypatch.setattr(MemoryTail, "poll", flaky)
    registry = SubscriptionRegistry(settings, Sealer(KEYS), log=log)
    registry.retry_s = 0.0
    async with registry:
        async with asyncio.timeout(BOUND):
            await registry.restored.wait()
        assert failed.is_set() and registry.table.get(before.id) == before
        later = _sub(2)
        await registry.put(later)  # answered: the view went on
        await _write(log, settings, before.id, None)  # another replica's unsubscribe
        await registry.caught_up(_partitions(settings))
        assert registry.table.get(later.id) == later and registry.table.get(before.id) is None
        assert registry._view is not None and not registry._view.done()

"""The rollout metrics of bridge/metrics.py: how long each events partition had no serving
owner as a replica saw it, and the distance from each owned partition's log start to the
oldest position an open stream still needs. Unit tests over a fake indexer and reader (the
wiring is tests/test_metrics_wiring.py's; the alerts on them tests/test_observability.py's),
and the positions of webhook subscriptions the distance counts."""

from __future__ import annotations

import asyncio
from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from support.subscriptions import subscription

from bridge.events_extension.cursor import encode_task
from bridge.events_extension.subscriptions import SubscriptionTable
from bridge.log.seqindex import TaskEntry
from bridge.metrics import Metrics

OWN = "http://10.0.0.1:8081"
OTHER = "http://10.0.0.2:8081"


@dataclass
class FakeIndexer:
    """What the metrics read of an indexer: ownership, the owner map, the index."""

    owned: dict[int, Any] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)
    group: bool = True
    partition_count: int = 4
    ends: dict[int, int] = field(default_factory=dict)

    @property
    def partitions(self) -> dict[int, Any]:
        return self.owned

    def owns(self, partition: int) -> bool:
        return partition in self.owned

    def owner_url(self, partition: int) -> str | None:
        return self.owners.get(partition)

    def partition_of(self, task_id: str) -> int:
        return int(task_id[-1])

    async def end_offsets(self) -> dict[int, int]:
        return dict(self.ends)


@dataclass
class FakeReader:
    starts: dict[int, int]
    #: Record timestamps (ms): offset x of any partition was written at 1000 * x.
    asked: list[tuple[int, int]] = field(default_factory=list)

    async def log_starts(self, partitions: list[int]) -> dict[int, int]:
        return {p: self.starts[p] for p in partitions}

    async def record_timestamp(self, partition: int, offset: int) -> int | None:
        self.asked.append((partition, offset))
        return 1000 * offset


def value(metrics: Metrics, name: str, partition: int) -> float | None:
    return metrics.registry.get_sample_value(name, {"partition": str(partition)})


def test_a_partition_counts_unavailable_while_revoked_restoring_or_unassigned_not_forwarded():
    metrics = Metrics()
    # p0 served here; p1 forwarded to another replica; p2 assigned here, still restoring;
    # p3 assigned to nobody.
    indexer = FakeIndexer(owned={0: object()}, owners={0: OWN, 1: OTHER, 2: OWN})
    metrics.sample_availability(indexer, OWN, 0.25)  # type: ignore[arg-type]
    metrics.sample_availability(indexer, OWN, 0.5)  # type: ignore[arg-type]
    indexer.owned[2] = object()  # p2 restored
    metrics.sample_availability(indexer, OWN, 0.25)  # type: ignore[arg-type]
    seconds = "bridge_partition_unavailable_seconds_total"
    assert [value(metrics, seconds, p) for p in range(4)] == [0, 0, 0.75, 0.75]
    now = [value(metrics, "bridge_partition_unavailable", p) for p in range(4)]
    assert now == [0, 0, 0, 1]


def test_a_partition_whose_named_owner_this_replica_suspects_counts_unavailable():
    """A dead owner is named by the group until its removal or session timeout: its
    partitions are forwarded to nobody that answers (users saw 20-25 s pauses counted as
    0.3-0.5 s by the group's view alone)."""
    metrics = Metrics()
    indexer = FakeIndexer(owned={0: object()}, owners={0: OWN, 1: OTHER, 2: OTHER, 3: OWN})
    indexer.owned[3] = object()
    suspected = {OTHER}
    metrics.sample_availability(indexer, OWN, 0.25, reachable=lambda url: url not in suspected)  # type: ignore[arg-type]
    metrics.sample_availability(indexer, OWN, 0.5, reachable=lambda url: url not in suspected)  # type: ignore[arg-type]
    seconds = "bridge_partition_unavailable_seconds_total"
    assert [value(metrics, seconds, p) for p in range(4)] == [0, 0.5, 0.5, 0]
    suspected.clear()  # its probe reached it again
    metrics.sample_availability(indexer, OWN, 0.25, reachable=lambda url: url not in suspected)  # type: ignore[arg-type]
    assert [value(metrics, "bridge_partition_unavailable", p) for p in range(4)] == [0, 0, 0, 0]


def test_a_single_process_that_owns_every_partition_counts_none_unavailable():
    metrics = Metrics()
    indexer = FakeIndexer(owned={p: object() for p in range(4)}, group=False)
    for _ in range(3):
        metrics.sample_availability(indexer, None, 0.25)  # type: ignore[arg-type]
    seconds = "bridge_partition_unavailable_seconds_total"
    assert [value(metrics, seconds, p) for p in range(4)] == [0, 0, 0, 0]


def entry(next_seq: int, *checkpoints: int) -> TaskEntry:
    found = TaskEntry()
    found.next_seq = next_seq
    found.checkpoints = array("q", checkpoints)
    return found


def index(**tasks: TaskEntry) -> Any:
    return SimpleNamespace(get=tasks.get)


def test_the_distance_runs_from_the_log_start_to_the_oldest_position_a_stream_still_needs():
    metrics = Metrics()
    # Partition 0 holds offsets 100-199; task "a0" has checkpoints (seq 0 at 120, seq 8 at
    # 150, seq 16 at 190) and 20 events. Partition 1: nothing behind (a stream at its head).
    indexer = FakeIndexer(
        owned={0: index(a0=entry(20, 0, 120, 8, 150, 16, 190)), 1: index(b1=entry(3, 0, 40))},
        ends={0: 200, 1: 60},
    )
    reader = FakeReader(starts={0: 100, 1: 30})
    positions = [("a0", 12), ("a0", 18), ("b1", 2)]  # behind at seq 12 and 18; b1 at its head
    asyncio.run(metrics.refresh_data_loss(indexer, reader, positions))  # type: ignore[arg-type]
    records, seconds = "bridge_data_loss_distance_records", "bridge_data_loss_distance_seconds"
    # a0 at seq 12 needs seq 13 on: read from the checkpoint at seq 8 (offset 150).
    assert value(metrics, records, 0) == 50 and value(metrics, seconds, 0) == 50.0
    # Nothing needed before the end: the whole retained span (to the newest record, 59).
    assert value(metrics, records, 1) == 30 and value(metrics, seconds, 1) == 29.0


def test_a_partition_that_moved_away_loses_its_series_and_timestamps_are_looked_up_once():
    metrics = Metrics()
    indexer = FakeIndexer(owned={0: index(), 1: index()}, ends={0: 10, 1: 10})
    reader = FakeReader(starts={0: 0, 1: 5})
    for _ in range(2):
        asyncio.run(metrics.refresh_data_loss(indexer, reader, []))  # type: ignore[arg-type]
    assert sorted(reader.asked) == [(0, 0), (0, 9), (1, 5), (1, 9)]
    del indexer.owned[1]
    asyncio.run(metrics.refresh_data_loss(indexer, reader, []))  # type: ignore[arg-type]
    assert value(metrics, "bridge_data_loss_distance_records", 0) == 10
    assert value(metrics, "bridge_data_loss_distance_records", 1) is None
    assert value(metrics, "bridge_data_loss_distance_seconds", 1) is None


def test_webhook_subscriptions_to_a_task_say_their_position_from_their_cursor():
    table = SubscriptionTable()
    subs = [
        subscription(id="s1", arguments={"taskId": "a0"}, cursor=encode_task(7, "a0")),
        subscription(
            id="s2", arguments={"taskId": "a0"}, cursor=encode_task(3, "a0"), expires_ms=50
        ),
        subscription(id="s3", arguments={"taskId": "b1"}, cursor=None),  # nothing delivered yet
        subscription(id="s4", arguments={"taskId": "b1"}, cursor=encode_task(2, "a0")),  # a0's
        subscription(id="s5", arguments={"topic": "x"}, cursor="c0"),  # another source's
    ]
    for sub in subs:
        table.apply(0, sub.id, sub)
    assert table.task_positions(now_ms=100) == [("a0", 7)]

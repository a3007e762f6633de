"""A replica that cannot fence the previous index writer does not start, and says why
(the fence itself is bounded in the adapter: tests/test_faults_kafka.py shows it on a cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.inmemory import memory_log
from support.layout import fresh_prefix, make_settings
from support.waits import wait_until

from bridge.config import Settings
from bridge.kafka.acls import index_writer_id
from bridge.kafka.memory import MemoryLog, MemoryWriter
from bridge.kafka.port import LogError
from bridge.log import migrate
from bridge.log.indexer import Indexer, IndexerError


class _Writer(MemoryWriter):
    """Partition 0's writer cannot fence; the others fence after partition 0 gave up."""

    def __init__(self, log: MemoryLog, transactional_id: str, stuck: str, seen: list[str]):
        super().__init__(log, transactional_id)
        self.stuck, self.seen = stuck, seen

    async def start(self) -> None:
        if self.transactional_id == self.stuck:
            raise LogError("FenceTimeout: the previous writer's transaction did not complete")
        for _ in range(100):  # a fence takes round trips: it ends after the failed one
            await asyncio.sleep(0)
        await super().start()
        self.seen.append(f"open {self.transactional_id}")

    async def close(self) -> None:
        self.seen.append(f"close {self.transactional_id}")
        await super().close()


async def test_a_replica_that_cannot_fence_the_previous_index_writer_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings("127.0.0.1:9", fresh_prefix())
    log = memory_log(settings)
    stuck = index_writer_id(settings.topics, 0)
    seen: list[str] = []
    monkeypatch.setattr(log, "transactional_writer", lambda tid: _Writer(log, tid, stuck, seen))
    indexer = Indexer(settings, persist=True, log=log)
    with pytest.raises(IndexerError) as refused:
        await indexer.start()
    said = str(refused.value)
    assert "could not fence the previous index writer of events partitions [0, 1, 2]" in said
    assert f"the index topic {settings.topics.index!r}" in said
    assert "FenceTimeout" in said
    assert not indexer.partitions  # nothing is served
    # The fences that succeeded are closed: no writer outlives the failed start.
    others = [index_writer_id(settings.topics, p) for p in (1, 2)]
    assert sorted(seen) == sorted([f"open {t}" for t in others] + [f"close {t}" for t in others])


# --- group mode: a share that cannot be taken ---------------------------------------------------


def group_settings(prefix: str, name: str, **overrides: object) -> Settings:
    return make_settings(
        "127.0.0.1:9",
        prefix,
        replicas={"ownership": "group", "session_timeout_ms": 6_000},
        peers={
            "advertised_url": f"http://{name}.test:8081",
            "secret": "indexer-fence-peer-secret-0123456789abcdef",
        },
        **overrides,
    )


async def test_a_group_member_that_cannot_take_its_first_share_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = group_settings(fresh_prefix(), "a")
    log = memory_log(settings)
    stuck = index_writer_id(settings.topics, 0)
    seen: list[str] = []
    monkeypatch.setattr(log, "transactional_writer", lambda tid: _Writer(log, tid, stuck, seen))
    indexer = Indexer(settings, persist=True, log=log)
    with pytest.raises(IndexerError) as refused:  # at once, not after the join's 60 s bound
        await indexer.start()
    assert "could not fence the previous index writer" in str(refused.value)
    assert not indexer.partitions
    others = [index_writer_id(settings.topics, p) for p in (1, 2)]
    assert sorted(seen) == sorted([f"open {t}" for t in others] + [f"close {t}" for t in others])


async def test_a_share_gained_mid_run_that_cannot_be_taken_is_retried_and_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = fresh_prefix()
    a_settings, b_settings = group_settings(prefix, "a"), group_settings(prefix, "b")
    log = memory_log(a_settings)
    a = Indexer(a_settings, persist=True, log=log)
    b = Indexer(b_settings, persist=True, log=log)
    heard: list[tuple[set[int], set[int]]] = []
    await a.start()
    try:
        await b.start()
        await wait_until(lambda: len(a.partitions) < 3, 30, what="b takes a share")
        b_parts = set(range(3)) - set(a.partitions)
        a._ownership.listeners.append(lambda gained, lost: heard.append((set(gained), set(lost))))
        stuck = {index_writer_id(a_settings.topics, p) for p in b_parts}
        real = log.transactional_writer

        def writer(tid: str) -> MemoryWriter:
            return _Writer(log, tid, tid, []) if tid in stuck else real(tid)

        monkeypatch.setattr(log, "transactional_writer", writer)
        await b.stop()  # a dynamic member leaves: a is assigned b's share, and cannot take it
        await wait_until(lambda: a.failed is not None, 30, what="a reports the failed gain")
        assert isinstance(a.failed, IndexerError)
        assert set(a.partitions) == set(range(3)) - b_parts  # what it had, still served
        assert heard and heard[-1][0] == set()  # the listeners heard: nothing gained
        monkeypatch.setattr(log, "transactional_writer", real)  # the index is back
        await wait_until(lambda: a.failed is None, 30, what="the retried gain succeeds")
        assert set(a.partitions) == set(range(3))
        assert heard[-1][0] == b_parts
    finally:
        await b.stop()
        await a.stop()


async def test_a_seq_tail_failing_for_good_is_reported_and_a_passing_failure_is_ridden_out() -> (
    None
):
    settings = make_settings("127.0.0.1:9", fresh_prefix())
    indexer = Indexer(settings, persist=True, log=memory_log(settings))
    await indexer.start()
    try:
        tail = indexer._reader
        assert tail is not None
        real = tail.poll
        failures = [LogError("NotLeaderForPartition", retriable=True, kind="NotLeader")] * 3
        polls: list[str] = []

        async def poll(timeout_s: float, max_records: int | None = None) -> Any:
            if failures:
                polls.append("failed")
                raise failures.pop()
            polls.append("ok")
            return await real(timeout_s, max_records)

        tail.poll = poll  # type: ignore[method-assign]
        await wait_until(lambda: polls.count("ok") >= 2, 30, what="polling goes on")
        assert indexer.failed is None and polls[:3] == ["failed"] * 3
        failures.append(LogError("TopicAuthorizationFailed", retriable=False, kind="Denied"))
        await wait_until(lambda: indexer.failed is not None, 30, what="the failure reported")
        assert isinstance(indexer.failed, LogError) and indexer.failed.kind == "Denied"
    finally:
        await indexer.stop()


@pytest.mark.parametrize(
    ("kind", "refused"), [("FenceTimeout", True), ("TransactionalIdAuthorizationFailed", False)]
)
async def test_the_index_migration_stops_when_the_old_writer_cannot_be_fenced(
    monkeypatch: pytest.MonkeyPatch, kind: str, refused: bool
) -> None:
    settings = make_settings("127.0.0.1:9", fresh_prefix())
    log = memory_log(settings)
    closed: list[str] = []

    class Old(MemoryWriter):
        async def start(self) -> None:
            raise LogError(kind, kind=kind)

        async def close(self) -> None:
            closed.append(self.transactional_id)

    monkeypatch.setattr(log, "transactional_writer", lambda tid: Old(log, tid))
    if refused:  # nothing may be written while the old writer's transaction may still end
        with pytest.raises(LogError, match=kind):
            await migrate._fence_the_single_writer(log, settings)
    else:  # a principal without WRITE on the old id never wrote with it
        await migrate._fence_the_single_writer(log, settings)
    assert len(closed) == 1

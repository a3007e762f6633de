"""A replica that cannot fence the previous index writer does not start, and says why
(the fence itself is bounded in the adapter: tests/test_faults_kafka.py shows it on a cluster)."""

from __future__ import annotations

import asyncio

import pytest
from support.inmemory import memory_log
from support.layout import fresh_prefix, make_settings

from bridge.kafka.acls import index_writer_id
from bridge.kafka.memory import MemoryLog, MemoryWriter
from bridge.kafka.port import LogError
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

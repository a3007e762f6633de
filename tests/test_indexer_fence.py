"""A replica that cannot fence the previous index writer does not start, and says why
(the fence itself is bounded in the adapter: tests/test_faults_kafka.py shows it on a cluster)."""

from __future__ import annotations

import pytest
from support.inmemory import memory_log
from support.layout import fresh_prefix, make_settings

from bridge.kafka.memory import MemoryWriter
from bridge.kafka.port import LogError
from bridge.log.indexer import Indexer, IndexerError


class _Unfenceable(MemoryWriter):
    async def start(self) -> None:
        raise LogError("FenceTimeout: the previous writer's transaction did not complete")


async def test_a_replica_that_cannot_fence_the_previous_index_writer_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings("127.0.0.1:9", fresh_prefix())
    log = memory_log(settings)
    monkeypatch.setattr(log, "transactional_writer", lambda tid: _Unfenceable(log, tid))
    indexer = Indexer(settings, persist=True, log=log)
    with pytest.raises(IndexerError) as refused:
        await indexer.start()
    said = str(refused.value)
    assert "could not fence the previous index writer of events partitions [0, 1, 2]" in said
    assert f"the index topic {settings.topics.index!r}" in said
    assert "FenceTimeout" in said
    assert not indexer.partitions  # nothing is served

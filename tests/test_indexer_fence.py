"""The indexer over the in-memory log when a gained partition's previous index writer cannot
be fenced (no broker)."""

from __future__ import annotations

import pytest
from support.inmemory import NO_BROKER, memory_log
from support.layout import fresh_prefix, make_settings

from bridge.kafka.memory import MemoryWriter
from bridge.kafka.port import LogError
from bridge.log.indexer import Indexer, IndexerError


class Unfenceable(MemoryWriter):
    """A writer whose start fails as a transactional producer's does while the previous
    writer's transaction cannot end (a partition it wrote has no leader)."""

    async def start(self) -> None:
        raise LogError("CONCURRENT_TRANSACTIONS: the previous transaction is still ending")


async def test_a_writer_that_cannot_fence_its_predecessor_stops_the_indexer_naming_the_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings(NO_BROKER, fresh_prefix("fence"))
    log = memory_log(settings)
    monkeypatch.setattr(log, "transactional_writer", lambda tid: Unfenceable(log, tid))
    indexer = Indexer(settings, persist=True, log=log)
    fence = r"could not fence the previous index writer of events partitions \[0, 1, 2\]"
    with pytest.raises(IndexerError, match=fence) as raised:
        await indexer.start()
    assert isinstance(raised.value.__cause__, LogError)
    assert indexer.partitions == {}  # nothing restored, so nothing served


async def test_a_writer_that_fences_lets_the_same_indexer_start() -> None:
    settings = make_settings(NO_BROKER, fresh_prefix("fence"))
    async with Indexer(settings, persist=True, log=memory_log(settings)) as indexer:
        assert sorted(indexer.partitions) == [0, 1, 2]
        assert indexer.fenced == set()

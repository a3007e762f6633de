"""The simulation's handles on the in-memory log: per replica, and for the producer SDK.

The parts on the log port (the indexer, the reader) are given a :class:`ReplicaLog`: the shared
in-memory log, whose transactional writers note who committed under which epoch (the
simulation's "one writer per partition and epoch" check).

Temporary scaffolding: the producer SDK (:class:`~bridge.log.publisher.TaskEventPublisher`)
still builds an aiokafka producer through :mod:`bridge.kafka.clients`; :func:`patched` swaps
that factory, in the module that calls it and for the duration of one run only, for a thin
wrapper over the memory log. Once the SDK takes a ``log`` argument, the patch goes away.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from bridge.kafka.memory import MemoryLog, MemoryWriter

__all__ = ["Commits", "Producer", "ReplicaLog", "patched"]


class Producer:
    """An idempotent producer's ``send_and_wait``."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> Any:
        sent = await self.log.producer().send(
            topic,
            value,
            key=key,
            partition=partition,
            headers=headers or (),
            timestamp_ms=timestamp_ms,
        )
        return _Metadata(topic, sent.partition, sent.offset)


class _Metadata:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset


#: (transactional id, epoch) -> the replicas whose writer committed under it.
Commits = dict[tuple[str, int], set[str]]


class _Writer(MemoryWriter):
    """A fenced writer that notes who committed under which epoch."""

    def __init__(self, log: MemoryLog, txid: str, owner: str, commits: Commits) -> None:
        super().__init__(log, txid)
        self.owner = owner
        self.commits = commits

    def _end(self, commit: bool) -> None:
        super()._end(commit)
        if commit and self._epoch is not None:
            self.commits.setdefault((self.transactional_id, self._epoch), set()).add(self.owner)


class ReplicaLog:
    """One replica's handle on the shared memory log: its writers are told apart."""

    def __init__(self, log: MemoryLog, owner: str, commits: Commits) -> None:
        self._log = log
        self.owner = owner
        self.commits = commits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def transactional_writer(self, transactional_id: str) -> MemoryWriter:
        return _Writer(self._log, transactional_id, self.owner, self.commits)


@contextlib.contextmanager
def patched(log: MemoryLog) -> Iterator[None]:
    """Swap the producer SDK's client factory for :class:`Producer`."""
    import bridge.log.publisher as publisher

    swaps: list[tuple[Any, str, Any]] = [
        (publisher, "idempotent_producer", lambda settings, role="": Producer(log)),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    try:
        for module, name, value in swaps:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)

"""The simulation's handles on the in-memory log, per replica.

The parts on the log port (the indexer, the reader) are given a :class:`ReplicaLog`: the shared
in-memory log, whose transactional writers note who committed under which epoch (the
simulation's "one writer per partition and epoch" check).

"""

from __future__ import annotations

from typing import Any

from bridge.kafka.memory import MemoryLog, MemoryWriter

__all__ = ["Commits", "ReplicaLog"]


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

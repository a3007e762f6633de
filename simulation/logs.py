"""The simulation's handles on the in-memory log, per replica.

The parts on the log port (the indexer, the reader) are given a :class:`ReplicaLog`: the shared
in-memory log, seen through hooks that let the simulation fault a replica and judge what it
wrote:

* its index writers check, when they start, that their replica owns the partition in the
  group's current generation (a writer opened by anyone else can fence the real owner: the
  "one writer per partition" rule is judged on who opens, since the log itself fences every
  older epoch);
* its consumer-group member can turn zombie (:meth:`SimGroupTail.zombie`): the group stops
  hearing from it, so its session expires and its partitions go to others, while its fetches
  go on from where they were (fetching needs no membership), so the half-dead process keeps
  indexing and flushing until a newer writer fences it;
* what takes effect is counted (:data:`Stats`): fenced index writes, ``OffsetOutOfRange``
  met by fetches and tails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bridge.config import TopicSettings
from bridge.kafka.acls import index_writer_prefix
from bridge.kafka.memory import MemoryGroupTail, MemoryLog, MemoryTail, MemoryWriter, _Group
from bridge.kafka.port import (
    Assignor,
    Fetched,
    GroupListener,
    OffsetOutOfRange,
    Polled,
    TopicPart,
    WriterFenced,
)

__all__ = ["ReplicaLog", "SimGroupTail", "Stats"]

#: What took effect in a run, by name (see the module docstring).
Stats = Counter[str]


class SimGroupTail(MemoryGroupTail):
    """A group member that a fault can turn zombie (see the module docstring)."""

    zombie_mode = False
    #: Where what takes effect is counted (the replica's log sets it).
    stats: Stats = Counter()

    def zombie(self) -> None:
        """Heartbeats stop reaching the coordinator; fetching goes on."""
        member = self.member
        if member is not None and member.tail is self:
            self._group.gone(member, self.session_timeout_s)
        self.zombie_mode = True
        self._log.changed()

    def owns(self, part: TopicPart) -> bool:
        """Whether this member holds ``part`` in the group's current generation."""
        member = self.member
        return (
            not self.zombie_mode
            and not self._closed
            and member is not None
            and member.tail is self
            and self._group.members.get(member.member_id) is member
            and part in member.share.parts
        )

    def _check_open(self) -> None:
        if self.zombie_mode:
            MemoryTail._check_open(self)  # the coordinator's fencing never reaches a fetch
        else:
            super()._check_open()

    async def _step(self, max_records: int | None) -> Polled | None:
        if self.zombie_mode:
            return self._take(max_records)  # deaf to the group's rounds
        return await super()._step(max_records)

    async def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        try:
            return await super().poll(timeout_s, max_records)
        except OffsetOutOfRange:
            self.stats["tail out of range"] += 1
            raise


class _Writer(MemoryWriter):
    """A fenced writer that checks its opener owns the partition, and counts fenced writes."""

    def __init__(self, replica: ReplicaLog, txid: str) -> None:
        super().__init__(replica._log, txid)
        self.replica = replica

    async def start(self) -> None:
        self.replica.check_opener(self.transactional_id)
        await super().start()

    def _checked(self) -> int:
        try:
            return super()._checked()
        except WriterFenced:
            self.replica.stats[f"fenced write {self.replica.owner}"] += 1
            raise


class ReplicaLog:
    """One replica's handle on the shared memory log (see the module docstring)."""

    def __init__(
        self,
        log: MemoryLog,
        owner: str,
        topics: TopicSettings,
        problems: list[str],
        stats: Stats,
    ) -> None:
        self._log = log
        self.owner = owner
        self.topics = topics
        self.problems = problems
        self.stats = stats
        #: The indexer's group member (the one that decides who owns a partition).
        self.member: SimGroupTail | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    async def fetch(self, part: TopicPart, offset: int, max_records: int = 500) -> Fetched:
        try:
            return await self._log.fetch(part, offset, max_records)
        except OffsetOutOfRange:
            self.stats["fetch out of range"] += 1
            raise

    def transactional_writer(self, transactional_id: str) -> MemoryWriter:
        return _Writer(self, transactional_id)

    def check_opener(self, txid: str) -> None:
        """A new index writer fences the partition's current one: only its owner may open it."""
        prefix = index_writer_prefix(self.topics)
        if not txid.startswith(prefix):
            return
        part = TopicPart(self.topics.events, int(txid[len(prefix) :]))
        if self.member is None or not self.member.owns(part):
            self.problems.append(
                f"{self.owner} opened index writer {txid} without owning {part} "
                "in the group's generation (it fences the owner's writer)"
            )

    def group_tail(
        self,
        group: str,
        topics: Sequence[str],
        listener: GroupListener,
        *,
        assignor: Assignor | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        role: str = "group",
        **_: Any,
    ) -> MemoryGroupTail:
        if assignor is None or role != "indexer":
            return self._log.group_tail(
                group,
                topics,
                listener,
                assignor=assignor,
                instance_id=instance_id,
                session_timeout_ms=session_timeout_ms,
                role=role,
                **_,
            )
        coordinator = self._log._groups.setdefault(group, _Group(self._log, group))
        tail = SimGroupTail(
            self._log,
            coordinator,
            list(topics),
            listener,
            assignor,
            instance_id,
            session_timeout_ms / 1000,
            _.get("reset", "earliest"),
        )
        tail.stats = self.stats
        self.member = tail
        return tail

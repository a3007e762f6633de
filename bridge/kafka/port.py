"""The log port: what the bridge needs of Kafka, with no aiokafka type in it.

Where it sits: between the domain (the indexer, the reader, the registries, the workers) and
the two logs that implement it, the aiokafka adapter (:mod:`bridge.kafka.adapter`) and the
in-memory log (:mod:`bridge.kafka.memory`). The contract suite (tests/test_log_contract.py)
runs the same tests against both, so the model cannot drift from Kafka.

The contract, in Kafka's words:

* **Reads are read_committed.** :meth:`Log.fetch` and a :class:`Tail` return committed records
  only. Transaction markers take an offset each and aborted records keep theirs: both move a
  reader's position without a record, so ``next_offset`` may pass offsets no record holds.
  Nothing at or past the last stable offset (the first offset of an open transaction) is read.
* **The log start moves under a reader** (retention, :meth:`Log.delete_records_before`): an
  offset below it, or past the end, raises :class:`OffsetOutOfRange`; nothing jumps silently,
  except in a group member, whose ``reset`` policy (aiokafka's ``auto_offset_reset``) moves an
  out-of-range position (a committed offset retention passed, a seek, a start moved under it)
  to the log start ("earliest") or the last stable offset ("latest") without an error.
* **A transactional writer is fenced** by a newer writer of the same id: starting the newer one
  aborts the older one's open transaction, and the older one's next send or commit raises
  :class:`WriterFenced`.
* **Group membership is eager** (what aiokafka 0.14 implements): before every rebalance each
  member is told that *all* its partitions are revoked, then each is assigned its new share.
  A static member (``instance_id``) never leaves on close: its partitions stay assigned until
  the session timeout or until the same instance id rejoins (which replaces it without a
  rebalance). A member that asks to rejoin with changed metadata causes a rebalance. A member
  fenced by a newer holder of its instance id gets a plain :class:`LogError` from ``poll``
  (retriable, of kind ``KafkaError``: aiokafka 0.14 does not know FENCED_INSTANCE_ID, and its
  coordinator keeps trying to join), at every poll; or, on Kafka, when a heartbeat of its is
  answered UNKNOWN_MEMBER_ID instead, it rejoins and takes the id back (the two holders then
  fence each other in turn). The in-memory log always takes the first way.

What it does not do: create topics, ACLs or security (bridge.kafka.topics, acls, security).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Protocol, Self

from bridge.component import Component

__all__ = [
    "Assignor",
    "Client",
    "Closable",
    "Fetched",
    "GroupListener",
    "GroupTail",
    "Log",
    "LogError",
    "LogRecord",
    "OffsetOutOfRange",
    "Polled",
    "Producer",
    "Record",
    "Sent",
    "Share",
    "Tail",
    "TopicPart",
    "TransactionScope",
    "TransactionalWriter",
    "UnknownTopic",
    "WriterFenced",
]

Header = tuple[str, bytes]
#: What a group member does with a position out of range (a committed offset or a seek that
#: retention passed): read from the log start, from the last stable offset, or (``none``) get
#: :class:`OffsetOutOfRange` naming the partitions, which its owner repositions itself.
Reset = Literal["earliest", "latest", "none"]


@dataclass(frozen=True, slots=True, order=True)
class TopicPart:
    """One partition of one topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """A committed record as a reader sees it (``value`` None is a tombstone)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[Header, ...] = ()


class LogRecord(Protocol):
    """What a record's readers use of it: a :class:`Record` has it, and so has the record
    an aiokafka consumer hands out. Reads return records typed as this protocol (the adapter
    hands aiokafka's on as they are, saving a copy per record on the hot path): nothing may
    rely on more than it."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def headers(self) -> Sequence[Header]: ...


@dataclass(frozen=True, slots=True)
class Fetched:
    """What :meth:`Log.fetch` read, and where the next read of the partition starts."""

    records: Sequence[LogRecord]
    next_offset: int


@dataclass(frozen=True, slots=True)
class Polled:
    """One :meth:`Tail.poll`: the records by partition, and every assigned, unpaused
    partition's position after them (markers and aborted records move it without records)."""

    records: Mapping[TopicPart, Sequence[LogRecord]] = field(default_factory=dict)
    positions: dict[TopicPart, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sent:
    """Where an acknowledged record landed."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Share:
    """A member's share of a group's assignment: its partitions and the assignor's data."""

    parts: tuple[TopicPart, ...]
    user_data: bytes = b""


class LogError(Exception):
    """A failure of the log (a broker error, a client closed, a member fenced).

    ``retriable``: whether asking again may succeed (the broker did not answer, or not yet),
    as opposed to an answer that retrying cannot change. ``kind``: the name of what failed
    (the client's error class), for logs and the wire's ``error`` field.
    """

    def __init__(self, message: str, *, retriable: bool = False, kind: str | None = None) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.kind = kind or type(self).__name__


class OffsetOutOfRange(LogError):
    """A read's offset is below the partition's log start or past its end."""

    def __init__(self, parts: Iterable[TopicPart]) -> None:
        self.parts = frozenset(parts)
        names = ", ".join(f"{p.topic}/{p.partition}" for p in sorted(self.parts))
        super().__init__(f"offset out of range in {names}")


class WriterFenced(LogError):
    """A newer transactional writer with the same id took over; this one may write no more."""


class UnknownTopic(LogError):
    """The topic does not exist."""


class Closable(Component):
    """The base of every client of a log: an async context manager over ``start`` and
    ``close`` (the port's name for a component's ``stop``; each implementation overrides what it
    has to connect and release)."""

    async def close(self) -> None:
        """Release everything; nothing by default."""

    async def stop(self) -> None:
        await self.close()


class Client(Protocol):
    """What every reader and writer of the port is: started, closed, and an async context
    manager over the two (:class:`Closable` implements it)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Tail(Client, Protocol):
    """A live reader of a set of partitions (read_committed), each at its own position.

    Start it (``await tail.start()`` or ``async with``) before assigning partitions.
    """

    async def start(self) -> None:
        """Connect (a group member also joins its group)."""

    def assign(self, positions: Mapping[TopicPart, int]) -> None:
        """Read exactly these partitions, each from the offset given."""

    def reposition(self, part: TopicPart, offset: int) -> None:
        """Read ``part`` from ``offset`` next (it must be assigned)."""

    def assignment(self) -> frozenset[TopicPart]:
        """The partitions read now."""

    def pause(self, *parts: TopicPart) -> None:
        """Stop reading ``parts`` (they stay assigned) until :meth:`resume`."""

    def resume(self, *parts: TopicPart) -> None:
        """Read ``parts`` again from where they stood."""

    async def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        """What is committed past the positions, waiting up to ``timeout_s`` for some; may
        be empty. Raises :class:`OffsetOutOfRange` naming the partitions to seek."""

    async def close(self) -> None:
        """Release the reader (a dynamic group member leaves its group); idempotent."""


class GroupListener(Protocol):
    """A group member's callbacks, called from inside :meth:`GroupTail.poll`."""

    async def revoked(self, parts: frozenset[TopicPart]) -> None:
        """Every partition the member held (eager): finish with them now."""

    async def assigned(self, parts: frozenset[TopicPart], user_data: bytes) -> None:
        """The member's new share and its assignor's data."""


class Assignor(Protocol):
    """A group's assignment rule over opaque member metadata (owner URLs travel in it)."""

    name: str

    def metadata(self) -> bytes:
        """This member's metadata, re-evaluated at every join."""

    def assign(self, parts: Sequence[TopicPart], members: Mapping[str, bytes]) -> dict[str, Share]:
        """Each member id's share of ``parts`` (run by the group's leader)."""


class GroupTail(Tail, Protocol):
    """A :class:`Tail` whose partitions a consumer group assigns (``assign`` is refused).

    ``start`` joins the group; each assignment arrives through the listener during ``poll``.
    Its ``poll`` raises no :class:`OffsetOutOfRange`: the member's ``reset`` policy moves an
    out-of-range position (see :meth:`Log.group_tail`).
    """

    def rejoin(self) -> None:
        """Join again with fresh metadata: a rebalance of the whole group."""

    async def commit(self, offsets: Mapping[TopicPart, int]) -> None:
        """Commit the group's offsets (the next offset to read) for owned partitions."""

    async def committed(self, part: TopicPart) -> int | None:
        """The group's committed offset of ``part``, or None."""


class Producer(Client, Protocol):
    """An idempotent, acks=all producer."""

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
        timestamp_ms: int | None = None,
    ) -> Sent:
        """Write one record and return once it is acknowledged (the key picks the partition
        as the Java client's default partitioner does, when ``partition`` is None)."""


class TransactionalWriter(Client, Protocol):
    """A fenced transactional producer: starting one fences every older one of its id."""

    async def start(self) -> None:
        """Register the id: older writers are fenced and their open transaction aborted."""

    def transaction(self) -> TransactionScope:
        """``async with writer.transaction():`` commits on exit, aborts on an exception."""

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
    ) -> None:
        """Add a record to the open transaction. Raises :class:`WriterFenced`."""


class TransactionScope(Protocol):
    async def __aenter__(self) -> None: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Log(Protocol):
    """A Kafka cluster as the bridge uses it."""

    async def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic``; :class:`UnknownTopic` if it does not exist."""

    async def fetch(self, part: TopicPart, offset: int, max_records: int = 500) -> Fetched:
        """Committed records of ``part`` from ``offset`` (up to ``max_records``) and the next
        offset to read. It may be empty short of the end (nothing arrived in time, or only
        markers and aborted records were passed): read on from ``next_offset``.
        :class:`OffsetOutOfRange` as above."""

    async def log_starts(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        """Each partition's log start offset."""

    async def log_ends(self, parts: Iterable[TopicPart]) -> dict[TopicPart, int]:
        """Each partition's last stable offset (the end a read_committed reader reaches)."""

    async def offsets_for_times(
        self, times: Mapping[TopicPart, int]
    ) -> dict[TopicPart, int | None]:
        """The first offset whose timestamp is at or after each time (ms); None past the end."""

    async def delete_records_before(self, part: TopicPart, offset: int) -> None:
        """Move the log start of ``part`` to ``offset`` (what retention does)."""

    async def remove_members(self, group: str, instance_ids: Sequence[str]) -> None:
        """Remove the static members ``instance_ids`` from consumer group ``group`` now (what
        their session timing out would do later): the group rebalances at once without them;
        one still running rejoins as a new member. An instance id the group does not know is no
        error."""

    def tail(self, role: str = "tail") -> Tail:
        """A group-less live reader; assign partitions before polling."""

    def group_tail(
        self,
        group: str,
        topics: Sequence[str],
        listener: GroupListener,
        *,
        assignor: Assignor | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int | None = None,
        max_poll_interval_ms: int | None = None,
        reset: Reset = "earliest",
        role: str = "group",
    ) -> GroupTail:
        """A member of consumer group ``group`` over ``topics``; call ``start`` to join.

        ``reset``: where the member reads a partition from when it has no committed offset,
        or its position is out of range (it never sees :class:`OffsetOutOfRange`): the log
        start, or the last stable offset. ``heartbeat_interval_ms`` (default: a tenth of the session, at least 300 ms) and
        ``max_poll_interval_ms`` (the client's default when None) tune the client's liveness;
        the in-memory log counts a member alive until it is closed or crashes.
        """

    def producer(self, role: str = "producer") -> Producer:
        """An idempotent producer; call ``start`` before sending."""

    def transactional_writer(self, transactional_id: str) -> TransactionalWriter:
        """A transactional writer of ``transactional_id``; call ``start`` to fence."""

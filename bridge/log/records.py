"""From a consumed Kafka record to what the log side works with: task id and event, and the
one :class:`Batch` type a stream carries (history and live alike).

A record that does not decode still occupies its seq: it becomes a placeholder event of the
bridge's own prefixed type (``<prefix>.event.undecodable`` or ``<prefix>.event.oversized``)
describing why, so no event is ever dropped and no bad record can crash a reader.

:func:`task_facts_of` reads the facts a record may state about its task (created, a status). Anyone who can write
to the events topic writes records, so it is strict: a status counts only under its exact wire
name, and an identity only from a well-formed ``task.created`` payload (the index then takes
it only from the task's seq 0, and only when the record is signed: :mod:`bridge.log.identity`).

The tail decodes only what the index folds (:class:`RecordDecoder`, :meth:`~RecordDecoder.facts`):
the key, and the whole event only when the record may be the bridge's own ``task.created`` or
``task.status`` (:func:`bridge.envelope.may_have_type` tells without decoding). Every other
record's event is a :class:`LazyEvent`, decoded on first use by the same
:func:`event_from_record`, so it is the very event (or placeholder) an eager decode gives. Most
records are never decoded by the tail at all: no live stream or call is waiting for their task.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

from bridge import strictjson, tracing
from bridge.envelope import (
    EnvelopeError,
    EnvelopeTooLarge,
    Item,
    TaskEvent,
    WireMembers,
    decode_event,
    decode_usual,
    may_have_type,
    splice_usual,
)
from bridge.kafka.port import LogRecord
from bridge.log.seqindex import TaskIdentity, owner_key
from bridge.tracing import with_trace
from bridge.vocabulary import REVERSE_DNS_ONLY, EventTypeRule, TaskEventTypes, TaskStatus

__all__ = [
    "NO_FACTS",
    "Batch",
    "Item",
    "LazyEvent",
    "ReadEvent",
    "RecordDecoder",
    "Sequenced",
    "TaskFacts",
    "WireMembers",
    "event_from_record",
    "task_facts_of",
    "task_id_of",
]

#: ``(is task.created, announced status, the created task's identity)``.
TaskFacts = tuple[bool, TaskStatus | None, TaskIdentity | None]
#: What every record but the bridge's own created and status events states about its task.
NO_FACTS: TaskFacts = (False, None, None)
#: Event types whose prefix check a :class:`RecordDecoder` remembers (then it starts over).
_PREFIXED_CACHE = 1024

#: What a batch holds: events, or events and wire members (covariant: a batch of events is
#: a batch of items).
T = TypeVar("T", bound=Item, covariant=True)
_OFFSET = operator.attrgetter("offset")


class Sequenced(Protocol):
    """An event with its seq and offset: a :class:`ReadEvent`, or a live
    :class:`~bridge.log.seqtail.IndexedEvent`."""

    @property
    def seq(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def event(self) -> TaskEvent: ...


@dataclass(slots=True)
class ReadEvent:
    """A retained event with its seq and offset. Not frozen: a replay makes one per event, and
    a frozen dataclass's ``__init__`` costs four times as much (0.8 against 0.2 µs); nothing
    changes one after the read made it."""

    seq: int
    offset: int
    event: TaskEvent


class Batch(Generic[T]):
    """Some of one task's events in seq order: the one batch type of a stream, from a history
    read (:meth:`RecordDecoder.batch`) and from the live buffer (:meth:`of`), and what the
    delivery rule (:func:`bridge.server.streams.take_next`) hands on to be written.

    Columns, not an object per event (a replay's object per event was 4% of its CPU):
    ``items[i]`` is seq ``seqs[i]``, at ``offsets[i]``, either a :class:`TaskEvent` or, in a
    ``Batch[Item]`` read for a stream that sends what it reads, the record's checked
    :data:`~bridge.envelope.WireMembers`. ``seqs`` is a ``range`` when they are consecutive
    (every read's batch: the rule then takes it in slices); ``full`` the indexes of the
    events among the items, ascending (None: every item is an event). No wire members are ever
    one of the bridge's own created or status events: a stream asks whether a status ends it.
    """

    __slots__ = ("full", "items", "offsets", "seqs")

    def __init__(
        self,
        seqs: range | list[int],
        offsets: list[int],
        items: list[T],
        full: list[int] | None = None,
    ) -> None:
        self.seqs = seqs
        self.offsets = offsets
        self.items = items
        self.full = full

    @classmethod
    def of(cls, events: Iterable[Sequenced]) -> Batch[TaskEvent]:
        """The batch of ``events`` (live ones, in the order they came: any seqs)."""
        seqs: list[int] = []
        offsets: list[int] = []
        items: list[TaskEvent] = []
        for e in events:
            seqs.append(e.seq)
            offsets.append(e.offset)
            items.append(e.event)
        return Batch(seqs, offsets, items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Batch(seqs={self.seqs!r}, items={len(self.items)})"

    def __iter__(self: Batch[TaskEvent]) -> Iterator[ReadEvent]:
        """Each event as a :class:`ReadEvent` (for readers other than a stream's)."""
        return map(ReadEvent, self.seqs, self.offsets, self.items)

    def pairs(self) -> Iterator[tuple[int, T]]:
        """``(seq, item)`` of each item, in order."""
        return zip(self.seqs, self.items, strict=True)

    @property
    def events_only(self) -> bool:
        """True when every item is a :class:`TaskEvent` (no wire members)."""
        return self.full is None or len(self.full) == len(self.items)

    def slice(self, start: int, stop: int) -> Batch[T]:
        """Items ``start`` to ``stop`` (the batch itself when that is all of it)."""
        if start == 0 and stop >= len(self.items):
            return self
        full = self.full
        if full is not None:
            full = [i - start for i in full if start <= i < stop]
        return Batch(self.seqs[start:stop], self.offsets[start:stop], self.items[start:stop], full)


def task_id_of(record: LogRecord) -> str | None:
    """The record's task id (its key), or None for keyless or non-UTF-8 keys."""
    key: bytes | None = record.key
    if not key:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def event_from_record(
    record: LogRecord,
    *,
    prefix: str,
    max_bytes: int,
    types: EventTypeRule = REVERSE_DNS_ONLY,
) -> TaskEvent:
    """Decode the record's event, or describe why it cannot be decoded (never raises).

    ``types`` decides which types are vendor-prefixed: pass ``settings.type_rule`` so the
    configured ``tasks.accepted_event_prefixes`` count; the default knows reverse-DNS types only.
    """
    return _event_of(record, prefix, max_bytes, types.is_prefixed)


def _event_of(
    record: LogRecord,
    prefix: str,
    max_bytes: int,
    is_prefixed: Callable[[str], bool],
) -> TaskEvent:
    try:
        event = decode_event(
            record.value,
            record.headers,
            max_bytes=max_bytes,
            record_timestamp_ms=record.timestamp,
        )
        if not is_prefixed(event.type):
            # A foreign producer's unprefixed type: SEP-2694 forbids emitting it, so it is
            # delivered under our prefix with the original type inside; it keeps its seq.
            payload: dict[str, Any] = {"type": event.type, "payload": event.payload}
            unprefixed = TaskEventTypes.of(prefix).unprefixed
            payload_json = None
            if event.payload_json is not None:  # the same object, written around the text
                type_json = strictjson.dumps_parsed(event.type)
                payload_json = f'{{"type":{type_json},"payload":{event.payload_json}}}'
            return TaskEvent(
                unprefixed, payload, event.meta, event.timestamp_ms, payload_json, event.meta_json
            )
        return event
    except EnvelopeTooLarge:
        size = len(record.value or b"")
        payload = {"offset": record.offset, "bytes": size, "limitBytes": max_bytes}
        oversized = TaskEventTypes.of(prefix).oversized
        return TaskEvent(oversized, payload, None, record.timestamp)
    except EnvelopeError as exc:
        payload = {"offset": record.offset, "reason": exc.reason, "error": exc.message}
        undecodable = TaskEventTypes.of(prefix).undecodable
        return TaskEvent(undecodable, payload, None, record.timestamp)


def task_facts_of(event: TaskEvent, prefix: str) -> TaskFacts:
    """``(is task.created, announced status, the created task's identity)`` of an event.

    The status is None unless the payload names one by its exact wire name.
    """
    types = TaskEventTypes.of(prefix)
    if event.type == types.created:
        return True, None, _identity(event.payload)
    if event.type == types.status:
        return False, TaskStatus.from_wire(event.payload.get("status")), None
    return NO_FACTS


def _identity(payload: dict[str, Any]) -> TaskIdentity | None:
    owner, created, ttl, poll = (
        payload.get(k) for k in ("owner", "createdMs", "ttlMs", "pollIntervalMs")
    )
    if not (isinstance(owner, str) and _count(created) and _count(poll)):
        return None
    if ttl is not None and not _count(ttl):
        return None
    try:
        key = owner_key(owner)
    except ValueError:
        return None
    return TaskIdentity(key, created, -1 if ttl is None else ttl, poll)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class RecordDecoder:
    """One process's way of reading records: its type prefix, size limit and type rule.

    :meth:`event` decodes eagerly (readers, which send what they read); :meth:`facts` is the
    tail's cheap path.
    """

    __slots__ = ("_members", "_prefixed", "fact_types", "max_bytes", "prefix", "types")

    def __init__(self, prefix: str, max_bytes: int, types: EventTypeRule = REVERSE_DNS_ONLY):
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.types = types
        own = TaskEventTypes.of(prefix)
        #: The only types whose records state facts; their payload is what the index folds.
        self.fact_types = frozenset({own.created, own.status})
        #: ``types.is_prefixed`` per type seen: a replay asks it for every record, of a few types.
        self._prefixed: dict[str, bool] = {}
        #: :meth:`wire_events`' ``"type":...,"payload":`` per type's Avro bytes; "" for a type
        #: it does not splice.
        self._members: dict[bytes, str] = {}

    def event(self, record: LogRecord) -> TaskEvent:
        """:func:`event_from_record` under this decoder's settings."""
        event = _event_of(record, self.prefix, self.max_bytes, self._is_prefixed)
        return with_trace(event, record.headers)  # tracing: the record's traceparent, if on

    def events(self, records: Sequence[LogRecord]) -> list[TaskEvent]:
        """``[self.event(r) for r in records]``, in one call: a replay decodes thousands of
        records at a time, and the calls around each decode were a third of its cost.

        The common record (it decodes, its type is one already known to be prefixed) is taken
        as :func:`decode_event` gives it; every other one, placeholders and unprefixed types
        included, goes through :meth:`event`, so each event is exactly the one it would give.
        """
        if tracing.enabled():
            return [self.event(record) for record in records]
        max_bytes, known = self.max_bytes, self._prefixed.get
        events: list[TaskEvent] = []
        append = events.append
        for record in records:
            # The usual record, read in one go; any other through event(), the full way.
            event = decode_usual(record.value, record.headers, max_bytes)
            if event is None or known(event.type) is not True:
                event = self.event(record)
            append(event)
        return events

    def batch(self, first: int, records: Sequence[LogRecord]) -> Batch[TaskEvent]:
        """The :class:`Batch` of ``records``, consecutive seqs from ``first``, every one decoded
        (:meth:`events`)."""
        seqs = range(first, first + len(records))
        return Batch(seqs, list(map(_OFFSET, records)), self.events(records))

    def wire_batch(self, first: int, records: Sequence[LogRecord]) -> Batch[Item]:
        """:meth:`batch` for a stream that sends what it reads: the usual records as their
        checked wire members (:meth:`wire_events`), the others as events."""
        items, full = self.wire_events(records)
        return Batch(range(first, first + len(records)), list(map(_OFFSET, records)), items, full)

    def wire_events(self, records: Sequence[LogRecord]) -> tuple[list[Item], list[int]]:
        """What a stream sends of ``records``: for a record of the usual shape
        (:func:`bridge.envelope.usual_parts`) whose payload is one line of the wire's JSON, an
        object, and whose type is prefixed and not one of :attr:`fact_types`, its event as
        wire JSON members, ``"type":<type>,"payload":<the producer's text>`` (a str); for every
        other record, its event (:meth:`event`). And the indexes of the events among them.

        The str is what rendering :meth:`event` ``(record)`` gives for those members (the
        tests hold them equal), made without building the event: no payload dict, no
        :class:`TaskEvent`, no serialising. The payload is still checked, here, in C (its
        text goes out as the producer wrote it): 0.8 µs per record against 3.1 for the event
        and its rendering. The bridge's own created and status events are always events:
        a stream asks whether a status ends it.
        """
        if tracing.enabled():  # the events carry their records' trace headers
            events: list[Item] = list(self.events(records))
            return events, list(range(len(events)))
        return splice_usual(records, self.max_bytes, self._members, self._members_head, self.event)

    def _members_head(self, raw_type: bytes) -> str:
        """``"type":<type as JSON>,"payload":`` for a type :meth:`wire_events` splices, else
        ""; remembered per type (bounded: any producer picks types)."""
        try:
            type_ = raw_type.decode("utf-8")
        except UnicodeDecodeError:
            head = ""  # the event is a placeholder: decoded the full way
        else:
            spliced = type_ not in self.fact_types and self._is_prefixed(type_)
            head = f'"type":{strictjson.dumps(type_)},"payload":' if spliced else ""
        if len(self._members) >= _PREFIXED_CACHE:
            self._members.clear()
        self._members[raw_type] = head
        return head

    def _is_prefixed(self, event_type: str) -> bool:
        known = self._prefixed.get(event_type)
        if known is None:
            if len(self._prefixed) >= _PREFIXED_CACHE:  # any producer picks types: bounded
                self._prefixed.clear()
            known = self._prefixed[event_type] = self.types.is_prefixed(event_type)
        return known

    def facts(self, record: LogRecord) -> tuple[TaskFacts, TaskEvent | None]:
        """What the record states about its task, and its event when finding out decoded it.

        Exactly ``task_facts_of(self.event(record))``: a record that may decode to the bridge's
        own created or status type is decoded in full (and its event returned, so nobody decodes
        it twice); any other record states nothing whatever it decodes to, placeholders
        included, so it is not decoded here (None).
        """
        if not may_have_type(record.value, record.headers, self.fact_types):
            return NO_FACTS, None
        event = self.event(record)
        return task_facts_of(event, self.prefix), event


class LazyEvent:
    """The event of a record :meth:`RecordDecoder.facts` did not decode, decoded on first
    :meth:`get` (then cached, and the record let go).

    The tail hands these to listeners instead of decoding every record: the fan-out only looks
    at the task id, and most tasks have no live subscriber. Decoding is
    :meth:`RecordDecoder.event`, the readers' own, so a lazy event equals the eager one, the
    placeholders of undecodable, oversized and unprefixed records included.
    """

    __slots__ = ("_decoder", "_event", "_record")

    def __init__(self, record: LogRecord, decoder: RecordDecoder) -> None:
        self._record: LogRecord | None = record
        self._decoder = decoder
        self._event: TaskEvent | None = None

    @property
    def decoded(self) -> bool:
        return self._event is not None

    def get(self) -> TaskEvent:
        """The event (decoded now if not yet)."""
        if self._event is None:
            assert self._record is not None  # set until the event is
            self._event = self._decoder.event(self._record)
            self._record = None
        return self._event

    def cannot_be(self, event_type: str) -> bool:
        """True when the tail already knows, undecoded, the event is not of ``event_type``.

        :meth:`RecordDecoder.facts` decodes every record that may be of one of the decoder's
        fact types, so the event of a record it did not decode is of none of them.
        """
        return event_type in self._decoder.fact_types

"""The checker: what stream clients were handed, compared with what the log holds.

It sits beside the flow, not in it: test clients (the load harness, fault tests, the soak)
write every event they were handed into a :class:`Recording`; :func:`ground_truth` reads each
task's committed records from the events topic in partition order and derives their seq by the
one rule (the count of earlier committed records of the key, as :mod:`bridge.log.seqindex`
states it); :func:`check` compares the two and returns a :class:`CheckReport`.

An event is identified by its digest: BLAKE2b of its type and of its payload as canonical JSON
(keys sorted, no whitespace, non-ASCII kept) computed over the *parsed* value, so the wire's
text (the producer's own payload text, whitespace and key order included) and the log's
decoded payload give the same digest whenever they are the same JSON value. The truth side
decodes records exactly as a stream does (:class:`bridge.log.records.RecordDecoder`), so
placeholders of undecodable records and wrapped unprefixed types have the digest a client sees.

What each category means (counted per client stream, a ``(client_id, task_id)`` pair):

* **lost**: a retained event of the truth the stream was never handed, not explained by an
  ``events_gone``. A stream that finished (was handed its task's result, :meth:`Recording.finished`)
  must have every event up to the truth's end; a stream stopped before that only its delivered
  prefix (up to its highest seq): its untried tail is not a loss. An ``events_gone`` whose
  ``earliestSeq`` is above the seq of the first event the log still holds declared retained
  events gone: those are lost too.
* **duplicated**: the stream's contract is de-duplication on seq, so one seq handed twice to a
  stream is a duplicate; so is an event handed at a wrong seq when the stream was also handed
  it at its own seq (one truth event, two seqs).
* **out_of_order**: a seq handed below the highest seq the stream had already been handed (and
  not a repeat of one of them).
* **wrong_payload**: the truth has an event at that seq, and the digest handed is neither it
  nor any other event of the task.
* **wrong_seq**: the digest handed differs from the truth's at that seq but is the digest of
  another event of the task (the event was numbered wrong).
* **phantom**: handed at a seq the truth does not have (past its end, or a task not in the
  log), with a digest the task does not have either.
* **disagreements**: two streams (replicas, or one client across restarts) handed different
  events for the same ``(task, seq)``; independent of the truth.
* **silently_skipped**: a gap between two consecutive seqs of a stream (or before its first)
  not covered by an ``events_gone``.
* **unverifiable**: a task whose seq base the truth cannot prove (its first records were
  deleted by retention and the persisted index does not cover what remains, or marks the task
  untrusted); its streams' deliveries are not judged. Also fails the check: it is a check not
  done, not a pass.

Categories may overlap: a silent skip over retained events also counts their seqs as lost.
Deliveries below the first retained seq of a task cannot be compared with anything and are
only counted (``unjudged``). This module does not run clients or touch the bridge's state.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.config import Settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.port import Log, LogRecord, TopicPart
from bridge.log.indexrestore import load_index, topic_partitions
from bridge.log.records import RecordDecoder, task_id_of
from bridge.log.restore import read_to_end
from bridge.log.seqindex import PartitionIndex

__all__ = [
    "CATEGORIES",
    "CheckReport",
    "Recording",
    "TaskTruth",
    "Truth",
    "check",
    "event_digest",
    "ground_truth",
]

#: Every kind of failure :func:`check` reports, in the order of the summary.
CATEGORIES = (
    "lost",
    "duplicated",
    "out_of_order",
    "wrong_payload",
    "wrong_seq",
    "phantom",
    "disagreements",
    "silently_skipped",
    "unverifiable",
)
#: Examples kept per category: enough to start debugging, bounded for a long soak.
MAX_EXAMPLES = 10
_DIGEST_BYTES = 8


def event_digest(event_type: str, payload: Mapping[str, Any]) -> bytes:
    """The digest of an event: type and canonical payload JSON (equal JSON, equal digest)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Type and payload separated by a byte no JSON text or type string starts with.
    text = f"{event_type}\x00{canonical}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=_DIGEST_BYTES).digest()


# --- what clients were handed ------------------------------------------------------------------

StreamKey = tuple[str, str]  # (client_id, task_id)


@dataclass
class _Stream:
    """One client's deliveries of one task, in the order handed."""

    after: int = -1  # the stream started after this seq
    seqs: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    replicas: list[str | None] = field(default_factory=list)
    #: ``(after, earliest_seq)`` of each events_gone the stream was answered.
    gone: list[tuple[int, int]] = field(default_factory=list)
    finished: bool = False


class Recording:
    """Every event test clients were handed, and every ``events_gone`` they were answered.

    Append-only and cheap (one digest and three list appends per event). ``client_id`` names
    one consumer with its own cursor; it may stream several tasks.
    """

    def __init__(self) -> None:
        self.streams: dict[StreamKey, _Stream] = {}
        self.deliveries = 0

    def _stream(self, client_id: str, task_id: str) -> _Stream:
        stream = self.streams.get((client_id, task_id))
        if stream is None:
            stream = self.streams[client_id, task_id] = _Stream()
        return stream

    def begin(self, client_id: str, task_id: str, after: int) -> None:
        """The client starts the task's stream after ``after`` (default: from the start)."""
        self._stream(client_id, task_id).after = after

    def record(
        self,
        client_id: str,
        task_id: str,
        seq: int,
        type: str,
        payload: Mapping[str, Any],
        replica: str | None = None,
    ) -> None:
        """The client was handed event ``seq`` of ``task_id`` (by ``replica``, if known)."""
        stream = self._stream(client_id, task_id)
        stream.seqs.append(seq)
        stream.digests.append(event_digest(type, payload))
        stream.replicas.append(replica)
        self.deliveries += 1

    def gone(self, client_id: str, task_id: str, after: int, earliest_seq: int) -> None:
        """The client asked for events after ``after`` and was answered events_gone."""
        self._stream(client_id, task_id).gone.append((after, earliest_seq))

    def finished(self, client_id: str, task_id: str) -> None:
        """The client was handed the stream's result: it has reached the task's end."""
        self._stream(client_id, task_id).finished = True


# --- what the log holds ------------------------------------------------------------------------


@dataclass
class TaskTruth:
    """One task's committed events in partition order: ``digests[i]`` is seq ``first_seq + i``.

    ``first_seq`` is None when it cannot be proven (see :func:`ground_truth`).
    """

    partition: int
    first_seq: int | None = 0
    digests: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    @property
    def end_seq(self) -> int | None:
        """One past the last seq (None when the base is unknown)."""
        return None if self.first_seq is None else self.first_seq + len(self.digests)

    def at(self, seq: int) -> bytes | None:
        if self.first_seq is None or not 0 <= seq - self.first_seq < len(self.digests):
            return None
        return self.digests[seq - self.first_seq]


@dataclass
class Truth:
    """Every task's :class:`TaskTruth`, and the end offset each partition was read up to."""

    tasks: dict[str, TaskTruth] = field(default_factory=dict)
    end_offsets: dict[int, int] = field(default_factory=dict)
    #: The first offset read in each partition with records (at or above its log start then).
    first_offsets: dict[int, int] = field(default_factory=dict)
    records: int = 0


async def ground_truth(
    settings: Settings, task_ids: Iterable[str] | None = None, *, log: Log | None = None
) -> Truth:
    """Each task's committed records (``read_committed``), from the log start to the end offset
    taken at call time, with seq derived by counting. ``task_ids``: only those tasks. ``log``:
    where to read (the simulation's in-memory log); the cluster of ``settings`` when None.

    When a partition's log start is above 0 (retention deleted records), the seq of a task's
    first retained record comes from the persisted index (:func:`bridge.log.indexrestore.load_index`,
    read before the log): see :func:`_base_from_index`. A task whose base the index cannot
    prove (it never counted the deleted records, or marks the task untrusted) gets
    ``first_seq`` None, and :func:`check` reports it unverifiable. So read the truth while the
    bridge's index is caught up, or, when deleting records on purpose, read it before deleting
    and keep that snapshot too.
    """
    wanted = None if task_ids is None else set(task_ids)
    decoder = RecordDecoder(
        settings.tasks.event_type_prefix, settings.tasks.max_event_bytes, settings.type_rule
    )
    truth = Truth()

    def take(record: LogRecord) -> None:
        truth.records += 1
        truth.first_offsets.setdefault(record.partition, record.offset)  # read in order
        task_id = task_id_of(record)
        if task_id is None or (wanted is not None and task_id not in wanted):
            return
        task = truth.tasks.get(task_id)
        if task is None:
            task = truth.tasks[task_id] = TaskTruth(record.partition)
        event = decoder.event(record)
        task.digests.append(event_digest(event.type, event.payload))
        task.offsets.append(record.offset)

    topic = settings.topics.events
    if log is None:
        tps = [TopicPart(topic, p) for p in await topic_partitions(settings, topic)]
    else:
        tps = [TopicPart(topic, p) for p in await log.partitions(topic)]
    kafka: Log = KafkaLog(settings, pool_size=1) if log is None else log
    try:
        begins = await kafka.log_starts(tps)
        trimmed = {tp.partition for tp, offset in begins.items() if offset > 0}
        # The index first: what it counted was committed before the log is read, so every
        # record it counted that is still retained is read below.
        index = await load_index(settings, trimmed, log=kafka) if trimmed else {}
        await read_to_end(kafka, tps, take, role="checker")
        truth.end_offsets = {tp.partition: o for tp, o in (await kafka.log_ends(tps)).items()}
        # Retention that moved while the log was read: the read may have started above 0.
        raced = {tp.partition for tp, o in (await kafka.log_starts(tps)).items() if o}
    finally:
        if isinstance(kafka, KafkaLog):
            await kafka.close()
    for task_id, task in truth.tasks.items():
        p = task.partition
        if p in trimmed:
            task.first_seq = _base_from_index(task_id, task, index[p], truth.first_offsets[p])
        elif p in raced and truth.first_offsets[p] > 0:
            task.first_seq = None
    # Tasks retention deleted whole: no record is read, the index still knows their count.
    for p in trimmed:
        first_read = truth.first_offsets.get(p, begins[TopicPart(topic, p)])
        for task_id in index[p].rows:
            if task_id in truth.tasks or (wanted is not None and task_id not in wanted):
                continue
            task = truth.tasks[task_id] = TaskTruth(p)
            task.first_seq = _base_from_index(task_id, task, index[p], first_read)
    return truth


def _base_from_index(
    task_id: str, task: TaskTruth, part: PartitionIndex, first_read: int
) -> int | None:
    """The seq of the task's first record read, from its partition's persisted index.

    The task's entry counted ``next_seq`` records up to its ``last_offset``; those of them still
    retained were read, so the first one read has seq ``next_seq`` minus them (a task none of
    whose records is retained: ``next_seq``, its events all deleted). That holds when
    the entry reaches into the records read, or when the index had read past the first record
    read in the partition (then it counted every deleted record of the task). Without an entry,
    a task the index had read past that point without losing records had no deleted record.
    None: not provable (the index lags behind the deletion, or distrusts the task).
    """
    covers_deleted = part.through >= first_read
    entry = part.get(task_id)
    if entry is None:
        return 0 if covers_deleted and part.lost_before < 0 else None
    counted = sum(1 for offset in task.offsets if offset <= entry.last_offset)
    base = entry.next_seq - counted
    return base if entry.trusted and (counted > 0 or covers_deleted) and base >= 0 else None


# --- the comparison ----------------------------------------------------------------------------


@dataclass
class CheckReport:
    """Counts and bounded examples of each of :data:`CATEGORIES`, and what was checked."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CATEGORIES})
    streams: int = 0
    finished_streams: int = 0
    deliveries: int = 0
    #: Deliveries below a task's first retained seq: nothing left to compare them with.
    unjudged: int = 0
    tasks: int = 0
    truth_events: int = 0

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def add(self, category: str, example: str, count: int = 1) -> None:
        self.counts[category] += count
        kept = self.examples[category]
        if len(kept) < MAX_EXAMPLES:
            kept.append(example)

    def summary(self) -> str:
        head = (
            f"checker: {'OK' if self.ok else 'FAILED'}: {self.deliveries} deliveries on "
            f"{self.streams} streams ({self.finished_streams} finished) of {self.tasks} tasks, "
            f"{self.truth_events} events in the log, {self.unjudged} unjudged"
        )
        lines = [head]
        for category in CATEGORIES:
            if self.counts[category]:
                lines.append(f"  {category}: {self.counts[category]}")
                lines.extend(f"    - {example}" for example in self.examples[category])
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": dict(self.counts),
            "examples": {c: list(e) for c, e in self.examples.items() if e},
            "streams": self.streams,
            "finished_streams": self.finished_streams,
            "deliveries": self.deliveries,
            "unjudged": self.unjudged,
            "tasks": self.tasks,
            "truth_events": self.truth_events,
        }


def check(truth: Truth, recording: Recording) -> CheckReport:
    """Compare every recorded stream with ``truth`` (see the module docstring for the rules)."""
    report = CheckReport(
        streams=len(recording.streams),
        deliveries=recording.deliveries,
        tasks=len({task_id for _, task_id in recording.streams}),
        truth_events=sum(len(t.digests) for t in truth.tasks.values()),
    )
    unverifiable: set[str] = set()
    for (client_id, task_id), stream in recording.streams.items():
        report.finished_streams += stream.finished
        task = truth.tasks.get(task_id)
        if task is not None and task.first_seq is None:
            unverifiable.add(task_id)
            continue
        _check_stream(f"{client_id}/{task_id}", stream, task, report)
    for task_id in sorted(unverifiable):
        report.add("unverifiable", f"task {task_id}: its first retained seq is not provable")
    _check_agreement(recording, report)
    return report


def _check_stream(where: str, stream: _Stream, task: TaskTruth | None, report: CheckReport) -> None:
    _check_order(where, stream, report)
    _check_content(where, stream, task, report)
    if task is not None:
        _check_lost(where, stream, task, report)


def _explained(stream: _Stream, seq: int) -> bool:
    """Whether an events_gone answer of the stream covers ``seq`` (after < seq < earliest)."""
    return any(after < seq < earliest for after, earliest in stream.gone)


def _unexplained(stream: _Stream, low: int, high: int) -> int:
    """How many seqs of ``[low, high)`` no events_gone answer of the stream covers.

    By intervals, not seq by seq: a wild seq (a phantom far past the end) costs nothing.
    """
    covered, reached = 0, low
    for after, earliest in sorted(stream.gone):
        start, end = max(after + 1, reached), min(earliest, high)
        if start < end:
            covered += end - start
            reached = end
    return max(0, high - low - covered)


def _check_order(where: str, stream: _Stream, report: CheckReport) -> None:
    seen: set[int] = set()
    highest = stream.after
    for seq in stream.seqs:
        if seq in seen:
            report.add("duplicated", f"{where}: seq {seq} handed again")
            continue
        seen.add(seq)
        if seq < highest:
            report.add("out_of_order", f"{where}: seq {seq} after seq {highest}")
            continue
        skipped = _unexplained(stream, highest + 1, seq)
        if skipped:
            report.add(
                "silently_skipped",
                f"{where}: {skipped} seqs skipped between {highest} and {seq} with no events_gone",
            )
        highest = seq


def _check_content(
    where: str, stream: _Stream, task: TaskTruth | None, report: CheckReport
) -> None:
    elsewhere = (
        {d: task.first_seq + i for i, d in enumerate(task.digests)}
        if task is not None and task.first_seq is not None
        else {}
    )
    handed_right = {
        seq
        for seq, d in zip(stream.seqs, stream.digests, strict=True)
        if task is not None and task.at(seq) == d
    }
    for seq, digest in zip(stream.seqs, stream.digests, strict=True):
        expected = task.at(seq) if task is not None else None
        if expected == digest:
            continue
        if task is not None and task.first_seq is not None and seq < task.first_seq:
            report.unjudged += 1  # deleted by retention since: nothing to compare with
            continue
        at = elsewhere.get(digest)
        if at is not None:
            report.add("wrong_seq", f"{where}: handed at seq {seq} the log's event of seq {at}")
            if at in handed_right:
                report.add("duplicated", f"{where}: the event of seq {at} handed again as {seq}")
        elif expected is not None:
            report.add("wrong_payload", f"{where}: seq {seq} differs from the log's event")
        else:
            report.add("phantom", f"{where}: seq {seq} is not in the log")


def _check_lost(where: str, stream: _Stream, task: TaskTruth, report: CheckReport) -> None:
    first, end = task.first_seq, task.end_seq
    assert first is not None and end is not None  # unverifiable tasks are not checked
    handed = set(stream.seqs)
    # Seqs past the truth's end are phantoms, not losses: the limit stays inside the truth.
    limit = end - 1 if stream.finished else min(max(handed, default=stream.after), end - 1)
    missing = [
        seq
        for seq in range(max(first, stream.after + 1), limit + 1)
        if seq not in handed and not _explained(stream, seq)
    ]
    for after, earliest in stream.gone:
        # Declared gone, yet the log still holds them now (retention only ever moves forward).
        missing.extend(
            s for s in range(max(first, after + 1), min(earliest, end)) if s not in handed
        )
    if missing:
        missing = sorted(set(missing))
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        state = "finished" if stream.finished else f"stopped at seq {limit}"
        report.add("lost", f"{where} ({state}): seqs {shown} never handed", len(missing))


def _check_agreement(recording: Recording, report: CheckReport) -> None:
    handed: dict[tuple[str, int], dict[bytes, str]] = defaultdict(dict)
    for (client_id, task_id), stream in recording.streams.items():
        for seq, digest, replica in zip(stream.seqs, stream.digests, stream.replicas, strict=True):
            by = handed[task_id, seq]
            if digest not in by:
                by[digest] = f"{client_id}" + (f"@{replica}" if replica else "")
    for (task_id, seq), by in handed.items():
        if len(by) > 1:
            report.add(
                "disagreements",
                f"task {task_id} seq {seq}: {len(by)} different events ({', '.join(sorted(by.values()))})",
            )

"""The seq rule as pure data: counting, checkpoints, idempotent replay, the index record format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import TaskEvent
from bridge.log.records import task_facts_of
from bridge.log.seqindex import (
    IndexRecordError,
    MarkerRecord,
    PartitionIndex,
    TaskIdentity,
    TaskRecord,
    decode_index_record,
    marker_key,
    owner_key,
    task_key,
)
from bridge.vocabulary import EventSuffix, TaskStatus

#: A signed identity (what the indexer passes for the bridge's own task.created).
IDENTITY = TaskIdentity(owner_key("c" * 32), 1000, -1, 500)

# A partition log: a list of task keys in offset order, with gaps for markers/aborted records.
logs = st.lists(st.tuples(st.sampled_from("abcde"), st.integers(1, 3)), max_size=200)


def _offsets(log):
    offset = 0
    for key, step in log:
        yield key, offset
        offset += step


@given(logs, st.integers(1, 7))
def test_seq_counts_earlier_records_of_the_same_key(log, k):
    idx = PartitionIndex(0, k)
    seen: dict[str, int] = {}
    for key, offset in _offsets(log):
        assert idx.apply(key, offset) == seen.get(key, 0)
        seen[key] = seen.get(key, 0) + 1
    for key, count in seen.items():
        entry = idx.get(key)
        assert entry.next_seq == count
        assert [s for s, _ in entry.checkpoint_pairs()] == list(range(0, count, k))


@given(logs, st.integers(1, 5), st.data())
def test_restoring_any_snapshot_and_replaying_from_older_positions_derives_the_same_seq(
    log, k, data
):
    records = list(_offsets(log))
    full = PartitionIndex(0, k)
    expected = [full.apply(key, offset) for key, offset in records]

    # Snapshot after a prefix, restore it through the index record format, then replay from an
    # even older offset (as a restart after a crash between writes would).
    cut = data.draw(st.integers(0, len(records)))
    first = PartitionIndex(0, k)
    for key, offset in records[:cut]:
        first.apply(key, offset)
    restored = PartitionIndex(0, k)
    for task_id, entry in first.items():
        rec = decode_index_record(task_key(task_id), entry.encode(0))
        assert isinstance(rec, TaskRecord)
        restored.restore_task(rec.task_id, rec.entry)
    replay_from = data.draw(st.integers(0, cut))
    replayed = [restored.apply(key, offset) for key, offset in records[replay_from:]]
    assert replayed[cut - replay_from :] == expected[cut:]
    assert all(seq is None for seq in replayed[: cut - replay_from])
    assert restored.entries() == full.entries()


def test_status_folds_and_terminal_status_sticks():
    idx = PartitionIndex(0, 64)
    idx.apply("t", 0, created=True, identity=IDENTITY, signed=True)
    assert idx.get("t").status is TaskStatus.WORKING
    idx.apply("t", 1, status=TaskStatus.INPUT_REQUIRED)
    idx.apply("t", 2, status=TaskStatus.COMPLETED)
    idx.apply("t", 3, status=TaskStatus.WORKING)
    entry = idx.get("t")
    assert entry.status is TaskStatus.COMPLETED and entry.status_offset == 2 and entry.terminal
    assert entry.next_seq == 4


def test_losing_records_to_retention_untrusts_known_tasks_and_foreign_new_ones():
    idx = PartitionIndex(0, 64)
    idx.apply("old", 0)
    idx.mark_lost(100)
    assert not idx.get("old").trusted
    idx.apply("ours", 100, created=True, identity=IDENTITY, signed=True)
    idx.apply("foreign", 101)
    assert idx.get("ours").trusted
    assert not idx.get("foreign").trusted
    assert idx.through == 102


def test_marker_and_task_records_round_trip_and_bad_ones_are_refused():
    idx = PartitionIndex(3, 2, through=77, lost_before=5)
    rec = decode_index_record(marker_key(3), idx.marker())
    assert rec == MarkerRecord(3, 77, 5)
    for key, value in [
        (b"t:x", b"\x01"),
        (b"t:x", b"\x09" + b"\x00" * 30),
        (b"p:3", b"\x03" + b"\x00" * 16),
        (b"zz", b""),
        (b"p:nan", idx.marker()),
    ]:
        with pytest.raises(IndexRecordError):
            decode_index_record(key, value)


# --- records never change a task's identity ----------------------------------------------------
#
# Records go through the indexer's own path (task_facts_of, then apply), so the strict parsing of
# status values is checked together with the rule of the index.

PREFIX = "io.mcpbridge"
CREATOR = "a" * 32
ATTACKER = "b" * 32


def _feed(idx: PartitionIndex, offset: int, suffix: str, payload: dict) -> int | None:
    event = TaskEvent(f"{PREFIX}.{suffix}", payload, None, 0)
    created, status, identity = task_facts_of(event, PREFIX)
    # Signed, as the bridge writes it: the rule of the index is under test here, not the MAC.
    signed = created
    return idx.apply("t", offset, created=created, status=status, identity=identity, signed=signed)


def _created(owner: str, created_ms: int = 1000) -> dict:
    return {
        "tool": "x",
        "owner": owner,
        "createdMs": created_ms,
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
    }


def _created_task() -> PartitionIndex:
    idx = PartitionIndex(0, 64)
    assert _feed(idx, 0, EventSuffix.CREATED, _created(CREATOR)) == 0
    return idx


def test_a_second_task_created_after_a_bogus_status_keeps_its_seq_and_changes_nothing():
    idx = _created_task()
    before = idx.get("t")
    assert _feed(idx, 1, EventSuffix.STATUS, {"status": "UNKNOWN"}) == 1
    assert _feed(idx, 2, EventSuffix.CREATED, _created(ATTACKER, 5)) == 2
    entry = idx.get("t")
    assert entry.owner == owner_key(CREATOR) == before.owner
    assert (entry.created_ms, entry.ttl_ms, entry.poll_ms) == (1000, 60_000, 500)
    assert entry.status is TaskStatus.WORKING and entry.status_offset == 0
    assert entry.next_seq == 3


@pytest.mark.parametrize(
    "status",
    ["Working", "COMPLETED", "Cancelled", "input-required", " working", "working\n", "Unknown"],
)
def test_a_status_in_another_case_or_spelling_is_an_ordinary_event(status):
    idx = _created_task()
    assert _feed(idx, 1, EventSuffix.STATUS, {"status": status}) == 1
    entry = idx.get("t")
    assert entry.status is TaskStatus.WORKING and entry.status_offset == 0


def test_the_status_unknown_is_an_ordinary_event_and_never_unknows_a_task():
    idx = _created_task()
    assert _feed(idx, 1, EventSuffix.STATUS, {"status": "unknown"}) == 1
    assert idx.get("t").status is TaskStatus.WORKING
    idx.apply("t", 2, status=TaskStatus.UNKNOWN)  # not even when a caller passes it in
    assert idx.get("t").status is TaskStatus.WORKING and idx.get("t").status_offset == 0


@pytest.mark.parametrize("status", [None, 3, 1.5, True, ["working"], {"working": 1}])
def test_a_status_that_is_not_a_string_is_an_ordinary_event(status):
    idx = _created_task()
    assert _feed(idx, 1, EventSuffix.STATUS, {"status": status}) == 1
    assert idx.get("t").status is TaskStatus.WORKING


@pytest.mark.parametrize(
    "status", ["working", "input_required", "completed", "failed", "cancelled"]
)
def test_each_exact_wire_name_changes_the_status(status):
    idx = _created_task()
    assert _feed(idx, 1, EventSuffix.STATUS, {"status": status}) == 1
    entry = idx.get("t")
    assert entry.status.wire == status and entry.status_offset == 1


def test_a_task_created_that_is_not_seq_0_defines_nothing():
    idx = PartitionIndex(0, 64)
    assert idx.apply("t", 0) == 0  # someone's ordinary event comes first
    assert _feed(idx, 1, EventSuffix.CREATED, _created(ATTACKER)) == 1
    entry = idx.get("t")
    assert entry.owner == 0 and entry.created_ms == 0 and entry.ttl_ms == -1
    assert entry.status is TaskStatus.UNKNOWN and entry.status_offset == -1


def test_a_terminal_task_stays_terminal_whatever_follows():
    idx = _created_task()
    _feed(idx, 1, EventSuffix.STATUS, {"status": "completed"})
    _feed(idx, 2, EventSuffix.STATUS, {"status": "UNKNOWN"})
    _feed(idx, 3, EventSuffix.CREATED, _created(ATTACKER))
    _feed(idx, 4, EventSuffix.STATUS, {"status": "working"})
    entry = idx.get("t")
    assert entry.status is TaskStatus.COMPLETED and entry.status_offset == 1
    assert entry.owner == owner_key(CREATOR) and entry.next_seq == 5

"""The checker (bridgedev/checker.py) on synthetic truths and recordings: each kind of
failure is found and named, a clean run passes, and equal JSON is an equal event."""

from __future__ import annotations

import json
from typing import Any

from bridgedev.checker import (
    CATEGORIES,
    Recording,
    TaskTruth,
    Truth,
    check,
    event_digest,
)

TASK = "task-a"


def events(n: int) -> list[tuple[str, dict[str, Any]]]:
    return [("com.example.step", {"i": i}) for i in range(n)]


def truth_of(
    timeline: list[tuple[str, dict[str, Any]]], *, first_seq: int | None = 0, task: str = TASK
) -> Truth:
    digests = [event_digest(t, p) for t, p in timeline]
    return Truth(tasks={task: TaskTruth(0, first_seq, digests, list(range(len(digests))))})


def hand(
    recording: Recording,
    client: str,
    timeline: list[tuple[str, dict[str, Any]]],
    seqs: list[int],
    *,
    base: int = 0,
    replica: str | None = None,
) -> None:
    for seq in seqs:
        event_type, payload = timeline[seq - base]
        recording.record(client, TASK, seq, event_type, payload, replica)


def only(report_counts: dict[str, int]) -> dict[str, int]:
    return {c: n for c, n in report_counts.items() if n}


def test_a_clean_run_of_two_finished_clients_and_one_stopped_early_is_ok() -> None:
    timeline = events(6)
    recording = Recording()
    for client in ("c1", "c2"):
        hand(recording, client, timeline, list(range(6)))
        recording.finished(client, TASK)
    hand(recording, "c3", timeline, [0, 1, 2])  # stopped before the end: its prefix is whole
    report = check(truth_of(timeline), recording)
    assert report.ok, report.summary()
    assert report.deliveries == 15 and report.finished_streams == 2
    assert "OK" in report.summary() and report.as_dict()["ok"] is True


def test_a_finished_client_missing_the_last_event_has_lost_it() -> None:
    timeline = events(5)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2, 3])
    recording.finished("c1", TASK)
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"lost": 1}
    assert "seqs 4 never handed" in report.examples["lost"][0]


def test_an_unfinished_client_is_not_charged_for_the_tail_it_never_reached() -> None:
    timeline = events(5)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1])
    assert check(truth_of(timeline), recording).ok


def test_a_gap_without_events_gone_is_a_silent_skip_and_a_loss() -> None:
    timeline = events(5)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 3, 4])
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"silently_skipped": 1, "lost": 1}
    assert "between 1 and 3" in report.examples["silently_skipped"][0]


def test_a_gap_an_events_gone_explains_is_not_a_failure() -> None:
    timeline = events(6)
    recording = Recording()
    recording.gone("c1", TASK, -1, 3)  # asked from the start: seqs 0..2 are gone
    hand(recording, "c1", timeline[3:], [3, 4, 5], base=3)
    recording.finished("c1", TASK)
    report = check(truth_of(timeline[3:], first_seq=3), recording)
    assert report.ok, report.summary()


def test_events_gone_for_events_the_log_still_holds_is_a_loss() -> None:
    timeline = events(6)
    recording = Recording()
    recording.gone("c1", TASK, -1, 3)  # but the log starts at seq 0
    hand(recording, "c1", timeline, [3, 4, 5])
    recording.finished("c1", TASK)
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"lost": 3}


def test_the_same_seq_handed_twice_to_one_client_is_a_duplicate() -> None:
    timeline = events(4)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2, 2, 3])
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"duplicated": 1}


def test_one_event_handed_again_under_the_next_seq_is_a_duplicate_with_a_wrong_seq() -> None:
    timeline = events(4)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1])
    recording.record("c1", TASK, 2, *timeline[1])  # seq 1's event again, numbered 2
    hand(recording, "c1", timeline, [3])
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"duplicated": 1, "wrong_seq": 1}
    assert "seq 1" in report.examples["wrong_seq"][0]


def test_a_seq_below_one_already_handed_is_out_of_order() -> None:
    timeline = events(4)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 2, 1, 3])
    report = check(truth_of(timeline), recording)
    # The skip over 1 is reported where it happened; 1 then came, so nothing is lost.
    assert only(report.counts) == {"out_of_order": 1, "silently_skipped": 1}


def test_a_different_payload_at_a_seq_is_a_wrong_payload() -> None:
    timeline = events(3)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1])
    recording.record("c1", TASK, 2, "com.example.step", {"i": 99})
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"wrong_payload": 1}


def test_an_event_past_the_logs_end_is_a_phantom() -> None:
    timeline = events(3)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2])
    recording.record("c1", TASK, 3, "com.example.step", {"i": "never written"})
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"phantom": 1}


def test_two_replicas_handing_different_events_for_one_seq_disagree() -> None:
    timeline = events(3)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2], replica="r0")
    hand(recording, "c2", timeline, [0, 1], replica="r1")
    recording.record("c2", TASK, 2, "com.example.step", {"i": -2}, "r1")
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"disagreements": 1, "wrong_payload": 1}
    assert "c1@r0" in report.examples["disagreements"][0]
    assert "c2@r1" in report.examples["disagreements"][0]


def test_a_task_whose_seq_base_is_unknown_is_unverifiable_not_passed() -> None:
    timeline = events(3)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2])
    report = check(truth_of(timeline, first_seq=None), recording)
    assert only(report.counts) == {"unverifiable": 1}
    assert not report.ok


def test_deliveries_below_the_first_retained_seq_are_counted_as_unjudged() -> None:
    timeline = events(5)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2, 3, 4])
    recording.finished("c1", TASK)
    report = check(truth_of(timeline[2:], first_seq=2), recording)
    assert report.ok, report.summary()
    assert report.unjudged == 2


def test_equal_json_has_an_equal_digest_whatever_its_text() -> None:
    wire = json.loads('{ "b" : [1, 2.5, "é"],\n "a": {"y": null, "x": true} }')
    log = {"a": {"x": True, "y": None}, "b": [1, 2.5, "é"]}
    assert event_digest("t.x", wire) == event_digest("t.x", log)
    assert event_digest("t.x", log) != event_digest("t.y", log)
    assert event_digest("t.x", {"n": 1}) != event_digest("t.x", {"n": "1"})


def test_examples_are_bounded_but_counts_are_not() -> None:
    timeline = events(40)
    recording = Recording()
    for client in range(30):
        hand(recording, f"c{client}", timeline, [0, 0])
    report = check(truth_of(timeline), recording)
    assert report.counts["duplicated"] == 30
    assert len(report.examples["duplicated"]) == 10
    assert set(report.as_dict()["counts"]) == set(CATEGORIES)
    assert "duplicated: 30" in report.summary()


def test_a_wild_seq_far_past_the_end_is_a_phantom_and_a_skip_and_costs_nothing() -> None:
    timeline = events(3)
    recording = Recording()
    hand(recording, "c1", timeline, [0, 1, 2])
    recording.record("c1", TASK, 10**15, "com.example.step", {"i": "wild"})
    report = check(truth_of(timeline), recording)
    assert only(report.counts) == {"phantom": 1, "silently_skipped": 1}
    assert f"{10**15 - 3} seqs skipped" in report.examples["silently_skipped"][0]


def test_several_events_gone_answers_explain_exactly_their_own_ranges() -> None:
    timeline = events(12)
    recording = Recording()
    recording.gone("c1", TASK, -1, 3)  # 0..2 were gone at the first open
    hand(recording, "c1", timeline, [3, 4])
    recording.gone("c1", TASK, 4, 7)  # 5..6 by the resume
    hand(recording, "c1", timeline, [7, 9, 10, 11])  # 8 skipped silently
    report = check(truth_of(timeline[7:], first_seq=7), recording)  # retained now: 7..11
    assert only(report.counts) == {"silently_skipped": 1, "lost": 1}
    assert "1 seqs skipped between 7 and 9" in report.examples["silently_skipped"][0]
    assert report.unjudged == 2  # 3 and 4: deleted since, nothing to compare with


def test_an_events_gone_explains_nothing_past_its_earliest_seq() -> None:
    timeline = events(8)
    recording = Recording()
    recording.gone("c1", TASK, -1, 3)  # 0..2 gone, yet the stream went on at 5
    hand(recording, "c1", timeline, [5, 6, 7])
    report = check(truth_of(timeline[3:], first_seq=3), recording)
    assert "2 seqs skipped between -1 and 5" in report.examples["silently_skipped"][0]
    assert report.counts["lost"] == 2

"""Who may open a tasks/stream, and the one delivery rule of a stream: pure, in-process."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.envelope import TaskEvent
from bridge.log.records import Batch, ReadEvent
from bridge.server.admission import Admission, Caller, Limits, connection_of
from bridge.server.streams import Step, take_next
from bridge.server.wire import RpcError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admission(per_client: int = 4, per_minute: int = 100, total: int = 100) -> Admission:
    return Admission(Limits(per_client, per_minute, total), clock=Clock())


def anonymous(address: str, port: int) -> Caller:
    return Caller("anonymous", f"anonymous@{address}", (("10.0.0.1", 8080), (address, port)))


def refusal(exc: pytest.ExceptionInfo[RpcError]) -> tuple[int, str, int]:
    return exc.value.code, exc.value.data["reason"], exc.value.http_status


def test_two_connections_of_one_principal_may_stream_one_task_at_once() -> None:
    gate = admission()
    gate.admit(anonymous("192.0.2.7", 50001), "task", 1)
    gate.admit(anonymous("192.0.2.7", 50002), "task", 1)
    assert gate.active == 2


def test_a_second_stream_of_a_task_on_one_connection_is_invalid_params() -> None:
    gate = admission()
    caller = anonymous("192.0.2.7", 50001)
    gate.admit(caller, "task", 1)
    with pytest.raises(RpcError) as exc:
        gate.admit(caller, "task", 2)
    assert refusal(exc) == (-32602, "stream_active", 200)
    gate.admit(caller, "another-task", 3)  # the rule is per task


def test_the_connection_rule_comes_before_the_limits() -> None:
    gate = admission(per_client=1, per_minute=1)
    caller = anonymous("192.0.2.7", 50001)
    gate.admit(caller, "task", 1)
    with pytest.raises(RpcError) as exc:  # over both limits too, yet stream_active
        gate.admit(caller, "task", 2)
    assert refusal(exc)[1] == "stream_active"


def test_a_released_slot_admits_the_next_stream_on_the_connection() -> None:
    gate = admission()
    caller = anonymous("192.0.2.7", 50001)
    ticket = gate.admit(caller, "task", 1)
    gate.release(ticket)
    gate.release(ticket)  # idempotent
    gate.admit(caller, "task", 2)
    assert gate.active == 1


def test_anonymous_callers_at_other_addresses_have_budgets_of_their_own() -> None:
    gate = admission(per_client=2)
    for port in (1, 2):
        gate.admit(anonymous("192.0.2.7", port), "task", port)
    with pytest.raises(RpcError) as exc:
        gate.admit(anonymous("192.0.2.7", 3), "task", 3)
    assert refusal(exc) == (-32600, "too_many_streams", 429)
    gate.admit(anonymous("198.51.100.9", 1), "task", 1)


def test_the_process_wide_cap_refuses_with_a_retriable_status() -> None:
    gate = admission(total=2)
    gate.admit(anonymous("192.0.2.1", 1), "task", 1)
    gate.admit(anonymous("192.0.2.2", 1), "task", 1)
    with pytest.raises(RpcError) as exc:
        gate.admit(anonymous("192.0.2.3", 1), "task", 1)
    assert refusal(exc) == (-32600, "too_many_streams", 503)


def test_opens_are_rate_limited_per_client_over_a_sliding_minute() -> None:
    clock = Clock()
    gate = Admission(Limits(100, 3, 100), clock=clock)
    caller = Caller("alice", "alice", None)
    for i in range(3):
        gate.release(gate.admit(caller, "task", i))
    with pytest.raises(RpcError) as exc:
        gate.admit(caller, "task", 9)
    assert refusal(exc) == (-32600, "rate_limited", 429)
    clock.now += 60
    gate.admit(caller, "task", 10)


def test_cancelling_a_request_id_reaches_only_that_clients_streams() -> None:
    gate = admission()
    mine = gate.admit(Caller("alice", "alice", ("a", 1)), "task", 7)
    theirs = gate.admit(Caller("bob", "bob", ("b", 1)), "task", 7)
    ended: list[str] = []
    mine.on_cancel.append(lambda: ended.append("mine"))
    theirs.on_cancel.append(lambda: ended.append("theirs"))
    assert gate.cancel("alice", 7) == 1
    assert ended == ["mine"] and mine.cancelled and not theirs.cancelled
    gate.release(mine)
    assert gate.cancel("alice", 7) == 0


def test_the_connection_is_both_ends_of_the_transport_connection() -> None:
    scope = {"server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 50123)}
    assert connection_of(scope) == (("127.0.0.1", 8080), ("127.0.0.1", 50123))
    assert connection_of({"server": None, "client": None}) is None


# --- the delivery rule ---------------------------------------------------------------------


@dataclass(frozen=True)
class Ev:
    seq: int
    offset: int
    event: TaskEvent


def log_of(n: int) -> list[Ev]:
    return [Ev(i, 10 * i, TaskEvent("com.example.e", {"i": i}, None, 0)) for i in range(n)]


def take(events: list[Ev], last: int, ends, **kwargs) -> tuple[list[int], int, Step]:
    """:func:`take_next` of ``events`` as the live buffer hands them (any seqs): the seqs taken."""
    batch, last, step = take_next(Batch.of(events), last, ends, **kwargs)
    return list(batch.seqs), last, step


# No deadline: an example makes hundreds of draws, and timing is not what this checks.
@settings(deadline=None)
@given(
    n=st.integers(1, 40),
    data=st.data(),
)
def test_any_interleaving_of_duplicates_and_gaps_delivers_each_seq_once_up_to_the_terminal(
    n: int, data: st.DataObject
) -> None:
    """History, live duplicates and holes in any order: what is delivered is exactly the
    events after the cursor up to the terminal one, each once, in order; then the stream ends."""
    events = log_of(n)
    terminal = data.draw(st.integers(0, n - 1), label="terminal")
    after = data.draw(st.integers(-1, n + 3), label="after")
    ends = lambda offset, _event: offset == 10 * terminal  # noqa: E731
    last, delivered, step = after, [], Step.MORE
    for _ in range(4 * n + 10):  # every round makes progress or re-reads the rest
        start = data.draw(st.integers(0, n - 1))
        chunk = [e for e in events[start:] if data.draw(st.booleans())]  # holes, duplicates
        seqs, last, step = take(chunk, last, ends)
        delivered += seqs
        if step is Step.GAP:  # the stream re-reads the rest from Kafka, without holes
            seqs, last, step = take(events[max(last, -1) + 1 :], last, ends)
            delivered += seqs
        if step is Step.ENDED:
            break
    # Always a gap-free run from the cursor on, each seq once ...
    assert delivered == list(range(after + 1, after + 1 + len(delivered)))
    if after < terminal and step is Step.ENDED:  # ... that ends exactly at the terminal event
        assert delivered[-1] == terminal


def test_a_cursor_past_the_terminal_event_ends_when_that_event_goes_by() -> None:
    """A cursor ahead of this replica's view (another replica handed it out) must not hang."""
    events = log_of(6)
    terminal = lambda offset, event: offset == 30  # noqa: E731
    seqs, last, step = take(events[2:], 4, terminal)
    assert seqs == [] and last == 4 and step is Step.ENDED


def test_without_a_cursor_the_first_event_may_have_any_seq() -> None:
    events = log_of(8)[5:]  # retention kept seq 5 onwards
    never = lambda offset, event: False  # noqa: E731
    seqs, last, step = take(events, -1, never, any_first=True)
    assert seqs == [5, 6, 7] and last == 7 and step is Step.MORE
    assert take(events, -1, never)[2] is Step.GAP


def as_read_batch(events: list[Ev]) -> Batch[TaskEvent]:
    """A reader's batch of consecutive events (what a catch-up read yields)."""
    seqs = range(events[0].seq, events[0].seq + len(events))
    return Batch(seqs, [e.offset for e in events], [e.event for e in events])


@settings(deadline=None)
@given(
    n=st.integers(1, 30),
    start=st.integers(0, 29),
    last=st.integers(-1, 32),
    terminal=st.integers(-1, 29),
    any_first=st.booleans(),
    end_type=st.sampled_from([None, "com.example.e", "com.example.other"]),
)
def test_a_read_batch_is_taken_exactly_as_the_same_events_one_by_one(
    n: int, start: int, last: int, terminal: int, any_first: bool, end_type: str | None
) -> None:
    """The stream takes a catch-up read's consecutive seqs in slices: same rule, same answer as
    for the events one by one (and end_type only spares asking about other types)."""
    events = log_of(n + start)[start:]
    ends = lambda offset, _event: offset == 10 * terminal  # noqa: E731
    read = as_read_batch(events)
    one_by_one = [ReadEvent(e.seq, e.offset, e.event) for e in events]
    assert list(read) == one_by_one and len(read) == n
    expected = take(events, last, ends, any_first=any_first)
    if end_type == "com.example.other":  # no event can end the stream then
        expected = take(events, last, lambda o, e: False, any_first=any_first)
    taken, got_last, step = take_next(read, last, ends, any_first=any_first, end_type=end_type)
    assert (list(taken.seqs), got_last, step) == expected
    assert taken.items == [events[seq - events[0].seq].event for seq in taken.seqs]

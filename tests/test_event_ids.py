"""Event ids are unique per server: a receiver that deduplicates on ``eventId`` (the
``webhook-id`` of a delivery) never drops a real occurrence of another source, and cursors
minted before ids were made unique still resume (docs/events.md, "Event ids").

In-process, over the fakes of the Kafka reader and of the task log that the sources' unit tests
use (no broker)."""

from __future__ import annotations

import itertools
from typing import Any

from test_event_sources_unit import (
    ORDERS,
    FakeTopic,
    add_update,
    order,
    orders_source,
    updates_source,
)
from test_event_sources_unit import poll as poll_source
from test_events_unit import FakeLog
from test_events_unit import poll as poll_task

from bridge.events_extension.cursor import decode_offsets, decode_partition, decode_task, topic_tag
from bridge.events_extension.occurrences import record_event_id, task_event_id, task_update_id

#: Task ids and source names chosen to make the shapes meet if they could: dots, hyphens, digits,
#: the words the ids end in. (Source names hold no "/": the settings refuse it.)
AWKWARD = ["t", "t.0", "t.0.updated", "0", "1-2", "a/1-2", "x.updated", "updated", "t-1", "."]
NAMES = ["t", "t.0", "a", "1-2", "x.updated", ORDERS, "com.example.orders-2"]


def ids_of(out: dict[str, Any]) -> list[str]:
    return [e["eventId"] for e in out["events"]]


def test_no_id_of_one_kind_is_ever_an_id_of_another_kind_or_of_another_occurrence() -> None:
    seqs = [0, 1, 12, 2**63 - 1]
    made: dict[str, tuple[Any, ...]] = {}
    kinds = [
        *(("event", t, s) for t, s in itertools.product(AWKWARD, seqs)),
        *(("updated", t, s) for t, s in itertools.product(AWKWARD, seqs)),
        *(("record", n, p, o) for n, p, o in itertools.product(NAMES, [0, 1, 12], [0, 2, 21])),
    ]
    for kind in kinds:
        if kind[0] == "event":
            made_id = task_event_id(kind[1], kind[2])
        elif kind[0] == "updated":
            made_id = task_update_id(kind[1], kind[2])
        else:
            made_id = record_event_id(kind[1], kind[2], kind[3])
        assert made.setdefault(made_id, kind) == kind, (made_id, made[made_id], kind)


async def test_the_same_position_on_two_sources_gives_two_ids() -> None:
    """Two pipelines' topics at one callback URL: each record's position exists in both."""
    orders, refunds = FakeTopic({0: [], 1: []}), FakeTopic({0: [], 1: []})
    for topic in (orders, refunds):
        order(topic, 0, {"orderId": "o1"})
        order(topic, 1, {"orderId": "o2"})
    first = orders_source(orders)
    second = orders_source(refunds, name="com.example.refunds")  # (its reader: another topic)
    start = {"cursor": first.encode({0: 0, 1: 0})}
    got = ids_of(await poll_source(first, **start))
    other = ids_of(await poll_source(second, cursor=second.encode({0: 0, 1: 0})))
    assert len(got) == len(other) == 2 and not set(got) & set(other), (got, other)
    # Two event types over one topic deliver two occurrences of a record: both arrive.
    same_topic = orders_source(orders, name="com.example.orders.any")
    assert not set(ids_of(await poll_source(same_topic, **start))) & set(got)


async def test_a_status_change_has_one_id_on_task_event_and_another_on_task_updated() -> None:
    """A receiver subscribed to a task's events and to its updates gets both occurrences."""
    events = ids_of(await poll_task(FakeLog(3), cursor="dDEuLTE"))  # t1.-1: from the start
    updates = FakeTopic({0: []})
    for seq in range(3):
        add_update(updates, "alice", "t", seq, "working")
    changes = ids_of(await poll_source(updates_source(updates), cursor="dTEuMC4w"))  # u1.0.0
    assert events == ["t.0", "t.1", "t.2"]  # unchanged by the upgrade
    assert changes == ["t.0.updated", "t.1.updated", "t.2.updated"]


async def test_cursors_minted_before_ids_changed_still_resume() -> None:
    """The cursors below are literal texts as the bridge minted them before the upgrade; a
    client that stored one resumes exactly after it, with the new ids."""
    assert decode_task("dDEuMA") == 0  # t1.0
    assert decode_partition("dTEuMC4x") == (0, 1)  # u1.0.1
    assert topic_tag("orders") == "1c168adb"
    assert decode_offsets("azEuMWMxNjhhZGIuMS4w", "1c168adb") == {0: 1, 1: 0}  # k1.<tag>.1.0

    task = await poll_task(FakeLog(3), cursor="dDEuMA")
    assert ids_of(task) == ["t.1", "t.2"] and task["truncated"] is False

    updates = FakeTopic({0: []})
    for seq in range(3):
        add_update(updates, "alice", "t", seq, "working")
    changed = await poll_source(updates_source(updates), cursor="dTEuMC4x")
    assert ids_of(changed) == ["t.1.updated", "t.2.updated"] and changed["truncated"] is False

    orders = FakeTopic({0: [], 1: []})
    order(orders, 0, {"orderId": "o1"})
    order(orders, 0, {"orderId": "o2"})
    order(orders, 1, {"orderId": "o3"})
    shipped = await poll_source(orders_source(orders), cursor="azEuMWMxNjhhZGIuMS4w")
    assert ids_of(shipped) == [f"{ORDERS}/0-1", f"{ORDERS}/1-0"]
    assert shipped["truncated"] is False

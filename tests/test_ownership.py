"""The pure rules of dividing the work: the sticky assignment, the signed hop, what is routed."""

from __future__ import annotations

import itertools
import random

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from bridge.config import load_settings
from bridge.kafka.adapter import PortAssignor
from bridge.kafka.ownership import Claim, OwnershipAssignor, sticky_assign
from bridge.kafka.port import TopicPart
from bridge.server.hops import PeerAuth
from bridge.server.peers import routed_task_id

SECRET = "s" * 40


def _counts(shares: dict[str, list[int]]) -> list[int]:
    return sorted(len(ps) for ps in shares.values())


@pytest.mark.parametrize(
    ("partitions", "members"), [(6, 1), (6, 2), (6, 3), (6, 4), (7, 3), (2, 3)]
)
def test_a_fresh_group_gets_every_partition_once_and_balanced(partitions, members) -> None:
    shares = sticky_assign(range(partitions), {f"m{i}": Claim(f"u{i}") for i in range(members)})
    assigned = sorted(itertools.chain.from_iterable(shares.values()))
    assert assigned == list(range(partitions))
    assert _counts(shares)[-1] - _counts(shares)[0] <= 1


def test_members_keep_what_they_own_when_nobody_joins_or_leaves() -> None:
    claims = {"a": Claim("ua", frozenset({0, 3})), "b": Claim("ub", frozenset({1, 4})),
              "c": Claim("uc", frozenset({2, 5}))}  # fmt: skip
    assert sticky_assign(range(6), claims) == {"a": [0, 3], "b": [1, 4], "c": [2, 5]}


def test_a_member_leaving_moves_only_its_partitions() -> None:
    claims = {"a": Claim("ua", frozenset({0, 3})), "c": Claim("uc", frozenset({2, 5}))}
    shares = sticky_assign(range(6), claims)
    assert set(shares["a"]) >= {0, 3} and set(shares["c"]) >= {2, 5}
    assert sorted(shares["a"] + shares["c"]) == list(range(6))
    assert _counts(shares) == [3, 3]


def test_a_member_joining_takes_only_what_evens_the_counts() -> None:
    claims = {"a": Claim("ua", frozenset({0, 1, 2})), "b": Claim("ub", frozenset({3, 4, 5})),
              "c": Claim("uc")}  # fmt: skip
    shares = sticky_assign(range(6), claims)
    assert _counts(shares) == [2, 2, 2]
    moved = 6 - len(set(shares["a"]) & {0, 1, 2}) - len(set(shares["b"]) & {3, 4, 5})
    assert moved == 2


def test_two_members_claiming_one_partition_do_not_both_get_it() -> None:
    claims = {"a": Claim("ua", frozenset({0, 1})), "b": Claim("ub", frozenset({1, 2}))}
    shares = sticky_assign(range(4), claims)
    assert sorted(shares["a"] + shares["b"]) == [0, 1, 2, 3]


def test_the_assignment_is_deterministic_for_any_claims() -> None:
    rng = random.Random(13)
    for _ in range(200):
        n, m = rng.randint(1, 12), rng.randint(1, 5)
        claims = {
            f"m{i}": Claim(f"u{i}", frozenset(rng.sample(range(n), rng.randint(0, n))))
            for i in range(m)
        }
        shares = sticky_assign(range(n), claims)
        assert shares == sticky_assign(range(n), dict(reversed(list(claims.items()))))
        assert sorted(itertools.chain.from_iterable(shares.values())) == list(range(n))
        assert _counts(shares)[-1] - _counts(shares)[0] <= 1


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(6))


def test_every_member_learns_every_partitions_owner_url_from_the_assignment() -> None:
    # Through aiokafka's group protocol (the adapter's wrapper and the wire encoding).
    replicas = [OwnershipAssignor(f"http://r{i}:8080", "ev") for i in range(3)]
    wrapped = [PortAssignor(r) for r in replicas]
    members = {f"m{i}": w.metadata(["ev"]) for i, w in enumerate(wrapped)}
    assignments = wrapped[0].assign(_Cluster(), members)
    for i, (replica, wrapper) in enumerate(zip(replicas, wrapped, strict=True)):
        wire = ConsumerProtocolMemberAssignment.decode(assignments[f"m{i}"].encode())
        wrapper.on_assignment(wire)
        parts = [TopicPart(t, p) for t, ps in wire.assignment for p in ps]
        replica.on_assignment(parts, wrapper.user_data)
    maps = [r.map.owners for r in replicas]
    assert maps[0] == maps[1] == maps[2] and sorted(maps[0]) == list(range(6))
    for i, replica in enumerate(replicas):
        assert {p for p, url in maps[0].items() if url == f"http://r{i}:8080"} == replica.owned
    # The next join claims what each owns now: nothing moves.
    again = {f"m{i}": w.metadata(["ev"]) for i, w in enumerate(wrapped)}
    second = wrapped[1].assign(_Cluster(), again)
    assert {m: a.partitions() for m, a in second.items()} == {
        m: a.partitions() for m, a in assignments.items()
    }


def test_a_member_whose_metadata_cannot_be_read_still_gets_a_share() -> None:
    good = OwnershipAssignor("http://a", "ev")
    parts = [TopicPart("ev", p) for p in range(6)]
    shares = good.assign(parts, {"a": good.metadata(), "b": b"\xff"})
    assert len(shares["b"].parts) == 3


# --- the signed hop (tests/test_peer_hops.py has the rest) ---------------------------------


def test_the_secret_never_shows_in_a_repr() -> None:
    assert SECRET not in repr(PeerAuth(SECRET))
    settings = load_settings(
        kafka={"bootstrap_servers": "k:9092"},
        replicas={"ownership": "group"},
        peers={"advertised_url": "http://a:8081", "secret": SECRET},
    )
    assert SECRET not in repr(settings)


# --- what is routed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "routed"),
    [
        ("tasks/get", {"taskId": "t1"}, "t1"),
        ("tasks/stream", {"taskId": "t1", "after": 3}, "t1"),
        ("tasks/cancel", {"taskId": "t1"}, "t1"),
        ("tasks/update", {"taskId": "t1", "inputResponses": {}}, "t1"),
        ("events/poll", {"name": "x", "arguments": {"taskId": "t1"}}, "t1"),
        ("events/stream", {"name": "x", "arguments": {"taskId": "t1"}}, "t1"),
        ("tools/call", {"name": "x", "requestState": "t1"}, "t1"),
        ("tools/call", {"name": "x", "arguments": {"taskId": "t1"}}, None),
        ("tasks/get", {"taskId": 7}, None),
        ("tasks/get", {"taskId": ""}, None),
        ("events/poll", {"name": "x", "arguments": "t1"}, None),
        ("tools/list", {}, None),
        ("subscriptions/listen", {"taskIds": ["t1"]}, None),
    ],
)
def test_only_requests_about_one_task_are_routed_to_its_owner(method, params, routed) -> None:
    assert routed_task_id(method, params) == routed


def test_group_ownership_without_a_url_or_a_long_enough_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="BRIDGE_PEERS__ADVERTISED_URL"):
        load_settings(
            kafka={"bootstrap_servers": "k:9092"},
            replicas={"ownership": "group"},
            peers={"secret": SECRET},
        )
    with pytest.raises(ValueError, match="at least 32 characters"):
        load_settings(
            kafka={"bootstrap_servers": "k:9092"},
            replicas={"ownership": "group"},
            peers={"advertised_url": "http://a:8081", "secret": "short"},
        )


# --- task ids ------------------------------------------------------------------------------


def test_task_ids_never_start_like_a_command_line_option() -> None:
    from bridge.tasks.messages import new_task_id

    ids = [new_task_id() for _ in range(5000)]  # a leading "-" is 1 in 64 of the raw draws
    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 32 for i in ids) and len(set(ids)) == len(ids)


def test_a_replica_creates_tasks_in_its_own_partitions() -> None:
    from types import SimpleNamespace

    from bridge.clock import SYSTEM_ENTROPY
    from bridge.kafka.clients import partition_for_key
    from bridge.tasks.service import TaskService

    owned = {1: object(), 4: object()}
    indexer = SimpleNamespace(
        partitions=owned, partition_of=lambda t: partition_for_key(t.encode(), 6)
    )
    service = SimpleNamespace(indexer=indexer, _entropy=SYSTEM_ENTROPY)
    draw = TaskService.new_task_id.__get__(service)
    assert {partition_for_key(draw().encode(), 6) for _ in range(300)} == {1, 4}

"""Who owns which events partition: a sticky assignment through Kafka's consumer group.

Where it sits: serving replicas running with ``ownership = "group"`` join one consumer group on
the events topic (bridge.log.indexer); Kafka's group coordinator picks a leader, and the leader
runs :class:`OwnershipAssignor` over every member's metadata. Each member's metadata carries
the URL its peers reach it at and the partitions it owns now; the leader keeps every partition
where it is (sticky, so a replica given back what it had keeps its state and streams), hands
out the unowned ones to the least loaded members, moves partitions only to even the counts, and
sends every member the whole partition -> URL map in its assignment. So each replica learns
where to forward a request from the same round that decided it (what Kafka Streams calls
``partitionsByHost``).

:func:`sticky_assign` is the rule, pure and unit-tested; the assignor only encodes it.
What it does not do: fence writers (per-partition transactional ids do) or forward requests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.kafka.port import Share, TopicPart

__all__ = ["Claim", "OwnershipAssignor", "OwnershipMap", "sticky_assign"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """What a member says of itself when it joins: its URL and the partitions it owns now."""

    url: str
    owned: frozenset[int] = frozenset()


def sticky_assign(partitions: Iterable[int], members: Mapping[str, Claim]) -> dict[str, list[int]]:
    """Partitions per member: balanced (counts differ by at most one), moving as few as possible.

    A partition stays with a member that claims it (the first by member id if two do, after an
    unclean handover) unless that member holds more than its share; unowned partitions go to
    the members with the fewest. Deterministic for the same input.
    """
    ids = sorted(members)
    if not ids:
        return {}
    parts = sorted(set(partitions))
    base, extra = divmod(len(parts), len(ids))
    # The members that keep the most get the extra partitions, so fewer move.
    by_claim = sorted(ids, key=lambda m: (-len(members[m].owned & set(parts)), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_claim)}
    result: dict[str, list[int]] = {m: [] for m in ids}
    taken: set[int] = set()
    for member in ids:
        for p in sorted(members[member].owned):
            if p in parts and p not in taken and len(result[member]) < quota[member]:
                result[member].append(p)
                taken.add(p)
    for p in parts:
        if p in taken:
            continue
        member = min(ids, key=lambda m: (len(result[m]) - quota[m], len(result[m]), m))
        result[member].append(p)
    return {m: sorted(ps) for m, ps in result.items()}


@dataclass
class OwnershipMap:
    """The last assignment's partition -> owner URL map, as every member received it."""

    owners: dict[int, str] = field(default_factory=dict)
    generation: int = 0

    def owner(self, partition: int) -> str | None:
        return self.owners.get(partition)


class OwnershipAssignor:
    """The group's assignment rule, a port :class:`~bridge.kafka.port.Assignor` (an instance
    per replica: it carries the replica's URL; :class:`~bridge.kafka.adapter.PortAssignor`
    runs it inside aiokafka's group protocol).

    ``metadata`` is evaluated at every join, ``assign`` runs on the elected leader, and the
    member's listener hands its share to ``on_assignment``.
    """

    name = "mcpbridge-owners"

    def __init__(self, url: str, topic: str) -> None:
        self.url = url
        self.topic = topic
        self.owned: frozenset[int] = frozenset()
        self.map = OwnershipMap()

    def metadata(self) -> bytes:
        return json.dumps({"url": self.url, "owned": sorted(self.owned)}).encode("utf-8")

    def assign(self, parts: Sequence[TopicPart], members: Mapping[str, bytes]) -> dict[str, Share]:
        partitions = {p.partition for p in parts if p.topic == self.topic}
        claims = {member: _claim(data) for member, data in members.items()}
        shares = sticky_assign(partitions, claims)
        owners = {str(p): claims[m].url for m, ps in shares.items() for p in ps}
        user_data = json.dumps({"owners": owners}).encode("utf-8")
        log.info("assigned %d partitions over %d replicas", len(partitions), len(members))
        return {
            member: Share(tuple(TopicPart(self.topic, p) for p in ps), user_data)
            for member, ps in shares.items()
        }

    def on_assignment(self, parts: Iterable[TopicPart], user_data: bytes) -> None:
        """Take this member's share and the owner map every member received with it."""
        self.owned = frozenset(p.partition for p in parts if p.topic == self.topic)
        try:
            raw = json.loads(user_data or b"{}").get("owners", {})
            owners = {int(p): str(url) for p, url in raw.items()}
        except (ValueError, AttributeError):
            log.error(
                "an assignment without a readable owner map; forwarding is off until the next"
            )
            owners = {}
        self.map = OwnershipMap(owners, self.map.generation + 1)


def _claim(user_data: bytes | None) -> Claim:
    """A member's claim; a member this version cannot read claims nothing (it still gets a share)."""
    try:
        raw = json.loads(user_data or b"{}")
        return Claim(str(raw.get("url", "")), frozenset(int(p) for p in raw.get("owned", ())))
    except (ValueError, TypeError, AttributeError):
        return Claim("")

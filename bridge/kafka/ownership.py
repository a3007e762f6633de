"""Who owns which events partition: a sticky assignment through Kafka's consumer group.

Where it sits: serving replicas running with ``replicas.ownership = "group"`` join one consumer group on
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
    """What a member says of itself when it joins: its URL, the partitions it owns now, and
    its static instance id (None for a dynamic member, or a replica older than the field)."""

    url: str
    owned: frozenset[int] = frozenset()
    instance: str | None = None


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
    """The last assignment's partition -> owner URL map, as every member received it, and the
    static instance id of each owner URL that has one (what a survivor names to have the group
    drop an owner whose process is gone)."""

    owners: dict[int, str] = field(default_factory=dict)
    generation: int = 0
    instances: dict[str, str] = field(default_factory=dict)

    def owner(self, partition: int) -> str | None:
        return self.owners.get(partition)

    def instance_owning(self, url: str) -> str | None:
        """The instance id of ``url`` when it owns a partition now, else None."""
        instance = self.instances.get(url)
        return instance if instance is not None and url in self.owners.values() else None


class OwnershipAssignor:
    """The group's assignment rule, a port :class:`~bridge.kafka.port.Assignor` (an instance
    per replica: it carries the replica's URL; :class:`~bridge.kafka.adapter.PortAssignor`
    runs it inside aiokafka's group protocol).

    ``metadata`` is evaluated at every join, ``assign`` runs on the elected leader, and the
    member's listener hands its share to ``on_assignment``.
    """

    name = "mcpbridge-owners"

    def __init__(self, url: str, topic: str, instance: str | None = None) -> None:
        self.url = url
        self.topic = topic
        self.instance = instance
        self.owned: frozenset[int] = frozenset()
        self.map = OwnershipMap()

    def metadata(self) -> bytes:
        claim: dict[str, object] = {"url": self.url, "owned": sorted(self.owned)}
        if self.instance is not None:  # older replicas ignore a field they do not know
            claim["instance"] = self.instance
        return json.dumps(claim).encode("utf-8")

    def assign(self, parts: Sequence[TopicPart], members: Mapping[str, bytes]) -> dict[str, Share]:
        partitions = {p.partition for p in parts if p.topic == self.topic}
        claims = {member: _claim(data) for member, data in members.items()}
        shares = sticky_assign(partitions, claims)
        owners = {str(p): claims[m].url for m, ps in shares.items() for p in ps}
        instances = {c.url: c.instance for c in claims.values() if c.instance is not None}
        user_data = json.dumps({"owners": owners, "instances": instances}).encode("utf-8")
        log.info("assigned %d partitions over %d replicas", len(partitions), len(members))
        return {
            member: Share(tuple(TopicPart(self.topic, p) for p in ps), user_data)
            for member, ps in shares.items()
        }

    def on_assignment(self, parts: Iterable[TopicPart], user_data: bytes) -> None:
        """Take this member's share and the owner map every member received with it."""
        self.owned = frozenset(p.partition for p in parts if p.topic == self.topic)
        try:
            data = json.loads(user_data or b"{}")
            owners = {int(p): str(url) for p, url in data.get("owners", {}).items()}
        except (ValueError, AttributeError):
            log.error(
                "an assignment without a readable owner map; forwarding is off until the next"
            )
            data, owners = {}, {}
        self.map = OwnershipMap(owners, self.map.generation + 1, _instances(data))


def _instances(data: object) -> dict[str, str]:
    """The URL -> instance id map of an assignment (empty from a leader older than it)."""
    raw = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {url: i for url, i in raw.items() if isinstance(url, str) and isinstance(i, str)}


def _claim(user_data: bytes | None) -> Claim:
    """A member's claim; a member this version cannot read claims nothing (it still gets a share)."""
    try:
        raw = json.loads(user_data or b"{}")
        instance = raw.get("instance")
        return Claim(
            str(raw.get("url", "")),
            frozenset(int(p) for p in raw.get("owned", ())),
            instance if isinstance(instance, str) else None,
        )
    except (ValueError, TypeError, AttributeError):
        return Claim("")

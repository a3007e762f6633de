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

A member about to stop (SIGTERM) rejoins *draining* (:attr:`Claim.draining`): it is given
nothing, so the others take its partitions while it still runs (the planned hand-over,
:mod:`bridge.log.ownership`). The assignment names the draining URLs too: a replica restarted
on Kafka's static replace path gets its old share back without a rebalance and with its old
metadata (the broker does not look at the new one), so it learns from that list that the group
still thinks it is draining, and rejoins once to be given partitions again. A member of an
older version claims neither (treated as not draining).

The assignment also names each partition's standbys (:func:`name_standbys`): the members that
keep a warm copy of its index (:mod:`bridge.log.standby`), so that whoever gains it next serves
it after a fence and a short catch-up instead of a full restore. A draining member stands by
for the partitions it gave away: what it gets back when it returns, once its copies are warm
(it rejoins only then, claiming them: :attr:`Claim.warm`). An owner over its share gives away
first the partitions another member claims warm.

:func:`sticky_assign` is the rule, pure and unit-tested; the assignor only encodes it.
What it does not do: fence writers (per-partition transactional ids do) or forward requests.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.kafka.port import Share, TopicPart

__all__ = [
    "Claim",
    "OwnershipAssignor",
    "OwnershipMap",
    "name_standbys",
    "sticky_assign",
]

log = logging.getLogger(__name__)

#: The most deliberate rejoins a replica counted as draining makes: the first one carries its
#: new claim, so one that is still counted draining after these is named by another member
#: (a forged claim, or a crashed dynamic member of the same pod until the session timeout),
#: and rejoining again would only rebalance the group once more, for as long as that lasts.
DRAINING_REJOINS = 3
#: The longest URL a claim may name: every member's claim is read by the leader and each
#: owner's URL is copied into the map sent to every member, once per partition it owns (a URL
#: of megabytes would take the assignment past the broker's limit: no round would complete).
MAX_URL = 2_048


@dataclass(frozen=True)
class Claim:
    """What a member says of itself when it joins: its URL, the partitions it owns now, its
    static instance id (None for a dynamic member, or a replica older than the field), whether
    it is draining (about to stop: it is given nothing), and the partitions it holds a warm
    standby copy of (it can serve them at once)."""

    url: str
    owned: frozenset[int] = frozenset()
    instance: str | None = None
    draining: bool = False
    warm: frozenset[int] = frozenset()


def sticky_assign(partitions: Iterable[int], members: Mapping[str, Claim]) -> dict[str, list[int]]:
    """Partitions per member: balanced (counts differ by at most one), moving as few as possible.

    A partition stays with a member that claims it (the first by member id if two do, after an
    unclean handover) unless that member holds more than its share: then it gives away first
    the partitions another member claims a warm copy of (that one can serve them at once).
    Unowned partitions go to the members with the fewest. A draining member gets nothing (its
    partitions are unowned) unless every member is draining: then each keeps what it claims,
    unbalanced. Deterministic for the same input.
    """
    if not members:
        return {}
    staying = {m: c for m, c in members.items() if not c.draining}
    if not staying:
        return _kept(partitions, members)
    if len(staying) < len(members):
        shares = _sticky(partitions, staying)
        return {m: shares.get(m, []) for m in sorted(members)}
    return _sticky(partitions, members)


def _kept(partitions: Iterable[int], members: Mapping[str, Claim]) -> dict[str, list[int]]:
    """Every member is draining: each keeps what it claims (no balancing: a member that
    handed its share over is stopping, and must not be given some back); only the unowned
    partitions are dealt, to the members with the fewest."""
    ids = sorted(members)
    parts = sorted(set(partitions))
    result: dict[str, list[int]] = {m: [] for m in ids}
    taken: set[int] = set()
    for member in ids:
        for p in sorted(members[member].owned & set(parts) - taken):
            result[member].append(p)
            taken.add(p)
    for p in parts:
        if p not in taken:
            result[min(ids, key=lambda m: (len(result[m]), m))].append(p)
    return {m: sorted(ps) for m, ps in result.items()}


def _sticky(partitions: Iterable[int], members: Mapping[str, Claim]) -> dict[str, list[int]]:
    ids = sorted(members)
    parts = sorted(set(partitions))
    base, extra = divmod(len(parts), len(ids))
    # The members that keep the most get the extra partitions, so fewer move.
    by_claim = sorted(ids, key=lambda m: (-len(members[m].owned & set(parts)), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_claim)}
    result: dict[str, list[int]] = {m: [] for m in ids}
    taken: set[int] = set()

    def warm_elsewhere(member: str, p: int) -> bool:
        return any(p in members[m].warm for m in ids if m != member)

    for member in ids:
        # An owner over its share keeps first what nobody else could serve at once.
        for p in sorted(members[member].owned, key=lambda p: (warm_elsewhere(member, p), p)):
            if p in parts and p not in taken and len(result[member]) < quota[member]:
                result[member].append(p)
                taken.add(p)
    for p in parts:
        if p in taken:
            continue
        # Among the members with the fewest, one with a warm copy of it.
        member = min(
            ids,
            key=lambda m: (len(result[m]) - quota[m], len(result[m]), p not in members[m].warm, m),
        )
        result[member].append(p)
    return {m: sorted(ps) for m, ps in result.items()}


def name_standbys(
    shares: Mapping[str, Sequence[int]], members: Mapping[str, Claim], count: int
) -> dict[int, list[str]]:
    """Up to ``count`` standby members per partition, never its owner: a draining member for
    the partitions it owned (its share when it comes back), then the staying members with the
    fewest standbys. Deterministic for the same input."""
    owner = {p: m for m, ps in shares.items() for p in ps}
    result: dict[int, list[str]] = {p: [] for p in owner}
    if count <= 0:
        return result
    load = dict.fromkeys(members, 0)
    for m in sorted(members):
        if members[m].draining:
            for p in sorted(members[m].owned):
                if p in owner and owner[p] != m and m not in result[p] and len(result[p]) < count:
                    result[p].append(m)
                    load[m] += 1
    staying = sorted(m for m, c in members.items() if not c.draining)
    for p in sorted(owner):
        while len(result[p]) < count:
            free = [m for m in staying if m != owner[p] and m not in result[p]]
            if not free:
                break
            chosen = min(free, key=lambda m: (load[m], m))
            result[p].append(chosen)
            load[chosen] += 1
    return result


@dataclass
class OwnershipMap:
    """The last assignment's partition -> owner URL map, as every member received it, and the
    static instance id of each owner URL that has one (what a survivor names to have the group
    drop an owner whose process is gone)."""

    owners: dict[int, str] = field(default_factory=dict)
    generation: int = 0
    instances: dict[str, str] = field(default_factory=dict)
    #: The URLs of the members that were draining when it was made.
    draining: frozenset[str] = frozenset()
    #: Each partition's standby URLs (who keeps a warm copy of its index).
    standbys: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def standing_by(self, url: str) -> set[int]:
        """The partitions ``url`` stands by for."""
        return {p for p, urls in self.standbys.items() if url in urls}

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

    def __init__(
        self, url: str, topic: str, instance: str | None = None, standbys: int = 0
    ) -> None:
        """``standbys``: how many members the leader names to stand by for each partition."""
        self.url = url
        self.topic = topic
        self.instance = instance
        self.standbys = standbys
        self.owned: frozenset[int] = frozenset()
        self.map = OwnershipMap()
        #: Set when the replica is about to stop: its next join asks for nothing.
        self.draining = False
        #: The partitions this replica holds a warm standby copy of (claimed at each join).
        self.warm: Callable[[], frozenset[int]] = frozenset
        #: Deliberate rejoins so far (:meth:`bump`): claimed, so that each one changes this
        #: member's metadata and Kafka rebalances (a known member rejoining with the metadata
        #: the broker holds just gets the current generation back, and the static replace
        #: path stores a restarted replica's new metadata without a rebalance).
        self.rejoins = 0

    def metadata(self) -> bytes:
        claim: dict[str, object] = {"url": self.url, "owned": sorted(self.owned)}
        # Each only when set: older replicas ignore a field they do not know.
        if self.instance is not None:
            claim["instance"] = self.instance
        if self.draining:
            claim["draining"] = True
        if warm := self.warm():
            claim["warm"] = sorted(warm)
        if self.rejoins:
            claim["rejoin"] = self.rejoins
        return json.dumps(claim).encode("utf-8")

    def bump(self) -> None:
        """Make the next join's metadata differ from any this member sent before: a rejoin
        that must rebalance (a replica back from a restart asking for its share)."""
        self.rejoins += 1

    @property
    def thought_draining(self) -> bool:
        """The last assignment counted this replica as draining while it is not (it came back
        on the static replace path with its old metadata): it must rejoin to get a share.

        Only with an empty share (the drained one: a replica given partitions is not counted
        out) and at most :data:`DRAINING_REJOINS` times."""
        return (
            not self.draining
            and not self.owned
            and self.rejoins < DRAINING_REJOINS
            and self.url in self.map.draining
        )

    def assign(self, parts: Sequence[TopicPart], members: Mapping[str, bytes]) -> dict[str, Share]:
        partitions = {p.partition for p in parts if p.topic == self.topic}
        claims = {member: _claim(data, partitions) for member, data in members.items()}
        shares = sticky_assign(partitions, claims)
        owners = {str(p): claims[m].url for m, ps in shares.items() for p in ps}
        instances = _unique_instances(list(claims.values()))
        draining = sorted({c.url for c in claims.values() if c.draining})
        data: dict[str, object] = {"owners": owners, "instances": instances}
        if draining:
            data["draining"] = draining
        named = name_standbys(shares, claims, self.standbys)
        standbys = {str(p): [claims[m].url for m in ms] for p, ms in named.items() if ms}
        if standbys:
            data["standbys"] = standbys
        user_data = json.dumps(data).encode("utf-8")
        log.info(
            "assigned %d partitions over %d replicas (%d draining)",
            len(partitions),
            len(members),
            len(draining),
        )
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
            draining = frozenset(str(url) for url in data.get("draining", ()))
            standbys = {
                int(p): tuple(str(u) for u in urls) for p, urls in data.get("standbys", {}).items()
            }
        except (ValueError, AttributeError, TypeError):
            log.error(
                "an assignment without a readable owner map; forwarding is off until the next"
            )
            data, owners, draining, standbys = {}, {}, frozenset(), {}
        self.map = OwnershipMap(
            owners, self.map.generation + 1, _instances(data), draining, standbys
        )


def _unique_instances(claims: Collection[Claim]) -> dict[str, str]:
    """URL -> instance id of the claims naming an instance id no other claim names: the broker
    keeps instance ids unique among its members, so one claimed twice is a forgery (naming it
    would have a survivor remove the healthy member instead of the unreachable one)."""
    claimed = {c.url: c.instance for c in claims if c.instance is not None}
    counts = Counter(i for c in claims if (i := c.instance) is not None)
    return {url: i for url, i in claimed.items() if counts[i] == 1}


def _instances(data: object) -> dict[str, str]:
    """The URL -> instance id map of an assignment (empty from a leader older than it)."""
    raw = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {url: i for url, i in raw.items() if isinstance(url, str) and isinstance(i, str)}


def _claim(user_data: bytes | None, partitions: set[int] | None = None) -> Claim:
    """A member's claim, its lists cut to ``partitions`` (the topic's: a claim of others costs
    the leader their number at every pass); a member this version cannot read, or naming a URL
    longer than :data:`MAX_URL`, claims nothing (it still gets a share)."""
    try:
        raw = json.loads(user_data or b"{}")
        instance = raw.get("instance")
        url = str(raw.get("url", ""))
        if len(url) > MAX_URL:
            log.warning("a group member claims a URL of %d characters: read as none", len(url))
            return Claim("")
        owned = frozenset(int(p) for p in raw.get("owned", ()))
        warm = frozenset(int(p) for p in raw.get("warm", ()))
        if partitions is not None:
            owned, warm = owned & partitions, warm & partitions
        return Claim(
            url,
            owned,
            instance if isinstance(instance, str) else None,
            # Only a literal true drains: an older member (no field) or a garbled one stays.
            raw.get("draining") is True,
            warm,
        )
    except (ValueError, TypeError, AttributeError):
        return Claim("")

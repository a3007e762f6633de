"""Prometheus metrics: the names, units and labels the dashboard and alerts are built on.

All names carry the ``bridge_`` prefix and base units; counters end in ``_total``; no label ever
takes a task id. Each app owns a :class:`Metrics` with its own registry (so tests can run several
apps in one process). Gauges that describe Kafka (offsets, lag, retention headroom) are refreshed
by :meth:`Metrics.refresh_log_gauges`, which the app runs every few seconds; task counts are
computed at scrape time from the index. The full table is in docs/operations.md.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.vocabulary import TaskStatus

if TYPE_CHECKING:
    from bridge.log.indexer import Indexer
    from bridge.log.reader import Reader

__all__ = [
    "HOP_REFUSAL_REASONS",
    "KNOWN_METHODS",
    "REMOVAL_OUTCOMES",
    "Metrics",
    "StreamMetrics",
]

#: What a report of a dead owner ended in (bridge.server.failover ``RemovalOutcome``): the
#: bounded label set of ``bridge_peer_removals_total``.
REMOVAL_OUTCOMES = ("removed", "failed", "not_owner", "rate_limited", "rejoined", "off")

#: Why a peer hop was refused (bridge.server.hops ``RefusalReason``), the bounded label set of
#: ``bridge_peer_hops_refused_total`` (anything else: ``other``).
HOP_REFUSAL_REASONS = (
    "missing",
    "malformed",
    "destination",
    "signature",
    "stale",
    "replay",
    "nonces_full",
    "owner_url",
    "other",
)

#: JSON-RPC methods named in labels; anything else is counted as "other" (bounded labels).
KNOWN_METHODS = frozenset(
    {
        "server/discover",
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "tasks/get",
        "tasks/update",
        "tasks/cancel",
        "tasks/stream",
        # The Events extension's (bridge/server/events.py): forwarded to a task's owner too.
        "events/list",
        "events/poll",
        "events/stream",
        "events/subscribe",
        "events/unsubscribe",
    }
)

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_HANDOVER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
_BACKLOG_BUCKETS = (0, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 10_000, 100_000)


class _TaskCounts(Collector):
    """``bridge_tasks{status}``: tasks known to the index, by folded status (at scrape time)."""

    def __init__(self) -> None:
        self.indexer: Indexer | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "bridge_tasks", "Tasks in the seq index by status", labels=["status"]
        )
        counts = {status: 0 for status in TaskStatus}
        if self.indexer is not None:
            for idx in self.indexer.partitions.values():
                for status, count in idx.status_counts().items():
                    counts[status] += count
        for status, count in counts.items():
            family.add_metric([status.wire], count)
        yield family


class _RefusedIdentities(Collector):
    """``bridge_identity_records_refused_total``: ``task.created`` records the indexer refused
    to take an identity from (unsigned after the upgrade offset, or forged), at scrape time."""

    def __init__(self) -> None:
        self.indexer: Indexer | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "bridge_identity_records_refused",
            "task.created records that define nothing: no valid signature of the task identity",
        )
        family.add_metric([], self.indexer.refused_identities if self.indexer else 0)
        yield family


def _nothing(*_: float) -> None:
    """A report nobody counts."""


@dataclass(frozen=True, slots=True)
class StreamMetrics:
    """What a :class:`~bridge.server.streams.StreamHub` reports: the few callables it needs,
    bound once at composition (:func:`bridge.server.app.start_components`), so a hub never
    reaches into a registry or rewires anything shared. Unset reports count nothing."""

    opened_fresh: Callable[[], None] = _nothing
    opened_resume: Callable[[], None] = _nothing
    refused_gone: Callable[[], None] = _nothing
    stream_started: Callable[[], None] = _nothing
    stream_ended: Callable[[], None] = _nothing
    catchup_read: Callable[[], None] = _nothing
    seq_gap: Callable[[], None] = _nothing
    delivered: Callable[[int], None] = _nothing  # events in one write
    backlog: Callable[[int], None] = _nothing  # head seq minus the write's last seq
    latency: Callable[[float], None] = _nothing  # seconds from event to write (live)


class Metrics:
    """Every metric of one bridge process."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.streams_active = Gauge(
            "bridge_streams_active", "Open long-lived responses (stream slots)", registry=r
        )
        self.stream_opens = Counter(
            "bridge_stream_opens_total",
            "tasks/stream requests by mode: fresh, resume, gone",
            ["mode"],
            registry=r,
        )
        self.events_delivered = Counter(
            "bridge_stream_events_delivered_total", "Task events written to streams", registry=r
        )
        self.delivery_latency = Histogram(
            "bridge_stream_delivery_latency_seconds",
            "Event timestamp to SSE write of live deliveries (the oldest event of each write)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.backlog = Histogram(
            "bridge_stream_backlog_events",
            "Task head seq minus the last seq of each write to a stream",
            buckets=_BACKLOG_BUCKETS,
            registry=r,
        )
        self.catchup_reads = Counter(
            "bridge_stream_catchup_reads_total",
            "Catch-up reads from Kafka (history or after a fallback)",
            registry=r,
        )
        self.catchup_scans = Histogram(
            "bridge_stream_catchup_scan_reads",
            "Catch-up reads served by each shared Kafka scan of a partition range",
            buckets=(1, 2, 5, 10, 50, 100, 1000, 10_000),
            registry=r,
        )
        self.catchup_detached = Counter(
            "bridge_stream_catchup_detached_total",
            "Catch-up reads that fell behind their shared scan and read on alone",
            registry=r,
        )
        self.log_start_lookups = Counter(
            "bridge_reader_log_start_lookups_total",
            "Log start offset requests of the reader (shared by the reads waiting for one)",
            registry=r,
        )
        self.slow_fallbacks = Counter(
            "bridge_stream_slow_consumer_fallbacks_total",
            "Streams whose bounded queue overflowed and fell back to catch-up reads",
            registry=r,
        )
        self.seq_gaps = Counter(
            "bridge_stream_seq_gaps_total",
            "Deliveries that would have skipped a seq (canary: must stay 0)",
            registry=r,
        )
        self.indexer_lag_records = Gauge(
            "bridge_indexer_lag_records",
            "Log end offset minus the indexed-through offset",
            ["partition"],
            registry=r,
        )
        self.indexer_lag_seconds = Gauge(
            "bridge_indexer_lag_seconds",
            "Age of the oldest record not yet indexed (0 when caught up)",
            ["partition"],
            registry=r,
        )
        self.log_start_offset = Gauge(
            "bridge_log_start_offset",
            "Log start offset of the events topic partition",
            ["partition"],
            registry=r,
        )
        self.log_end_offset = Gauge(
            "bridge_log_end_offset",
            "Log end (last stable) offset of the events topic partition",
            ["partition"],
            registry=r,
        )
        self.retention_headroom = Gauge(
            "bridge_retention_headroom_seconds",
            "Age of the oldest retained event: how long a client may stay away before events_gone",
            ["partition"],
            registry=r,
        )
        self.lost_partitions = Gauge(
            "bridge_indexer_lost_partitions",
            "Partitions where retention outran the indexer (must stay 0)",
            registry=r,
        )
        self.index_writer_active = Gauge(
            "bridge_index_writer_active",
            "1 when this process persists the seq index (the writer, not fenced), else 0",
            registry=r,
        )
        self.rpc_requests = Counter(
            "bridge_rpc_requests_total",
            "JSON-RPC requests by method and outcome code",
            ["method", "code"],
            registry=r,
        )
        self.rpc_duration = Histogram(
            "bridge_rpc_request_duration_seconds",
            "Time to answer a JSON-RPC request (to the first byte for streams)",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._oldest: dict[int, tuple[int, int]] = {}  # partition -> (log start, its timestamp)
        self._rpc_children: dict[tuple[str, int | str], tuple[Counter, Histogram]] = {}
        self._forward_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._per_partition = (
            self.indexer_lag_records,
            self.indexer_lag_seconds,
            self.log_start_offset,
            self.log_end_offset,
            self.retention_headroom,
        )
        self.owned_partitions = Gauge(
            "bridge_owned_partitions",
            "Events partitions this replica owns (indexes, persists and serves)",
            registry=r,
        )
        self.events_partitions = Gauge(
            "bridge_events_partitions", "Partitions of the events topic", registry=r
        )
        self.rebalances = Counter(
            "bridge_rebalances_total", "Assignments of the replicas' group applied", registry=r
        )
        self.partitions_moved = Counter(
            "bridge_partitions_moved_total",
            "Events partitions gained or lost at a rebalance",
            ["direction"],
            registry=r,
        )
        self.forwarded = Counter(
            "bridge_forwarded_requests_total",
            "Requests forwarded to the owner of their task's partition, by outcome",
            ["method", "outcome"],
            registry=r,
        )
        self.forward_seconds = Histogram(
            "bridge_forward_seconds",
            "Time from receiving a forwarded request to the owner's response headers",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Webhooks (bridge/events_extension/delivery.py): verification challenges the throttle refused.
        self.webhook_verifications_throttled = Counter(
            "bridge_webhook_verifications_throttled_total",
            "events/subscribe verification challenges refused by the per (principal, callback "
            "host) token bucket",
            registry=r,
        )
        # Webhook events never sent because their body stays over the client profile's bound
        # (bridge/events_extension/delivery.py; the chatgpt profile's 256 KiB), abandoned as a 413.
        self.webhook_bodies_too_large = Counter(
            "bridge_webhook_bodies_too_large_total",
            "Webhook events not sent: their body exceeds the client profile's bound even reduced",
            registry=r,
        )
        # Signed hops between replicas that were refused (bridge/server/hops.py), by reason:
        # on the peer listener (a bad, stale, replayed or misaddressed hop) or before sending
        # (an owner URL from the group that is no peer listener). Every reason starts at 0.
        self.hops_refused = Counter(
            "bridge_peer_hops_refused_total",
            "Peer hops refused: received ones not believed, or owner URLs not contacted",
            ["reason"],
            registry=r,
        )
        for reason in HOP_REFUSAL_REASONS:
            self.hops_refused.labels(reason)
        # Task events in a partition their task id does not map to (bridge/log/misrouted.py):
        # a producer whose partitioner is not murmur2; they belong to no task.
        self.events_misrouted = Counter(
            "bridge_events_misrouted_total",
            "Task events indexed in a partition other than their task id's (not the task's)",
            registry=r,
        )
        # The end-to-end canary (bridge/canary.py): probes through the stream path.
        self.canary_probes = Counter(
            "bridge_canary_probes_total",
            "Canary probes with an outcome (delivered on the stream path, or lost), by partition",
            ["partition"],
            registry=r,
        )
        self.canary_lost = Counter(
            "bridge_canary_lost_total",
            "Canary probes not delivered on the stream path within canary.timeout_s",
            ["partition"],
            registry=r,
        )
        self.canary_latency = Histogram(
            "bridge_canary_latency_seconds",
            "Canary probe: from its write to Kafka to its delivery on the stream path",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Rolling updates and fail-over (docs/operations.md, the Rollouts row): how long each
        # events partition had no serving owner as this replica saw it, and how close retention
        # is to what open streams still need. Fed by sample_availability() and
        # refresh_data_loss(), which the composition runs (bridge/server/app.py).
        self.partition_unavailable_seconds = Counter(
            "bridge_partition_unavailable_seconds_total",
            "Seconds an events partition had no serving owner as this replica saw it (revoked "
            "and not yet assigned, or assigned here and still restoring)",
            ["partition"],
            registry=r,
        )
        self.partition_unavailable = Gauge(
            "bridge_partition_unavailable",
            "1 while an events partition has no serving owner as this replica sees it, else 0",
            ["partition"],
            registry=r,
        )
        self.data_loss_distance_records = Gauge(
            "bridge_data_loss_distance_records",
            "Offsets from an owned events partition's log start to the oldest position an open "
            "stream or a webhook subscription still needs (retention deletes from the log start)",
            ["partition"],
            registry=r,
        )
        self.data_loss_distance_seconds = Gauge(
            "bridge_data_loss_distance_seconds",
            "Record time from an owned events partition's log start to the oldest position an "
            "open stream or a webhook subscription still needs",
            ["partition"],
            registry=r,
        )
        self._unserved: set[int] = set()
        self._needed: set[int] = set()
        self._stamps: dict[tuple[int, int], int] = {}
        # --- crash fail-over and replay pacing (issue 30: bridge/server/suspects.py,
        # bridge/server/failover.py, the stream hub's pacing) ---
        self.peer_suspicions = Counter(
            "bridge_peer_suspicions_total",
            "Owners this replica could not connect to and answered for at once (suspected)",
            registry=r,
        )
        self.peer_removals = Counter(
            "bridge_peer_removals_total",
            "Owners whose peer port kept refusing connections, by what was done: removed from "
            "the group, failed, not_owner, rate_limited, off",
            ["outcome"],
            registry=r,
        )
        for outcome in REMOVAL_OUTCOMES:
            self.peer_removals.labels(outcome)
        self.replay_paced = Counter(
            "bridge_replay_paced_seconds_total",
            "Seconds reconnecting streams' catch-up waited for the replay pace",
            registry=r,
        )
        # --- end of the crash fail-over block ---
        # --- Partitions handed over between replicas (bridge/log/handover.py) -------------
        # Losing side: from a partition's loss to its streams ending here (once its new owner
        # serves it, or the bound). Gaining side: fence, restore and seek of a gained share.
        self.handover_seconds = Histogram(
            "bridge_partition_handover_seconds",
            "From an events partition's loss in a rebalance to the end of its streams here, by "
            "outcome (served: its new owner was seen serving it; timeout: handover.timeout_s)",
            ["outcome"],
            buckets=_HANDOVER_BUCKETS,
            registry=r,
        )
        for outcome in ("served", "timeout"):
            self.handover_seconds.labels(outcome)
        self.gain_seconds = Histogram(
            "bridge_partition_gain_seconds",
            "From an assignment to serving the events partitions it gave (fence, restore, seek)",
            buckets=_HANDOVER_BUCKETS,
            registry=r,
        )
        self.partitions_held = Gauge(
            "bridge_partitions_held",
            "Events partitions lost in a rebalance whose streams stay open here until their new "
            "owner serves them",
            registry=r,
        )
        self.standby_partitions = Gauge(
            "bridge_standby_partitions",
            "Events partitions this replica keeps a warm standby copy of the index of",
            registry=r,
        )
        self.standby_lag_records = Gauge(
            "bridge_standby_lag_records",
            "Index records the standby copies are behind their index partitions, in all",
            registry=r,
        )
        self._rebalances_seen = 0  # the indexer's count at the last report (see _moved)
        # --- end of the hand-over block ---------------------------------------------------
        self._tasks = _TaskCounts()
        r.register(self._tasks)
        self._refused_identities = _RefusedIdentities()
        r.register(self._refused_identities)

    def attach(self, indexer: Indexer) -> None:
        self._tasks.indexer = indexer
        self._refused_identities.indexer = indexer
        self.events_partitions.set(indexer.partition_count)
        self.owned_partitions.set(len(indexer.partitions))
        self._rebalances_seen = indexer.rebalances
        indexer.add_ownership_listener(lambda gained, lost: self._moved(indexer, gained, lost))

    def handed_over(self, seconds: float, served: bool) -> None:
        """A lost partition's streams ended here (its new owner serves it, or the bound)."""
        self.handover_seconds.labels("served" if served else "timeout").observe(seconds)

    def _moved(self, indexer: Indexer, gained: set[int], lost: set[int]) -> None:
        # A held partition's loss is told after its rebalance: count assignments, not calls.
        self.rebalances.inc(indexer.rebalances - self._rebalances_seen)
        self._rebalances_seen = indexer.rebalances
        self.partitions_moved.labels("gained").inc(len(gained))
        self.partitions_moved.labels("lost").inc(len(lost))
        self.owned_partitions.set(len(indexer.partitions))
        for p in lost:  # a partition's series belong to its owner now
            for gauge in self._per_partition:
                with contextlib.suppress(KeyError):
                    gauge.remove(str(p))
        self._oldest = {p: v for p, v in self._oldest.items() if p not in lost}

    def streams(self) -> StreamMetrics:
        """The client-facing hub's reports: the ``bridge_stream_*`` series."""
        return StreamMetrics(
            # labels() takes a lock and a dict lookup: once here, not on every open.
            opened_fresh=self.stream_opens.labels("fresh").inc,
            opened_resume=self.stream_opens.labels("resume").inc,
            refused_gone=self.stream_opens.labels("gone").inc,
            stream_started=self.streams_active.inc,
            stream_ended=self.streams_active.dec,
            catchup_read=self.catchup_reads.inc,
            seq_gap=self.seq_gaps.inc,
            delivered=self.events_delivered.inc,
            backlog=self.backlog.observe,
            latency=self.delivery_latency.observe,
        )

    def canary_streams(self) -> StreamMetrics:
        """The canary's hub: its streams are not clients, so the ``bridge_stream_*`` series stay
        the clients' own; only a seq gap counts (the canary is there to find one)."""
        return StreamMetrics(seq_gap=self.seq_gaps.inc)

    def forward(self, method: str, outcome: str, seconds: float | None) -> None:
        # Every forwarded request is counted: the children are looked up once (as in rpc()).
        children = self._forward_children.get((method, outcome))
        if children is None:
            label = method if method in KNOWN_METHODS else "other"
            children = (self.forwarded.labels(label, outcome), self.forward_seconds.labels(label))
            if label != "other":  # names a client chose are not remembered
                self._forward_children[(method, outcome)] = children
        children[0].inc()
        if seconds is not None:
            children[1].observe(seconds)

    def peer_removal(self, outcome: str) -> None:
        """Count a report of a dead owner by its outcome (an unknown one is not counted)."""
        if outcome in REMOVAL_OUTCOMES:
            self.peer_removals.labels(outcome).inc()

    def hop_refused(self, reason: str) -> None:
        """Count a refused peer hop (a reason outside the known set counts as ``other``)."""
        self.hops_refused.labels(reason if reason in HOP_REFUSAL_REASONS else "other").inc()

    def rpc(self, method: str, code: int | str, seconds: float) -> None:
        # labels() takes a lock and builds its key on every call: once per (method, code)
        # here, as every request (each stream open) is counted. Clients name methods, so
        # only the known ones are remembered.
        children = self._rpc_children.get((method, code))
        if children is None:
            label = method if method in KNOWN_METHODS else "other"
            children = (self.rpc_requests.labels(label, str(code)), self.rpc_duration.labels(label))
            if label != "other":
                self._rpc_children[(method, code)] = children
        children[0].inc()
        children[1].observe(seconds)

    async def refresh_log_gauges(self, indexer: Indexer, reader: Reader) -> None:
        """Offsets, lag and retention headroom of every events partition (a few Kafka calls)."""
        owned = list(indexer.partitions)
        starts = await reader.log_starts(owned)
        ends = await indexer.end_offsets()
        now = time.time()
        lost = 0
        for p in owned:
            idx = indexer.partitions.get(p)
            if idx is None or p not in starts or p not in ends:
                continue  # moved to another replica meanwhile
            label = str(p)
            start, end = starts[p], ends[p]
            self.log_start_offset.labels(label).set(start)
            self.log_end_offset.labels(label).set(end)
            lag = max(0, end - idx.through)
            self.indexer_lag_records.labels(label).set(lag)
            behind = 0.0
            if lag:
                ts = await reader.record_timestamp(p, max(idx.through, start))
                behind = max(0.0, now - ts / 1000) if ts is not None else 0.0
            self.indexer_lag_seconds.labels(label).set(behind)
            headroom = 0.0
            if end > start:
                # The oldest record changes only when the log start moves: look it up once.
                cached = self._oldest.get(p)
                ts = cached[1] if cached is not None and cached[0] == start else None
                if ts is None:
                    ts = await reader.record_timestamp(p, start)
                    if ts is not None:
                        self._oldest[p] = (start, ts)
                headroom = max(0.0, now - ts / 1000) if ts is not None else 0.0
            self.retention_headroom.labels(label).set(headroom)
            lost += idx.lost_before >= 0
        self.lost_partitions.set(lost)
        self.index_writer_active.set(1 if indexer.persist and not indexer.fenced else 0)

    def canary_probed(self, partition: int, seconds: float | None) -> None:
        """One canary probe's outcome: delivered after ``seconds``, or lost (None)."""
        label = str(partition)
        self.canary_probes.labels(label).inc()
        if seconds is None:
            self.canary_lost.labels(label).inc()
        else:
            self.canary_lost.labels(label)  # the series exists (at 0) from the first probe
            self.canary_latency.observe(seconds)

    def canary_forget(self, partition: int) -> None:
        """Drop a partition's canary series when it moves away (its new owner probes it)."""
        for counter in (self.canary_probes, self.canary_lost):
            with contextlib.suppress(KeyError):
                counter.remove(str(partition))

    # --- rolling updates: partitions without an owner, distance to data loss ------------------

    def sample_availability(
        self,
        indexer: Indexer,
        own_url: str | None,
        elapsed_s: float,
        reachable: Callable[[str], bool] = lambda url: True,
    ) -> None:
        """One look at who serves each events partition, ``elapsed_s`` after the previous one:
        a partition found unserved then adds that time to its unavailability. ``reachable(url)``
        says whether this replica can forward to an owner the group names (False while it
        suspects it: a dead owner stays named until its removal or session timeout)."""
        for p in self._unserved:
            self.partition_unavailable_seconds.labels(str(p)).inc(elapsed_s)
        unserved = {
            p for p in range(indexer.partition_count) if not _served(indexer, p, own_url, reachable)
        }
        for p in range(indexer.partition_count):
            label = str(p)
            self.partition_unavailable.labels(label).set(1 if p in unserved else 0)
            self.partition_unavailable_seconds.labels(label)  # every partition's series, from 0
        self._unserved = unserved

    async def refresh_data_loss(
        self, indexer: Indexer, reader: Reader, positions: list[tuple[str, int]]
    ) -> None:
        """Per owned events partition, the distance from its log start to the oldest position
        an open stream or a webhook subscription still needs (``positions``: task id and last
        delivered seq); with none behind its task's head, to the log end."""
        owned = sorted(indexer.partitions)
        starts = await reader.log_starts(owned)
        ends = await indexer.end_offsets()
        needed = _oldest_needed(indexer, positions)
        for p in self._needed - set(owned):  # moved away: its new owner reports it
            for gauge in (self.data_loss_distance_records, self.data_loss_distance_seconds):
                with contextlib.suppress(KeyError):
                    gauge.remove(str(p))
        for p in owned:
            if p not in starts or p not in ends:
                continue
            start, end = starts[p], ends[p]
            offset = min(max(needed.get(p, end), start), end)
            self.data_loss_distance_records.labels(str(p)).set(offset - start)
            seconds = 0.0
            if end > start:  # the needed record's time, or the newest one's when none is needed
                first = await self._timestamp(reader, p, start)
                then = await self._timestamp(reader, p, min(offset, end - 1))
                if first is not None and then is not None:
                    seconds = max(0.0, (then - first) / 1000)
            self.data_loss_distance_seconds.labels(str(p)).set(seconds)
        self._needed = set(owned)

    async def _timestamp(self, reader: Reader, partition: int, offset: int) -> int | None:
        """A record's timestamp, looked up once per (partition, offset) while it stays the one
        asked for (positions and the log start move seldom between two refreshes)."""
        key = (partition, offset)
        if key not in self._stamps:
            if len(self._stamps) >= 4 * max(1, len(self._needed)) + 16:
                self._stamps.clear()  # bounded: two lookups per partition per refresh
            found = await reader.record_timestamp(partition, offset)
            if found is None:
                return None  # not kept: asked again next time
            self._stamps[key] = found
        return self._stamps[key]


def _served(
    indexer: Indexer, partition: int, own_url: str | None, reachable: Callable[[str], bool]
) -> bool:
    """Whether ``partition`` has a serving owner as this replica sees it: itself (restored),
    or another replica the group named that it can reach (the router's view: forwarded
    there, not answered at once as unavailable)."""
    if indexer.owns(partition):
        return True
    if not indexer.group:
        return False  # a single process serves every partition once restored
    url = indexer.owner_url(partition)
    return url is not None and url != own_url and reachable(url)


def _oldest_needed(indexer: Indexer, positions: list[tuple[str, int]]) -> dict[int, int]:
    """Per owned partition, the lowest offset an open stream still has to read (from the
    task's checkpoint at or before its next seq; a stream at its task's head needs nothing)."""
    oldest: dict[int, int] = {}
    for task_id, last in positions:
        p = indexer.partition_of(task_id)
        idx = indexer.partitions.get(p)
        entry = idx.get(task_id) if idx is not None else None
        if entry is None or last + 1 >= entry.next_seq:
            continue
        checkpoint = entry.checkpoint_at_or_before(last + 1)
        offset = checkpoint[1] if checkpoint is not None else entry.first_offset
        if offset >= 0:
            oldest[p] = min(offset, oldest.get(p, offset))
    return oldest

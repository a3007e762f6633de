"""Topics as code: the layout of docs/architecture.md, created idempotently and checked for safety.

``ensure_topics`` creates what is missing and inspects what exists; ``create_layout`` does it
with an admin client of its own. It refuses (raises :class:`TopicLayoutError`) when an existing
topic would break the seq guarantee: an events topic whose ``cleanup.policy`` includes
``compact`` (compaction deletes records out of order, so counted seq would no longer match the
log), or an index topic that is not compacted (retention would delete the durable seq counts).
Other differences from the configured values are reported, never changed silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError, for_code

from bridge.config import Settings
from bridge.kafka.admin import kafka_admin

__all__ = [
    "TopicLayoutError",
    "TopicReport",
    "TopicSpec",
    "create_layout",
    "describe_topic_configs",
    "ensure_topics",
    "topic_layout",
    "topic_partition_ids",
]

#: The topics that must be compacted only, and what retention would delete from them.
_COMPACTED = {"index": "the durable seq counts", "subscriptions": "live webhook subscriptions"}

# Room for record batch overhead on top of the largest event we accept.
_RECORD_OVERHEAD = 64 * 1024


class TopicLayoutError(Exception):
    """An existing topic that the bridge must not use as it is configured."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    role: Literal["events", "index", "updates", "control", "subscriptions", "jobs"]
    partitions: int
    replication_factor: int
    configs: dict[str, str]


@dataclass
class TopicReport:
    spec: TopicSpec
    created: bool
    partitions: int
    differences: list[str] = field(default_factory=list)

    def describe(self) -> str:
        state = "created" if self.created else "exists"
        line = f"{self.spec.name} ({self.spec.role}): {state}, {self.partitions} partitions"
        if self.differences:
            line += "; differs from config: " + "; ".join(self.differences)
        return line


def topic_layout(settings: Settings, job_topics: Iterable[str] = ()) -> list[TopicSpec]:
    """The topics the bridge needs, with the configs each must have."""
    t = settings.topics
    rf = t.replication_factor
    min_isr = str(min(t.min_insync_replicas, rf))
    max_message = str(settings.tasks.max_event_bytes + _RECORD_OVERHEAD)
    events = TopicSpec(
        t.events,
        "events",
        t.partitions,
        rf,
        {
            "cleanup.policy": "delete",
            "retention.ms": str(t.retention_ms),
            "retention.bytes": str(t.retention_bytes),
            "segment.ms": str(t.segment_ms),
            "min.insync.replicas": min_isr,
            "max.message.bytes": max_message,
            "message.timestamp.type": "CreateTime",
        },
    )
    index = TopicSpec(
        t.index,
        "index",
        t.partitions,
        rf,
        {"cleanup.policy": "compact", "min.insync.replicas": min_isr, "segment.ms": "3600000"},
    )
    updates = TopicSpec(
        t.updates,
        "updates",
        t.partitions,
        rf,
        {
            "cleanup.policy": "delete",
            "retention.ms": str(t.retention_ms),
            "min.insync.replicas": min_isr,
        },
    )
    control = TopicSpec(
        t.control,
        "control",
        t.partitions,
        rf,
        {
            "cleanup.policy": "delete",
            "retention.ms": str(t.retention_ms),
            "min.insync.replicas": min_isr,
        },
    )
    # Webhook subscriptions (key = subscription id, latest record = the subscription, a
    # tombstone when it ends): compaction keeps every live one without a retention horizon.
    subscriptions = TopicSpec(
        t.subscriptions,
        "subscriptions",
        t.partitions,
        rf,
        {"cleanup.policy": "compact", "min.insync.replicas": min_isr, "segment.ms": "3600000"},
    )
    jobs = [
        TopicSpec(
            name,
            "jobs",
            t.partitions,
            rf,
            {
                "cleanup.policy": "delete",
                "retention.ms": str(t.retention_ms),
                "min.insync.replicas": min_isr,
            },
        )
        for name in job_topics
    ]
    return [events, index, updates, control, subscriptions, *jobs]


async def describe_topic_configs(
    admin: AIOKafkaAdminClient, names: list[str], *, settle_s: float = 15.0
) -> dict[str, dict[str, str]]:
    """Current configs of existing topics, ``{topic: {key: value}}``.

    A topic created a moment ago may not be known to every broker yet: retry those for up to
    ``settle_s`` seconds before giving up.
    """
    deadline = asyncio.get_running_loop().time() + settle_s
    while True:
        try:
            return await _describe_once(admin, names)
        except UnknownTopicOrPartitionError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)  # metadata propagation has no event to wait on


async def _describe_once(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    if not names:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    out: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.resources:
            error_code, error_message, _rtype, rname, entries = resource[:5]
            if error_code:
                raise for_code(error_code)(f"describe configs of {rname}: {error_message}")
            out[rname] = {entry[0]: entry[1] for entry in entries}
    return out


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    if not names:
        return {}
    counts: dict[str, int] = {}
    for topic in await admin.describe_topics(names):
        counts[_field(topic, "topic")] = len(_field(topic, "partitions"))
    return counts


async def topic_partition_ids(
    settings: Settings, topic: str, *, settle_s: float = 3.0
) -> list[int]:
    """The partition ids of ``topic``; :class:`TopicLayoutError` if it does not exist.

    A topic created a moment ago (`bridge topics create`, then `bridge serve`) may not be in
    the answering broker's metadata yet: asked again for up to ``settle_s`` seconds before the
    error. (A clean-clone CI run met it: a bridge started right after creating its topics
    refused to start.)
    """
    deadline = asyncio.get_running_loop().time() + settle_s
    async with kafka_admin(settings) as admin:
        while True:
            for entry in await admin.describe_topics([topic]):
                if _field(entry, "topic") == topic and not _field(entry, "error_code"):
                    ids = sorted(_field(p, "partition") for p in _field(entry, "partitions"))
                    if ids:
                        return ids
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)  # metadata propagation has no event to wait on
    raise TopicLayoutError(f"topic {topic!r} does not exist: run `bridge topics create` first")


def _field(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def _check_safety(spec: TopicSpec, actual: dict[str, str]) -> None:
    policies = {p.strip() for p in actual.get("cleanup.policy", "delete").split(",")}
    if spec.role == "events" and "compact" in policies:
        raise TopicLayoutError(
            f"refusing to use events topic {spec.name!r}: its cleanup.policy is "
            f"{actual.get('cleanup.policy')!r}. Compaction removes records out of order, so seq "
            "derived by counting a task's records would change. Use a topic with "
            "cleanup.policy=delete (or choose another prefix with BRIDGE_TOPICS__PREFIX)."
        )
    if spec.role in _COMPACTED and policies != {"compact"}:
        raise TopicLayoutError(
            f"refusing to use {spec.role} topic {spec.name!r}: its cleanup.policy is "
            f"{actual.get('cleanup.policy')!r}, but it must be exactly 'compact' or retention "
            f"would delete {_COMPACTED[spec.role]}."
        )


async def ensure_topics(
    admin: AIOKafkaAdminClient, settings: Settings, job_topics: Iterable[str] = ()
) -> list[TopicReport]:
    """Create the missing topics of the layout; check the existing ones. Idempotent."""
    specs = topic_layout(settings, job_topics)
    existing = set(await admin.list_topics())
    present = [s for s in specs if s.name in existing]
    configs = await describe_topic_configs(admin, [s.name for s in present])
    for spec in present:
        _check_safety(spec, configs[spec.name])

    created: set[str] = set()
    missing = [s for s in specs if s.name not in existing]
    if missing:
        new = [
            NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.configs)
            for s in missing
        ]
        response = await admin.create_topics(new, timeout_ms=30_000)
        for name, code, *rest in response.topic_errors:
            error = for_code(code)
            if code and error is not TopicAlreadyExistsError:
                message = rest[0] if rest else ""
                raise error(f"create topic {name}: {message}")
            if not code:
                created.add(name)
        # Someone else may have created one in between: check it like any existing topic.
        raced = [s for s in missing if s.name not in created]
        configs.update(await describe_topic_configs(admin, [s.name for s in raced]))
        for spec in raced:
            _check_safety(spec, configs[spec.name])

    counts = await _partition_counts(admin, [s.name for s in specs])
    reports = []
    for spec in specs:
        report = TopicReport(spec, spec.name in created, counts.get(spec.name, spec.partitions))
        if not report.created:
            report.differences = _differences(spec, configs.get(spec.name, {}), report.partitions)
        reports.append(report)
    return reports


async def create_layout(settings: Settings, job_topics: Iterable[str] = ()) -> list[TopicReport]:
    """:func:`ensure_topics` through an admin client of its own: one report per topic."""
    async with kafka_admin(settings) as admin:
        return await ensure_topics(admin, settings, job_topics)


def _differences(spec: TopicSpec, actual: dict[str, str], partitions: int) -> list[str]:
    diffs = [
        f"{key}={actual.get(key)!r} (configured {want!r})"
        for key, want in spec.configs.items()
        if actual.get(key) != want
    ]
    if partitions != spec.partitions:
        diffs.append(
            f"partitions={partitions} (configured {spec.partitions}; never change it on a live events topic)"
        )
    return diffs

"""Kafka topics for a test: small settings on a fresh topic prefix, and their layout created.

Every test (or test module) gets a prefix of its own, so tests never share topics and the
broker can be shared by parallel runs.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bridge.config import Settings, load_settings
from bridge.kafka.admin import delete_records_before
from bridge.kafka.clients import TopicPartition
from bridge.kafka.topics import create_layout
from bridge.tasks.tools import job_topics

__all__ = [
    "changed",
    "create_served_topics",
    "create_topics",
    "delete_events_before",
    "fresh_prefix",
    "make_settings",
    "merged",
]


def fresh_prefix(kind: str = "t") -> str:
    """A topic prefix no other test uses: ``<kind>-<12 hex>``."""
    return f"{kind}-{secrets.token_hex(6)}"


def make_settings(bootstrap: str, prefix: str, **overrides: Any) -> Settings:
    """Small, test-sized settings: 3 events partitions, checkpoints every 4 events, and the
    conformance tools (production offers no built-in tools by default)."""
    values: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap},
        "topics": {
            "prefix": prefix,
            "partitions": 3,
            "min_insync_replicas": 1,
        },
        "tasks": {"checkpoint_interval": 4, "max_event_bytes": 4096},
        "tool_packs": ["conformance"],
    }
    return load_settings(**merged(values, overrides))


def changed(settings: Settings, **groups: dict[str, Any]) -> Settings:
    """``settings`` with some fields of its groups replaced, unvalidated as ``model_copy``:
    ``changed(settings, tasks={"max_active_per_principal": 1})``. A name the group does not
    have is refused: ``model_copy`` would keep it beside the fields and change nothing."""
    update = {}
    for name, fields in groups.items():
        if name not in type(settings).model_fields:
            raise TypeError(f"settings have no group {name!r}")
        group = getattr(settings, name)
        unknown = sorted(set(fields) - set(type(group).model_fields))
        if unknown:
            raise TypeError(f"settings group {name!r} has no {', '.join(unknown)}")
        update[name] = group.model_copy(update=fields)
    return settings.model_copy(update=update)


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` over it, group by group: ``{"tasks": {"a": 1}}`` and
    ``{"tasks": {"b": 2}}`` give ``{"tasks": {"a": 1, "b": 2}}`` (settings are grouped)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            value = merged(out[key], value)
        out[key] = value
    return out


async def create_topics(settings: Settings, tools: Iterable[str] = ()) -> Settings:
    """The topic layout of ``settings``, with the job topics of ``tools``; returns ``settings``."""
    await create_layout(settings, [settings.topics.jobs(tool) for tool in tools])
    return settings


def create_served_topics(settings: Settings) -> None:
    """What `bridge topics create` makes: the layout and the job topics of every tool served.

    Callable from sync code, also while an event loop runs in this thread.
    """
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, create_layout(settings, job_topics(settings))).result()


async def delete_events_before(settings: Settings, partition: int, offset: int) -> None:
    """Retention by hand: the log start of events ``partition`` moves to ``offset``."""
    tp = TopicPartition(settings.topics.events, partition)
    await delete_records_before(settings, tp, offset)

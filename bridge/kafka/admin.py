"""Kafka admin operations with the bridge's settings: one client per operation, always closed.

Sits beside :mod:`bridge.kafka.clients` (which builds the admin client) and below
:mod:`bridge.kafka.topics` (the topic layout, created through :func:`kafka_admin`). It knows
topics and partitions, not tasks, seq or the layout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, RecordsToDelete

from bridge.config import Settings
from bridge.kafka.clients import KafkaError, TopicPartition, admin_client
from bridge.kafka.port import LogError

__all__ = ["add_partitions", "delete_records_before", "kafka_admin", "topic_names"]


@contextlib.asynccontextmanager
async def kafka_admin(settings: Settings) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client, closed on the way out (also when starting it failed).

    Building the client may raise ``ValueError`` (security settings aiokafka refuses) before
    anything connects.
    """
    admin = admin_client(settings)
    try:
        await admin.start()  # inside try: a failed bootstrap still releases its connections
        yield admin
    finally:
        await admin.close()


async def delete_records_before(settings: Settings, tp: TopicPartition, offset: int) -> None:
    """Kafka ``DeleteRecords``: the log start of ``tp`` moves to ``offset`` (what retention does)."""
    async with kafka_admin(settings) as admin:
        await admin.delete_records({tp: RecordsToDelete(offset)}, timeout_ms=30_000)


async def add_partitions(admin: AIOKafkaAdminClient, topic: str, total: int) -> None:
    """Grow ``topic`` to ``total`` partitions (Kafka never removes any)."""
    await admin.create_partitions({topic: NewPartitions(total)}, timeout_ms=30_000)


async def topic_names(settings: Settings, timeout_s: float) -> set[str]:
    """The cluster's topics (proves a client connects with ``settings`` and reads metadata).

    Raises :class:`~bridge.kafka.port.LogError` for Kafka's refusal and ``TimeoutError`` when
    no answer came within ``timeout_s``.
    """
    try:
        async with asyncio.timeout(timeout_s), kafka_admin(settings) as admin:
            while True:
                try:
                    return set(await admin.list_topics())
                except KafkaError as exc:
                    # The admin client asks a random known broker: one that just died is still
                    # listed until the controller fences it; ask another.
                    if not exc.retriable:
                        raise
                await asyncio.sleep(0.2)  # the retry's backoff
    except KafkaError as exc:
        raise LogError(f"{type(exc).__name__}: {exc}", kind=type(exc).__name__) from exc

"""Creating a task in the log: its ``task.created`` record, the one fact that makes it a task.

A task exists once its seq 0 is the bridge's own ``<prefix>.task.created`` event, signed: the
index takes the task's owner, creation time, ttl and poll interval from that record only when
its :data:`~bridge.log.identity.IDENTITY_HEADER` carries a valid signature of them by the
publisher's keyring (:mod:`bridge.log.identity`), and nothing written later changes them.
Every way of creating a task writes it here, so they cannot drift apart:
:meth:`bridge.tasks.service.TaskService.create` (tools/call, then a job for a worker),
:mod:`bridgedev.replay` (a recorded session, whose events the caller publishes itself) and the
canary.

This module queues no job and waits for no indexer; the callers do what comes next.
"""

from __future__ import annotations

import time

from bridge.config import ToolSpec
from bridge.log.identity import IDENTITY_HEADER, Keyring, identity_message
from bridge.log.publisher import Published, TaskEventPublisher
from bridge.log.seqindex import TaskIdentity, owner_key
from bridge.tasks.messages import owner_digest
from bridge.vocabulary import CreatedPayload, TaskEventTypes

__all__ = ["identity_header", "now_ms", "publish_created"]


def now_ms() -> int:
    """Wall-clock milliseconds: the task's ``createdMs`` and its record's timestamp."""
    return time.time_ns() // 1_000_000


async def publish_created(
    publisher: TaskEventPublisher,
    types: TaskEventTypes,
    tool: ToolSpec,
    principal: str,
    task_id: str,
    created_ms: int,
) -> Published:
    """Write ``task_id``'s ``task.created`` for ``tool``, owned by ``principal``.

    Returns once Kafka acknowledged it on all in-sync replicas. The record's timestamp is
    ``created_ms`` too, so the log and tasks/get agree on when the task began.
    """
    created = CreatedPayload(
        tool=tool.name,
        owner=owner_digest(principal),
        created_ms=created_ms,
        ttl_ms=tool.ttl_ms,
        poll_interval_ms=tool.poll_interval_ms,
    )
    signature = identity_header(publisher.keyring, types.created, task_id, created)
    return await publisher.publish(
        task_id, types.created, created.to_dict(), timestamp_ms=created_ms, headers=[signature]
    )


def identity_header(
    keyring: Keyring, event_type: str, task_id: str, created: CreatedPayload
) -> tuple[str, bytes]:
    """The record header that makes ``created`` define ``task_id`` (signed by ``keyring``)."""
    identity = TaskIdentity(
        owner_key(created.owner),
        created.created_ms,
        -1 if created.ttl_ms is None else created.ttl_ms,
        created.poll_interval_ms,
    )
    message = identity_message(event_type, task_id, identity, created.tool)
    return IDENTITY_HEADER, keyring.sign(message)

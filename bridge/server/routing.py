"""Where a request about a task is served: here, at its partition's owner, or not yet.

Where it sits: the MCP endpoint (bridge.server.http) asks :meth:`Routing.where` for every
request that names a task (:func:`~bridge.server.peers.routed_task_id`). With ``ownership =
"all"`` the answer is always here. In a group, the partition's owner is this replica (here), or
another one whose URL the last assignment named (forward there), or nobody for a moment (the
partition is moving): the request then waits for the next assignment, up to ``owner_wait_s``,
and is answered with :func:`partition_moving_error` if it is still unowned.

What it does not do: send anything (bridge.server.peers does).
"""

from __future__ import annotations

import asyncio
import contextlib

from bridge.config import Settings
from bridge.log.indexer import Indexer
from bridge.server.wire import INTERNAL_ERROR, RpcError

__all__ = ["Routing", "partition_moving_error"]

#: What a client is told to wait before retrying a request whose partition is moving.
RETRY_AFTER_MS = 1000


def partition_moving_error(task_id: str) -> RpcError:
    """The retriable answer for a task whose partition has no owner right now (HTTP 503)."""
    return RpcError(
        INTERNAL_ERROR,
        "The task's partition is moving between replicas; retry shortly",
        {"reason": "partition_moving", "taskId": task_id, "retryAfterMs": RETRY_AFTER_MS},
        http_status=503,
    )


class Routing:
    """Answers "where is this task served" from the indexer's ownership."""

    def __init__(self, settings: Settings, indexer: Indexer) -> None:
        self.settings = settings
        self.indexer = indexer
        self.own_url = settings.advertised_url

    @property
    def divided(self) -> bool:
        """Whether replicas divide the partitions (else every request is served here)."""
        return self.indexer.group

    def _owner(self, task_id: str) -> str | None:
        """None: served here; a URL: the owner; raises :class:`LookupError` while unowned."""
        partition = self.indexer.partition_of(task_id)
        if self.indexer.owns(partition):
            return None
        url = self.indexer.owner_url(partition)
        if url is None or url == self.own_url:
            # Assigned to nobody, or to this replica before it restored the partition.
            raise LookupError(partition)
        return url

    async def where(self, task_id: str) -> str | None:
        """None to serve here, or the owner's base URL; :func:`partition_moving_error` after
        waiting ``owner_wait_s`` for an owner."""
        if not self.divided:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.owner_wait_s
        while True:
            try:
                return self._owner(task_id)
            except LookupError:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise partition_moving_error(task_id) from None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self.indexer.next_rebalance()

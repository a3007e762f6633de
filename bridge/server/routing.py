"""Where a request about a task is served: here, at its partition's owner, or not yet.

Where it sits: the MCP endpoint (bridge.server.http) asks :meth:`Routing.where` for every
request that names a task (:func:`~bridge.server.peers.routed_task_id`). With ``replicas.ownership =
"all"`` the answer is always here. In a group, the partition's owner is this replica (here), or
another one whose URL the last assignment named (forward there), or nobody for a moment (the
partition is moving): the request then waits for the next assignment, up to ``replicas.owner_wait_s``,
and is answered with :func:`partition_moving_error` if it is still unowned.

Owner URLs come from the group's metadata, which any member of the consumer group writes: each
is checked against the peer settings (scheme, host, port: ``PeerSettings.origin``) before a
request goes there. A URL that fails is never contacted: the request is answered with the
retriable :func:`owner_unavailable_error`, and the refusal is counted (``on_refused``).

What it does not do: send anything (bridge.server.peers does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from bridge.config import Settings
from bridge.log.indexer import Indexer
from bridge.server.wire import INTERNAL_ERROR, RpcError

__all__ = ["Routing", "owner_unavailable_error", "partition_moving_error"]

log = logging.getLogger(__name__)

#: Owner URLs whose check is remembered (the group names one per replica; more is noise).
_CHECKED_URLS = 256

#: What a client is told to wait before retrying a request whose partition is moving.
RETRY_AFTER_MS = 1000


def partition_moving_error(task_id: str) -> RpcError:
    """The retriable answer for a task whose partition has no owner right now (HTTP 503);
    ``data.taskId`` names the task, and is left out when the request named none."""
    data: dict[str, Any] = {"reason": "partition_moving", "retryAfterMs": RETRY_AFTER_MS}
    if task_id:
        data["taskId"] = task_id
    return RpcError(
        INTERNAL_ERROR,
        "The task's partition is moving between replicas; retry shortly",
        data,
        http_status=503,
    )


def owner_unavailable_error(retry_after_s: int = RETRY_AFTER_MS // 1000) -> RpcError:
    """The retriable answer when the owner cannot be asked (HTTP 503); ``retry_after_s``: how
    long until another owner is expected to serve it (``Retry-After`` says the same)."""
    return RpcError(
        INTERNAL_ERROR,
        "The replica that owns this task did not answer; retry shortly",
        {"reason": "owner_unavailable", "retryAfterMs": max(1, retry_after_s) * 1000},
        http_status=503,
    )


class Routing:
    """Answers "where is this task served" from the indexer's ownership.

    ``on_refused`` is called with ``"owner_url"`` for each request whose owner URL is no peer
    listener of this configuration (a metric, wired at composition).
    """

    def __init__(
        self,
        settings: Settings,
        indexer: Indexer,
        on_refused: Callable[[str], object] = lambda reason: None,
    ) -> None:
        self.settings = settings
        self.indexer = indexer
        self._on_refused = on_refused
        url = settings.peers.advertised_url
        self._hosts = settings.peers.accepted_hosts(url) if url else []
        self._checked: dict[str, str | None] = {}
        self.own_url = self._origin(url) if url else None

    @property
    def generation(self) -> int:
        """The ownership map's generation: it changes with every assignment."""
        assignor = self.indexer.assignor
        return assignor.map.generation if assignor is not None else 0

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
        if url is None:
            raise LookupError(partition)  # assigned to nobody
        origin = self._origin(url)
        if origin is None:
            self._on_refused("owner_url")
            raise owner_unavailable_error()
        if origin == self.own_url:
            raise LookupError(partition)  # to this replica, before it restored the partition
        return origin

    def origin(self, url: str) -> str | None:
        """The peer origin ``url`` names (what hops go to), or None when it is no peer
        listener of ours."""
        return self._origin(url)

    def _origin(self, url: str) -> str | None:
        """The peer origin ``url`` names, or None when it is no peer listener of ours."""
        if url in self._checked:
            return self._checked[url]
        try:
            origin: str | None = self.settings.peers.origin(url, self._hosts)
        except ValueError as exc:
            origin = None
            log.warning("the group names an owner URL that is no peer listener: %s", exc)
        if len(self._checked) >= _CHECKED_URLS:
            self._checked.clear()
        self._checked[url] = origin
        return origin

    async def where(self, task_id: str) -> str | None:
        """None to serve here, or the owner's base URL; :func:`partition_moving_error` after
        waiting ``replicas.owner_wait_s`` for an owner."""
        if not self.divided:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.replicas.owner_wait_s
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

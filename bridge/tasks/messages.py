"""Messages between the bridge and job pipelines, and the task's identifiers.

* Job requests (``<prefix>.jobs.<tool>``, key = task id): what tools/call hands to a worker.
* Control messages (``<prefix>.task-control``, key = task id): cancel requests and input
  answers from clients, and the worker's own "finished" mark that stops a retried job early.

All are JSON, so any language can implement a worker. The payloads of the task's own
``task.created`` and status events live in :mod:`bridge.vocabulary`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bridge.clock import SYSTEM_ENTROPY, Entropy

__all__ = [
    "ControlMessage",
    "JobRequest",
    "iso_ms",
    "new_task_id",
    "owner_digest",
]


def new_task_id(entropy: Entropy = SYSTEM_ENTROPY) -> str:
    """A task id with 192 random bits (32 URL-safe characters), never starting with ``-``.

    Ids are typed into command lines (``bridge tail <id>``), where a leading ``-`` reads as an
    option: such draws (1 in 64) are drawn again, which keeps the id uniform over the rest
    (still more than 191 bits).
    """
    while True:
        task_id = entropy.token_urlsafe(24)
        if not task_id.startswith("-"):
            return task_id


def owner_digest(principal: str) -> str:
    """What the log stores of a principal: 128 bits of its SHA-256, never the name itself."""
    return hashlib.sha256(principal.encode("utf-8")).hexdigest()[:32]


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with milliseconds, e.g. ``2026-11-30T10:00:00.123Z``."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        dumped: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True)
        return dumped

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()


class JobRequest(_Message):
    task_id: str = Field(alias="taskId")
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    created_ms: int = Field(alias="createdMs")
    #: Answers to the tool's ``input_before`` requests (multi round-trip), if any.
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")
    #: Where the task's ``task.created`` event is: the task's events partition and offset.
    partition: int
    offset: int
    #: The task's TTL (its ``task.created`` says the same; None: unlimited): past
    #: ``created_ms + ttl_ms`` nobody can read the task, and a worker stops its job.
    ttl_ms: int | None = Field(default=None, alias="ttlMs")


class ControlMessage(_Message):
    type: Literal["cancel", "input", "finished"]
    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")

"""The sleeping agent's home directory: what it is told once, and what it keeps between runs.

* ``agent.json``: where the bridge is, the agent's bearer token, the webhook's callback URL and
  signing secret, the tool to run (written by whoever sets the agent up, mode 0600);
* ``cursors.json``: its tasks/stream cursor (:class:`~bridge.client.FileCursorStore`: the seq of
  the last event it fully processed);
* ``task.json``: the task it is waiting for; ``runs.jsonl``: one line per run (what it read).

Shared by the agent program (:mod:`bridgedev.demo.agent`, which writes the cursor, the task and the
journal) and the demo that sets it up and reads the journal (:mod:`bridgedev.demo.sleeper`); a
module of its own so that importing it does not import the program.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bridge.client import FileCursorStore

__all__ = ["AgentConfig", "AgentHome"]


@dataclass(frozen=True)
class AgentConfig:
    """What the agent is told once, when it is set up."""

    url: str
    token: str = field(repr=False)
    callback: str
    secret: str = field(repr=False)
    #: The Events extension's event type of task status changes (``<prefix>.task.updated``).
    event: str
    tool: str
    arguments: dict[str, Any]
    #: Events the first run processes before it goes to sleep.
    read_before_sleep: int


class AgentHome:
    """The agent's directory: its configuration, its cursor, its task and its run journal."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cursors = FileCursorStore(path / "cursors.json")

    def set_up(self, config: AgentConfig) -> None:
        """Write the configuration, readable by this user only (it holds a token and a secret)."""
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / "agent.json"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(config), fh)

    def config(self) -> AgentConfig:
        return AgentConfig(**json.loads((self.path / "agent.json").read_text(encoding="utf-8")))

    def remember_task(self, task_id: str) -> None:
        (self.path / "task.json").write_text(json.dumps({"taskId": task_id}), encoding="utf-8")

    def task_id(self) -> str:
        return str(json.loads((self.path / "task.json").read_text(encoding="utf-8"))["taskId"])

    def journal(self, entry: dict[str, Any]) -> None:
        with (self.path / "runs.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def runs(self) -> list[dict[str, Any]]:
        """The journal: one entry per finished run, oldest first."""
        try:
            lines = (self.path / "runs.jsonl").read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

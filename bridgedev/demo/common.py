"""What the demo's light package and its command share: the data set's path, the user's error."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_SESSION", "DemoError"]

#: The data set shipped with the repository (found from a source checkout or editable install).
DEFAULT_SESSION = Path(__file__).resolve().parents[2] / "data" / "agent-session.jsonl"


class DemoError(Exception):
    """A problem the user can fix (busy port, auth mode, missing data set...)."""

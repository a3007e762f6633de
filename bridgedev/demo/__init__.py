"""The reviewer demo (``bridge demo``): a recorded agent session, streamed through real Kafka.

:func:`demo_command` brings up Kafka (the configured cluster, else the local broker), the topics
and the bridge (in this process, with workers, on a socket bound up front), then runs the
narrated walkthrough of SEP-2694 (:mod:`bridgedev.demo.walkthrough`, printed by
:mod:`bridgedev.demo.narrator`): a live stream, a disconnect and resume with ``after``, a late
joiner, a second writer that knows nothing of MCP (kcat), ``events_gone`` after forced
retention, and an agent process that sleeps until a webhook wakes it (the Events extension's
``events/subscribe``; :mod:`bridgedev.demo.sleeper`). Every step checks its own outcome and prints
PASS or FAIL; see ``docs/demo.md``.

The bridge authenticates with a bearer token made for the run (webhooks need an authenticated
principal): every client of the walkthrough presents it, and the demo prints it for the
commands a reviewer tries afterwards.

This package's own import is light: the sleeping agent runs as ``python -m bridgedev.demo.agent``,
twice per demo, and should load the MCP client only, not the bridge (:mod:`bridgedev.demo.command`
is imported when the demo runs). The session file format and the replay live in
:mod:`bridgedev.replay`. The demo is an application: nothing in the library imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridgedev.demo.common import DEFAULT_SESSION, DemoError

if TYPE_CHECKING:
    from bridge.config import Settings

__all__ = ["DEFAULT_SESSION", "DemoError", "demo_command"]


def demo_command(
    settings: Settings,
    *,
    exit_after: bool,
    speed: float,
    data: str | Path | None,
    progress: Callable[[str], None],
    create_topics: Callable[[Settings], Coroutine[Any, Any, list[str]]],
) -> int:
    """``bridge demo``: exit status 0 when every step passed, 1 when one failed, 130 when
    interrupted. ``create_topics`` creates or checks the topic layout (one line per topic)."""
    from bridgedev.demo import command  # the whole bridge: loaded only when the demo runs

    return command.demo_command(
        settings,
        exit_after=exit_after,
        speed=speed,
        data=data,
        progress=progress,
        create_topics=create_topics,
    )

"""The tool catalog: which tools this deployment offers, as data.

The tools of the configured built-in packs (``Settings.tool_packs``; none by default, so a
production install offers no test fixtures) and those declared in the settings, in that order;
a declared tool replaces a pack tool of the same name. The server lists and validates calls
against this catalog; workers run the same packs' handlers.
"""

from __future__ import annotations

from bridge.config import Settings, ToolSpec

__all__ = ["job_topics", "tool_catalog"]


def tool_catalog(settings: Settings) -> list[ToolSpec]:
    """The tools of the configured packs, then those declared in the settings."""
    from bridge.workers.packs import pack_tools  # the packs' specs (their handlers stay there)

    tools: dict[str, ToolSpec] = {}
    for tool in [*pack_tools(settings.tool_packs), *settings.tools]:
        tools[tool.name] = tool
    return list(tools.values())


def job_topics(settings: Settings) -> list[str]:
    """The job topic of every tool in the catalog (what ``bridge topics create`` makes)."""
    return [tool.job_topic or settings.topics.jobs(tool.name) for tool in tool_catalog(settings)]

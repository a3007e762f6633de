"""Server-Sent Events in tests: a whole body parsed at once, or the events of a streaming reply.

The parser is the conformance suite's (``conformance.wire``, written from the HTML standard and
self-contained so that the suite runs against any server); this module only adapts it to
httpx replies and JSON-RPC messages. JSON is parsed strictly: ``NaN`` and ``Infinity`` are
never valid on the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
from conformance.wire import SseEvent, SseParser, iter_sse, loads

__all__ = ["SseEvent", "parse_sse", "sse_events", "sse_messages"]


def parse_sse(text: str) -> list[SseEvent]:
    """The events of a complete SSE body (an event not ended by a blank line included)."""
    parser = SseParser()
    events = [parser.feed(line) for line in [*text.splitlines(), ""]]
    return [event for event in events if event is not None]


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a complete SSE body, in order."""
    return [loads(event.data) for event in parse_sse(text)]


def sse_events(reply: httpx.Response, comments: list[str] | None = None) -> AsyncIterator[SseEvent]:
    """The events of a streaming reply as they arrive; comment lines (``: keep-alive``) are
    appended to ``comments`` as they are read, without the colon."""
    return iter_sse(reply.aiter_lines(), comments)  # type: ignore[no-any-return]

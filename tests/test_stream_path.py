"""The stream path a newcomer follows: the modules one event of a tasks/stream passes through
from its record's decode to the socket write, history and live (docs/architecture.md, "The
stream path").

Counted as the call path itself: a profile hook on the bridge's server thread (an in-memory
bridge on real HTTP) walks the stack when the record is decoded, from the decode up to the
frame that writes to the socket (``SseResponse.__call__``). Helpers the path calls and leaves
(the decode's checks, the metrics' samples) are not on it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge
from support.layout import fresh_prefix, make_settings
from support.mcp import StreamRead, cancel, long_task, read_stream
from support.waits import wait_until

import bridge
from bridge.log.publisher import TaskEventPublisher

BRIDGE = str(Path(bridge.__file__).parent) + "/"
#: The frame that writes a stream's bytes to the socket (its callers only started it).
WRITER = "SseResponse.__call__"
#: docs/architecture.md, "The stream path": change both together.
HISTORY = ["envelope", "log/records", "log/reader", "server/streams", "server/sse"]
LIVE = ["envelope", "log/records", "log/seqtail", "server/streams", "server/sse"]


class CallPath:
    """A profile hook that records the call path at the first call of ``function`` in
    ``module`` (a path under bridge/) once armed."""

    def __init__(self) -> None:
        self.trigger: tuple[str, str] | None = None
        self.path: list[str] | None = None
        self.found = threading.Event()

    def arm(self, module: str, function: str) -> None:
        self.path, self.trigger = None, (BRIDGE + module + ".py", function)
        self.found.clear()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        trigger = self.trigger
        if event != "call" or trigger is None or self.found.is_set():
            return
        code = frame.f_code
        if code.co_name == trigger[1] and code.co_filename == trigger[0]:
            self.path = list(_modules(frame))
            self.found.set()


def _modules(frame: FrameType | None) -> Iterator[str]:
    """The bridge modules of the frames from ``frame`` up to the writer, each once, in order."""
    seen: set[str] = set()
    while frame is not None and frame.f_code.co_filename.startswith(BRIDGE):
        module = frame.f_code.co_filename[len(BRIDGE) : -len(".py")]
        if module not in seen:
            seen.add(module)
            yield module
        if frame.f_code.co_qualname == WRITER:
            return
        frame = frame.f_back
    yield "<the stack left bridge/ before reaching the writer>"


@pytest.fixture
def traced() -> Iterator[tuple[MemoryBridge, CallPath]]:
    hook = CallPath()
    with memory_bridge(make_settings(NO_BROKER, fresh_prefix("p"))) as running:

        async def install(profile: Any) -> None:
            sys.setprofile(profile)  # on the server's thread, where the streams run

        running.call(install(hook))
        try:
            yield running, hook
        finally:
            running.call(install(None))


async def test_one_event_passes_through_five_modules_from_its_decode_to_the_socket_write(
    traced: tuple[MemoryBridge, CallPath],
) -> None:
    running, hook = traced
    task = await long_task(running.url)
    async with TaskEventPublisher(running.settings, log=running.log) as pub:
        for i in range(3):
            await pub.publish(task, "com.example.step", {"i": i})
    # History: a tasks/stream's read splices the usual records (their decode).
    hook.arm("envelope", "splice_usual")
    out = StreamRead()
    reading = asyncio.create_task(read_stream(running.url, task, into=out))
    try:
        await wait_until(hook.found.is_set, what="the history read's decode")
        assert hook.path == HISTORY, "update docs/architecture.md#the-stream-path too"
        await wait_until(lambda: len(out.events) >= 4, what="the history delivered")
        # Live: an event written while the stream waits, decoded at its first use.
        hook.arm("envelope", "decode_event")
        async with TaskEventPublisher(running.settings, log=running.log) as pub:
            await pub.publish(task, "com.example.step", {"i": 99})
        await wait_until(hook.found.is_set, what="the live event's decode")
        assert hook.path == LIVE, "update docs/architecture.md#the-stream-path too"
        hook.trigger = None
        await cancel(running.url, task)
        async with asyncio.timeout(60):
            await reading
    finally:
        reading.cancel()
    assert out.result == {"resultType": "complete"}
    assert len(HISTORY) <= 6 and len(LIVE) <= 6  # issue 29: a newcomer follows at most six

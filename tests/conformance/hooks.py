"""The hooks protocol: how the suite makes a server under test produce what it checks.

A server's tasks have whatever events its tools produce; a black-box suite needs a task that
stays running until told otherwise, a way to make it emit events, and (for the retention
clauses) a way to force old events out. An implementation plugs in by a module, passed as
``--hooks package.module``, that defines::

    def make_hooks(server: ServerUnderTest) -> Hooks: ...

returning a subclass of :class:`Hooks` (below). Every method is a coroutine except
:meth:`Hooks.emitted_index`. Methods the server cannot support raise :class:`NotSupported`
(the tests that need them are then skipped with the message as reason).

The module may also define ``KNOWN_FAILURES = {"test_name": "reason"}``: those tests are
marked ``xfail`` (not strict: a bug fixed while others still work on the code base must not
break their runs); the report then shows the clause as XPASS, and the entry should go.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pytest

__all__ = [
    "DEFAULT_HOOKS",
    "OUTCOMES",
    "Hooks",
    "NotSupported",
    "ServerUnderTest",
    "load_hooks",
]

#: Our bridge's hooks (module path, as passed to ``--hooks``).
DEFAULT_HOOKS = "conformance.bridge_hooks"

#: The terminal statuses :meth:`Hooks.finish` can be asked for.
OUTCOMES = ("completed", "failed", "cancelled")


class NotSupported(Exception):
    """The hook cannot do this against this server; the message is the skip reason."""


@dataclass(frozen=True)
class ServerUnderTest:
    """What the suite knows of the server; ``details`` is implementation-specific."""

    url: str
    auth_token: str | None = None
    other_auth_token: str | None = None
    #: True when the suite started the server itself (our bridge, on the test Kafka).
    started_by_suite: bool = False
    details: Mapping[str, Any] = field(default_factory=dict)

    def not_applicable(self, reason: str) -> NoReturn:
        """A check this server cannot take part in: skipped for a foreign server; a failure for
        our own bridge, the reference implementation, which must support every check."""
        if self.started_by_suite:
            pytest.fail(f"our bridge must support this check: {reason}", pytrace=False)
        pytest.skip(reason)


class Hooks:
    """Base class of an implementation's hooks. Override the first four; the rest are optional.

    The suite calls the methods from one asyncio event loop (the session's), one test at a time.
    """

    def __init__(self, server: ServerUnderTest) -> None:
        self.server = server

    async def start(self) -> None:
        """Called once before the first test."""

    async def close(self) -> None:
        """Called once after the last test."""

    async def create_task(self) -> str:
        """Create a task (as ``server.auth_token``'s principal) that stays non-terminal until
        :meth:`finish`; return its task id. The task may emit events of its own."""
        raise NotImplementedError

    async def emit(self, task_id: str, n: int) -> None:
        """Make the task emit ``n`` more events, in order. Return once the server has accepted
        them (they may reach streams a moment later). The k-th event emitted for a task over
        all calls (k = 0, 1, …) must be recognisable by :meth:`emitted_index`."""
        raise NotImplementedError

    def emitted_index(self, event: Mapping[str, Any]) -> int | None:
        """For the ``params`` of a ``notifications/tasks/event``: k if it is the k-th event
        :meth:`emit` produced for its task, else None (the task's own events)."""
        raise NotImplementedError

    async def finish(self, task_id: str, outcome: str | None = None) -> None:
        """Make the task reach a terminal status: ``outcome`` (one of :data:`OUTCOMES`), or any
        terminal status when None. Raise :class:`NotSupported` for an outcome the hooks cannot
        bring about (the tests of that ending are then skipped). May return before the status
        is visible: the suite then polls tasks/get."""
        raise NotImplementedError

    async def delete_before(self, task_id: str, seq: int) -> None:
        """Force retention: afterwards the task's events with seq < ``seq`` are gone and those
        from ``seq`` on are retained. The suite calls it only for events it has received; a
        ``seq`` past the task's last event means "all of them"."""
        raise NotSupported("this server's hooks cannot force event retention (delete_before)")

    async def emit_careless(self, task_id: str) -> None:
        """Make the task's producers write what a careless producer might: an unprefixed
        (reserved) event type, a payload that is not an object, bytes that are no event at all.
        Whatever the server makes of them, it must deliver only vendor-prefixed types with
        object payloads. Without it that test is skipped."""
        raise NotSupported("this server's hooks cannot write careless events (emit_careless)")

    async def emit_raw(
        self,
        task_id: str,
        values: Sequence[bytes],
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Write ``values`` as the task's next records, byte for byte, as a producer outside the
        server could (for our bridge: Kafka records on the events topic, with ``headers``).

        The suite passes JSON envelopes ``{"type": ..., "payload": ...}`` whose JSON parses but
        cannot be written back (``1e999``, a lone surrogate escape, 5000 nested arrays, a
        5000-digit integer), records larger than the server's limit, and arbitrary bytes; hooks
        of a server with another record format may translate the envelopes. Each value must
        become one event of the task (one seq), whatever the server makes of its content."""
        raise NotSupported("this server's hooks cannot write raw records (emit_raw)")

    async def create_quiet_task(self) -> str:
        """Like :meth:`create_task`, but the task emits nothing by itself once this returns
        (only :meth:`emit` adds events). Used to check a stream of a task whose events are all
        gone; without it that test is skipped."""
        raise NotSupported("this server's hooks cannot create a quiet task (create_quiet_task)")


def load_hooks(module_path: str, server: ServerUnderTest) -> Hooks:
    module = importlib.import_module(module_path)
    factory = getattr(module, "make_hooks", None)
    if not callable(factory):
        raise TypeError(f"hooks module {module_path!r} has no make_hooks(server) function")
    hooks = factory(server)
    if not isinstance(hooks, Hooks):
        raise TypeError(
            f"{module_path}.make_hooks returned {type(hooks).__name__}, not a "
            "conformance.hooks.Hooks subclass"
        )
    return hooks


def known_failures(module_path: str) -> dict[str, str]:
    try:
        module = importlib.import_module(module_path)
    except ImportError:
        return {}
    found = getattr(module, "KNOWN_FAILURES", {})
    return dict(found) if isinstance(found, Mapping) else {}

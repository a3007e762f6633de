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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pytest

__all__ = ["DEFAULT_HOOKS", "Hooks", "NotSupported", "ServerUnderTest", "load_hooks"]

#: Our bridge's hooks (module path, as passed to ``--hooks``).
DEFAULT_HOOKS = "conformance.bridge_hooks"


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

    #: How the server maps SEP-2694's "connection" (one active stream per task per connection)
    #: onto Streamable HTTP, where every request is its own HTTP exchange:
    #: ``"principal"``: requests with the same credentials are one connection (our bridge);
    #: ``None``: the server defines no such scope (the one-stream tests are skipped).
    connection_scope: str | None = "principal"

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

    async def finish(self, task_id: str) -> None:
        """Make the task reach a terminal status (completed, failed or cancelled). May return
        before the status is visible: the suite then polls tasks/get."""
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

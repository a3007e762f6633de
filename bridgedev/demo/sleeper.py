"""The sleeping agent, run end to end: the agent processes, the receiver, and what happened.

:class:`SleepingAgent` sets up the agent's home (:mod:`bridgedev.demo.agent`), serves the webhook
receiver (:mod:`bridgedev.demo.receiver`) on loopback, and starts the agent as a separate process.
The agent starts a long task, subscribes a webhook for its updates, processes a few events and
exits; when the task ends the bridge POSTs the update to the receiver, which has the agent
started again (after the previous run exited, never beside it). Then a forged copy of that
delivery is posted, to show the receiver refuses it. :meth:`SleepingAgent.run` returns a
:class:`SleepOutcome` with the facts to check; it checks nothing and prints nothing itself
(its ``note`` callback gets every line the agent processes print, and the milestones).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bridge.component import cancel_and_wait
from bridgedev.demo.agenthome import AgentConfig, AgentHome
from bridgedev.demo.receiver import Delivery, ReceiverTls, Wake, WebhookReceiver, serve_https

__all__ = ["AgentRun", "SleepOutcome", "SleepingAgent", "new_webhook_secret"]

#: How long one agent process may run before it is stopped (it needs a few seconds).
RUN_BOUND_S = 60.0


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


@dataclass
class AgentRun:
    """One agent process: which run, its pid, when it started and exited (monotonic)."""

    kind: str
    pid: int
    started: float
    ended: float | None = None
    returncode: int | None = None


@dataclass
class SleepOutcome:
    """What happened, for the step's checks and the tests."""

    task_id: str
    runs: list[AgentRun]
    #: What each agent run wrote to its journal (``runs.jsonl`` in its home).
    journal: list[dict[str, Any]]
    deliveries: list[Delivery]
    #: The HTTP status the receiver answered to a forged copy of the waking delivery.
    forged_status: int | None = None
    wakes: list[Wake] = field(default_factory=list)

    @property
    def waking(self) -> Delivery | None:
        """The delivery that woke the agent."""
        return next((d for d in self.deliveries if d.wake is not None), None)

    def run(self, kind: str) -> AgentRun | None:
        """The agent process of ``kind`` (``start`` or ``wake``)."""
        return next((r for r in self.runs if r.kind == kind), None)

    def journal_of(self, kind: str) -> dict[str, Any]:
        """What the agent's ``kind`` run journaled (empty if it journaled nothing)."""
        return next((j for j in self.journal if j.get("run") == kind), {})


class SleepingAgent:
    """The story of step 6 (see the module docstring)."""

    def __init__(
        self,
        home: Path,
        tls: ReceiverTls,
        config: Callable[[str, str], AgentConfig],
        *,
        note: Callable[[str, str], None],
    ) -> None:
        """``config(callback, secret)`` gives the agent's configuration once the receiver's URL
        is known; ``note(who, text)`` gets every line the agent processes print (``who`` is
        ``pid N``) and the milestones (``demo``, ``receiver``)."""
        self.home = AgentHome(home)
        self.tls = tls
        self.make_config = config
        self.note = note
        self.runs: list[AgentRun] = []
        self.wakes: list[Wake] = []
        self._woken_run: asyncio.Task[AgentRun] | None = None
        self._woke = asyncio.Event()
        self._idle = asyncio.Lock()  # one agent process at a time

    async def run(self, wake_bound_s: float) -> SleepOutcome:
        """The whole story; ``wake_bound_s`` bounds the wait for the webhook and the woken run."""
        loop = asyncio.get_running_loop()
        secret = new_webhook_secret()

        def wake(w: Wake) -> None:  # called in the receiver's thread
            loop.call_soon_threadsafe(self._woken, w)

        receiver = WebhookReceiver(secret, wake)
        with serve_https(receiver, self.tls) as callback:
            self.home.set_up(self.make_config(callback, secret))
            try:
                first = await self._launch("start")
                self.note(
                    "demo",
                    f"the agent (pid {first.pid}) has exited: no agent process runs now; the "
                    "task goes on",
                )
                await self._until_woken_run_ended(wake_bound_s, receiver)
                forged = await self._post_forged(receiver, callback)
            finally:
                await cancel_and_wait(self._woken_run)
        return SleepOutcome(
            self.home.task_id(),
            self.runs,
            self.home.runs(),
            list(receiver.deliveries),
            forged,
            list(self.wakes),
        )

    async def _until_woken_run_ended(self, bound_s: float, receiver: WebhookReceiver) -> None:
        try:
            async with asyncio.timeout(bound_s):
                await self._woke.wait()
        except TimeoutError:
            kinds = [d.kind for d in receiver.deliveries]
            raise TimeoutError(
                f"no webhook woke the agent within {bound_s:.0f} s (the receiver got: {kinds})"
            ) from None
        assert self._woken_run is not None
        await self._woken_run  # bounded by RUN_BOUND_S

    def _woken(self, wake: Wake) -> None:
        """The receiver asks for the agent (from its thread, through the loop)."""
        self.wakes.append(wake)
        self.note(
            "receiver",
            f"signed webhook verified: task {wake.task_id} is {wake.status} (seq {wake.seq}) → "
            "starts the agent again",
        )
        if self._woken_run is None:  # one wake-up is the whole story: the task has ended
            self._woken_run = asyncio.create_task(self._launch("wake", wake), name="agent-wake")
            self._woke.set()

    async def _launch(self, kind: str, wake: Wake | None = None) -> AgentRun:
        """Start ``python -m bridgedev.demo.agent kind`` once no other run is alive; wait for it."""
        args = [sys.executable, "-m", "bridgedev.demo.agent", kind, "--home", str(self.home.path)]
        if wake is not None:
            args += ["--task", wake.task_id, "--seq", str(wake.seq), "--status", wake.status]
        async with self._idle:
            proc = await asyncio.create_subprocess_exec(
                *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            run = AgentRun(kind, proc.pid, time.monotonic())
            self.runs.append(run)
            try:
                async with asyncio.timeout(RUN_BOUND_S):
                    await self._relay(kind, proc)
                    run.returncode = await proc.wait()
            finally:
                await _stopped(proc)
            run.ended = time.monotonic()
        if run.returncode != 0:
            raise RuntimeError(f"the agent's {kind} run exited with status {run.returncode}")
        return run

    async def _relay(self, kind: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            self.note(f"pid {proc.pid}", raw.decode(errors="replace").rstrip())

    async def _post_forged(self, receiver: WebhookReceiver, callback: str) -> int | None:
        """Post the waking delivery again with its signature but another body: the receiver
        must refuse it (and wake nobody)."""
        waking = next((d for d in receiver.deliveries if d.wake is not None), None)
        if waking is None:
            return None
        forged = _forged(waking.body)
        headers = {k: v for k, v in waking.headers.items() if k.lower().startswith("webhook-")}
        headers["Content-Type"] = "application/json"
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        async with httpx.AsyncClient(verify=context, trust_env=False) as http:
            reply = await http.post(callback, content=forged, headers=headers)
        self.note(
            "demo",
            "the same delivery forged (status changed, its signature headers kept) → "
            f"HTTP {reply.status_code}",
        )
        return reply.status_code


def _forged(body: bytes) -> bytes:
    """``body`` with its task status changed: what a forger would send to mislead the agent."""
    message = json.loads(body)
    message["data"]["status"] = "failed" if message["data"]["status"] != "failed" else "completed"
    return json.dumps(message, separators=(",", ":")).encode()


async def _stopped(proc: asyncio.subprocess.Process) -> None:
    """An agent process that outlived its bound (or an interrupted step) is stopped."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        async with asyncio.timeout(5):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

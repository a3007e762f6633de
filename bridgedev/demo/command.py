"""``bridge demo`` itself: Kafka, topics, the bridge in this process, the steps, the exit status.

Imported by :func:`bridgedev.demo.demo_command` only when the demo runs (it loads the whole
bridge); see :mod:`bridgedev.demo` for what the demo shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.component import cancel_and_wait, stop_signal
from bridge.config import AuthSettings, Settings, WebhookKeySettings
from bridge.log.publisher import TaskEventPublisher
from bridge.server.runner import AppServer, ServerExited, bridge_server
from bridge.workers.inprocess import run_workers_in_process
from bridgedev.demo.common import DEFAULT_SESSION, DemoError
from bridgedev.demo.narrator import Narrator
from bridgedev.demo.receiver import LOOPBACK, ReceiverTls, throwaway_tls
from bridgedev.demo.walkthrough import STEP_BOUND_S, Step, StepFailed, Walkthrough
from bridgedev.replay import SessionEvent, load_session

__all__ = ["demo_command"]

log = logging.getLogger(__name__)

#: Bound of the bridge's start (the indexer catches up with the log first).
START_BOUND_S = 180.0
#: The principal of the demo's token: every task of the walkthrough belongs to it.
DEMO_PRINCIPAL = "demo"


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
    if speed <= 0:
        raise DemoError("--speed must be more than 0 (the live steps need pacing)")
    path = Path(data) if data is not None else _default_data()
    session = load_session(path)
    settings = _settings_for_demo(settings, progress)
    for line in asyncio.run(create_topics(settings)):
        progress(line)
    relative = os.path.relpath(path)
    shown = relative if not relative.startswith("..") else str(path)
    token = secrets.token_urlsafe(24)  # this run's only credential: never a fixed default
    with tempfile.TemporaryDirectory(prefix="bridge-demo-") as workdir, _narration_only(settings):
        tls = throwaway_tls(Path(workdir))
        demo = _Demo(
            _with_auth_and_webhooks(settings, token, tls, Path(workdir)), token, tls, Path(workdir)
        )
        return asyncio.run(_run_demo(demo, session, shown, speed, exit_after))


def _default_data() -> Path:
    if not DEFAULT_SESSION.is_file():
        raise DemoError(
            f"the data set {DEFAULT_SESSION} is missing (bridge demo runs from a source checkout);"
            " pass --data FILE"
        )
    return DEFAULT_SESSION


def _settings_for_demo(settings: Settings, progress: Callable[[str], None]) -> Settings:
    """The configured cluster, else the long-lived local broker; the demo pack's tools served."""
    if settings.auth.mode != "none":
        raise DemoError(
            "bridge demo runs the bridge with a bearer token of its own (made for the run); "
            f"unset BRIDGE_AUTH__MODE (it is {settings.auth.mode!r})"
        )
    if not settings.kafka.bootstrap_servers:
        from bridgedev.kafka import start_local_detached

        progress("starting the local Kafka broker (the first start downloads ~45 MB of jars)")
        info = start_local_detached(settings, progress=progress)
        kafka = settings.kafka.model_copy(update={"bootstrap_servers": info.bootstrap_servers})
        settings = settings.model_copy(update={"kafka": kafka})
    packs = list(dict.fromkeys([*settings.tool_packs, "demo"]))
    return settings.model_copy(update={"tool_packs": packs})


def _with_auth_and_webhooks(
    settings: Settings, token: str, tls: ReceiverTls, workdir: Path
) -> Settings:
    """Bearer auth with the run's one token, and webhooks to the demo's loopback receiver:
    its CA trusted, loopback allowed (nothing else is added to what the SSRF rules allow), the
    secrets sealed by a key made for the run (unless one is configured)."""
    auth = AuthSettings(mode="bearer", tokens={token: DEMO_PRINCIPAL})
    allow = list(dict.fromkeys([*settings.webhooks.allowlist, f"{LOOPBACK}/32"]))
    keys = settings.webhooks.keys
    if keys.file is None:
        keys = WebhookKeySettings(file=workdir / "webhook-keys.json", create=True)
    webhooks = settings.webhooks.model_copy(
        update={"allowlist": allow, "ca_file": tls.ca_file, "keys": keys}
    )
    return settings.model_copy(update={"auth": auth, "webhooks": webhooks})


@dataclass(frozen=True)
class _Demo:
    """The run's settings and what was made for it: the token, the receiver's TLS, a workdir."""

    settings: Settings
    token: str = field(repr=False)
    tls: ReceiverTls
    workdir: Path


@contextlib.contextmanager
def _narration_only(settings: Settings) -> Iterator[None]:
    """The narration is the output: the bridge's INFO logs would drown it."""
    quiet = settings.log_level == "INFO"
    if quiet:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        yield
    finally:
        if quiet:
            logging.getLogger().setLevel(logging.INFO)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket up front, so a busy port is a clear error, not a uvicorn exit."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise DemoError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass --port or set "
            "BRIDGE_SERVER__PORT"
        ) from None
    return sock


def _url_of(settings: Settings, sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown_host = settings.server.host if settings.server.host not in ("0.0.0.0", "::") else host
    return f"http://{shown_host}:{port}/mcp"


# --- the run -----------------------------------------------------------------------------------


async def _run_demo(
    demo: _Demo, session: list[SessionEvent], source: str, speed: float, exit_after: bool
) -> int:
    settings = demo.settings
    say = Narrator(sys.stdout)
    stop = stop_signal()  # the demo handles SIGINT/SIGTERM: a step is interrupted, not killed
    sock = _listen(settings.server.host, settings.server.port)
    url = _url_of(settings, sock)
    server = bridge_server(
        settings,
        companions=[run_workers_in_process],
        sock=sock,
        quiet=True,
        handle_signals=False,
    )
    say.title("SEP-2694 resumable task event streams: the reviewer demo")
    say.say(f"Kafka: {settings.kafka.bootstrap_servers} · topics {settings.topics.prefix}.*")
    say.say(
        f"Auth: bearer. The demo token of this run (principal {DEMO_PRINCIPAL!r}; every client "
        f"below presents it; it dies with the run): {demo.token}"
    )
    try:
        await _start_bridge(server, settings, url, say)
        async with TaskEventPublisher(settings) as publisher:
            walk = Walkthrough(
                settings=settings,
                publisher=publisher,
                url=url,
                session=session,
                source=source,
                speed=speed,
                workdir=demo.workdir,
                say=say,
                token=demo.token,
                principal=DEMO_PRINCIPAL,
                tls=demo.tls,
            )
            code = await _run_steps(walk, say, stop, server)
            if code == 0 and not exit_after:
                _suggest_next(say, url, walk.task_id, source, demo.token)
                await _until_done_or_stopped(stop, server.task)
    finally:
        await server.close()
    if code == 0 and not exit_after:
        say.say("bridge stopped")
    return code


async def _start_bridge(server: AppServer, settings: Settings, url: str, say: Narrator) -> None:
    """Start the bridge and wait until it is ready (its indexer has caught up), bounded."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(START_BOUND_S):
            await server.start()
    except TimeoutError:
        raise DemoError(f"the bridge was not ready within {START_BOUND_S:.0f} s") from None
    except ServerExited:
        raise DemoError("the bridge stopped while starting (see the log above)") from None
    say.say(
        f"bridge: ready in {time.monotonic() - started:.1f} s at {url} (in-process, with workers "
        f"for the tool packs {', '.join(settings.tool_packs)})"
    )


async def _run_steps(
    walk: Walkthrough, say: Narrator, stop: asyncio.Event, server: AppServer
) -> int:
    """Run the steps in order until one fails; the exit status (0, 1, or 130 if interrupted)."""
    steps = walk.steps()
    began = time.monotonic()
    passed = 0
    try:
        for number, step in enumerate(steps, 1):
            if not await _run_step(number, len(steps), step, say, stop, server):
                break
            passed += 1
    finally:
        await walk.close()
    elapsed = time.monotonic() - began
    if passed == len(steps):
        say.title(f"All {len(steps)} steps passed in {elapsed:.1f} s.")
        return 0
    say.title(
        f"{passed} of {len(steps)} steps passed; step {passed + 1} failed "
        f"({elapsed:.1f} s). Nothing below it ran."
    )
    return 130 if stop.is_set() else 1


async def _run_step(
    number: int, total: int, step: Step, say: Narrator, stop: asyncio.Event, server: AppServer
) -> bool:
    """One step, bounded, until it ends, the user interrupts, or the bridge stops: passed?"""
    title, run = step
    say.header(number, total, title)
    runner = asyncio.create_task(_bounded(run()))
    await _until_done_or_stopped(stop, runner, server.task)
    if not runner.done():
        await cancel_and_wait(runner)
        say.failed(number, "interrupted" if stop.is_set() else "the bridge stopped")
        return False
    try:
        summary = runner.result()
    except (StepFailed, AssertionError) as exc:
        say.failed(number, str(exc) or type(exc).__name__)
        return False
    except Exception as exc:
        log.debug("step %d failed", number, exc_info=True)
        say.failed(number, f"{type(exc).__name__}: {exc}")
        return False
    say.passed(number, summary)
    return True


async def _bounded(step: Awaitable[str]) -> str:
    try:
        async with asyncio.timeout(STEP_BOUND_S):
            return await step
    except TimeoutError:
        raise StepFailed(f"did not finish within {STEP_BOUND_S:.0f} s") from None


async def _until_done_or_stopped(stop: asyncio.Event, *tasks: asyncio.Task[Any] | None) -> None:
    """Wait until one of ``tasks`` has ended or ``stop`` is set (SIGINT/SIGTERM)."""
    stopping = asyncio.create_task(stop.wait())
    try:
        watched = {stopping, *(task for task in tasks if task is not None)}
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(stopping)


def _suggest_next(say: Narrator, url: str, task_id: str, source: str, token: str) -> None:
    tail_url = "" if url == "http://127.0.0.1:8080/mcp" else f" --url {url}"
    say.say(f"The bridge keeps serving at {url}. Try, in another terminal:")
    say.command(f"export BRIDGE_CLIENT__TOKEN={token}")
    say.note("    (the demo token: the bridge answers 401 without it)")
    say.command(f"bridge tail {task_id}{tail_url}")
    say.note("    (the whole session again, from seq 0; add --after N to resume)")
    say.command(f"bridge replay {source} --speed 2 --principal {DEMO_PRINCIPAL}{tail_url}")
    say.note("    (a new task from the data set at 2x; tail the id it prints)")
    say.say("Ctrl-C stops the bridge (the local Kafka keeps running: bridge kafka stop).")

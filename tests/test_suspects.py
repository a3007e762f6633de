"""Suspected owners: answered for at once, probed in the background (one probe per owner,
backed off, jittered), forgotten when the ownership map changes, bounded; a run of refusals
reports a crash, a timeout never does; the wait a client is told follows the session timeout.

In-process, no network: a fake clock, a ``sleep`` the test releases step by step, a scripted
probe.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from bridge.server.suspects import MAX_SUSPECTS, ProbeFailed, Suspects, refused

URL = "http://replica-1.peers:8081"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Steps:
    """A ``sleep`` that records each delay and returns when the test lets it."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._slept = asyncio.Condition()
        self._go: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, delay: float) -> None:
        async with self._slept:
            self.delays.append(delay)
            self._slept.notify_all()
        await self._go.get()

    async def slept(self, count: int) -> None:
        """Return once the probe loop has begun its ``count``-th sleep (bounded)."""
        async with asyncio.timeout(5), self._slept:
            await self._slept.wait_for(lambda: len(self.delays) >= count)

    def step(self) -> None:
        """Let one sleep end."""
        self._go.put_nowait(None)


class Probe:
    """Answers each probe with the next scripted outcome: None (answered) or a ProbeFailed."""

    def __init__(self, *outcomes: ProbeFailed | None) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[str] = []
        self.called = asyncio.Event()

    async def __call__(self, url: str) -> None:
        self.calls.append(url)
        self.called.set()
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome


def refusal() -> httpx.ConnectError:
    """What httpx raises for a refused connect: the OS error at the end of its chain."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except ConnectionRefusedError as exc:
            raise OSError("All connection attempts failed") from exc
    except OSError as exc:
        error = httpx.ConnectError("All connection attempts failed")
        error.__cause__ = exc
        return error


def suspects(probe: Probe, steps: Steps, clock: Clock, **options: Any) -> Suspects:
    return Suspects(probe, clock=clock, sleep=steps, jitter=lambda: 0.5, **options)


async def ended(known: Suspects, url: str = URL) -> None:
    """Wait (bounded) until the probe of ``url`` has ended."""
    probe = known.probe_of(url)
    assert probe is not None
    async with asyncio.timeout(5):
        await asyncio.gather(probe, return_exceptions=True)


def test_a_refused_connection_is_told_from_a_tls_failure_or_a_timeout() -> None:
    assert refused(refusal())
    assert not refused(httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]"))
    assert not refused(httpx.ConnectTimeout("timed out"))
    assert not refused(TimeoutError())


async def test_a_suspect_is_probed_in_the_background_with_growing_waits_until_it_answers() -> None:
    clock, steps = Clock(), Steps()
    failed = ProbeFailed(refused=False)
    probe = Probe(failed, failed, failed, failed, None)
    known = suspects(probe, steps, clock, probe_first_s=0.25, probe_max_s=1.0)
    known.suspect(URL, httpx.ConnectTimeout("no answer"))
    for _ in range(10):  # requests meanwhile: answered at once, no probe of their own
        assert known.is_suspected(URL)
    probe_task = known.probe_of(URL)
    for count in range(1, 6):
        await steps.slept(count)
        steps.step()
    async with asyncio.timeout(5):
        await asyncio.gather(probe_task, return_exceptions=True)
    assert probe.calls == [URL] * 5 and URL not in known
    # The delay doubles to the cap; each is jittered in [d/2, d) (the jitter here draws 0.5).
    assert steps.delays == [0.1875, 0.375, 0.75, 0.75, 0.75]
    await known.close()


async def test_one_probe_per_owner_however_many_requests_fail() -> None:
    clock, steps = Clock(), Steps()
    probe = Probe(None)
    known = suspects(probe, steps, clock)
    for _ in range(50):
        known.suspect(URL, httpx.ConnectTimeout("no answer"))
    await steps.slept(1)
    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("peer-probe")]
    assert len(tasks) == 1
    steps.step()
    await ended(known)
    assert URL not in known
    assert probe.calls == [URL]
    await known.close()


async def test_a_new_ownership_map_forgets_the_suspicion() -> None:
    clock, steps, generation = Clock(), Steps(), [3]
    known = suspects(Probe(), steps, clock, generation=lambda: generation[0])
    known.suspect(URL, refusal())
    assert known.is_suspected(URL)
    probe_task = known.probe_of(URL)
    generation[0] = 4
    assert not known.is_suspected(URL) and URL not in known
    async with asyncio.timeout(5):
        await asyncio.gather(probe_task, return_exceptions=True)  # cancelled with it
    assert probe_task is not None and probe_task.cancelled()
    await known.close()


async def test_a_run_of_refusals_within_the_window_reports_a_crash_once() -> None:
    clock, steps = Clock(), Steps()
    refusing: list[str] = []
    no = ProbeFailed(refused=True)
    probe = Probe(no, no, no, no, no)
    known = suspects(
        probe, steps, clock, refusals=3, refusal_window_s=5.0, on_refusing=refusing.append
    )
    known.suspect(URL, refusal())  # the request's refusal: 1
    assert refusing == []  # never on a single failure
    await steps.slept(1)
    steps.step()  # probe refused: 2
    await steps.slept(2)
    assert refusing == []
    clock.now += 0.5
    steps.step()  # probe refused: 3 within 5 s
    await steps.slept(3)
    assert refusing == [URL]
    await known.close()


async def test_refusals_count_once_per_suspicion_and_never_across_a_new_map() -> None:
    """Requests in flight when the owner went away all fail together: that is one moment, not
    a run. A probe refused after the map changed under it speaks of an owner the new map may
    not name (or names under another instance): it counts for nothing."""
    clock, steps, generation = Clock(), Steps(), [1]
    refusing: list[str] = []

    class Moving(Probe):
        async def __call__(self, url: str) -> None:
            generation[0] += 1  # a rebalance ends while the probe is under way
            await super().__call__(url)

    no = ProbeFailed(refused=True)
    known = suspects(
        Moving(no, no),
        steps,
        clock,
        refusals=2,
        refusal_window_s=5.0,
        generation=lambda: generation[0],
        on_refusing=refusing.append,
    )
    for _ in range(3):  # three requests begun together, refused together
        known.suspect(URL, refusal())
    assert refusing == []
    probe = known.probe_of(URL)
    await steps.slept(1)
    steps.step()  # refused, but under a map that is gone
    assert probe is not None
    async with asyncio.timeout(5):
        await asyncio.gather(probe, return_exceptions=True)
    assert refusing == [] and URL not in known
    await known.close()


@pytest.mark.parametrize("breaker", ["timeout", "outside the window"])
async def test_timeouts_and_old_refusals_never_make_a_crash(breaker: str) -> None:
    clock, steps = Clock(), Steps()
    refusing: list[str] = []
    no, silent = ProbeFailed(refused=True), ProbeFailed(refused=False)
    middle = silent if breaker == "timeout" else no
    probe = Probe(no, middle, no, silent, silent)
    known = suspects(
        probe, steps, clock, refusals=3, refusal_window_s=5.0, on_refusing=refusing.append
    )
    known.suspect(URL, refusal())
    for count in range(1, 4):
        await steps.slept(count)
        if breaker == "outside the window":
            clock.now += 3.0  # each refusal 3 s after the one before: never 3 within 5 s
        steps.step()
    await steps.slept(4)
    assert refusing == []
    await known.close()


def test_the_wait_a_client_is_told_is_what_is_left_of_the_session_timeout() -> None:
    async def main() -> None:
        clock, steps = Clock(), Steps()
        known = suspects(Probe(), steps, clock, session_s=10.0)
        assert known.retry_after_s(URL) == 1  # not suspected: the floor
        known.suspect(URL, refusal())
        assert known.retry_after_s(URL) == 10
        clock.now += 3.5
        assert known.retry_after_s(URL) == 7  # 6.5 s left, in whole seconds up
        clock.now += 30
        assert known.retry_after_s(URL) == 1  # overdue: at least 1 s
        await known.close()

    asyncio.run(main())


async def test_a_refusing_owner_s_wait_is_the_fail_over_s_not_the_session_timeout() -> None:
    """With the crash fail-over on, a refused owner is dropped within the refusal window and a
    standby serves its partitions about a second later: a client told the whole session
    timeout (30 s in k8s/), or the whole window, would come back long after its partitions
    moved. A silent owner (a timeout) is the session timeout's to end."""
    clock, steps = Clock(), Steps()
    known = suspects(Probe(), steps, clock, session_s=30.0, refusal_wait_s=5.0)
    known.suspect(URL, refusal())
    assert known.retry_after_s(URL) == 1  # the floor: not the window's 5 s
    clock.now += 4.5
    assert known.retry_after_s(URL) == 1
    silent = "http://replica-2.peers:8081"
    known.suspect(silent, httpx.ConnectTimeout("no answer"))
    assert known.retry_after_s(silent) == 30
    off = suspects(Probe(), steps, clock, session_s=30.0)  # no fail-over: the session timeout
    off.suspect(URL, refusal())
    assert off.retry_after_s(URL) == 30
    await known.close()
    await off.close()


async def test_suspects_are_bounded_and_the_oldest_is_forgotten_with_its_probe() -> None:
    clock, steps = Clock(), Steps()
    known = suspects(Probe(), steps, clock)
    for i in range(MAX_SUSPECTS * 3):
        known.suspect(f"http://replica-{i}.peers:8081", refusal())
        clock.now += 1.0
        assert len(known) <= MAX_SUSPECTS
    assert "http://replica-0.peers:8081" not in known
    assert f"http://replica-{MAX_SUSPECTS * 3 - 1}.peers:8081" in known
    await asyncio.sleep(0)  # let the cancelled probes end
    probes = [t for t in asyncio.all_tasks() if t.get_name().startswith("peer-probe")]
    assert len([t for t in probes if not t.done()]) <= MAX_SUSPECTS
    await known.close()
    assert len(known) == 0


async def test_closing_stops_every_probe_and_suspects_no_more() -> None:
    clock, steps = Clock(), Steps()
    known = suspects(Probe(), steps, clock)
    known.suspect(URL, refusal())
    await steps.slept(1)
    await known.close()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("peer-probe")]
    known.suspect(URL, refusal())
    assert URL not in known


async def test_a_new_ownership_map_ends_the_probe_without_a_request() -> None:
    """After the group moved on (e.g. it dropped the dead owner), a suspect nobody asks for is
    not probed forever."""
    clock, steps, generation = Clock(), Steps(), [1]
    probe = Probe()
    known = suspects(probe, steps, clock, generation=lambda: generation[0])
    known.suspect(URL, refusal())
    await steps.slept(1)
    generation[0] = 2
    steps.step()
    await ended(known)
    assert probe.calls == [] and URL not in known
    await known.close()


async def test_a_probe_that_breaks_or_a_report_that_fails_never_ends_the_probing() -> None:
    clock, steps = Clock(), Steps()

    async def broken(url: str) -> None:
        raise RuntimeError("a bug in the probe")

    def failing_report(url: str) -> None:
        raise RuntimeError("a bug in the report")

    known = Suspects(
        broken,
        clock=clock,
        sleep=steps,
        jitter=lambda: 0.5,
        refusals=2,
        on_refusing=failing_report,
    )
    known.suspect(URL, refusal())
    known.suspect(URL, refusal())  # two refusals: the failing report runs, and is logged
    for count in range(1, 4):
        await steps.slept(count)
        steps.step()
    await steps.slept(4)
    assert URL in known
    await known.close()

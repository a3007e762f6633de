"""The deterministic simulation (simulation/): hundreds of seeds pass, a seed replays exactly,
a failing seed prints the command that replays it, and a past bug put back is found."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the simulation is development tooling beside bridge/

from bridge.kafka.port import LogRecord, TopicPart  # noqa: E402
from bridge.log import fanout, seqindex  # noqa: E402
from bridge.log.indexwriter import IndexWriter  # noqa: E402
from bridge.server.streams import StreamHub  # noqa: E402
from bridge.tasks.messages import ControlMessage  # noqa: E402
from bridge.workers.sdk import Worker  # noqa: E402
from simulation import loop  # noqa: E402
from simulation.__main__ import main, replay_command  # noqa: E402
from simulation.world import run_seed  # noqa: E402

#: Seeds run by CI: each one three or more replicas, 10 tasks, 500 events and 3 faults.
CI_SEEDS = "0-499"
#: A seed whose zombie is fenced.
ZOMBIE_SEED = 7


def test_five_hundred_seeds_lose_duplicate_reorder_and_misnumber_nothing() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "simulation", "--seeds", CI_SEEDS, "--quiet"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "500 seeds, 0 failed" in done.stdout


def test_one_seed_run_twice_gives_the_same_trace() -> None:
    first, again, other = run_seed(11), run_seed(11), run_seed(12)
    assert first.ok, first.summary()
    assert first.digest == again.digest
    assert first.deliveries == again.deliveries
    assert other.digest != first.digest


def test_a_seed_replays_on_a_machine_whose_real_clock_races(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing in a run reads the real clock: with ``time.monotonic`` advancing 3 s a call (a
    loaded CI runner), the trace is the same. (Before catch-up's recent fetches aged on the
    injected clock, seed 1 and 8 of seeds 0-19 ran otherwise.)"""
    calm = run_seed(1)
    ticks, start = itertools.count(), time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: start + 3.0 * next(ticks))
    assert run_seed(1).digest == calm.digest


def test_the_simulation_finds_a_closed_subscription_spinning_and_prints_the_replay(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """97d8381 put back: a wait on a closed subscription answers at once, so the stream's
    loop around it never suspends again."""
    fixed = fanout.TaskFeed.wait

    async def reverted(self: fanout.TaskFeed, idle_s: float | None = None) -> bool:
        if self.closed:  # the fix raises FeedClosed here; the bug answered at once
            return True
        return await fixed(self, idle_s)

    monkeypatch.setattr(fanout.TaskFeed, "wait", reverted)
    assert main(["--seed", "6", "--wall-limit", "1"]) == 1
    out = capsys.readouterr().out
    assert "Spinning" in out
    assert f"replay: {replay_command(6)}" in out
    assert replay_command(1) == "PYTHONHASHSEED=0 python -m simulation --seed 1"


def test_the_virtual_loop_jumps_to_the_next_timer() -> None:
    async def an_hour() -> float:
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(3600)
        async with asyncio.timeout(5):
            await asyncio.sleep(1)
        return asyncio.get_running_loop().time() - began

    assert loop.run(an_hour) == 3601


def test_the_virtual_loop_says_when_nothing_can_move_again() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    with pytest.raises(loop.Stuck):
        loop.run(forever)


def test_the_virtual_loop_says_when_a_task_spins_on_awaits_that_complete_at_once() -> None:
    async def spin() -> None:
        while True:  # noqa: ASYNC110 - the spin is what is tested
            await asyncio.sleep(0)

    with pytest.raises(loop.Spinning):
        loop.run(spin, spin_limit=10_000)


def test_the_simulation_finds_streams_left_on_a_partition_that_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0aa48c9 put back: a stream whose partition moves away no longer ends (for its client
    to resume on the new owner), it waits for live events that never come here."""
    monkeypatch.setattr(StreamHub, "_partitions_moved", lambda self, gained, lost: None)
    monkeypatch.setattr(fanout.Fanout, "_partitions_moved", lambda self, gained, lost: None)
    outcome = run_seed(1)
    assert not outcome.ok
    assert any("never ended" in problem for problem in outcome.problems), outcome.summary()


def test_the_simulation_finds_a_duplicate_job_writing_after_its_task_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """d84caaf put back: a job whose partition moved keeps running, and another worker's
    "finished" mark does not stop it: its events land after the task's terminal status."""
    monkeypatch.setattr(Worker, "_assigned", _assigned_before_d84caaf)
    fixed = Worker._on_control

    def on_control(self: Worker, record: LogRecord) -> None:
        message = ControlMessage.model_validate_json(record.value or b"")
        if message.type != "finished":
            fixed(self, record)

    monkeypatch.setattr(Worker, "_on_control", on_control)
    outcome = run_seed(2)
    assert outcome.report.counts["lost"] > 0, outcome.summary()


def _assigned_before_d84caaf(self: Worker, assigned: set[TopicPart]) -> None:
    for tp in [tp for tp in self._pending if tp not in assigned]:
        del self._pending[tp]
        self._done.pop(tp, None)


def test_the_simulation_finds_a_forged_task_created_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signature check put back to "any identity": the forged task.created that races a
    pipeline's own to seq 0 binds the task to its forger."""
    monkeypatch.setattr(
        seqindex.PartitionIndex,
        "_authentic",
        lambda self, offset, identity, signed: identity is not None,
    )
    outcome = run_seed(3)
    assert any("bound to another owner" in p for p in outcome.problems), outcome.summary()


def test_the_simulation_finds_a_fenced_zombie_that_fences_the_owner_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fenced index writer re-opened (the zombie fences its partition's new owner)."""

    async def reopen(self: IndexWriter, partition: int) -> None:
        await self._open(partition)

    monkeypatch.setattr(IndexWriter, "_fenced", reopen)
    outcome = run_seed(ZOMBIE_SEED)
    assert any("without owning" in p for p in outcome.problems), outcome.summary()


def test_the_simulation_finds_a_terminal_status_overwritten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seq rule's "a status changes the task only until it is terminal" put back: the
    stale status a pipeline writes after the terminal one wins."""
    fixed = seqindex.PartitionIndex.apply

    def apply(self: seqindex.PartitionIndex, task_id: str, offset: int, **facts: Any) -> int | None:
        seq = fixed(self, task_id, offset, **facts)
        status = facts.get("status")
        if seq and status is not None and status not in seqindex._NO_STATUS:
            row = self.rows[task_id]
            self._status[row], self._status_offset[row] = status, offset
        return seq

    monkeypatch.setattr(seqindex.PartitionIndex, "apply", apply)
    outcome = run_seed(0)
    assert any("not COMPLETED" in p for p in outcome.problems), outcome.summary()

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

#: Seeds run by CI (`make test`): each one three or more replicas, 10 tasks, 500 events and 3
#: faults. ``SIMULATION_SEEDS=A-B`` runs others instead (`make test-fast` runs 0-99).
CI_SEEDS = "0-499"
#: Seeds a test runs (in one subprocess): the range is split so that pytest-xdist's workers
#: share it (one process took 98 s for CI's 500 on a quiet 2-core machine).
SEEDS_A_TEST = 25
#: A seed whose zombie is fenced.
ZOMBIE_SEED = 7


def _seed_range(text: str) -> range:
    """``A-B`` (both included) as a range; a bad value is a clear error at collection."""
    first, _, last = text.partition("-")
    try:
        seeds = range(int(first), int(last or first) + 1)
    except ValueError:
        seeds = range(0)
    if not seeds:
        raise ValueError(f"SIMULATION_SEEDS={text!r}: expected a range A-B, e.g. 0-99")
    return seeds


def _seed_chunks() -> list[str]:
    """The seeds to run (``SIMULATION_SEEDS``, else CI's), as ranges of SEEDS_A_TEST."""
    seeds = _seed_range(os.environ.get("SIMULATION_SEEDS") or CI_SEEDS)
    return [
        f"{first}-{min(first + SEEDS_A_TEST, seeds.stop) - 1}"
        for first in range(seeds.start, seeds.stop, SEEDS_A_TEST)
    ]


@pytest.mark.parametrize("seeds", _seed_chunks())
def test_every_seed_loses_duplicates_reorders_and_misnumbers_nothing(seeds: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "simulation", "--seeds", seeds, "--quiet"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert f"{len(_seed_range(seeds))} seeds, 0 failed" in done.stdout, done.stdout[-3000:]


def test_the_seed_ranges_cover_every_seed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIMULATION_SEEDS", raising=False)
    chunks = _seed_chunks()
    assert len(chunks) == 20
    assert [seed for chunk in chunks for seed in _seed_range(chunk)] == list(range(500))
    monkeypatch.setenv("SIMULATION_SEEDS", "0-99")
    assert _seed_chunks() == ["0-24", "25-49", "50-74", "75-99"]
    monkeypatch.setenv("SIMULATION_SEEDS", "7")
    assert _seed_chunks() == ["7-7"]
    for bad in ("100-7", "0-x", "first 100"):
        monkeypatch.setenv("SIMULATION_SEEDS", bad)
        with pytest.raises(ValueError, match="expected a range A-B"):
            _seed_chunks()


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

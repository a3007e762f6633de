"""A long run of the deterministic simulation (simulation/): many seeds, and what they cost.

Run::

    .venv/bin/python bench/bench_simulation.py                  # 5,000 seeds (~10 minutes here)
    .venv/bin/python bench/bench_simulation.py --seeds 500      # what CI runs
    .venv/bin/python bench/bench_simulation.py --first 5000 --seeds 20000 --jobs 4

Each seed is three or more bridge replicas (indexer, reader, fan-out, stream hub, task service)
in one process over the in-memory log, two worker SDKs, raw producers, 20 resuming stream
clients, 10 tasks, 500 events and 3 seeded faults, in virtual time, judged by the checker
(docs/reliability.md, "The simulation"). Seeds are split over ``--jobs`` processes.

Targets (PASS/MISS, printed, never raised):

* every seed passes (a failing seed prints its replay command);
* the CI run (500 seeds) fits in 180 s of wall time on this machine, extrapolated from the
  measured wall time per seed with one process;
* one second of real time simulates at least 60 s of the bridge's time.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CI_SEEDS = 500
CI_BUDGET_S = 180.0
MIN_SPEEDUP = 60.0


@dataclass
class Tally:
    seeds: int = 0
    failed: list[str] = field(default_factory=list)
    virtual_s: float = 0.0
    deliveries: int = 0
    cpu_s: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    #: What the faults reached (fenced writes, OffsetOutOfRange met, cuts past the index...).
    reached: Counter[str] = field(default_factory=Counter)


def _run(seeds: range) -> Tally:
    logging.getLogger("bridge").setLevel(logging.CRITICAL)
    from simulation.__main__ import replay_command
    from simulation.world import run_seed

    tally = Tally()
    started = time.process_time()
    for seed in seeds:
        outcome = run_seed(seed)
        tally.seeds += 1
        tally.virtual_s += outcome.virtual_s
        tally.deliveries += outcome.deliveries
        tally.faults.update(f.split("(")[0] for f in outcome.faults)  # "zombie(fenced 1)"
        for what, count in outcome.stats.items():
            tally.reached[re.sub(r" r\d+$", "", what)] += count  # "fenced write r0": per replica
        if not outcome.ok:
            tally.failed.append(f"{outcome.summary()}\nreplay: {replay_command(seed)}")
    tally.cpu_s = time.process_time() - started
    return tally


def _chunks(first: int, count: int, jobs: int) -> list[range]:
    size = -(-count // jobs)
    return [range(s, min(s + size, first + count)) for s in range(first, first + count, size)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=5000, help="how many seeds")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # a seed's run depends on string hashing
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    started = time.perf_counter()
    chunks = _chunks(args.first, args.seeds, max(1, args.jobs))
    with ProcessPoolExecutor(len(chunks)) as pool:
        tallies = list(pool.map(_run, chunks))
    wall = time.perf_counter() - started
    total = Tally()
    for t in tallies:
        total.seeds += t.seeds
        total.failed += t.failed
        total.virtual_s += t.virtual_s
        total.deliveries += t.deliveries
        total.cpu_s += t.cpu_s
        total.faults.update(t.faults)
        total.reached.update(t.reached)
    for failure in total.failed:
        print(failure)
    per_seed_wall = wall * len(chunks) / max(1, total.seeds)
    ci_estimate = per_seed_wall * CI_SEEDS
    speedup = total.virtual_s / max(1e-9, total.cpu_s)
    last = args.first + args.seeds - 1
    print(
        f"seeds {args.first}-{last} in {wall:.1f} s wall, {len(chunks)} process(es); "
        f"{1000 * total.cpu_s / max(1, total.seeds):.0f} ms CPU a seed"
    )
    print(
        f"simulated {total.virtual_s / 3600:.1f} h of bridge time, "
        f"{total.deliveries:,} deliveries; faults: "
        + ", ".join(f"{k} {n}" for k, n in sorted(total.faults.items()))
    )
    print("they reached: " + ", ".join(f"{k} {n}" for k, n in sorted(total.reached.items())))
    rows = [
        ("every seed passes", f"{len(total.failed)} failed of {total.seeds}", not total.failed),
        (
            f"CI run ({CI_SEEDS} seeds) <= {CI_BUDGET_S:.0f} s",
            f"{ci_estimate:.0f} s",
            ci_estimate <= CI_BUDGET_S,
        ),
        (
            f"virtual time >= {MIN_SPEEDUP:.0f}x real (CPU)",
            f"{speedup:.0f}x",
            speedup >= MIN_SPEEDUP,
        ),
    ]
    for name, value, ok in rows:
        print(f"{'PASS' if ok else 'MISS'}  {name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

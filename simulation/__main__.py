"""``python -m simulation --seed N`` replays one seed; ``--seeds A-B`` runs a range.

Prints one line per seed (the full report of a failing one) and, for every failing seed, the
one command that replays it. Exit status 1 when any seed failed. String hashing is part of a
run's schedule (sets of task ids), so the command pins ``PYTHONHASHSEED`` (re-executing itself
with it when it is not set).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator

HASH_SEED = "0"


def replay_command(seed: int) -> str:
    """The one command that replays ``seed`` exactly."""
    return f"PYTHONHASHSEED={HASH_SEED} python -m simulation --seed {seed}"


def _seeds(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="replay this seed (prints its report)")
    group.add_argument("--seeds", type=_seeds, help="run a range of seeds, e.g. 0-499")
    parser.add_argument("--quiet", action="store_true", help="print failing seeds only")
    parser.add_argument(
        "--verbose", action="store_true", help="show the bridge's warnings (faults cause many)"
    )
    parser.add_argument(
        "--wall-limit",
        type=float,
        default=10.0,
        help="real seconds one callback may run before the run is judged spinning",
    )
    args = parser.parse_args(argv)
    with _quiet(not args.verbose):
        return _run(args)


@contextlib.contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    """Faults make the bridge log errors by design (a fenced writer, a refused commit): hide
    them while the seeds run, and give the loggers their levels back after."""
    loggers = [logging.getLogger(name) for name in ("bridge", "asyncio")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL if quiet else logger.level)
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    from simulation.world import run_seed

    seeds = range(args.seed, args.seed + 1) if args.seed is not None else args.seeds
    failed: list[int] = []
    started = time.perf_counter()
    for seed in seeds:
        outcome = run_seed(seed, wall_limit_s=args.wall_limit)
        if not outcome.ok:
            failed.append(seed)
        if not outcome.ok or not args.quiet or args.seed is not None:
            print(outcome.summary(), flush=True)
        if not outcome.ok:
            print(f"replay: {replay_command(seed)}", flush=True)
    took = time.perf_counter() - started
    print(
        f"{len(seeds)} seeds, {len(failed)} failed, {took:.1f} s "
        f"({1000 * took / max(1, len(seeds)):.0f} ms a seed)"
    )
    return 1 if failed else 0


def _pin_hash_seed() -> None:
    """Re-execute this command with ``PYTHONHASHSEED`` pinned, unless it already is."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, "-m", "simulation", *sys.argv[1:]], env)


if __name__ == "__main__":
    _pin_hash_seed()
    sys.exit(main())

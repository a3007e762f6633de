"""The long fuzzing run: the targets of ``tests/support/fuzz.py`` for minutes instead of cases.

Run::

    nice -n 10 .venv/bin/python bench/fuzz.py --minutes 10              # each target 10 min
    .venv/bin/python bench/fuzz.py --minutes 1 --target records --seed 7

No Kafka: both targets run in this process (the MCP endpoint in-process, through an ASGI
call). Each target runs in rounds of ``--round`` cases, round ``i`` drawing from seed
``seed + i`` (so any round replays with ``FUZZ_SEED=<its seed>`` and ``examples`` at least as
large in ``tests/test_fuzz.py``), until its minutes are up. A failing round is shrunk by
Hypothesis and reported with its seed; the run goes on with the next round. Per target it
prints the cases run, cases per second of wall and of CPU time, the distinct failures, and
the distinct outcomes (statuses and codes, decode results) with their counts: Hypothesis
measures no code coverage, and the outcomes show which paths the cases reached. The last line
is PASS (no failure) or MISS.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.fuzz import (  # tests/ is not a package: its folder goes on the path first
    Endpoint,
    decode_record,
    fuzz_test,
    record_cases,
    request_cases,
)

#: Characters of a failure's report that are printed (a case may hold a 64 KiB body).
_REPORT_CHARS = 1500


@dataclass
class Result:
    target: str
    cases: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    rounds: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    #: First line of each distinct failure -> (seed of the round that found it, its report).
    failures: dict[str, tuple[int, str]] = field(default_factory=dict)


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The failures in what Hypothesis raised (a group when a round found several bugs)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _report(exc: BaseException) -> str:
    notes = "\n".join(getattr(exc, "__notes__", []))
    return f"{type(exc).__name__}: {exc}\n{notes}"[:_REPORT_CHARS]


def fuzz(
    name: str,
    target: Callable[[Any], str],
    cases: Any,
    *,
    minutes: float,
    seed: int,
    round_cases: int,
) -> Result:
    """Run ``target`` in seeded rounds until ``minutes`` have passed."""
    result = Result(name)

    def counted(case: Any) -> None:
        result.outcomes[target(case)] += 1
        result.cases += 1

    started, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - started < minutes * 60:
        round_seed = seed + result.rounds
        result.rounds += 1
        try:
            fuzz_test(counted, cases, examples=round_cases, seed_value=round_seed)()
        except Exception as exc:
            for failure in _leaves(exc):
                key = f"{type(failure).__name__}: {str(failure).splitlines()[0][:160]}"
                if key not in result.failures:
                    result.failures[key] = (round_seed, _report(failure))
                    print(f"[fuzz] {name}: new failure (seed {round_seed}): {key}", flush=True)
        elapsed = time.monotonic() - started
        print(
            f"[fuzz] {name}: {result.cases} cases in {elapsed:.0f} s, {len(result.failures)} failures",
            file=sys.stderr,
            flush=True,
        )
    result.wall_s = time.monotonic() - started
    result.cpu_s = time.process_time() - cpu
    return result


def print_result(result: Result) -> None:
    print(f"\n== {result.target}")
    print(f"cases          {result.cases} in {result.rounds} rounds")
    print(f"wall           {result.wall_s:.0f} s, {result.cases / result.wall_s:.1f} cases/s")
    print(
        f"cpu            {result.cpu_s:.0f} s, {result.cases / max(result.cpu_s, 1e-9):.1f} cases/s"
    )
    print("coverage       not measured (Hypothesis gives none); outcomes reached below")
    print(f"outcomes       {len(result.outcomes)} distinct")
    for outcome, count in result.outcomes.most_common():
        print(f"  {count:>9}  {outcome}")
    print(f"failures       {len(result.failures)} distinct")
    for key, (seed, report) in result.failures.items():
        print(f"--- seed {seed}: {key}\n{report}")


@contextmanager
def _target(name: str) -> Iterator[tuple[Callable[[Any], str], Any]]:
    if name == "records":
        yield decode_record, record_cases()
        return
    with Endpoint() as endpoint:
        yield endpoint, request_cases(endpoint.credentials())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="per target")
    parser.add_argument("--target", choices=["records", "requests", "all"], default="all")
    parser.add_argument("--seed", type=int, default=1, help="the first round's seed")
    parser.add_argument("--round", type=int, default=500, dest="round_cases")
    args = parser.parse_args()
    names = ["records", "requests"] if args.target == "all" else [args.target]
    results = []
    for name in names:
        with _target(name) as (target, cases):
            results.append(
                fuzz(
                    name,
                    target,
                    cases,
                    minutes=args.minutes,
                    seed=args.seed,
                    round_cases=args.round_cases,
                )
            )
    for result in results:
        print_result(result)
    failed = sum(len(r.failures) for r in results)
    print(f"\n{'PASS' if not failed else 'MISS'}: {failed} distinct failures")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

"""The JSON codec of the replay path: which library validates a record's payload fastest, under
the wire's rules, and writes a parsed payload back out fastest.

Run::

    .venv/bin/python bench/bench_codec.py            # ~20 s
    .venv/bin/python bench/bench_codec.py --quick    # fewer rounds

No Kafka, no server: one process, realistic payloads (the bench's tick, a progress event, a
completed status with a tool result, a 2 KiB text chunk, non-ASCII text). Per payload and
library it prints:

* ``validate`` - the per-record check of the read path: is this text wire JSON (the value is
  built too, the index may need it). ``json`` is :func:`bridge.strictjson.loads_full`, the
  standard library's parser with the wire's checks (the path before the fast one); ``orjson``
  and ``msgspec`` run :mod:`bridge.strictjson`'s cheap pre-checks, then the library;
* ``render`` - writing the parsed payload as compact JSON text (the JSON envelope's path, and
  the fallback of events that carry no text): ``json.dumps`` vs ``orjson.dumps`` vs
  ``msgspec.json.encode``;
* ``events/s`` - validate + carry the text as it is (what one replayed Avro event costs here).

The best of several rounds is reported (the machine may be shared: compare columns of one
run, not runs). orjson turns integers past 64 bits into floats (``10**30`` comes back as
``1e+30``), so it could only be used behind a further check of the text; msgspec keeps them
exact. Which edge cases each library takes is pinned in ``tests/test_strictjson.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import timeit
from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from bridge import strictjson

PAYLOADS: dict[str, Any] = {
    "bench tick": {"i": 17, "pad": "x" * 32},
    "progress": {
        "progress": 3,
        "total": 10,
        "message": "Reviewing src/app/module_3.py: 14 issues found so far",
        "data": {"file": "src/app/module_3.py", "lines": [1, 20, 33, 47], "ratio": 0.4375},
    },
    "status+result": {
        "status": "completed",
        "statusMessage": "done",
        "result": {
            "content": [{"type": "text", "text": "The review found 14 issues. " * 12}],
            "structuredContent": {"issues": [{"line": i, "rule": f"E{i:03d}"} for i in range(12)]},
            "isError": False,
        },
    },
    "2 KiB text": {"delta": "lorem ipsum dolor sit amet, " * 73, "index": 412},
    "non-ASCII": {"text": "Größenänderung: 完了しました ✓ " * 8, "lang": "mixed"},
}

_MSGSPEC = msgspec.json.Decoder()
_MSGSPEC_OUT = msgspec.json.Encoder()


def _pre(text: str) -> bool:
    # strictjson's own pre-check of the fast path (nesting; str input needs nothing else).
    return strictjson._fast_ok(text, strictjson.MAX_DEPTH)


def _orjson_validate(text: str) -> Any:
    if _pre(text):
        return orjson.loads(text)
    return strictjson.loads_full(text)


def _msgspec_validate(text: str) -> Any:
    if _pre(text):
        return _MSGSPEC.decode(text)
    return strictjson.loads_full(text)


VALIDATE: dict[str, Callable[[str], Any]] = {
    "json": strictjson.loads_full,
    "orjson": _orjson_validate,
    "msgspec": _msgspec_validate,
}
RENDER: dict[str, Callable[[Any], str]] = {
    "json": lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False),
    "orjson": lambda v: orjson.dumps(v).decode("utf-8"),
    "msgspec": lambda v: _MSGSPEC_OUT.encode(v).decode("utf-8"),
}


def best_ns(fn: Callable[[], Any], number: int, rounds: int) -> float:
    """The best of ``rounds`` timings of ``number`` calls, per call, in ns."""
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    args = parser.parse_args(argv)
    number, rounds = (2_000, 3) if args.quick else (20_000, 5)
    print(
        f"{'payload':14} {'bytes':>6}  {'library':8} {'validate ns':>12} {'render ns':>10}"
        f" {'validate+carry events/s':>24}"
    )
    for name, value in PAYLOADS.items():
        text = json.dumps(value, ensure_ascii=False)
        for lib in ("json", "orjson", "msgspec"):
            validate, render = VALIDATE[lib], RENDER[lib]
            if validate(text) != value or json.loads(render(value)) != value:
                print(f"{lib} does not round-trip {name}", file=sys.stderr)
                return 1
            v_ns = best_ns(functools.partial(validate, text), number, rounds)
            r_ns = best_ns(functools.partial(render, value), number, rounds)
            print(
                f"{name:14} {len(text.encode()):>6}  {lib:8} {v_ns:>12,.0f} {r_ns:>10,.0f}"
                f" {1e9 / v_ns:>24,.0f}"
            )
    print("\nbig integers: " + ", ".join(_big_int(lib) for lib in ("json", "orjson", "msgspec")))
    return 0


def _big_int(lib: str) -> str:
    text = '{"n":' + "9" * 30 + "}"
    decoded = VALIDATE[lib](text)["n"] if lib == "json" else _raw_decode(lib, text)["n"]
    return f"{lib} {'exact' if decoded == int('9' * 30) else f'lossy ({decoded!r})'}"


def _raw_decode(lib: str, text: str) -> Any:
    return orjson.loads(text) if lib == "orjson" else _MSGSPEC.decode(text)


if __name__ == "__main__":
    sys.exit(main())

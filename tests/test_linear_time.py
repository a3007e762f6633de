"""Every parser of untrusted text takes time linear in its input (issue 26, item 1).

One request body or one record once froze a replica: strictjson's depth pre-check stripped
string tokens with a regex quadratic in a run of escaped quotes with no closing quote (32 KB
took ~7 s). The growth tests measure, for each adversarial input of ``tests/support/linear.py``,
the median CPU time of 5 parses at ``n`` = 64 KiB and at ``8n``: linear code takes about 8x,
quadratic 64x; the bound is 20x. No absolute time is asserted (``bench/bench_parsers.py``
holds the budgets); a parse still running after :data:`HANG_S` is a failure, not a wait.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz import wall_bound
from support.linear import ADVERSARIES, KIB, Adversary, growth, input_size

from bridge import strictjson
from bridge.events_extension.cursor import BadCursor, decode_task
from bridge.server.browser import _cursor as view_cursor

#: The size the growth is measured from (and 8x it); large enough that fixed costs are small.
N = 64 * KIB
#: How much more 8x the input may cost: linear is ~8, n log n ~9, quadratic 64.
MAX_GROWTH = 20
#: Slack for parsers that answer in microseconds either way (a fixed refusal, a length cap).
SLACK_S = 0.001
#: A parse of 512 KiB still running after this is the bug itself (the old pre-check: hours).
HANG_S = 10.0


@pytest.mark.parametrize("adversary", ADVERSARIES, ids=lambda a: a.name)
def test_each_parser_of_untrusted_text_grows_linearly_on_its_worst_input(
    adversary: Adversary,
) -> None:
    with wall_bound(HANG_S, adversary.name):
        small, large = growth(adversary, N)
    assert large <= MAX_GROWTH * small + SLACK_S, (
        f"{adversary.name}: {small * 1e3:.2f} ms at {N // KIB} KiB, "
        f"{large * 1e3:.2f} ms at {8 * N // KIB} KiB"
    )


@pytest.mark.parametrize("adversary", ADVERSARIES, ids=lambda a: a.name)
def test_each_adversarial_input_has_the_size_it_is_measured_at(adversary: Adversary) -> None:
    # A maker that ignored n would measure a constant and pass for linear.
    assert 2 * KIB <= input_size(adversary, 4 * KIB) <= 8 * KIB
    assert 7 * input_size(adversary, 4 * KIB) <= input_size(adversary, 32 * KIB)


# --- the depth scan: exact for JSON, and never lower than the parser's own depth --------------

nasty_strings = st.text(st.sampled_from('ab"\\[]{}/u'), max_size=8)
json_values = st.recursive(
    st.none() | st.integers() | nasty_strings,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(nasty_strings, children, max_size=3)
    ),
    max_leaves=12,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(json_values, st.booleans())
@example(["\\", ['"\\"']], False)
@example({'"': {"\\\\": ["[", "\\"]}}, True)
def test_the_depth_scan_is_exact_for_json(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert strictjson._text_depth(text) == _depth(value)


def _parse_deep_in_the_stack(text: str, frames: int) -> str:
    if frames:
        return _parse_deep_in_the_stack(text, frames - 1)
    try:
        json.loads(text)
    except RecursionError:
        return "recursion"
    except ValueError:
        return "refused"
    return "ok"


careless_texts = st.builds(
    lambda depth, tail: "[" * depth + tail,
    st.integers(0, 300),
    st.text(st.sampled_from('[]{}"\\:,1 '), max_size=400),
)


@given(careless_texts)
@example("[" * 100 + '"' + "[" * 200)  # a string never closed: its brackets count for nothing
@example('["\\\\"' + "[" * 200)  # the pair of backslashes ends nothing: the quote closes
@example("[" * 100 + '\\"' + "[" * 200)  # a backslash outside any string
@example('["a",' + "[" * 400)  # a string, then more than the stack holds
def test_a_text_the_depth_scan_clears_never_exhausts_the_parsers_stack(text: str) -> None:
    # What the scan lets through goes to a recursive parser, maybe from deep in a stack: the
    # scan may misread text that is no JSON, but never below the depth the parser reaches.
    # Hypothesis raises the recursion limit while it runs a test: leave the parser a fixed
    # room, a little more than the bound, whatever the limit is.
    room = sys.getrecursionlimit() - _stack_depth() - (strictjson.MAX_DEPTH + 40)
    if strictjson._text_depth(text) <= strictjson.MAX_DEPTH:
        assert _parse_deep_in_the_stack(text, room) != "recursion"


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


# --- refusals the audit found, each a ValueError escaping its parser ------------------------


def test_a_last_event_id_of_thousands_of_digits_is_refused_as_no_seq() -> None:
    # int() raised ValueError past 4300 digits: a fault, not the view's 400.
    for digits in (20, 4301, 100_000):
        assert "must be a seq" in str(view_cursor("9" * digits, None))
    assert view_cursor("9223372036854775807", None) == 2**63 - 1


@pytest.mark.parametrize("seq", ["--5", "-" * 40 + "5", "9" * 5000, "-", "٣"])
def test_an_events_cursor_with_no_number_is_a_bad_cursor(seq: str) -> None:
    cursor = base64.urlsafe_b64encode(f"t1.{seq}".encode()).decode().rstrip("=")
    with pytest.raises(BadCursor):
        decode_task(cursor)

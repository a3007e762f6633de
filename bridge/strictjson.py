"""JSON under the wire's rules: parse only what can be written back out as the wire's JSON.

The bridge sends every value as ``json.dumps(..., ensure_ascii=False, allow_nan=False)`` encoded
to UTF-8. Python's own parser accepts more than that writer can emit, and a value let in on
parse then fails later, far from its origin, on every replay: ``NaN`` / ``Infinity``, numbers
that overflow to a non-finite float (``1e999``), lone UTF-16 surrogates (``"\\ud800"``, which
JavaScript producers that cut strings by code unit emit), nesting deep enough to exhaust the
stack when re-serialised. :func:`loads` refuses all of these with one error,
:class:`NotWireJson`, at the edge where the text comes in; :func:`dumps` is its writer.

The checks cost little on the common path: the expensive walks run only when a cheap look at
the text says they might find something. Used by the envelope codec (every record the indexer
decodes) and the MCP endpoint's request body parser. Knows nothing of events or JSON-RPC.

The fast path (``bench/bench_codec.py`` measured it): :func:`loads` first hands the text to
msgspec's JSON decoder, whose accepted set is a subset of this module's with equal values
(exact big integers, correctly rounded floats, duplicate keys: the last wins, as here; it
refuses ``NaN``, non-finite numbers, lone surrogates raw or escaped, BOMs and UTF-16/32, and
integers past the interpreter's digit limit). The one rule it does not know, the nesting bound,
is the same cheap pre-check as before; bytes with a NUL or a BOM (which :func:`json.detect_encoding`
reads as UTF-16/32 or UTF-8-SIG) skip it. Whatever the fast decoder refuses, or a pre-check
flags, goes the full way below, whose answer is authoritative: the fast path only ever says
yes sooner, never no. ``tests/test_strictjson.py`` pins the differences.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import accumulate
from typing import Any

import msgspec

__all__ = [
    "MAX_DEPTH",
    "NotWireJson",
    "dumps",
    "dumps_parsed",
    "fast_decode",
    "loads",
    "loads_full",
    "loads_short",
    "may_nest_deeper",
]

#: How deeply arrays and objects may nest (``[]`` is depth 1). Far beyond any real event, and
#: far enough below the interpreter's recursion limit (1000) that a value accepted here can be
#: serialised from deep inside a server's call stack, wrapped in a few envelope levels.
MAX_DEPTH = 128

_CONTAINERS = (dict, list, tuple)
#: ``\uD800``-``\uDFFF`` escapes: the only way a lone surrogate gets into decoded UTF-8 text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class NotWireJson(ValueError):
    """Text that is not JSON, or JSON the wire could not carry; the message says which."""


def loads(text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text`` like :func:`json.loads`, refusing what :func:`dumps` could not write.

    Bytes are decoded strictly (UTF-8, or UTF-16/32 as JSON allows), so they cannot carry
    surrogates. Raises :class:`NotWireJson` and nothing else.
    """
    if _fast_ok(text, max_depth):
        try:
            return _FAST.decode(text)
        except Exception:  # msgspec's refusals (and UnicodeEncodeError): the full path decides
            pass
    return loads_full(text, max_depth=max_depth)


def loads_short(text: str) -> Any:
    """:func:`loads` of a text of at most ``2 * MAX_DEPTH`` characters, the fast decoder's
    answer straight away (so short a text cannot nest too deeply); :class:`NotWireJson` when it
    refuses, and the caller asks :func:`loads` for the authoritative answer."""
    try:
        return _FAST.decode(text)
    except Exception:  # msgspec's refusals (and UnicodeEncodeError)
        raise NotWireJson("refused by the fast decoder") from None


def loads_full(text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """:func:`loads` without its fast path: the authoritative answer, always the slow way.

    :func:`loads` falls back to it; the tests and ``bench/bench_codec.py`` compare the two.
    """
    if isinstance(text, bytes | bytearray):
        text = _decode(text)
    elif _has_raw_surrogate(text):
        raise NotWireJson("text contains a lone UTF-16 surrogate")
    if may_nest_deeper(text, max_depth) and _text_depth(text) > max_depth:
        # Before parsing: the parser's own limit is the interpreter's recursion limit less
        # the caller's stack, so the answer for a deep text would depend on who asks (a
        # replay and the tail gave one record two different placeholders).
        raise NotWireJson(f"arrays and objects nest deeper than {max_depth} levels")
    value = _parse(text)  # the depth was read from the text above: exact for JSON
    if _SURROGATE_ESCAPE.search(text) is not None:
        _check_encodable(value)
    return value


def dumps(value: Any, *, max_depth: int = MAX_DEPTH) -> str:
    """Compact wire JSON of ``value``; :class:`NotWireJson` for what :func:`loads` would refuse."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotWireJson(f"not JSON-serialisable: {exc}") from None
    if _has_raw_surrogate(text):
        raise NotWireJson("a string contains a lone UTF-16 surrogate")
    if may_nest_deeper(text, max_depth) and _nests_deeper(value, max_depth):
        raise NotWireJson(f"arrays and objects nest deeper than {max_depth} levels")
    return text


#: The fast decoder (see the module docstring); untyped, so it returns plain JSON values.
_FAST = msgspec.json.Decoder()
#: The fast decoder alone, for a hot loop that checks texts in bulk: what it accepts of a text
#: that :func:`may_nest_deeper` clears (and, given bytes, that is valid UTF-8 without a BOM),
#: :func:`loads` accepts with the same value; what it refuses (ValueError), ask :func:`loads`.
fast_decode = _FAST.decode
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")


def _fast_ok(text: str | bytes | bytearray, max_depth: int) -> bool:
    """True when the fast decoder's answer, if it accepts, is this module's answer too."""
    if may_nest_deeper(text, max_depth):
        return False  # the depth rule is checked by the full path only
    if isinstance(text, str):
        return True  # msgspec refuses raw surrogates itself (it encodes the str as UTF-8)
    # detect_encoding would read these as UTF-16/32 or UTF-8-SIG: the full path decodes them.
    return b"\x00" not in text and not text.startswith(_BOMS)


#: The fast encoder for :func:`dumps_parsed`.
_FAST_OUT = msgspec.json.Encoder()


def dumps_parsed(value: Any) -> str:
    """Compact wire JSON of a value :func:`loads` returned, fast (no checks: loads made them).

    Only for such values: it writes NaN as ``null`` where :func:`dumps` refuses it, for one.
    """
    return _FAST_OUT.encode(value).decode("utf-8")


def _decode(data: bytes | bytearray) -> str:
    try:
        return data.decode(json.detect_encoding(data))
    except UnicodeDecodeError as exc:
        raise NotWireJson(str(exc)) from None


def _has_raw_surrogate(text: str) -> bool:
    # isascii() is O(1) on CPython strings; encoding beats a regex scan for the rest.
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _reject_constant(name: str) -> Any:
    raise NotWireJson(f"non-standard constant {name}")


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise NotWireJson(f"number {literal[:40]} is out of the range of a double")
    return number


#: One decoder for all calls: json.loads with options would build a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _parse(text: str) -> Any:
    try:
        return _DECODER.decode(text)
    except NotWireJson:
        raise
    except RecursionError:
        raise NotWireJson("arrays and objects nest too deeply to parse") from None
    except json.JSONDecodeError as exc:
        raise NotWireJson(str(exc)) from None
    except ValueError:  # the only other one json.loads raises: int()'s digit limit
        limit = sys.get_int_max_str_digits()
        raise NotWireJson(f"an integer has more than {limit} digits") from None


def may_nest_deeper(text: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> bool:
    """Cheap necessary condition: deeper nesting needs more than ``max_depth`` openers."""
    if len(text) <= 2 * max_depth:
        return False
    if isinstance(text, str):
        return text.count("[") + text.count("{") > max_depth
    return text.count(b"[") + text.count(b"{") > max_depth


#: Every byte but quotes and brackets (deleted in one pass of ``bytes.translate``), and what each
#: byte does to the depth.
_NOT_MARKS = bytes(b for b in range(256) if b not in b'"[]{}')
_STEPS = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


def _text_depth(text: str) -> int:
    """How deeply the text's arrays and objects nest, read from its brackets outside strings,
    without parsing it (so without recursion). Exact for JSON; for other text an answer the
    parser then refuses anyway (see :func:`_brackets_outside_strings`).

    Linear in the text: a fixed number of passes of C string methods, no regex (one matching
    whole string tokens took time quadratic in a run of escaped quotes with no closing quote;
    ``tests/test_linear_time.py``).
    """
    steps = map(_STEPS.__getitem__, _brackets_outside_strings(text))
    return max(accumulate(steps, initial=0))


def _brackets_outside_strings(text: str) -> bytes:
    """The brackets of the text that lie outside its string tokens, in order.

    Inside a string a backslash escapes the next character, so a run of backslashes pairs up
    from its left: dropping every ``\\\\`` pair, left to right, leaves at most one, and dropping
    ``\\"`` after it leaves only the quotes that open and close strings (UTF-8 never uses these
    bytes inside a multi-byte character). Of those quotes and the brackets, what lies between
    an opening quote and the next is inside a string. For JSON that is exact. Other text (a
    backslash outside a string, a string never closed) may read otherwise, but only after the
    first place the parser refuses, so it never counts fewer brackets than the parser opens
    before refusing: a text cleared here never exhausts its stack.
    """
    data = text.encode("utf-8", "surrogatepass")
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(data.translate(None, _NOT_MARKS).split(b'"')[::2])


def _nests_deeper(value: Any, max_depth: int) -> bool:
    # Level by level, not recursively: the value may be nested almost to the recursion limit.
    # Only containers are kept from one level to the next, tested inline: this is the slow path
    # of large events (more than max_depth brackets), so no call per node.
    level = [value] if isinstance(value, _CONTAINERS) else []
    for _ in range(max_depth):
        if not level:
            return False
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, _CONTAINERS)
        ]
    return bool(level)


def _check_encodable(value: Any) -> None:
    """The wire's own test, run only on text with surrogate escapes (pairs are fine)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise NotWireJson("a string contains a lone UTF-16 surrogate") from None
    except RecursionError:  # only with a max_depth near the recursion limit
        raise NotWireJson("arrays and objects nest too deeply to write") from None

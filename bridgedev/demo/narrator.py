"""The demo's narrator: what the reviewer reads while the walkthrough runs.

Step headers, one line per event (streamed ``message.delta`` text written inline, as a chat UI
would), commands to copy, and each step's PASS or FAIL. It only prints: the steps
(:mod:`bridgedev.demo.walkthrough`) decide what to say and check the outcomes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from typing import Any, TextIO

__all__ = ["INDENT", "Narrator"]

#: The data set's event type prefix, left out of event lines.
_AGENT = "com.example.agent."
#: The margin of streamed text, under the seq column.
INDENT = " " * 14


class Narrator:
    """Prints the walkthrough: step headers, event lines, streamed text, PASS/FAIL."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        color = out.isatty() and not os.environ.get("NO_COLOR")
        self._green = "\033[32m" if color else ""
        self._red = "\033[31m" if color else ""
        self._bold = "\033[1m" if color else ""
        self._dim = "\033[2m" if color else ""
        self._reset = "\033[0m" if color else ""
        self._column = 0  # >0 while a streamed message is being written inline
        self.width = min(max(shutil.get_terminal_size((100, 24)).columns, 72), 120)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _end_text(self) -> None:
        if self._column:
            self._write("\n")
            self._column = 0

    def header(self, number: int, total: int, title: str) -> None:
        self._end_text()
        line = f"── {number}/{total} · {title} "
        self._write(f"\n{self._bold}{line}{'─' * max(3, self.width - len(line))}{self._reset}\n")

    def title(self, text: str) -> None:
        self._end_text()
        self._write(f"\n{self._bold}{text}{self._reset}\n")

    def say(self, text: str) -> None:
        self._end_text()
        wrapped = textwrap.fill(
            text,
            self.width - 2,
            initial_indent="  ",
            subsequent_indent="  ",
            break_on_hyphens=False,
        )
        self._write(wrapped + "\n")

    def command(self, text: str) -> None:
        """A command line the reader can copy (never wrapped)."""
        self._end_text()
        self._write(f"    {self._bold}{text}{self._reset}\n")

    def note(self, text: str) -> None:
        self._end_text()
        self._write(f"  {self._dim}{text}{self._reset}\n")

    def event(self, seq: int, event_type: str, payload: dict[str, Any], who: str = "") -> None:
        """One event: message deltas are written inline as the text they carry."""
        short = event_type.removeprefix(_AGENT)
        if short == "message.delta" and isinstance(payload.get("text"), str):
            self._text(seq, payload["text"])
            return
        self._end_text()
        label = f"{who} " if who else ""
        line = f"  {label}seq {seq:>4}  {short:<20} {_describe(short, payload)}"
        limit = self.width - 1
        self._write((line if len(line) <= limit else line[: limit - 1] + "…") + "\n")

    def _text(self, seq: int, text: str) -> None:
        margin = len(INDENT) + 2
        for piece in re.findall(r"\S+\s*|\s+", text):
            if not self._column:  # a new block of text: show the seq it starts at
                self._write(f"  seq {seq:>4}".ljust(len(INDENT)) + "│ ")
                self._column = margin
                piece = piece.lstrip()
            elif self._column + len(piece.rstrip()) > self.width:
                self._write("\n" + INDENT + "│ ")
                self._column = margin
                piece = piece.lstrip()
            self._write(piece)
            self._column += len(piece)

    def cut(self, text: str) -> None:
        """Mark an interruption inside the streamed text."""
        if self._column:
            self._write(f" {self._red}✂{self._reset}\n")
            self._column = 0
        self.say(text)

    def passed(self, number: int, text: str) -> None:
        self._verdict(f"{self._green}{self._bold}PASS{self._reset}", number, text)

    def failed(self, number: int, text: str) -> None:
        self._verdict(f"{self._red}{self._bold}FAIL{self._reset}", number, text)

    def _verdict(self, word: str, number: int, text: str) -> None:
        self._end_text()
        lines = textwrap.wrap(f"step {number}: {text}", self.width - 8, break_on_hyphens=False)
        self._write(f"  {word}  " + "\n        ".join(lines) + "\n")


def _describe(short: str, p: dict[str, Any]) -> str:
    """A one-line human summary of a payload (the event types of data/agent-session.jsonl)."""

    def compact(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    if short == "tool.call":
        return f"{p.get('name')} {compact(p.get('arguments', {}))}"
    if short == "tool.result":
        keys = [k for k in p if k not in ("callId", "name", "ok", "durationMs", "subtaskId")]
        state = "ok" if p.get("ok") else "ERROR"
        return f"{p.get('name')} {state} in {p.get('durationMs')} ms: {', '.join(keys)}"
    if short == "subtask.progress":
        return f"{p.get('subtaskId')} {p.get('completed')}/{p.get('total')} · {p.get('message')}"
    if short in ("subtask.started", "subtask.finished"):
        return f"{p.get('subtaskId')} {p.get('title') or p.get('summary') or ''}"
    if short in ("message.started", "message.completed"):
        return f"{p.get('messageId')} {p.get('role') or str(p.get('chunks', '')) + ' chunks'}"
    if short == "artifact":
        return f"{p.get('uri')} ({p.get('mimeType')}, {p.get('sizeBytes')} bytes)"
    if short == "usage":
        return (
            f"in {p.get('inputTokens')} · out {p.get('outputTokens')} tokens · "
            f"{p.get('toolCalls')} tool calls · ${p.get('costUsd')}"
        )
    if short == "plan.updated" and isinstance(p.get("steps"), list):
        marks = {"done": "✓", "in_progress": "▶", "pending": "·"}
        return " ".join(f"{marks.get(s.get('status'), '?')}{s.get('id')}" for s in p["steps"])
    if short.endswith(".task.status"):
        return f"{p.get('status')} {compact(p.get('result', {}))}"
    return compact(p)

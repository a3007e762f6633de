"""Rewrite the tree from the settings names of 0.2.0 to the grouped ones (issue 29, item 4).

Re-runnable: a second run changes nothing. It uses the one table of renames
(:data:`bridge.settings_renames.RENAMED`) and rewrites, over the files given (default: the
repository's code, docs, chart and manifests):

* attribute reads on a settings object: ``settings.stream_queue_size`` ->
  ``settings.streams.queue_size`` (the receiver's last name ends in ``settings`` or ``config``,
  or is ``cfg``), and the two secret accessors that moved with their group;
* ``env_name("kafka_tls", "ca_file")`` -> ``env_name("kafka", "tls", "ca_file")``;
* environment names: ``BRIDGE_KAFKA_TLS__CA_FILE`` -> ``BRIDGE_KAFKA__TLS__CA_FILE``;
* in Markdown, backquoted names: ```kafka_tls.ca_file``` -> ```kafka.tls.ca_file```.

A line that says ``0.1.0``, ``0.2.0`` or "the flat " is left as it is: it names the old
settings on purpose.

Keyword arguments (``load_settings(max_streams=3)``), dict keys (``model_copy(update=...)``) and
TOML files are left to hand edits: the old keyword names still load (with a deprecation
warning), but ``model_copy(update={"max_streams": 3})`` would not, so grep for those.

    python -m bridgedev.rewrite_settings            # the default tree, from the repository root
    python -m bridgedev.rewrite_settings --check    # list what would change, exit 1 if any
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge.config import Settings
from bridge.settings_renames import RENAMED, new_path

#: Properties that moved with their group (not settings names, so not in RENAMED).
MOVED_ATTRIBUTES = {
    "peer_secret_value": "peers.secret_value",
    "view_token_secret_value": "view.token_secret_value",
}

#: A line holding this speaks of the old names on purpose (in a file not in KEEP).
#: A line that says one of these speaks of the old names on purpose (the deprecation notes).
KEEP_LINE = ("0.2.0", "0.1.0", "the flat ")

#: Files that speak of the old names on purpose.
KEEP = {
    "CHANGELOG.md",
    "bridge/config.py",
    "bridge/settings_renames.py",
    "bridgedev/rewrite_settings.py",
    "charts/mcp-kafka-bridge/files/renamed-settings.json",
    "docs/configuration.md",
    "tests/test_settings_renames.py",
    "tests/fixtures/upgrade-8fd441c-subscriptions/generate.py",
}
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".txt", ".env", ".toml", ".sh", ".json"}
SUFFIXLESS = {"Makefile", "Dockerfile"}

_ATTRIBUTES = {**RENAMED, **MOVED_ATTRIBUTES}
_NAMES = "|".join(sorted(_ATTRIBUTES, key=len, reverse=True))
_ATTRIBUTE = re.compile(
    r"(?P<receiver>\b(?:[A-Za-z0-9_]*(?:settings|config)|cfg)(?:\(\))?)"
    rf"\.(?P<old>{_NAMES})\b"
)
_ENV_NAME = re.compile(r"env_name\((?P<args>\s*(?:[\"'][a-z0-9_]+[\"']\s*,?\s*)+)\)")
_ENV_VAR = re.compile(r"\bBRIDGE_(?P<name>[A-Z0-9_]+)\b")
_BACKQUOTED = re.compile(r"`(?P<name>[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)`")


def _attribute(match: re.Match[str]) -> str:
    return f"{match['receiver']}.{_ATTRIBUTES[match['old']]}"


def _env_name(match: re.Match[str]) -> str:
    parts = re.findall(r"[\"']([a-z0-9_]+)[\"']", match["args"])
    moved = new_path(".".join(parts))
    if moved is None:
        return match.group(0)
    quote = '"' if '"' in match["args"] else "'"
    return "env_name(" + ", ".join(f"{quote}{part}{quote}" for part in moved.split(".")) + ")"


def _env_var(match: re.Match[str]) -> str:
    head, sep, rest = match["name"].partition("__")
    moved = RENAMED.get(head.lower())
    if moved is None:
        return match.group(0)
    return "BRIDGE_" + "__".join(moved.upper().split(".")) + sep + rest


def _backquoted(match: re.Match[str]) -> str:
    moved = new_path(match["name"])
    # Only a name that is a setting now: `ownership.py` is a file, not replicas.ownership.py.
    return match.group(0) if moved is None or not _is_setting(moved) else f"`{moved}`"


def _is_setting(path: str) -> bool:
    model: Any = Settings
    for part in path.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


def rewrite(text: str, suffix: str) -> str:
    """``text`` of a file with ``suffix`` in the new names; a line that says one of
    :data:`KEEP_LINE` speaks of the old names on purpose and is kept."""
    return "".join(
        line if any(keep in line for keep in KEEP_LINE) else _rewrite_line(line, suffix)
        for line in text.splitlines(keepends=True)
    )


def _rewrite_line(line: str, suffix: str) -> str:
    line = _ENV_VAR.sub(_env_var, line)
    if suffix == ".py":
        line = _ATTRIBUTE.sub(_attribute, line)
        line = _ENV_NAME.sub(_env_name, line)
    if suffix == ".md":
        line = _BACKQUOTED.sub(_backquoted, line)
    return line


def default_files(root: Path) -> list[Path]:
    """The repository's tracked files this rewrite reads."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files"], check=True, capture_output=True, text=True
    ).stdout.split()
    return [
        root / name
        for name in listed
        if name not in KEEP and (Path(name).suffix in SUFFIXES or Path(name).name in SUFFIXLESS)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridgedev.rewrite_settings")
    parser.add_argument("files", nargs="*", type=Path, help="default: the repository's files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    files = args.files or default_files(Path.cwd())
    changed = []
    for path in files:
        before = path.read_text(encoding="utf-8")
        after = rewrite(before, path.suffix)
        if after != before:
            changed.append(path)
            if not args.check:
                path.write_text(after, encoding="utf-8")
    for path in changed:
        print(path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())

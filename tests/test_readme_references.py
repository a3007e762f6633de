"""Every module, class or function of ``bridge``/``bridgedev`` that the README, docs/*.md and the
code's docstrings and comments name still exists (no broker, no import of the modules): a rename
cannot leave a stale name behind.

A reference is a dotted name (`` `bridge.log.reader.Reader` ``, ``:class:`~bridge.log.fanout.TaskFeed```)
or a path (`` `bridge/log/reader.py` ``, ``../bridge/workers/sdk.py``, ``bridge/server/``). A dotted
name resolves to its longest prefix that is a module or package; what follows, if anything, must
start with a name that module defines or imports at its top level (a method of a class is not
checked further). A path must exist.

In the code only docstrings and comments are read (a variable named ``bridge`` is not a
reference), and a dotted name counts only when its second part is not one of :data:`NOT_MODULES`.
This covers what tests/test_first_impressions.py checked before (the ``:mod:`` roles of bridge/).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from support.imports import BRIDGE

ROOT = BRIDGE.parent
#: A reference: a dotted name or a path of either package (``../`` links included).
REFERENCE = re.compile(r"(?<![\w./-])(?:\.\./)*(bridge(?:dev)?(?:(?:\.\w+)+|/[\w./]*))")
#: Spans that look like references and are not, with why.
NOT_REFERENCES = {
    "bridge.env": "the k8s overlay's settings file (docs/deployment.md)",
    "bridge.extraSettings": "a chart value (docs/deployment.md)",
    "bridge/server/mcp.py": "history: where a benchmark finding was, then (benchmarks-streams.md)",
    "bridge/log/x.py": "an example of the layout table's syntax (tests/test_readme_layout.py)",
}
#: Second parts of ``bridge.<x>`` in code comments and docstrings that are not modules:
#: attributes of variables named ``bridge`` (tests, benches), file names, chart values, hosts.
NOT_MODULES = frozenset(
    {
        "__file__",
        "alive",
        "allowedHosts",
        "example",
        "extraSettings",
        "extra_env",
        "log_path",
        "pid",
        "port",
        "prefix",
        "settings",
        "start",
        "stop",
        "tail",
        "toml",
        "toolPacks",
        "url",
        "yaml",
    }
)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def sources() -> list[Path]:
    folders = ("bridge", "bridgedev", "simulation", "tests", "bench")
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


@cache
def top_level_names(module: Path) -> frozenset[str]:
    """What ``module`` defines or imports at its top level (inside ``if``/``try`` too)."""
    names: set[str] = set()
    body = list(ast.parse(module.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try):
            body.extend([*node.body, *node.orelse, *getattr(node, "handlers", [])])
        elif isinstance(node, ast.ExceptHandler):
            body.extend(node.body)
    return frozenset(names)


def exists(reference: str, root: Path = ROOT) -> bool:
    """True when ``reference`` names a path, module, or top-level name of a module that is there."""
    if "/" in reference:
        return (root / reference).exists()
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        path = root.joinpath(*parts[:cut])
        module = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if module.is_file():
            rest = parts[cut:]
            return not rest or rest[0] in top_level_names(module)
    return False


def references(text: str) -> Iterator[str]:
    for match in REFERENCE.finditer(text):
        reference = match.group(1).rstrip(".")
        if reference not in NOT_REFERENCES:
            yield reference


def prose(source: str) -> Iterator[tuple[int, str]]:
    """The docstrings and comments of ``source``, with their line numbers."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield first.lineno, first.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def in_code(reference: str) -> bool:
    parts = reference.split(".")
    return "/" in reference or len(parts) < 2 or parts[1] not in NOT_MODULES


def stale_in_documents() -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{number}: {reference}"
        for path in documents()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for reference in references(line)
        if not exists(reference)
    ]


def stale_in_code() -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{number}: {reference}"
        for path in sources()
        for number, text in prose(path.read_text(encoding="utf-8"))
        for reference in references(text)
        if in_code(reference) and not exists(reference)
    ]


def test_every_module_and_name_the_docs_mention_exists() -> None:
    assert stale_in_documents() == []


def test_every_module_and_name_the_code_s_docstrings_and_comments_mention_exists() -> None:
    assert stale_in_code() == []


def test_a_stale_name_is_found_in_each_form(tmp_path: Path) -> None:
    (tmp_path / "bridge" / "log").mkdir(parents=True)
    (tmp_path / "bridge" / "__init__.py").write_text("")
    (tmp_path / "bridge" / "log" / "__init__.py").write_text("")
    (tmp_path / "bridge" / "log" / "fanout.py").write_text(
        "import asyncio\nclass TaskFeed:\n    def wait(self): ...\nMOVED = 'moved'\n"
    )
    text = (
        "`bridge.log.fanout.TaskFeed.wait`, :class:`~bridge.log.fanout.MOVED`, "
        "[x](../bridge/log/fanout.py), `bridge.log`. `bridge.log.fanout.asyncio`; "
        "`bridge.log.fanout.Gone`, `bridge/gone.py`, `bridge.gone.TaskStatus`, `bridge/gone/`, "
        "mcpbridge.gone"
    )
    found = {reference: exists(reference, tmp_path) for reference in references(text)}
    assert found == {
        "bridge.log.fanout.TaskFeed.wait": True,
        "bridge.log.fanout.MOVED": True,
        "bridge/log/fanout.py": True,
        "bridge.log": True,
        "bridge.log.fanout.asyncio": True,
        "bridge.log.fanout.Gone": False,
        "bridge/gone.py": False,
        "bridge.gone.TaskStatus": False,
        "bridge/gone/": False,
    }


def test_code_prose_is_docstrings_and_comments_and_skips_variables_named_bridge() -> None:
    source = (
        '"""Reads :mod:`bridge.gone`."""\n'
        "x = 'bridge.nothing'  # see bridge.log.gone\n"
        "def f(bridge):\n"
        '    """Uses ``bridge.port`` and bridge.server.handlers.MethodHandlers.dispatch."""\n'
        "    return bridge.url\n"
    )
    named = [r for _, text in prose(source) for r in references(text) if in_code(r)]
    assert sorted(named) == [
        "bridge.gone",
        "bridge.log.gone",
        "bridge.server.handlers.MethodHandlers.dispatch",
    ]

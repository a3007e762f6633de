"""The README's layout table names every module of ``bridge/`` and of ``bridgedev/`` (the
development package beside it) (no broker, no import of them).

Granularity: every ``.py`` file under ``bridge/`` or ``bridgedev/`` except the ``__init__.py`` of a package, named
in a row of the table either by its path (`` `bridge/log/reader.py` ``) or by its file name after
the path of its directory in the same row (`` `bridge/log/` `` or any `` `bridge/log/x.py` ``,
then `` `catchup.py` ``). One package is named as a whole: ``bridgedev/kafka/``, development
Kafka that no runtime module imports, mapped file by file in docs/architecture.md. Every path the
table names must exist too, so a renamed module cannot leave a stale name behind.
"""

from __future__ import annotations

from support.imports import BRIDGE, BRIDGEDEV

README = BRIDGE.parent / "README.md"
HEADING = "## Layout (along the data flow)"
#: Packages the table names as a whole (see the module docstring).
WHOLE = ("bridgedev/kafka/",)
#: The spans that are paths of the two packages.
PACKAGES = ("bridge/", "bridgedev/")


def table_rows(readme: str) -> list[str]:
    """The rows of the table under :data:`HEADING` (up to the next heading)."""
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def code_spans(row: str) -> list[str]:
    """The texts between backticks in ``row``, in order."""
    return row.split("`")[1::2]


def named_in(row: str) -> set[str]:
    """The paths ``row`` names: ``bridge/...`` and ``bridgedev/...`` spans, and bare ``x.py``
    spans read in the directory of the last such span before them."""
    named: set[str] = set()
    directory = None
    for span in code_spans(row):
        if span.startswith(PACKAGES):
            directory = span if span.endswith("/") else span.rsplit("/", 1)[0] + "/"
            named.add(span)
        elif span.endswith(".py") and "/" not in span and directory is not None:
            named.add(directory + span)
    return named


def modules() -> set[str]:
    root = BRIDGE.parent
    return {
        path.relative_to(root).as_posix()
        for package in (BRIDGE, BRIDGEDEV)
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and not path.relative_to(root).as_posix().startswith(WHOLE)
    }


def test_the_layout_table_names_every_module_of_bridge_and_bridgedev() -> None:
    named = set().union(*map(named_in, table_rows(README.read_text(encoding="utf-8"))))
    missing = sorted(modules() - named)
    assert missing == [], f"README's layout table does not name: {missing}"
    assert set(WHOLE) <= named


def test_every_path_the_layout_table_names_exists() -> None:
    named = set().union(*map(named_in, table_rows(README.read_text(encoding="utf-8"))))
    root = BRIDGE.parent
    assert len(named) > 40, "the table was not found or not read"
    assert sorted(p for p in named if not (root / p).exists()) == []


def test_a_bare_file_name_belongs_to_the_directory_named_before_it() -> None:
    row = "| `bridge/log/reader.py`, `catchup.py`, `bridge/server/` `cursor.py` | x `y` |"
    assert named_in(row) == {
        "bridge/log/reader.py",
        "bridge/log/catchup.py",
        "bridge/server/",
        "bridge/server/cursor.py",
    }

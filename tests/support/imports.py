"""Who imports what in bridge/ (and bridgedev/ beside it), read from the source with a small AST scan (no import of the
modules): imports inside functions count too, and relative imports are resolved."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import bridge

__all__ = [
    "BRIDGE",
    "BRIDGEDEV",
    "bridge_modules",
    "imported_names",
    "importers_of",
    "imports_of",
    "module_name",
]

BRIDGE = Path(bridge.__file__).parent
#: The development package beside the runtime one (not in its wheel).
BRIDGEDEV = BRIDGE.parent / "bridgedev"


def module_name(path: Path) -> str:
    """``bridgedev/demo/__init__.py`` -> ``bridgedev.demo``; ``bridge/cli.py`` -> ``bridge.cli``."""
    parts = path.relative_to(BRIDGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every dotted name ``source`` imports, relative imports resolved; ``from m import n``
    gives both ``m`` and ``m.n`` (``n`` may be a submodule or a name inside ``m``)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def bridge_modules(under: Path = BRIDGE) -> dict[str, Path]:
    """Module name -> file of every module of bridge/ (or of a package below it)."""
    return {module_name(path): path for path in sorted(under.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    name = module_name(path)
    return imported_names(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")


def importers_of(roots: Iterable[str], modules: dict[str, Path]) -> set[str]:
    """The names among ``modules`` that import one of ``roots`` or anything below them."""
    prefixes = tuple(roots)
    return {
        name
        for name, path in modules.items()
        if any(i == r or i.startswith(r + ".") for i in imports_of(path) for r in prefixes)
    }

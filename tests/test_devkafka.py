"""The shape of bridge.devkafka: its public surface, and who may import it (no broker needed).

The behaviour of the brokers it provides is tested in tests/test_broker.py.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import bridge
import bridge.devkafka as devkafka

BRIDGE = Path(bridge.__file__).parent
DEVKAFKA = BRIDGE / "devkafka"
#: The applications that start brokers for a developer; the runtime packages never do.
DEVKAFKA_IMPORTERS = ("cli.py", "demo/")
KAFKA_CLIENT_LIBRARIES = ("aiokafka", "kafka")


def _package_of(path: Path) -> list[str]:
    """The package a module of bridge/ sits in, as name parts (for relative imports)."""
    parts = list(path.relative_to(BRIDGE.parent).with_suffix("").parts)
    return parts[:-1]  # drops the module's name, or the "__init__" of a package


def _imported_modules(source: str, package: list[str]) -> set[str]:
    """Every module ``source`` imports, relative imports resolved against ``package``;
    ``from m import n`` gives both ``m`` and ``m.n`` (``n`` may be a submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _imports_any(names: set[str], roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for name in names for root in roots)


def _imports_of(path: Path) -> set[str]:
    return _imported_modules(path.read_text(encoding="utf-8"), _package_of(path))


def _may_import_devkafka(relative: str) -> bool:
    return any(
        relative == allowed or relative.startswith(allowed) for allowed in DEVKAFKA_IMPORTERS
    )


def test_all_lists_exactly_the_public_names_of_the_package() -> None:
    public = {
        name
        for name, value in vars(devkafka).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert sorted(devkafka.__all__) == sorted(public)
    assert len(set(devkafka.__all__)) == len(devkafka.__all__)


def test_only_the_cli_and_the_demo_import_devkafka() -> None:
    importers = {
        path.relative_to(BRIDGE).as_posix()
        for path in BRIDGE.rglob("*.py")
        if not path.is_relative_to(DEVKAFKA)
        and _imports_any(_imports_of(path), ("bridge.devkafka",))
    }
    assert importers, "the CLI at least starts brokers: the import scan found none"
    assert {name for name in importers if not _may_import_devkafka(name)} == set()


def test_devkafka_imports_no_kafka_client_library() -> None:
    modules = sorted(DEVKAFKA.glob("*.py"))
    assert len(modules) > 1
    offenders = [
        path.name for path in modules if _imports_any(_imports_of(path), KAFKA_CLIENT_LIBRARIES)
    ]
    assert offenders == []


def test_the_import_scan_resolves_relative_and_aliased_imports() -> None:
    """The scan the two rules above rely on must not miss an import written another way."""
    source = "from ..devkafka import probe\nimport aiokafka.admin as admin\nfrom bridge import devkafka\n"
    found = _imported_modules(source, ["bridge", "server"])
    assert {"bridge.devkafka.probe", "aiokafka.admin", "bridge.devkafka"} <= found
    assert _package_of(BRIDGE / "server" / "app.py") == ["bridge", "server"]
    assert _package_of(DEVKAFKA / "__init__.py") == ["bridge", "devkafka"]

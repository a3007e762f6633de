"""The shape of bridgedev.kafka: its public surface, and who may import it (no broker needed).

The behaviour of the brokers it provides is tested in tests/test_broker.py.
"""

from __future__ import annotations

import inspect

from support.imports import BRIDGEDEV, bridge_modules, imported_names, importers_of

import bridgedev.kafka as devkafka

DEVKAFKA = BRIDGEDEV / "kafka"
#: The applications that start brokers for a developer; the runtime packages never do.
DEVKAFKA_IMPORTERS = ("bridge.cli", "bridgedev.demo")
KAFKA_CLIENT_LIBRARIES = ("aiokafka", "kafka")


def _may_import_devkafka(module: str) -> bool:
    return any(module == app or module.startswith(app + ".") for app in DEVKAFKA_IMPORTERS)


def test_all_lists_exactly_the_public_names_of_the_package() -> None:
    public = {
        name
        for name, value in vars(devkafka).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert sorted(devkafka.__all__) == sorted(public)
    assert len(set(devkafka.__all__)) == len(devkafka.__all__)


def test_only_the_cli_and_the_demo_import_devkafka() -> None:
    everything = {**bridge_modules(), **bridge_modules(BRIDGEDEV)}
    outside = {name: path for name, path in everything.items() if not path.is_relative_to(DEVKAFKA)}
    importers = importers_of(["bridgedev.kafka"], outside)
    assert importers, "the CLI at least starts brokers: the import scan found none"
    assert {name for name in importers if not _may_import_devkafka(name)} == set()


def test_devkafka_imports_no_kafka_client_library() -> None:
    modules = bridge_modules(DEVKAFKA)
    assert len(modules) > 1
    assert importers_of(KAFKA_CLIENT_LIBRARIES, modules) == set()


def test_the_import_scan_resolves_relative_and_aliased_imports() -> None:
    """The scan the two rules above rely on must not miss an import written another way."""
    source = (
        "from ..kafka import probe\nimport aiokafka.admin as admin\nfrom bridgedev import kafka\n"
    )
    found = imported_names(source, "bridgedev.demo.command", is_package=False)
    assert {"bridgedev.kafka.probe", "aiokafka.admin", "bridgedev.kafka"} <= found
    found = imported_names("from . import probe\n", "bridgedev.kafka", is_package=True)
    assert "bridgedev.kafka.probe" in found

"""The layering of bridge/ (and of bridgedev/, the development package beside it): who may import what, read from the source (no broker needed).

A small AST scan, not an import of the modules: it sees the imports inside functions too (the
CLI imports its commands lazily), so a cycle hidden from start-up time still shows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from support.imports import (
    BRIDGE,
    BRIDGEDEV,
    bridge_modules,
    imported_names,
    importers_of,
    imports_of,
)

#: The Kafka client layer: the only place that knows aiokafka.
KAFKA_LAYER = BRIDGE / "kafka"


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of bridge/ it imports (a name imported from a module is an edge to
    that module; importing ``a.b`` is not counted as importing the package ``a``)."""
    return {
        name: {other for other in imports_of(path) if other in modules and other != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = list(_pop_until(stack, on_stack, node))
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _pop_until(stack: list[str], on_stack: set[str], node: str) -> Iterator[str]:
    while True:
        top = stack.pop()
        on_stack.discard(top)
        yield top
        if top == node:
            return


# --- the scanner itself ------------------------------------------------------------------------


def test_the_cycle_finder_names_every_module_of_a_cycle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_scan_resolves_relative_imports_and_imports_inside_functions():
    source = "from .narrator import Narrator\ndef f():\n    from bridge import cli\n"
    names = imported_names(source, "bridgedev.demo.walkthrough", is_package=False)
    assert {"bridgedev.demo.narrator", "bridge.cli"} <= names
    names = imported_names("from . import walkthrough\n", "bridgedev.demo", is_package=True)
    assert "bridgedev.demo.walkthrough" in names


# --- the rules ---------------------------------------------------------------------------------


def test_the_import_graph_of_bridge_has_no_cycle():
    graph = import_graph(bridge_modules())
    assert sum(len(edges) for edges in graph.values()) > 50, "the scan found too few imports"
    assert cycles(graph) == []


def test_only_the_kafka_client_layer_imports_aiokafka():
    modules = bridge_modules()
    layer = {name for name, path in modules.items() if path.is_relative_to(KAFKA_LAYER)}
    importers = importers_of(["aiokafka"], modules)
    assert importers & layer, "bridge.kafka imports aiokafka: the scan must see it"
    assert sorted(importers - layer) == []


def test_the_library_imports_no_application_and_the_applications_do_not_import_the_cli():
    runtime = bridge_modules()
    modules = {**runtime, **bridge_modules(BRIDGEDEV)}
    graph = import_graph(modules)
    demo = {
        name for name in modules if name == "bridgedev.demo" or name.startswith("bridgedev.demo.")
    }
    applications = {"bridge.cli", "bridgedev.replay", *demo}
    assert demo, "the scan must see the demo package"
    library = set(runtime) - applications
    assert sorted(name for name in library if graph[name] & applications) == []
    assert sorted(name for name in applications if "bridge.cli" in graph.get(name, set())) == []


def test_of_the_runtime_only_the_cli_imports_the_development_package():
    """bridge/ is the runtime wheel and bridgedev/ is not in it: only the CLI's development
    commands import it, each behind ``development_tooling`` (one line when it is missing)."""
    assert importers_of(["bridgedev"], bridge_modules()) == {"bridge.cli"}


def test_only_the_tracing_module_imports_opentelemetry():
    modules = bridge_modules()
    importers = importers_of(["opentelemetry"], modules)
    assert "bridge.tracing" in importers, (
        "bridge.tracing imports opentelemetry: the scan must see it"
    )
    assert sorted(importers - {"bridge.tracing"}) == []


#: A Kafka client's calls and aiokafka's types, as issue 28 counts them (outside the Kafka layer
#: there must be none: the domain speaks to the log port; the development tooling that drives a
#: broker itself is in bridgedev/, not scanned).
KAFKA_CALLS = re.compile(
    r"getmany\(|\.seek\(|\.position\(|ConsumerRecord|TopicPartition|begin_transaction"
    r"|send_and_wait|AIOKafka"
)
#: aiokafka's errors and result types: code outside the layer catches the port's errors.
KAFKA_NAMES = re.compile(
    r"\bKafkaError\b|OffsetOutOfRangeError|ProducerFenced|RecordMetadata|RecordsToDelete"
    r"|ConsumerRebalanceListener|KafkaTimeoutError"
)


def _outside_the_kafka_layer() -> Iterator[tuple[str, str]]:
    for path in sorted(BRIDGE.rglob("*.py")):
        rel = path.relative_to(BRIDGE).as_posix()
        if path.is_relative_to(KAFKA_LAYER):
            continue
        yield rel, path.read_text(encoding="utf-8")


def test_no_module_outside_the_kafka_layer_calls_a_kafka_client_or_names_its_types():
    inside = (KAFKA_LAYER / "adapter.py").read_text(encoding="utf-8")
    assert KAFKA_CALLS.search(inside) and KAFKA_NAMES.search(inside), "the rules must see them"
    found = {}
    for rel, text in _outside_the_kafka_layer():
        lines = text.splitlines()
        counts = (
            sum(1 for line in lines if KAFKA_CALLS.search(line)),
            sum(1 for line in lines if KAFKA_NAMES.search(line)),
        )
        if counts != (0, 0):
            found[rel] = counts
    assert found == {}, "speak to the log port (bridge/kafka/port.py) instead"


# --- SSE is written in one module --------------------------------------------------------------

#: The one module that writes ``text/event-stream`` text.
SSE_MODULE = BRIDGE / "server" / "sse.py"
#: An SSE field line (``id:``, ``event:``, ``data:``, ``retry:``) or a comment line ending an
#: event, at the start of a literal or of one of its lines.
SSE_FRAMING = re.compile(r"(?:^|\n)(?:id|event|data|retry): |(?:^|\n): [^\n]*\n\n")


def _literals(source: str) -> Iterator[str]:
    """Every string and bytes literal of ``source`` but docstrings; an f-string as its literal
    parts with ``{}`` for each value (so ``f"id: {seq}\\n"`` reads ``id: {}\\n``)."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docstrings.add(id(body[0].value))
    parts_of_fstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                for v in node.values
            )
            parts_of_fstrings.update(id(v) for v in node.values)
            yield text
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in parts_of_fstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            value = node.value
            yield value.decode("latin-1") if isinstance(value, bytes) else value


def sse_framers(root: Path = BRIDGE) -> dict[str, list[str]]:
    """The modules under ``root`` with a literal that frames SSE, and those literals."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        framing = [t for t in _literals(path.read_text(encoding="utf-8")) if SSE_FRAMING.search(t)]
        if framing:
            found[path.relative_to(root).as_posix()] = framing
    return found


def test_only_the_sse_module_frames_server_sent_events():
    """``id:``/``event:``/``data:``/``retry:`` lines, comments and keep-alives are written by
    bridge/server/sse.py alone: the MCP endpoint, the browser view, the Events push stream and
    subscriptions/listen all call it."""
    found = sse_framers()
    rel = SSE_MODULE.relative_to(BRIDGE).as_posix()
    assert rel in found, "the rule must see the SSE module's framing"
    assert {k: v for k, v in found.items() if k != rel} == {}


def test_the_sse_rule_sees_framing_in_any_literal_shape(tmp_path: Path):
    """What the rule catches (and leaves alone), so a framing moved elsewhere cannot hide."""
    (tmp_path / "framing.py").write_text(
        '"""A docstring may say data: x\\n\\n."""\n'
        'A = f"id: {1}\\nevent: message\\ndata: {2}\\n\\n"\n'
        'B = b": keep-alive\\n\\n"\n'
        'C = "retry: 5"\n'
    )
    (tmp_path / "other.py").write_text('D = "a: b"\nE = f"{1}: {2}"\nF = "no data: here"\n')
    found = sse_framers(tmp_path)
    assert list(found) == ["framing.py"] and len(found["framing.py"]) == 3

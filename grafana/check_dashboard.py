"""Check a dashboard JSON file against Grafana's own dashboard model (grafana-foundation-sdk).

Where it sits: beside the dashboard it checks (grafana/dashboards/*.json), outside the bridge's
runtime. ``tests/test_grafana.py`` runs it on the committed dashboard in CI; run it by hand after
editing or exporting the dashboard::

    .venv/bin/python grafana/check_dashboard.py [grafana/dashboards/mcp-kafka-bridge.json ...]

It decodes the JSON into the SDK's typed model (the Python classes generated from Grafana's
dashboard schema and from each panel plugin's and datasource's schema, pinned in pyproject.toml
to the Grafana line the dashboard's ``schemaVersion`` belongs to) and reports, each with its JSON
path:

- keys the model does not know (a misspelled option, a field Grafana would drop or ignore),
- values whose JSON type the model does not allow (a string ``gridPos.w``, an unknown enum),
- panel types and query datasources the model has no schema for (their options, field config or
  queries would go unchecked),
- anything the SDK's own decode -> encode round trip loses or changes (it must keep every
  key/value we wrote; the defaults it adds are fine), and
- a ``schemaVersion`` other than the pinned model's.

The SDK's ``from_json`` neither rejects unknown keys nor checks types (it copies values), so this
module walks the JSON and the decoded objects side by side, reading the expected types from the
model's annotations and each class's JSON key names from its own ``to_json``.
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

#: The committed dashboard (the chart's files/dashboard.json links to it).
DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "mcp-kafka-bridge.json"
#: The package whose generated classes are Grafana's model (not the builders, not cog's runtime).
MODELS_PACKAGE = "grafana_foundation_sdk.models."

# Panel options, field config and queries decode into their typed classes only once the SDK's
# panel and datasource plugins are registered; without this they would stay unchecked dicts.
plugins.register_default_plugins()


def _is_model(value: object) -> bool:
    """Whether ``value`` is an instance of one of the SDK's generated model classes."""
    return type(value).__module__.startswith(MODELS_PACKAGE) and hasattr(value, "to_json")


@cache
def _json_keys(cls: type) -> dict[str, str]:
    """``{JSON key: attribute name}`` of a model class, read from its own ``to_json``.

    Every generated ``to_json`` copies attributes into keys (``payload["gridPos"] =
    self.grid_pos``), so an instance whose attributes are distinct markers shows the mapping
    without restating the SDK's naming rules (``id_val`` -> ``id``, ``min_val`` -> ``min``).
    """
    probe: Any = object.__new__(cls)  # no __init__: its defaults would hide the markers
    markers = {name: object() for name in typing.get_type_hints(cls)}
    for name, marker in markers.items():
        setattr(probe, name, marker)
    payload = probe.to_json()
    by_marker = {id(marker): name for name, marker in markers.items()}
    return {key: by_marker[id(value)] for key, value in payload.items() if id(value) in by_marker}


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(annotation: Any) -> str:
    """A short name of an expected type, for messages."""
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return "one of " + ", ".join(repr(m.value) for m in annotation)
        return {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(
            annotation, f"an object ({annotation.__name__})"
        )
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin is list:
        return "a list"
    if origin is dict:
        return "an object"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    return str(annotation)


def _check_object(src: Any, decoded: Any, path: str) -> list[str]:
    """Problems of the JSON object ``src`` that the SDK decoded into the model ``decoded``."""
    cls: type = type(decoded)
    if not isinstance(src, dict):
        return [f"{path}: expected an object ({cls.__name__}), got {json.dumps(src)}"]
    if isinstance(decoded, runtime.UnknownDataquery):
        return [f"{path}: a query of a datasource type the model has no schema for"]
    keys = _json_keys(cls)
    found = []
    for key, value in src.items():
        where = f"{path}.{key}"
        if key not in keys:
            found.append(f"{where}: not in Grafana's model of {cls.__name__}")
            continue
        name = keys[key]
        found += _check_value(value, getattr(decoded, name), _hints(cls)[name], where)
    return found


def _check_value(src: Any, decoded: Any, annotation: Any, path: str) -> list[str]:
    """Problems of the JSON value ``src`` against the model's ``annotation``; ``decoded`` is what
    the SDK made of it (a model object where it decodes one, else the JSON value itself)."""
    if _is_model(decoded) or isinstance(decoded, cogvariants.Dataquery):
        return _check_object(src, decoded, path)
    if annotation is Any or annotation is object:
        return []
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if src is None and type(None) in args:
            return []
        arms = [a for a in args if a is not type(None)]
        for arm in arms:
            found = _check_value(src, decoded, arm, path)
            if not found:
                return []
        if len(arms) == 1:
            return found
        return [f"{path}: expected {_describe(annotation)}, got {json.dumps(src)}"]
    if origin is typing.Literal:
        if src in args and type(src) in {type(a) for a in args}:
            return []
        return [f"{path}: expected {_describe(annotation)}, got {json.dumps(src)}"]
    if origin is list:
        if not isinstance(src, list):
            return [f"{path}: expected a list, got {json.dumps(src)}"]
        items = decoded if isinstance(decoded, list) and len(decoded) == len(src) else src
        return [
            problem
            for i, (item, made) in enumerate(zip(src, items, strict=True))
            for problem in _check_value(item, made, args[0], f"{path}[{i}]")
        ]
    if origin is dict:
        if not isinstance(src, dict):
            return [f"{path}: expected an object, got {json.dumps(src)}"]
        return [
            problem
            for key, item in src.items()
            for problem in _check_value(item, item, args[1], f"{path}.{key}")
        ]
    if isinstance(annotation, type):
        return _check_scalar_or_class(src, annotation, path)
    return [f"{path}: the model's type {annotation!r} is not understood by this checker"]


def _check_scalar_or_class(src: Any, annotation: type, path: str) -> list[str]:
    """Problems of a JSON scalar (or an object the SDK left undecoded) against a class."""
    if issubclass(annotation, enum.Enum):
        values = [m.value for m in annotation]
        # JSON's true is not the integer 1, although Python says True == 1.
        if src in values and not isinstance(src, bool):
            return []
    elif annotation is float:
        if isinstance(src, int | float) and not isinstance(src, bool):
            return []
    elif annotation is int:
        if isinstance(src, int) and not isinstance(src, bool):
            return []
    elif annotation in (str, bool):
        if isinstance(src, annotation):
            return []
    elif hasattr(annotation, "from_json"):
        # A field the SDK's from_json copies as JSON although the model types it (Panel.links).
        if isinstance(src, dict):
            return _check_object(src, annotation.from_json(src), path)
    else:
        return [f"{path}: the model's type {annotation!r} is not understood by this checker"]
    return [f"{path}: expected {_describe(annotation)}, got {json.dumps(src)}"]


def _round_trip_losses(src: Any, encoded: Any, path: str) -> list[str]:
    """Where the SDK's encoding of the decoded dashboard dropped or changed what ``src`` says."""
    if isinstance(src, dict):
        if not isinstance(encoded, dict):
            return [f"{path}: became {json.dumps(encoded)} in the round trip"]
        return [
            problem
            for key, value in src.items()
            for problem in (
                _round_trip_losses(value, encoded[key], f"{path}.{key}")
                if key in encoded
                else [f"{path}.{key}: dropped by the round trip through the model"]
            )
        ]
    if isinstance(src, list):
        if not isinstance(encoded, list) or len(encoded) != len(src):
            return [f"{path}: became {json.dumps(encoded)} in the round trip"]
        return [
            problem
            for i, (item, out) in enumerate(zip(src, encoded, strict=True))
            for problem in _round_trip_losses(item, out, f"{path}[{i}]")
        ]
    if src != encoded or type(src) is not type(encoded):
        return [f"{path}: {json.dumps(src)} became {json.dumps(encoded)} in the round trip"]
    return []


def _decode(board: dict[str, Any]) -> tuple[model.Dashboard | None, list[str]]:
    """The dashboard decoded by the SDK, or the panels/variables it cannot decode."""
    try:
        return model.Dashboard.from_json(board), []
    # The SDK raises whatever the bad JSON provokes (KeyError, TypeError, AttributeError...).
    except Exception as whole:
        found = []
        parts: list[tuple[str, Any, Any]] = [
            (f"$.panels[{i}]", model.RowPanel if p.get("type") == "row" else model.Panel, p)
            for i, p in enumerate(board.get("panels", []))
            if isinstance(p, dict)
        ]
        templating = board.get("templating", {})
        variables = templating.get("list", []) if isinstance(templating, dict) else []
        parts += [
            (f"$.templating.list[{i}]", model.VariableModel, v) for i, v in enumerate(variables)
        ]
        for where, cls, part in parts:
            try:
                cls.from_json(part)
            except Exception as error:
                found.append(f"{where}: the model cannot decode it ({error!r})")
        return None, found or [f"$: the model cannot decode the dashboard ({whole!r})"]


def _panels(decoded: model.Dashboard) -> list[tuple[str, model.Panel]]:
    """``(JSON path, panel)`` of every panel that is not a row, inside collapsed rows too."""
    found = []
    for i, panel in enumerate(decoded.panels or []):
        if isinstance(panel, model.RowPanel):
            found += [(f"$.panels[{i}].panels[{j}]", p) for j, p in enumerate(panel.panels)]
        else:
            found.append((f"$.panels[{i}]", panel))
    return found


def problems(board: Any) -> list[str]:
    """Everything in the dashboard JSON ``board`` that Grafana's model does not represent, each
    message starting with its JSON path; empty when the dashboard is all model."""
    if not isinstance(board, dict):
        return [f"$: expected a dashboard object, got {json.dumps(board)[:80]}"]
    decoded, found = _decode(board)
    if decoded is None:
        return found
    found += _check_object(board, decoded, "$")
    for where, panel in _panels(decoded):
        if runtime.panelcfg_config(panel.type_val) is None:
            found.append(f"{where}.type: {panel.type_val!r} is not a panel the model knows")
    encoded = json.loads(json.dumps(decoded, cls=JSONEncoder))
    # An unknown key is also dropped by the round trip: say it once, the first way.
    said = {problem.partition(": ")[0] for problem in found}
    found += [
        problem
        for problem in _round_trip_losses(board, encoded, "$")
        if problem.partition(": ")[0] not in said
    ]
    pinned = model.Dashboard().schema_version
    if board.get("schemaVersion") != pinned:
        found.append(
            f"$.schemaVersion: {board.get('schemaVersion')!r}, but the pinned Grafana model is "
            f"schemaVersion {pinned} (re-export the dashboard from that Grafana or change the pin)"
        )
    return found


def main(argv: list[str]) -> int:
    """Check each dashboard file named in ``argv`` (default: the committed one); 1 if any fails."""
    failed = False
    for name in argv or [str(DASHBOARD)]:
        try:
            board = json.loads(Path(name).read_text())
        except (OSError, ValueError) as error:
            print(f"{name}: cannot read it as JSON: {error}")
            failed = True
            continue
        found = problems(board)
        for problem in found:
            print(f"{name}: {problem}")
        failed = failed or bool(found)
        if not found:
            print(f"{name}: OK (Grafana's dashboard model, schemaVersion {board['schemaVersion']})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

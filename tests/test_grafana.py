"""The Grafana dashboard checked against Grafana's own dashboard model, and the project's rules.

grafana/check_dashboard.py decodes grafana/dashboards/mcp-kafka-bridge.json into the typed model
of grafana-foundation-sdk (pyproject's test extra pins the Grafana line) and reports, by JSON
path, every key the model does not know, every value of a type it does not allow, and anything the
decode -> encode round trip loses. These tests run it on the committed file, show on deliberately
broken copies that it catches each kind of fault, and keep the project's own rules (stable uid,
no id/version, the $datasource variable, the rows, a description on every panel, the
provisioning). No network and no Grafana: the model is the installed package. Which metrics the
panels use, and that every panel returns data from a live bridge, is tests/test_observability.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "grafana" / "dashboards" / "mcp-kafka-bridge.json"
PROVISIONING = ROOT / "grafana" / "provisioning"
CHECKER = ROOT / "grafana" / "check_dashboard.py"

ROWS = [
    *("Streams", "Lag", "Retention", "Index", "Ownership", "Tasks", "Wire", "Canary"),
    *("Fail-over", "Rollouts"),
]
#: How every panel, query and the $job variable name their datasource: the dashboard variable.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _load_checker() -> ModuleType:
    """grafana/check_dashboard.py as a module (grafana/ is a folder of files, not a package)."""
    spec = importlib.util.spec_from_file_location("check_dashboard", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _index(board: dict[str, Any], kind: str) -> int:
    """The index in ``panels`` of the first panel of type ``kind``."""
    return next(i for i, p in enumerate(board["panels"]) if p["type"] == kind)


# --- Grafana's model -----------------------------------------------------------------------


def test_the_dashboard_is_all_grafana_model() -> None:
    assert checker.problems(dashboard()) == []


def test_every_panel_and_query_decodes_into_its_plugin_s_typed_model() -> None:
    """The check is only as deep as the decoding: the options, field config and queries of every
    panel must come out as the stat/timeseries/prometheus classes, not as unchecked dicts."""
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus, stat, timeseries

    decoded = model.Dashboard.from_json(dashboard())
    kinds = {"stat": stat, "timeseries": timeseries}
    seen = set()
    for _, panel in checker._panels(decoded):  # the panels of collapsed rows too
        plugin = kinds[panel.type_val]
        seen.add(panel.type_val)
        assert isinstance(panel.options, plugin.Options), panel.title
        assert panel.field_config is not None
        custom = panel.field_config.defaults.custom
        assert custom is None or isinstance(custom, plugin.FieldConfig), panel.title
        assert panel.targets and all(isinstance(t, prometheus.Dataquery) for t in panel.targets)
    assert seen == set(kinds)


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    """A change of the dashboard: the value at ``path`` set to ``value``."""

    def change(board: dict[str, Any]) -> None:
        node: Any = board
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return change


STAT, SERIES = 1, 2  # the first stat and the first timeseries panel of the committed dashboard


def _collapse_first_row_with_a_misspelled_stat(board: dict[str, Any]) -> None:
    """A collapsed row keeps its panels inside it: they are checked there too."""
    stat = copy.deepcopy(board["panels"][STAT])
    stat["options"]["colourMode"] = "background"
    board["panels"][0].update(collapsed=True, panels=[stat])


#: A fault a hand edit or an export can bring in, and the start of the message that must name it.
FAULTS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "misspelled panel option": (
        _set(["panels", STAT, "options", "colourMode"], "background"),
        f"$.panels[{STAT}].options.colourMode: not in Grafana's model",
    ),
    "misspelled nested option": (
        _set(["panels", SERIES, "options", "legend", "showLegnd"], True),
        f"$.panels[{SERIES}].options.legend.showLegnd: not in Grafana's model",
    ),
    "misspelled custom field config": (
        _set(["panels", SERIES, "fieldConfig", "defaults", "custom", "lineWidht"], 1),
        f"$.panels[{SERIES}].fieldConfig.defaults.custom.lineWidht: not in Grafana's model",
    ),
    "string gridPos width": (
        _set(["panels", STAT, "gridPos", "w"], "4"),
        f"$.panels[{STAT}].gridPos.w: expected an integer",
    ),
    "gridPos not an object": (
        _set(["panels", STAT, "gridPos"], [0, 0, 4, 8]),
        f"$.panels[{STAT}].gridPos: expected an object",
    ),
    "unknown enum value": (
        _set(["panels", STAT, "options", "colorMode"], "bg"),
        f"$.panels[{STAT}].options.colorMode: expected one of",
    ),
    "string threshold": (
        _set(["panels", STAT, "fieldConfig", "defaults", "thresholds", "steps", 1, "value"], "1"),
        f"$.panels[{STAT}].fieldConfig.defaults.thresholds.steps[1].value: expected a number",
    ),
    "misspelled query field": (
        _set(["panels", STAT, "targets", 0, "legend"], "x"),
        f"$.panels[{STAT}].targets[0].legend: not in Grafana's model",
    ),
    "boolean as a string": (
        _set(["panels", STAT, "targets", 0, "range"], "true"),
        f"$.panels[{STAT}].targets[0].range: expected a boolean",
    ),
    "misspelled datasource ref": (
        _set(["panels", STAT, "datasource", "uuid"], "x"),
        f"$.panels[{STAT}].datasource.uuid: not in Grafana's model",
    ),
    "unknown panel type": (
        _set(["panels", STAT, "type"], "stats"),
        f"$.panels[{STAT}].type: 'stats' is not a panel the model knows",
    ),
    "query of an unknown datasource type": (
        _set(["panels", STAT, "datasource", "type"], "prom"),
        f"$.panels[{STAT}].targets[0]: a query of a datasource type the model has no schema",
    ),
    "fault inside a collapsed row": (
        _collapse_first_row_with_a_misspelled_stat,
        "$.panels[0].panels[0].options.colourMode: not in Grafana's model",
    ),
    "description on a row": (
        _set(["panels", 0, "description"], "rows show no description"),
        "$.panels[0].description: not in Grafana's model of RowPanel",
    ),
    "boolean variable hide": (
        _set(["templating", "list", 0, "hide"], True),
        "$.templating.list[0].hide: expected one of 0, 1, 2",
    ),
    "misspelled top-level key": (_set(["refrsh"], "30s"), "$.refrsh: not in Grafana's model"),
    "undecodable value mapping": (
        _set(["panels", STAT, "fieldConfig", "defaults", "mappings"], [{"type": "valu"}]),
        f"$.panels[{STAT}]: the model cannot decode it",
    ),
    "schemaVersion of another Grafana": (
        _set(["schemaVersion"], 41),
        "$.schemaVersion: 41, but the pinned Grafana model is schemaVersion 39",
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_model_check_names_each_kind_of_fault_by_its_json_path(fault: str) -> None:
    board = dashboard()
    assert [p["type"] for p in board["panels"][: SERIES + 1]] == ["row", "stat", "timeseries"]
    change, expected = FAULTS[fault]
    broken = copy.deepcopy(board)
    change(broken)
    found = checker.problems(broken)
    assert [p for p in found if p.startswith(expected)], found
    assert len(found) == 1, found  # one fault, one message: nothing else changed


def test_the_round_trip_reports_what_the_sdk_would_lose_or_change() -> None:
    """The second, independent net: the SDK's own encoding of what it decoded must keep every
    key/value of the file (here a key the SDK cannot carry through its encoder)."""
    board = dashboard()
    encoded = {**board, "panels": board["panels"][:1]}
    assert checker._round_trip_losses(board, encoded, "$") == [
        f"$.panels: became {json.dumps(encoded['panels'])} in the round trip"
    ]
    assert checker._round_trip_losses({"a": {"b": 1}}, {"a": {"b": 1.0}}, "$") == [
        "$.a.b: 1 became 1.0 in the round trip"
    ]
    assert checker._round_trip_losses({"a": [True]}, {"a": [True], "added": 0}, "$") == []


def test_the_check_command_prints_the_paths_and_fails(tmp_path: Path) -> None:
    good = subprocess.run(
        [sys.executable, str(CHECKER)], capture_output=True, text=True, timeout=60
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert "OK (Grafana's dashboard model, schemaVersion 39)" in good.stdout
    board = dashboard()
    board["panels"][STAT]["gridPos"]["w"] = "4"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(board))
    not_json = tmp_path / "not.json"
    not_json.write_text("{")
    bad = subprocess.run(
        [sys.executable, str(CHECKER), str(broken), str(not_json)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert f"{broken}: $.panels[{STAT}].gridPos.w: expected an integer" in bad.stdout
    assert f"{not_json}: cannot read it as JSON" in bad.stdout


# --- the project's rules -------------------------------------------------------------------


def test_dashboard_is_code_with_a_stable_uid_a_datasource_variable_and_described_panels() -> None:
    board = dashboard()
    assert board["uid"] == "mcp-kafka-bridge"
    assert "id" not in board and "version" not in board
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["datasource"] == DATASOURCE
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ROWS
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        # Rows have no description in Grafana's model (the check above rejects one); panels must.
        assert panel.get("description", "").strip(), f"panel {panel['title']!r} has no description"
        assert panel["targets"], panel["title"]
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert source == DATASOURCE, panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique within the dashboard"


def test_grafana_provisioning_points_at_the_dashboards_folder() -> None:
    datasource = (PROVISIONING / "datasources" / "prometheus.yaml").read_text()
    assert "type: prometheus" in datasource
    provider = (PROVISIONING / "dashboards" / "bridge.yaml").read_text()
    assert "type: file" in provider
    assert "path: /var/lib/grafana/dashboards/mcp-kafka-bridge" in provider


def test_the_sdk_pin_in_pyproject_is_the_installed_model() -> None:
    """The model the check uses is the one pyproject pins (an exact version: the SDK's versions
    carry a build epoch, so a range would pick a build of another Grafana line)."""
    from importlib.metadata import version

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"grafana-foundation-sdk=={version("grafana-foundation-sdk")}"' in pyproject

"""Runtime vs development: the runtime wheel holds ``bridge/`` and nothing of the development
tooling beside it (``bridgedev/``, ``simulation/``, trustme), and in an install without the
development package its commands say so in one line (no broker needed).

The wheel is built from a copy of what ``pip install .`` of a checkout sees (pip builds in the
source tree and setuptools keeps its ``build/`` there, which could carry stale files into the next
wheel: the copy keeps the checkout clean and the wheel honest).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
from support.imports import BRIDGE

from bridge import cli

ROOT = BRIDGE.parent
#: What the runtime wheel is made from, and the development tooling beside it that it must leave.
SOURCES = ("pyproject.toml", "README.md", "schemas", "bridge", "bridgedev", "simulation")
#: Names that only the development tooling has (its packages, the modules that moved out).
DEV_MARKERS = ("bridgedev", "devkafka", "simulation", "/demo/", "checker.py", "replay.py")
BUILD_BOUND_S = 300.0  # a bound on a hung build, not a timing target


@pytest.fixture(scope="module")
def runtime_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("checkout")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        check=True,
        timeout=BUILD_BOUND_S,
    )
    (wheel,) = out.glob("mcp_kafka_bridge-*.whl")
    return zipfile.ZipFile(wheel)


@pytest.mark.slow  # the wheel is built once for both (~5 s)
def test_the_runtime_wheel_holds_bridge_and_no_development_tooling(
    runtime_wheel: zipfile.ZipFile,
) -> None:
    names = runtime_wheel.namelist()
    assert {"bridge/cli.py", "bridge/kafka/probe.py", "bridge/schemas/task_event.avsc"} <= set(
        names
    ), "the wheel must hold the runtime (and the scan must see it)"
    outside = [n for n in names if not n.startswith(("bridge/", "mcp_kafka_bridge-"))]
    assert outside == []
    assert [n for n in names if any(marker in n for marker in DEV_MARKERS)] == []


@pytest.mark.slow  # the wheel is built once for both (~5 s)
def test_the_runtime_wheel_does_not_require_trustme(runtime_wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in runtime_wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [
        line.split(":", 1)[1].strip()
        for line in runtime_wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    runtime = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("aiokafka") for r in runtime), "the scan must see the dependencies"
    assert [r for r in runtime if r.startswith("trustme")] == []


def test_the_image_gets_only_the_runtime_and_checks_it_at_build_time() -> None:
    """The build context is an allow-list (.dockerignore) without the development tooling, and
    the image's build fails if it is importable there anyway."""
    allowed = [
        line[1:].strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    ]
    assert "bridge" in allowed, "the scan must see the allow-list"
    assert [a for a in allowed if any(m.strip("/") in a for m in DEV_MARKERS)] == []
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    check = "for m in ('bridgedev', 'trustme')))"
    assert any(line.startswith("RUN ") and check in line for line in dockerfile.splitlines())


# --- a runtime-only install: the development commands say what they need ---------------------


@pytest.fixture
def without_bridgedev(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process as a runtime-only install sees it: every import of bridgedev fails."""
    names = {"bridgedev", "bridgedev.kafka", "bridgedev.demo", "bridgedev.replay"}
    names |= {name for name in sys.modules if name.startswith("bridgedev.")}
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)  # None: "import of ... halted"


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["kafka", "start"], "`bridge kafka`"),
        (["kafka", "status"], "`bridge kafka`"),
        (["demo", "--exit"], "`bridge demo`"),
        (["replay", "data/agent-session.jsonl"], "`bridge replay`"),
    ],
)
@pytest.mark.usefixtures("without_bridgedev")
def test_a_development_command_without_the_development_install_is_one_clear_line(
    argv: list[str], what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"bridge {argv[0]}")
    assert what in err and "development install" in err and "./bridgedev" in err


@pytest.mark.usefixtures("without_bridgedev")
def test_without_kafka_settings_a_runtime_install_names_the_bootstrap_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (
        "BRIDGE_KAFKA__BOOTSTRAP_SERVERS",
        "KAFKA_BOOTSTRAP_SERVERS",
        "BRIDGE_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["topics", "create"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "no Kafka configured: set BRIDGE_KAFKA__BOOTSTRAP_SERVERS" in err
    assert "development install" in err


def test_a_module_missing_inside_the_development_package_is_not_hidden() -> None:
    """Only bridgedev itself missing is the runtime-install case; its own missing dependency
    (trustme, say) is a broken install and keeps its traceback."""
    with pytest.raises(ModuleNotFoundError), cli.development_tooling("x"):
        raise ModuleNotFoundError("No module named 'trustme'", name="trustme")
    with pytest.raises(cli.UserError), cli.development_tooling("x"):
        raise ModuleNotFoundError("No module named 'bridgedev'", name="bridgedev")

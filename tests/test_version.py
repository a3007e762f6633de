"""One version everywhere a release names it: the package, the chart, the images the manifests
deploy and the changelog's newest entry (a release that bumps one and not the others would ship
manifests that deploy another version's code)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

import bridge

ROOT = Path(__file__).resolve().parent.parent


def _package_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_package_and_the_module_say_the_same_version() -> None:
    assert bridge.__version__ == _package_version()


def test_the_chart_deploys_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "charts/mcp-kafka-bridge/Chart.yaml").read_text())
    assert chart["appVersion"] == _package_version()


def test_every_kustomization_deploys_the_package_version() -> None:
    tags = []
    for path in sorted((ROOT / "k8s").rglob("kustomization.yaml")):
        for image in yaml.safe_load(path.read_text()).get("images", []):
            if "newTag" in image:
                tags.append((path.relative_to(ROOT).as_posix(), str(image["newTag"])))
    assert tags, "no kustomization pins an image tag"
    assert all(tag == _package_version() for _, tag in tags), tags


def test_the_changelog_s_newest_entry_is_the_package_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", text, re.MULTILINE)
    assert newest is not None and newest.group(1) == _package_version()

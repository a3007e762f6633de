"""Lay out the Kubernetes JSON schemas of the PyPI package kubernetes-validate for kubeconform.

kubeconform validates offline against a folder of JSON schemas, one file per kind and API
version. kubernetes-validate (PyPI) bundles such schemas, generated from the Kubernetes OpenAPI
documents, for every minor release it supports, in a "-local-strict" flavour (no additional
properties anywhere). Its files refer to a shared ``_definitions.json`` by an absolute URL
(``$id: https://kubernetes.io/api/...``, ``$ref: /api/_definitions.json#...``) that its own
Python resolver maps to the package; kubeconform would fetch that URL. So this copies each
wanted version into kubeconform's default layout,

    DEST/v1.30.0-standalone-strict/deployment-apps-v1.json

with the ``$id`` removed and the references made relative to the file. Then

    kubeconform -strict -kubernetes-version 1.30.0 -schema-location DEST ...

finds them without any network. Idempotent: a version already laid out is skipped.

    python k8s/schemas/kubernetes_schemas.py SITE_DIR DEST

SITE_DIR is where ``pip install --target`` put kubernetes-validate.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

__all__ = ["KUBERNETES_VERSIONS", "layout"]

#: The Kubernetes versions tests/test_k8s.py validates k8s/ against: the oldest we support and
#: the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

_ABSOLUTE_REF = '"/api/_definitions.json#'


def _convert(source: Path, target: Path) -> None:
    for path in source.glob("*.json"):
        text = path.read_text(encoding="utf-8").replace(_ABSOLUTE_REF, '"_definitions.json#')
        schema = json.loads(text)
        schema.pop("$id", None)
        (target / path.name).write_text(json.dumps(schema), encoding="utf-8")


def layout(site_dir: Path, dest: Path, versions: tuple[str, ...] = KUBERNETES_VERSIONS) -> None:
    """Lay out ``versions`` from the kubernetes-validate package in ``site_dir`` under ``dest``."""
    bundled = site_dir / "kubernetes_validate" / "kubernetes-json-schema"
    for version in versions:
        target = dest / f"v{version}-standalone-strict"
        if (target / "_definitions.json").is_file():
            continue
        source = bundled / f"v{version}-local-strict"
        if not source.is_dir():
            raise SystemExit(f"kubernetes-validate in {site_dir} has no schemas for {version}")
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _convert(source, partial)
        partial.rename(target)  # all or nothing: a half-written folder is never used
        print(f"kubeconform schemas for Kubernetes {version}: {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    layout(Path(sys.argv[1]), Path(sys.argv[2]))

"""The published worker contract's JSON Schemas (schemas/*.schema.json) as validators.

Shared by the tests that check what the bridge, the Python SDK and the Java reference worker
write: every ``$ref`` between the schemas resolves locally, nothing is fetched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

__all__ = ["JSON_SCHEMAS", "SCHEMAS", "invalid", "valid", "validator"]

SCHEMAS = Path(__file__).resolve().parent.parent.parent / "schemas"
JSON_SCHEMAS = sorted(SCHEMAS.glob("*.schema.json"))


def _registry() -> Registry:
    resources = []
    for path in JSON_SCHEMAS:
        document = json.loads(path.read_text(encoding="utf-8"))
        resources.append((document["$id"], Resource.from_contents(document)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(name: str) -> jsonschema.Draft202012Validator:
    """The validator of ``schemas/<name>.schema.json``, its references resolved locally."""
    document = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(document, registry=REGISTRY)


def valid(name: str, instance: Any) -> None:
    """Assert that ``instance`` keeps ``schemas/<name>.schema.json``."""
    errors = [e.message for e in validator(name).iter_errors(instance)]
    assert not errors, f"{name}: {errors} in {instance!r}"


def invalid(name: str, instance: Any) -> None:
    """Assert that ``schemas/<name>.schema.json`` refuses ``instance``."""
    assert not validator(name).is_valid(instance), f"{name} accepted {instance!r}"

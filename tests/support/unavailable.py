"""The one rule for a test whose tool or broker is missing on this machine.

Locally such a test is skipped with a reason that names what is missing and how to get it
(`make test` sets everything up); under CI (``CI`` set) it fails instead, since CI sets up
everything and a skip there would hide a test that never ran.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

from bridge.config import running_in_ci

__all__ = ["unavailable"]


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``; under CI, fail it."""
    if running_in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)

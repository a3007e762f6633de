"""tests/support/unavailable.py: a missing tool or broker skips locally and fails under CI."""

from __future__ import annotations

import pytest
from support.unavailable import unavailable


def test_a_missing_tool_skips_here_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium \\(run `make system-deps`\\)"):
        unavailable("no chromium (run `make system-deps`)")


def test_under_ci_a_missing_tool_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no Kafka broker"):
        unavailable("no Kafka broker could be provided")

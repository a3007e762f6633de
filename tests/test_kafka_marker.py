"""The `kafka` marker is set from a test's fixtures, so `-m "not kafka"` needs no broker."""

from __future__ import annotations

import pytest


def test_every_collected_test_using_a_broker_fixture_is_marked_kafka(
    request: pytest.FixtureRequest,
) -> None:
    from conftest import BROKER_FIXTURES

    unmarked = [
        item.nodeid
        for item in request.session.items
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("kafka") is None
    ]
    assert unmarked == []


def test_a_test_without_a_broker_fixture_or_marker_stays_in_the_fast_tier(
    request: pytest.FixtureRequest,
) -> None:
    assert request.node.get_closest_marker("kafka") is None

"""The method label of the request and forwarding counters (bridge.metrics.KNOWN_METHODS)."""

from __future__ import annotations

from prometheus_client import generate_latest

from bridge.metrics import Metrics


def test_the_events_methods_are_counted_under_their_own_names() -> None:
    """They were ``other`` in the request and forwarding counters, so an operator could not
    tell a forwarded ``events/poll`` from a client's unknown method; an unknown method is
    still ``other`` (clients choose method names: the label set stays bounded)."""
    metrics = Metrics()
    for method in ("events/poll", "events/stream", "events/subscribe", "nonsense/method"):
        metrics.forward(method, "ok", 0.001)
        metrics.rpc(method, "ok", 0.001)
    text = generate_latest(metrics.registry).decode()
    for method in ("events/poll", "events/stream", "events/subscribe", "other"):
        assert f'bridge_forwarded_requests_total{{method="{method}",outcome="ok"}} 1.0' in text
        assert f'bridge_rpc_requests_total{{code="ok",method="{method}"}} 1.0' in text
    assert "nonsense" not in text

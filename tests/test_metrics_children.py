"""Labelled series found once per label set (app/metrics.py, issue 40): each request, statement,
transition and pull end adds to the one series its labels name, as labels() would, and the
children are kept per label set, not looked up again."""

from __future__ import annotations

from app.domain.pulls import PullEnd
from app.metrics import Metrics


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_each_label_set_has_its_series_and_keeps_its_child() -> None:
    metrics = Metrics()
    for status in (202, 202, 404):
        metrics.observe_request("POST", "/channel/{channel_id}/broadcast", status, 0.002)
    metrics.observe_request("GET", "/_status", 200, 0.5)
    route = {"method": "POST", "route": "/channel/{channel_id}/broadcast"}
    assert value(metrics, "webhook_broker_http_requests_total", **route, status="202") == 2
    assert value(metrics, "webhook_broker_http_requests_total", **route, status="404") == 1
    seconds = "webhook_broker_http_request_duration_seconds"
    assert value(metrics, f"{seconds}_count", **route) == 3
    assert value(metrics, f"{seconds}_bucket", **route, le="0.0025") == 3
    assert value(metrics, f"{seconds}_count", method="GET", route="/_status") == 1
    assert len(metrics._request_series) == 3  # one per (method, route, status)

    for _ in range(2):
        metrics.transition("ack", 3)
        metrics.statement("ack", 0.001)
        metrics.pull_ended("http", PullEnd.FILLED, 0.01, 5)
    metrics.transition("nak", 0)  # nothing to count: no series made
    assert value(metrics, "webhook_broker_transitions_total", kind="ack") == 6
    assert value(metrics, "webhook_broker_transitions_total", kind="nak") is None
    assert value(metrics, "webhook_broker_statement_duration_seconds_count", statement="ack") == 2
    waits = "webhook_broker_pull_wait_seconds_count"
    assert value(metrics, waits, transport="http", outcome="filled") == 2
    assert value(metrics, "webhook_broker_pull_jobs_total", transport="http") == 10
    kept = (metrics._transitions, metrics._statements, metrics._pull_waits)
    assert [len(children) for children in kept] == [1, 1, 1]

"""The grouped PromQL and its fan-out: one query for every service of a Prometheus."""

import re
from datetime import UTC, datetime
from typing import Any

from kiln_operator.autoscaling.prometheus import Snapshot, observation
from kiln_operator.autoscaling.signals import (
    SIGNAL_LABEL,
    ServiceSignals,
    fan_out,
    grouped_query,
    signal_expressions,
)


def test_every_signal_is_grouped_by_namespace_and_service_in_one_query() -> None:
    query = grouped_query(60)
    expressions = signal_expressions(60)
    inner = sum(expression.count(" or ") for expression in expressions.values())
    assert query.count(" or ") == len(expressions) - 1 + inner
    for signal, expression in expressions.items():
        assert f'label_replace({expression}, "{SIGNAL_LABEL}", "{signal}", "", "")' in query
        assert "by (namespace, inferenceservice" in expression
    assert "[60s]" in expressions["requests_per_second"]
    assert "sum by (namespace, inferenceservice, le)" in expressions["p99_seconds"]
    assert "selector" not in query and 'inferenceservice="' not in query  # no per-service text


def test_gauges_survive_a_failed_scrape() -> None:
    """A failed scrape leaves a staleness marker as the newest point, which hides a series from
    an instant selector: the gauges are read over the window as well."""
    expressions = signal_expressions(60)
    stable = '{kiln_track!="canary"}'
    assert f"max_over_time(timestamp(kiln_queue_depth{stable})[60s:5s])" in expressions["freshest"]
    live, fallback = expressions["queue_depth"].split(" or ")
    assert live == f"sum by (namespace, inferenceservice) (kiln_queue_depth{stable})"
    assert f"last_over_time(kiln_queue_depth{stable}[60s])" in fallback
    assert "[15s:1s]" in signal_expressions(15)["freshest"]


def sample(signal: str, namespace: str, service: str, value: str) -> dict[str, Any]:
    labels = {SIGNAL_LABEL: signal, "namespace": namespace, "inferenceservice": service}
    return {"metric": labels, "value": [1_700_000_000.0, value]}


def test_fan_out_gives_each_service_its_own_signals_and_drops_nan() -> None:
    result = [
        sample("freshest", "shop", "ranker", "1700000000"),
        sample("requests_per_second", "shop", "ranker", "12.5"),
        sample("p99_seconds", "shop", "ranker", "0.042"),
        sample("freshest", "ads", "ranker", "1699999990"),
        sample("requests_per_second", "ads", "ranker", "0"),
        sample("p99_seconds", "ads", "ranker", "NaN"),  # no traffic in the window
        sample("unknown", "ads", "ranker", "1"),
        {"metric": {SIGNAL_LABEL: "freshest"}, "value": [0, "1"]},  # no service labels
    ]
    services = fan_out(result)
    assert services == {
        ("shop", "ranker"): ServiceSignals(
            freshest=1_700_000_000.0, requests_per_second=12.5, p99_seconds=0.042
        ),
        ("ads", "ranker"): ServiceSignals(freshest=1_699_999_990.0, requests_per_second=0.0),
    }


def test_observation_per_service_from_one_snapshot() -> None:
    signals = ServiceSignals(
        freshest=1_700_000_000.0,
        requests_per_second=40.0,
        p99_seconds=0.05,
        queue_depth=6.0,
        rows_per_second=40.0,
        batches_per_second=5.0,
        compute_seconds_per_second=1.0,
        ok_per_second=40.0,
    )
    snapshot = Snapshot(taken_at=0.0, services={("shop", "ranker"): signals})
    seen = observation(snapshot, ("shop", "ranker"), ready_replicas=3)
    assert seen.metrics_error is None
    assert seen.observed_at == datetime.fromtimestamp(1_700_000_000.0, UTC)
    assert seen.queue_depth_per_replica == 2.0
    assert seen.batches is not None and seen.batches.rows_per_second == 40.0
    missing = observation(snapshot, ("shop", "other"), ready_replicas=1)
    assert missing.metrics_error == "no kiln_queue_depth series for shop/other in Prometheus"
    down = observation(Snapshot(taken_at=0.0, error="refused"), ("shop", "ranker"), 1)
    assert down.metrics_error == "refused"


def test_every_signal_is_the_stable_versions() -> None:
    """A canary's pods (spec.rollout.canary) carry kiln_track="canary": their latency and load
    never size the stable Deployment, and series without the label (no canary) all count."""
    for signal, expression in signal_expressions(60).items():
        selectors = re.findall(r"kiln_(?!track)[a-z_]+(\{[^}]*\})?", expression)
        assert selectors, signal
        assert all('kiln_track!="canary"' in selector for selector in selectors), signal

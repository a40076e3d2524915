"""The PromQL the autoscaler runs for every service of one Prometheus at once, and its fan-out.

Why it exists: evaluating each InferenceService with its own queries makes the load on the
user's Prometheus grow with the number of services. Instead, one instant query per rate window
returns every signal of every service, grouped `by (namespace, inferenceservice)` (the labels
the scrape config attaches, docs/prometheus.md) and tagged with a `signal` label; `fan_out`
turns its result into one `ServiceSignals` per service. Pure: it builds text and reads the
JSON Prometheus returned, never the network or the clock.
"""

import math
from dataclasses import dataclass
from typing import Any

GROUP_LABELS = ("namespace", "inferenceservice")
SIGNAL_LABEL = "kiln_signal"
"""The label `label_replace` adds to tell the signals apart in the one result vector."""

STABLE = 'kiln_track!="canary"'
"""Every signal is the stable version's: a canary's pods (spec.rollout.canary) are judged by
their own query, and their latency must never scale the stable Deployment. Series without the
label (every pod of a service without a canary) match."""

FRESHNESS_STEPS = 12
"""How many points of the window the freshness subquery samples (every 5 s of a 60 s window)."""

ServiceKey = tuple[str, str]
"""(namespace, InferenceService name)."""


@dataclass(frozen=True)
class ServiceSignals:
    """One service's raw signals as Prometheus returned them; None when a series is absent.

    Rates are per second over the window; `freshest` is the newest queue-depth sample's Unix
    time (how stale the metrics are). The batch signals feed the capacity estimate
    (`autoscaling.capacity`).

    The gauges (`freshest`, `queue_depth`) are read so that one failed scrape does not hide
    them: Prometheus marks every series of a target stale after a scrape that failed (a busy
    pod answering /metrics after the scrape timeout), and an instant selector returns nothing
    for a stale series until the next good scrape, while rates, read over a range, carry on.
    So `freshest` is the newest sample time seen over the window, and the queue depth falls
    back to each pod's last sample in the window when no pod of the service has a live one.
    """

    freshest: float | None = None
    p99_seconds: float | None = None
    requests_per_second: float | None = None
    """Every request answered, whatever its outcome (the demand)."""
    ok_per_second: float | None = None
    """Requests answered successfully: the ones that were computed."""
    queue_depth: float | None = None
    rows_per_second: float | None = None
    """Rows the model computed (kiln_batch_size_sum)."""
    batches_per_second: float | None = None
    compute_seconds_per_second: float | None = None
    """Seconds spent computing batches per second (kiln_compute_duration_seconds_sum)."""


def _by(expression: str) -> str:
    return f"sum by ({', '.join(GROUP_LABELS)}) ({expression})"


def signal_expressions(window_seconds: int) -> dict[str, str]:
    """Each signal's PromQL for every service, keyed by the `ServiceSignals` field it fills."""
    w = f"[{window_seconds}s]"
    step = max(1, window_seconds // FRESHNESS_STEPS)
    return {
        # The newest sample time over the window, sampled every `step` (a subquery): a plain
        # `timestamp(kiln_queue_depth)` is empty while the newest point is a staleness marker.
        "freshest": f"max by ({', '.join(GROUP_LABELS)}) "
        f"(max_over_time(timestamp(kiln_queue_depth{{{STABLE}}})[{window_seconds}s:{step}s]))",
        # Buckets summed over the service's pods by `le`, then the quantile: a service-wide
        # tail, never an average of per-pod quantiles.
        "p99_seconds": "histogram_quantile(0.99, sum by "
        f"({', '.join(GROUP_LABELS)}, le) "
        f"(rate(kiln_request_duration_seconds_bucket{{{STABLE}}}{w})))",
        "requests_per_second": _by(f"rate(kiln_requests_total{{{STABLE}}}{w})"),
        "ok_per_second": _by(f'rate(kiln_requests_total{{code="ok",{STABLE}}}{w})'),
        # Live values; only when no pod of the service has one (a failed scrape marked them
        # stale), each pod's last value in the window.
        "queue_depth": f"{_by(f'kiln_queue_depth{{{STABLE}}}')} "
        f"or {_by(f'last_over_time(kiln_queue_depth{{{STABLE}}}{w})')}",
        "rows_per_second": _by(f"rate(kiln_batch_size_sum{{{STABLE}}}{w})"),
        "batches_per_second": _by(f"rate(kiln_batch_size_count{{{STABLE}}}{w})"),
        "compute_seconds_per_second": _by(
            f"rate(kiln_compute_duration_seconds_sum{{{STABLE}}}{w})"
        ),
    }


def grouped_query(window_seconds: int) -> str:
    """One query returning every signal of every service, each series tagged with its signal."""
    parts = [
        f'label_replace({expression}, "{SIGNAL_LABEL}", "{signal}", "", "")'
        for signal, expression in signal_expressions(window_seconds).items()
    ]
    return " or ".join(parts)


def fan_out(result: list[dict[str, Any]]) -> dict[ServiceKey, ServiceSignals]:
    """The instant-query result split per service. NaN values (a quantile over an empty window)
    are dropped: the absence of a value is what the policy reads as "no traffic" or "missing"."""
    fields: dict[ServiceKey, dict[str, float]] = {}
    known = set(signal_expressions(60))
    for item in result:
        labels = item.get("metric") or {}
        signal = labels.get(SIGNAL_LABEL)
        namespace, service = labels.get("namespace"), labels.get("inferenceservice")
        if signal not in known or not namespace or not service:
            continue
        value = float(item["value"][1])
        if math.isnan(value):
            continue
        fields.setdefault((namespace, service), {})[signal] = value
    return {key: ServiceSignals(**values) for key, values in fields.items()}

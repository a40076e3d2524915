"""The PromQL that reads both versions of one service over the same window, and its parsing.

Why it exists: the canary is judged against the stable version in the same window, so one
instant query returns both, told apart by the `kiln_track` series label the scrape config copies
from the canary pods' track label (docs/prometheus.md; series without it are the stable
version's). Pure: it builds text and reads the JSON Prometheus returned.
"""

import math
from typing import Any

from kiln_operator.rollout.machine import CanaryMetrics, TrackSignals

TRACK_LABEL = "kiln_track"
"""The series label that holds the pod's track (`canary`; absent on stable pods)."""
SIGNAL_LABEL = "kiln_signal"
FAILED_CODES = "internal|deadline|overloaded"
"""The codes (docs/metrics.md) that count as the version's failures: not `invalid` (the
client's) nor `cancelled` (the client left)."""


def canary_query(namespace: str, name: str, window_seconds: int) -> str:
    """Requests, failures and the p99 of answered requests, per track, over the window."""
    selector = f'namespace="{namespace}",inferenceservice="{name}"'
    w = f"[{window_seconds}s]"
    expressions = {
        "requests": f"sum by ({TRACK_LABEL}) (increase(kiln_requests_total{{{selector}}}{w}))",
        "errors": f"sum by ({TRACK_LABEL}) (increase(kiln_requests_total"
        f'{{{selector},code=~"{FAILED_CODES}"}}{w}))',
        "p99": f"histogram_quantile(0.99, sum by ({TRACK_LABEL}, le) "
        f'(rate(kiln_request_duration_seconds_bucket{{{selector},code="ok"}}{w})))',
    }
    return " or ".join(
        f'label_replace({expression}, "{SIGNAL_LABEL}", "{signal}", "", "")'
        for signal, expression in expressions.items()
    )


def parse(result: list[dict[str, Any]], window_seconds: int) -> CanaryMetrics:
    """The query's result as both tracks' signals (a track with no requests is None)."""
    values: dict[str, dict[str, float]] = {"canary": {}, "stable": {}}
    for item in result:
        labels = item.get("metric") or {}
        side = "canary" if labels.get(TRACK_LABEL) == "canary" else "stable"
        value = float(item["value"][1])
        if not math.isnan(value):
            values[side][str(labels.get(SIGNAL_LABEL))] = value

    def signals(of: dict[str, float]) -> TrackSignals | None:
        if "requests" not in of:
            return None
        return TrackSignals(of["requests"], of.get("errors", 0.0), of.get("p99"))

    return CanaryMetrics(window_seconds, signals(values["canary"]), signals(values["stable"]))

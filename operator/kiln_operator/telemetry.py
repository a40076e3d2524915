"""The operator's own metrics: what a platform team reads to tell a slow Kiln from a slow cluster.

Why it exists: the reconcile loop, the work queue, the API client, the autoscaler, the warm-up
gate and the Prometheus adapter each report here, and `docs/metrics.md` documents every series
from this one table. They are served with the warm-up gate's on the operator's metrics port
(`KILN_OPERATOR_METRICS_PORT`, the chart's `metrics.port`).

Cardinality is bounded by construction: every label but `namespace` and `inferenceservice` takes
values from a fixed vocabulary (named reasons, HTTP verbs and status codes, Kiln's resource kinds),
and only the per-service series (`PER_SERVICE`) carry a service's name; `forget_service` drops
those when the InferenceService is deleted, so deleted services leave no series behind.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Seconds; shared by the reconcile, API request and Prometheus query histograms."""

RECONCILE_DURATION = Histogram(
    "kiln_operator_reconcile_duration_seconds",
    "Time one reconcile of an InferenceService took (reads, writes, status), by outcome.",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
)
RECONCILES = Counter(
    "kiln_operator_reconciles_total",
    "Reconciles by what queued them, their outcome and the condition reason behind it.",
    ["trigger", "outcome", "reason"],
)

WORKQUEUE_DEPTH = Gauge(
    "kiln_operator_workqueue_depth",
    "InferenceServices waiting in the reconcile work queue (not those being reconciled).",
)
WORKQUEUE_OLDEST = Gauge(
    "kiln_operator_workqueue_oldest_seconds",
    "Age of the longest-waiting key in the reconcile work queue; 0 when it is empty.",
)
WORKQUEUE_ACTIVE = Gauge(
    "kiln_operator_workqueue_active",
    "Reconciles running now (at most KILN_RECONCILE_WORKERS).",
)
WORKQUEUE_ADDS = Counter(
    "kiln_operator_workqueue_adds_total",
    "Keys queued, by trigger (a key already waiting is not queued again, so not counted).",
    ["trigger"],
)
WORKQUEUE_RETRIES = Counter(
    "kiln_operator_workqueue_retries_total",
    "Failed reconciles put back after a backoff.",
)

API_REQUESTS = Counter(
    "kiln_operator_api_requests_total",
    "Requests Kiln's own client made to the Kubernetes API server, by client, resource, "
    "verb and HTTP status code ('none': no answer).",
    ["client", "resource", "verb", "code"],
)
API_DURATION = Histogram(
    "kiln_operator_api_request_duration_seconds",
    "Latency of Kiln's own requests to the Kubernetes API server, by verb.",
    ["verb"],
    buckets=LATENCY_BUCKETS,
)

DECISIONS = Counter(
    "kiln_operator_autoscaler_decisions_total",
    "Autoscaler decisions by service and reason (status.autoscaling.reason), one per pass.",
    ["namespace", "inferenceservice", "reason"],
)
DESIRED_REPLICAS = Gauge(
    "kiln_operator_autoscaler_desired_replicas",
    "Replicas the autoscaler's last decision asked for.",
    ["namespace", "inferenceservice"],
)
PREVIOUS_REPLICAS = Gauge(
    "kiln_operator_autoscaler_current_replicas",
    "The Deployment's replicas before the autoscaler's last decision.",
    ["namespace", "inferenceservice"],
)
CONDITION = Gauge(
    "kiln_operator_inferenceservice_condition",
    "1 while the InferenceService's condition is True, 0 while False, with its reason; one "
    "series per service and condition (Ready, Progressing, Stalled), as the last reconcile "
    "computed it.",
    ["namespace", "inferenceservice", "condition", "reason"],
)
EXPORTED_CONDITIONS = ("Ready", "Progressing", "Stalled")
"""The conditions the alerts and dashboards read; the others stay in the status only."""
_condition_reasons: dict[tuple[str, str, str], str] = {}
"""The reason each exported condition's series carries now, by (namespace, name, type)."""
SLO_P99 = Gauge(
    "kiln_operator_slo_p99_latency_seconds",
    "The service's p99 latency objective (spec.slo.p99LatencyMilliseconds, or its profile's), "
    "as the autoscaler last read it: what dashboards and the SLO alerts compare p99 with.",
    ["namespace", "inferenceservice"],
)

WARMUP_ATTEMPT_DURATION = Histogram(
    "kiln_operator_warmup_attempt_duration_seconds",
    "Time one warm-up attempt against a pod took, by result.",
    ["result"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
)
WARMUP_GATES = Counter(
    "kiln_operator_warmup_gates_total",
    "Warm-up gates decided (the pod condition set True or False after its last attempt).",
    ["namespace", "inferenceservice", "result"],
)

PROMETHEUS_DURATION = Histogram(
    "kiln_operator_prometheus_query_duration_seconds",
    "Latency of the autoscaler's queries to Prometheus, by query: signals (the grouped "
    "query), load_by_pod (before a scale-down), history (the learned pre-warm).",
    ["query"],
    buckets=LATENCY_BUCKETS,
)
PROMETHEUS_ERRORS = Counter(
    "kiln_operator_prometheus_query_errors_total",
    "The autoscaler's Prometheus queries that failed, by query and kind: unreachable "
    "(connection refused, reset or timed out), error (Prometheus answered an error), "
    "invalid (an answer Kiln cannot read).",
    ["query", "kind"],
)

PER_SERVICE: list[Counter | Gauge | Histogram] = [
    DECISIONS,
    DESIRED_REPLICAS,
    PREVIOUS_REPLICAS,
    SLO_P99,
    CONDITION,
    WARMUP_GATES,
]
"""Metrics whose first two labels are namespace and inferenceservice; other modules add theirs
(`register_per_service`) so that `forget_service` drops them all."""

VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
"""Kubernetes' verb for each HTTP method but GET (get or list: the caller says)."""


def register_per_service(*metrics: Counter | Gauge | Histogram) -> None:
    """Metrics labelled (namespace, inferenceservice, …) that `forget_service` clears."""
    PER_SERVICE.extend(metrics)


def forget_service(namespace: str, name: str) -> None:
    """Drop every per-service series of a deleted InferenceService."""
    for metric in PER_SERVICE:
        for labels in _label_sets(metric):
            if labels[:2] == (namespace, name):
                metric.remove(*labels)
    for kind in EXPORTED_CONDITIONS:
        _condition_reasons.pop((namespace, name, kind), None)


def _label_sets(metric: Counter | Gauge | Histogram) -> list[tuple[str, ...]]:
    # prometheus_client has no public listing of a metric's children; `_metrics` is the dict
    # `remove` itself edits, keyed by the label values.
    return [tuple(labels) for labels in metric._metrics]


def reconcile_outcome(
    *, writes: bool, deleted: bool, spec_error_reason: str | None, child_problem: str | None
) -> tuple[str, str]:
    """(outcome, reason) of a reconcile that returned: `gone` (deleted), `spec_error` (with the
    InvalidSpec/PolicyViolation/Profile… reason), `child_problem` (with the child's reason),
    `applied` (it wrote) or `converged` (nothing to write)."""
    if deleted:
        return "gone", ""
    if spec_error_reason is not None:
        return "spec_error", spec_error_reason
    if child_problem is not None:
        return "child_problem", child_problem
    return ("applied" if writes else "converged"), ""


def error_reason(error: BaseException) -> str:
    """A bounded name for a reconcile that raised: the exception's class if it is Kiln's or
    kopf's own (a fixed set), else `Unexpected`."""
    module = type(error).__module__
    if module.startswith(("kiln_operator.", "kopf.")):
        return type(error).__name__
    return "Unexpected"


def observe_reconcile(trigger: str, outcome: str, reason: str, seconds: float) -> None:
    """Count one reconcile and its time."""
    RECONCILE_DURATION.labels(outcome).observe(seconds)
    RECONCILES.labels(trigger, outcome, reason).inc()


def observe_api(client: str, resource: str, verb: str, code: str, seconds: float) -> None:
    """Count one API request."""
    API_REQUESTS.labels(client, resource, verb, code).inc()
    API_DURATION.labels(verb).observe(seconds)


def observe_conditions(namespace: str, name: str, conditions: list[dict[str, Any]]) -> None:
    """Keep one series per exported condition type, with its current reason (the series of a
    reason it no longer has is dropped)."""
    current = {c.get("type"): c for c in conditions if c.get("type") in EXPORTED_CONDITIONS}
    for kind in EXPORTED_CONDITIONS:
        key = (namespace, name, kind)
        condition = current.get(kind)
        reason = None if condition is None else str(condition.get("reason", ""))
        previous = _condition_reasons.get(key)
        if previous is not None and previous != reason:
            CONDITION.remove(namespace, name, kind, previous)
        if condition is None or reason is None:
            _condition_reasons.pop(key, None)
            continue
        _condition_reasons[key] = reason
        value = 1.0 if condition.get("status") == "True" else 0.0
        CONDITION.labels(namespace, name, kind, reason).set(value)


def observe_decision(
    namespace: str,
    name: str,
    *,
    reason: str,
    desired: int,
    previous: int,
    slo_p99_seconds: float | None = None,
) -> None:
    """Count one autoscaler decision and keep its replica counts and the SLO it decided on."""
    DECISIONS.labels(namespace, name, reason).inc()
    DESIRED_REPLICAS.labels(namespace, name).set(desired)
    PREVIOUS_REPLICAS.labels(namespace, name).set(previous)
    if slo_p99_seconds is not None:
        SLO_P99.labels(namespace, name).set(slo_p99_seconds)


@contextmanager
def prometheus_query(query: str) -> Iterator[None]:
    """Time one Prometheus query; count it as failed if it raises (the caller handles it)."""
    started = time.perf_counter()
    try:
        yield
    except BaseException as error:
        PROMETHEUS_ERRORS.labels(query, _query_error_kind(error)).inc()
        raise
    finally:
        PROMETHEUS_DURATION.labels(query).observe(time.perf_counter() - started)


def _query_error_kind(error: BaseException) -> str:
    if isinstance(error, requests.ConnectionError | requests.Timeout):
        return "unreachable"
    if isinstance(error, PrometheusApiClientException):
        return "error"
    return "invalid"


def watch_workqueue(
    depth: Callable[[], float], oldest: Callable[[], float], active: Callable[[], float]
) -> None:
    """Read the work queue's gauges from the live queue at each scrape."""
    WORKQUEUE_DEPTH.set_function(depth)
    WORKQUEUE_OLDEST.set_function(oldest)
    WORKQUEUE_ACTIVE.set_function(active)

"""Kiln's Grafana dashboards, generated: `python tools/dashboards.py` writes the chart's
`dashboards/*.json`.

Why it exists: a dashboard is mostly PromQL, and every query must name Kiln's real metrics. Here
each panel is one line of title, unit and queries, so a reader reviews the queries rather than
Grafana's layout JSON; the tests read the same `DASHBOARDS` to run every query against a real
Prometheus scraping a runtime and the operator's metrics (tests/integration/observability), and
fail if the committed JSON is not what this file generates.
"""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHART_DASHBOARDS = Path(__file__).resolve().parents[1] / "manifests/charts/kiln/dashboards"
SERVICE = 'namespace="$namespace", inferenceservice="$inferenceservice"'
"""The per-service dashboard's selector (its two template variables)."""


@dataclass(frozen=True)
class Panel:
    """One time-series panel: its queries as (legend, PromQL)."""

    title: str
    unit: str
    queries: list[tuple[str, str]]
    description: str = ""
    width: int = 12


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: list[Panel]
    per_service: bool = False
    tags: list[str] = field(default_factory=lambda: ["kiln"])


def rate(metric: str, selector: str, by: str = "", window: str = "$__rate_interval") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{selector}}}[{window}]))"


def quantile(q: float, metric: str, selector: str, by: str = "") -> str:
    labels = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, {rate(metric + '_bucket', selector, labels)})"


def mean(metric: str, selector: str, by: str = "") -> str:
    return f"{rate(metric + '_sum', selector, by)} / {rate(metric + '_count', selector, by)}"


OK = f'{SERVICE}, code="ok"'

SERVICE_DASHBOARD = Dashboard(
    uid="kiln-service",
    title="Kiln / InferenceService",
    description="One InferenceService: its latency against its SLO, load, queue, replicas, the "
    "autoscaler's decisions, cold starts and warm-up outcomes (docs/observability.md).",
    per_service=True,
    panels=[
        Panel(
            "Latency against the SLO",
            "s",
            [
                ("p99", quantile(0.99, "kiln_request_duration_seconds", OK)),
                ("p50", quantile(0.5, "kiln_request_duration_seconds", OK)),
                ("SLO (p99)", f"max(kiln_operator_slo_p99_latency_seconds{{{SERVICE}}})"),
            ],
            "Answered requests' end-to-end latency inside the runtime; the SLO line is "
            "spec.slo.p99LatencyMilliseconds as the autoscaler reads it.",
        ),
        Panel(
            "Requests by outcome",
            "reqps",
            [("{{code}}", rate("kiln_requests_total", SERVICE, "code"))],
            "kiln_requests_total by code: ok, invalid, overloaded, deadline, cancelled, internal.",
        ),
        Panel(
            "Queue depth and requests in flight",
            "short",
            [
                ("queued", f"sum(kiln_queue_depth{{{SERVICE}}})"),
                ("in flight", f"sum(kiln_inflight_requests{{{SERVICE}}})"),
            ],
            "Summed over the service's pods.",
        ),
        Panel(
            "Replicas: desired and ready",
            "short",
            [
                ("desired", f"max(kiln_operator_autoscaler_desired_replicas{{{SERVICE}}})"),
                ("ready", f"sum(kiln_ready{{{SERVICE}}})"),
            ],
            "desired: the autoscaler's last decision; ready: runtimes answering readiness.",
        ),
        Panel(
            "Autoscaler decisions by reason",
            "short",
            [
                (
                    "{{reason}}",
                    f"sum by (reason) (increase(kiln_operator_autoscaler_decisions_total"
                    f"{{{SERVICE}}}[$__rate_interval]))",
                )
            ],
            "One per pass; the reason is status.autoscaling.reason (docs/autoscaling.md).",
        ),
        Panel(
            "Time per stage",
            "s",
            [
                ("{{stage}}", mean("kiln_stage_duration_seconds", SERVICE, "stage")),
                ("queue wait", mean("kiln_queue_wait_seconds", SERVICE)),
            ],
            "Mean per request (decode, encode) or per batch (preprocess, forward, postprocess).",
        ),
        Panel(
            "Cold starts",
            "s",
            [
                (
                    "p90 cold start",
                    quantile(0.9, "kiln_operator_pod_cold_start_seconds", SERVICE).replace(
                        "$__rate_interval", "1h"
                    ),
                ),
                (
                    "model download p90",
                    quantile(0.9, "kiln_operator_model_download_seconds", SERVICE).replace(
                        "$__rate_interval", "1h"
                    ),
                ),
            ],
            "From a pod's creation to its warm-up passed, over the last hour's new pods.",
        ),
        Panel(
            "Warm-up gate outcomes",
            "short",
            [
                (
                    "{{result}}",
                    f"sum by (result) (increase(kiln_operator_warmup_gates_total"
                    f"{{{SERVICE}}}[$__rate_interval]))",
                )
            ],
            "Pods admitted (passed) or kept out of the Service (failed: WarmupFailed).",
        ),
    ],
)

OPERATOR_DASHBOARD = Dashboard(
    uid="kiln-operator",
    title="Kiln / Operator",
    description="The operator itself: reconciles, its work queue, the API server's answers, the "
    "autoscaler, the warm-up gate and Prometheus (docs/metrics.md).",
    panels=[
        Panel(
            "Reconciles by outcome",
            "ops",
            [
                (
                    "{{outcome}} {{reason}}",
                    rate("kiln_operator_reconciles_total", "", "outcome, reason"),
                )
            ],
        ),
        Panel(
            "Reconcile latency p99",
            "s",
            [
                (
                    "{{outcome}}",
                    quantile(0.99, "kiln_operator_reconcile_duration_seconds", "", "outcome"),
                )
            ],
        ),
        Panel(
            "Work queue",
            "short",
            [
                ("waiting", "max(kiln_operator_workqueue_depth)"),
                ("reconciling", "max(kiln_operator_workqueue_active)"),
                ("retries/s", "sum(rate(kiln_operator_workqueue_retries_total[$__rate_interval]))"),
            ],
        ),
        Panel(
            "Oldest key's wait",
            "s",
            [("oldest", "max(kiln_operator_workqueue_oldest_seconds)")],
        ),
        Panel(
            "API requests by verb and code",
            "reqps",
            [("{{verb}} {{code}}", rate("kiln_operator_api_requests_total", "", "verb, code"))],
        ),
        Panel(
            "API latency p99",
            "s",
            [
                (
                    "{{verb}}",
                    quantile(0.99, "kiln_operator_api_request_duration_seconds", "", "verb"),
                )
            ],
        ),
        Panel(
            "Autoscaler decisions by reason",
            "ops",
            [("{{reason}}", rate("kiln_operator_autoscaler_decisions_total", "", "reason"))],
        ),
        Panel(
            "Autoscaler pass lag p99",
            "s",
            [("lag", quantile(0.99, "kiln_operator_autoscaler_evaluation_lag_seconds", ""))],
        ),
        Panel(
            "Warm-up gates",
            "short",
            [
                (
                    "{{result}}",
                    "sum by (result) "
                    "(increase(kiln_operator_warmup_gates_total[$__rate_interval]))",
                ),
                (
                    "attempt p90 {{result}}",
                    quantile(0.9, "kiln_operator_warmup_attempt_duration_seconds", "", "result"),
                ),
            ],
        ),
        Panel(
            "Prometheus queries",
            "s",
            [
                (
                    "p99 {{query}}",
                    quantile(0.99, "kiln_operator_prometheus_query_duration_seconds", "", "query"),
                ),
                (
                    "errors/s {{query}} {{kind}}",
                    rate("kiln_operator_prometheus_query_errors_total", "", "query, kind"),
                ),
            ],
        ),
        Panel(
            "Services not Ready, by reason",
            "short",
            [
                (
                    "{{reason}}",
                    "count by (reason) "
                    '(kiln_operator_inferenceservice_condition{condition="Ready"} == 0)',
                )
            ],
            width=24,
        ),
    ],
)

DASHBOARDS = [SERVICE_DASHBOARD, OPERATOR_DASHBOARD]


def _variables(dashboard: Dashboard) -> list[dict[str, Any]]:
    source = {"type": "prometheus", "uid": "${datasource}"}
    variables: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    ]
    if dashboard.per_service:
        for name, query in (
            ("namespace", "label_values(kiln_requests_total, namespace)"),
            (
                "inferenceservice",
                'label_values(kiln_requests_total{namespace="$namespace"}, inferenceservice)',
            ),
        ):
            variables.append(
                {
                    "name": name,
                    "type": "query",
                    "datasource": source,
                    "query": {"query": query, "refId": name},
                    "refresh": 2,
                    "sort": 1,
                }
            )
    return variables


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana's dashboard JSON (schema 39) for one dashboard."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    panels, x, y = [], 0, 0
    for number, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        panels.append(
            {
                "id": number,
                "type": "timeseries",
                "title": panel.title,
                "description": panel.description,
                "datasource": source,
                "gridPos": {"x": x, "y": y, "w": panel.width, "h": 8},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "datasource": source,
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for i, (legend, expr) in enumerate(panel.queries)
                ],
            }
        )
        x += panel.width
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": dashboard.tags,
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": _variables(dashboard)},
        "panels": panels,
    }


def rendered_files() -> dict[str, str]:
    """File name -> content of every dashboard."""
    return {
        f"{d.uid}.json": json.dumps(render(d), indent=2, ensure_ascii=False) + "\n"
        for d in DASHBOARDS
    }


def main() -> None:
    CHART_DASHBOARDS.mkdir(exist_ok=True)
    for name, text in rendered_files().items():
        (CHART_DASHBOARDS / name).write_text(text)
        print(f"wrote {CHART_DASHBOARDS.name}/{name}", file=sys.stderr)


if __name__ == "__main__":
    main()

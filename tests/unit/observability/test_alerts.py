"""Kiln's alerts, checked by Prometheus' own promtool: the rules file parses (`check rules`),
and each alert fires in its scenario, with its labels and rendered annotations, and in no other
scenario (`test rules`): every scenario is a healthy baseline plus one fault, and every alert is
evaluated in every scenario."""

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "manifests" / "charts" / "kiln" / "files" / "kiln-alerts.rules.yaml"
SVC = {"namespace": "models", "inferenceservice": "svc"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed (Debian's prometheus package): make system-deps")
    return found


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in {"job": "kiln", **labels}.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def latency(values_by_le: dict[str, str], **labels: str) -> list[dict[str, str]]:
    return [
        series("kiln_request_duration_seconds_bucket", v, **SVC, code="ok", le=le, **labels)
        for le, v in values_by_le.items()
    ]


# A healthy operator and service: 100 requests a minute answered within 50 ms, SLO 100 ms,
# metrics present, the work queue empty, the API and reconciles clean.
BASELINE = [
    series("kiln_operator_workqueue_depth", "0x90"),
    series("kiln_operator_workqueue_oldest_seconds", "0x90"),
    series("kiln_operator_slo_p99_latency_seconds", "0.1x90", **SVC),
    series("kiln_operator_autoscaler_desired_replicas", "2x90", **SVC),
    series("kiln_queue_depth", "0x90", **SVC, pod="svc-1"),
    series("kiln_requests_total", "0+100x90", **SVC, code="ok"),
    series("kiln_operator_reconciles_total", "0+20x90", outcome="converged", reason=""),
    series("kiln_operator_api_requests_total", "0+50x90", verb="patch", code="200"),
    series("kiln_operator_inferenceservice_condition", "0x90", **SVC, condition="Stalled",
           reason="NotStalled"),
    series("kiln_operator_warmup_gates_total", "0+1x90", **SVC, result="passed"),
    *latency({"0.05": "0+100x90", "0.25": "0+100x90", "0.5": "0+100x90", "+Inf": "0+100x90"}),
]  # fmt: skip


def without(name: str, inputs: list[dict[str, str]]) -> list[dict[str, str]]:
    return [s for s in inputs if not s["series"].startswith(name + "{")]


def svc_alert(**labels: str) -> dict[str, str]:
    return {**SVC, **labels}


# name -> (series replacing the baseline's of the same names, eval time, labels, annotations)
SCENARIOS: dict[str, tuple[list[dict[str, str]], str, dict[str, str], dict[str, str]]] = {
    "KilnLatencySLOBurn": (
        latency({"0.05": "0x90", "0.25": "0x90", "0.5": "0+100x90", "+Inf": "0+100x90"}),
        "70m",
        svc_alert(severity="critical"),
        {
            "summary": "models/svc: p99 latency above its SLO for 5 minutes and over the last hour",
            "description": "p99 is 497.5ms over 5 minutes. "
            "See docs/observability.md#kilnlatencysloburn.",
        },
    ),
    "KilnErrorBudgetBurn": (
        [
            series("kiln_requests_total", "0+90x90", **SVC, code="ok"),
            series("kiln_requests_total", "0+10x90", **SVC, code="overloaded"),
        ],
        "70m",
        svc_alert(severity="critical"),
        {
            "summary": "models/svc: 10% of requests refused, timed out or failed",
            "description": "See docs/observability.md#kilnerrorbudgetburn.",
        },
    ),
    "KilnRolloutStalled": (
        [
            series(
                "kiln_operator_inferenceservice_condition",
                "0x20 1x70",
                **SVC,
                condition="Stalled",
                reason="CrashLoop",
            ),
        ],
        "40m",
        svc_alert(severity="warning", reason="CrashLoop"),
        {
            "summary": "models/svc: rollout stalled (CrashLoop)",
            "description": "kubectl describe inferenceservice shows the Stalled condition's "
            "message. See docs/observability.md#kilnrolloutstalled.",
        },
    ),
    "KilnWarmupFailing": (
        [series("kiln_operator_warmup_gates_total", "0x30 1x60", **SVC, result="failed")],
        "40m",
        svc_alert(severity="warning"),
        {
            "summary": "models/svc: pods failed their warm-up gate in the last 30 minutes",
            "description": "Those pods stay out of the Service. "
            "See docs/observability.md#kilnwarmupfailing.",
        },
    ),
    "KilnRuntimeMetricsMissing": (
        [series("kiln_queue_depth", "0x10", **SVC, pod="svc-1")],  # gone after 10 minutes
        "40m",
        svc_alert(severity="warning"),
        {
            "summary": "models/svc: no kiln_queue_depth in Prometheus for 10 minutes",
            "description": "The autoscaler cannot scale it from metrics. "
            "See docs/observability.md#kilnruntimemetricsmissing.",
        },
    ),
    "KilnOperatorMetricsMissing": (
        [series("kiln_operator_workqueue_depth", "0x10")],
        "40m",
        {"severity": "warning"},
        {
            "summary": "No operator metrics in Prometheus for 10 minutes: the operator is down "
            "or not scraped",
            "description": "See docs/observability.md#kilnoperatormetricsmissing.",
        },
    ),
    "KilnOperatorReconcileErrors": (
        [
            series("kiln_operator_reconciles_total", "0+10x90", outcome="converged", reason=""),
            series("kiln_operator_reconciles_total", "0+10x90", outcome="error", reason="NoAnswer"),
        ],
        "40m",
        {"severity": "warning"},
        {
            "summary": "50% of the operator's reconciles fail",
            "description": "See docs/observability.md#kilnoperatorreconcileerrors.",
        },
    ),
    "KilnOperatorWorkQueueStuck": (
        [series("kiln_operator_workqueue_oldest_seconds", "0+60x90")],
        "20m",
        {"severity": "warning"},
        {
            "summary": "A reconcile has waited 20m 0s in the operator's work queue",
            "description": "See docs/observability.md#kilnoperatorworkqueuestuck.",
        },
    ),
    "KilnOperatorAPIErrors": (
        [series("kiln_operator_api_requests_total", "0+50x90", verb="patch", code="503")],
        "40m",
        {"severity": "warning"},
        {
            "summary": "50% of the operator's API requests fail or get no answer",
            "description": "See docs/observability.md#kilnoperatorapierrors.",
        },
    ),
}


EARLY = {
    "KilnLatencySLOBurn": "4m",  # breached from the start: not before its 5 minutes
    "KilnErrorBudgetBurn": "1m",
    "KilnRolloutStalled": "28m",  # stalled from 21 minutes on, for 10
    "KilnWarmupFailing": "30m",  # the failed gate comes at 31 minutes
    "KilnRuntimeMetricsMissing": "20m",  # stale 5 minutes after its last sample, then 10 more
    "KilnOperatorMetricsMissing": "20m",
    "KilnOperatorReconcileErrors": "10m",
    "KilnOperatorWorkQueueStuck": "9m",  # over 300 s from 6 minutes on, for 5
    "KilnOperatorAPIErrors": "8m",
}
"""A time in each scenario when the fault has not lasted long enough to fire yet."""


def alert_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def scenario_inputs(fault: list[dict[str, str]], replaced: bool) -> list[dict[str, str]]:
    """The baseline with the fault's series: a fault series replaces the baseline's series of
    exactly the same name and labels, and adds to it otherwise (a new `code` or `outcome`);
    `replaced` drops every baseline series of the fault's metric names first."""
    keys = {s["series"] for s in fault}
    names = {s["series"].split("{", 1)[0] for s in fault}
    inputs = [s for s in BASELINE if s["series"] not in keys]
    if replaced:  # the fault's metric replaces the baseline's entirely
        for name in names:
            inputs = without(name, inputs)
    return inputs + fault


# scenarios whose fault takes a metric's place (its baseline series would hide the fault)
REPLACES = {"KilnLatencySLOBurn", "KilnRuntimeMetricsMissing", "KilnOperatorMetricsMissing",
            "KilnOperatorWorkQueueStuck", "KilnRolloutStalled"}  # fmt: skip


def test_every_alert_has_a_scenario() -> None:
    assert sorted(alert_names()) == sorted(SCENARIOS) == sorted(EARLY)


def test_the_rules_file_is_valid() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(SCENARIOS)} rules found" in result.stdout


def test_each_alert_fires_in_its_scenario_and_in_no_other(tmp_path: Path) -> None:
    names = alert_names()
    tests: list[dict[str, Any]] = []
    for fault_name, (fault, at, labels, annotations) in {
        "healthy": ([], "70m", {}, {}),
        **SCENARIOS,
    }.items():
        checks = []
        for name in names:
            expected = (
                [{"exp_labels": labels, "exp_annotations": annotations}]
                if name == fault_name
                else []
            )
            checks.append({"eval_time": at, "alertname": name, "exp_alerts": expected})
        tests.append(
            {
                "name": fault_name,
                "interval": "1m",
                "input_series": scenario_inputs(fault, fault_name in REPLACES),
                "alert_rule_test": checks,
            }
        )
    # and no alert fires before its fault has lasted long enough (its `for` or window)
    for fault_name, (fault, _, _, _) in SCENARIOS.items():
        early = EARLY[fault_name]
        tests.append(
            {
                "name": f"{fault_name} early",
                "interval": "1m",
                "input_series": scenario_inputs(fault, fault_name in REPLACES),
                "alert_rule_test": [
                    {"eval_time": early, "alertname": n, "exp_alerts": []} for n in names
                ],
            }
        )
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests})
    )
    result = subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]

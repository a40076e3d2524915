"""The SLO/autoscaling/pre-warm API: camelCase wire format and clear errors for bad specs."""

from typing import Any

import pytest
from pydantic import ValidationError

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec, PrewarmSpec, SloSpec

SCHEDULE = {
    "name": "business",
    "cron": "0 9 * * 1-5",
    "timeZone": "Europe/Berlin",
    "durationMinutes": 60,
    "minReplicas": 4,
}


def test_defaults_keep_headroom_and_a_hold_window() -> None:
    spec = AutoscalingSpec()
    assert spec.target_utilization_percent == 75
    assert spec.scale_down.stabilization_seconds == 300
    assert spec.when_metrics_missing.policy == "ScheduleFloor"
    wire = spec.model_dump(by_alias=True)
    assert {"minReplicas", "queueDepthPerReplica", "whenMetricsMissing"} <= wire.keys()


@pytest.mark.parametrize(
    ("model", "data", "path", "words"),
    [
        (AutoscalingSpec, {"minReplicas": 5, "maxReplicas": 2}, "", "must not exceed"),
        (
            AutoscalingSpec,
            {"whenMetricsMissing": {"policy": "Fixed"}},
            "whenMetricsMissing",
            "required",
        ),
        (
            AutoscalingSpec,
            {"whenMetricsMissing": {"policy": "Hold", "replicas": 3}},
            "whenMetricsMissing",
            "only used",
        ),
        (
            AutoscalingSpec,
            {"maxReplicas": 4, "whenMetricsMissing": {"policy": "Fixed", "replicas": 9}},
            "",
            "within",
        ),
        (
            AutoscalingSpec,
            {"targetUtilizationPercent": 99},
            "targetUtilizationPercent",
            "less than or equal",
        ),
        (AutoscalingSpec, {"prometheusUrl": "prometheus:9090"}, "prometheusUrl", "pattern"),
        (
            AutoscalingSpec,
            {"evaluationIntervalSeconds": 120, "metricsWindowSeconds": 60},
            "",
            "metricsWindowSeconds",
        ),
        (AutoscalingSpec, {"maxReplica": 3}, "maxReplica", "Extra inputs"),
        (SloSpec, {"p99LatencyMilliseconds": 0}, "p99LatencyMilliseconds", "greater than"),
        (
            PrewarmSpec,
            {"schedules": [SCHEDULE | {"cron": "0 9 * * 1 2026"}]},
            "schedules.0.cron",
            "five fields",
        ),
        (
            PrewarmSpec,
            {"schedules": [SCHEDULE | {"cron": "0 25 * * *"}]},
            "schedules.0.cron",
            "does not parse",
        ),
        (
            PrewarmSpec,
            {"schedules": [SCHEDULE | {"timeZone": "Europe/Atlantis"}]},
            "schedules.0.timeZone",
            "unknown IANA",
        ),
        (PrewarmSpec, {"schedules": [SCHEDULE, SCHEDULE]}, "schedules", "unique"),
        (
            PrewarmSpec,
            {"schedules": [SCHEDULE | {"name": "Business Hours"}]},
            "schedules.0.name",
            "pattern",
        ),
    ],
)
def test_bad_specs_name_the_field(model: Any, data: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(data)
    error = raised.value.errors()[0]
    assert ".".join(str(part) for part in error["loc"]) == path
    assert words in error["msg"]


def test_every_field_is_described_for_kubectl_explain() -> None:
    for model in (SloSpec, AutoscalingSpec, PrewarmSpec):
        schema = model.model_json_schema(by_alias=True)
        for definition in [schema, *schema.get("$defs", {}).values()]:
            for name, field in definition.get("properties", {}).items():
                assert field.get("description"), f"{definition.get('title')}.{name}"

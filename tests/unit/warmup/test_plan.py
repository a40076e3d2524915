"""The warm-up plan: what a pod is sent, how the attempt is judged, when it is retried."""

from typing import Any

import pytest

from kiln_operator.api.v1alpha1.inferenceservice import InferenceServiceSpec
from kiln_operator.warmup import plan as warmup


def spec(**warmup_fields: Any) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "model": {
                "uri": "/opt/models/m.pt",
                "format": "torchscript",
                "inputs": [
                    {"name": "IDS", "datatype": "INT64", "shape": [-1]},
                    {"name": "X", "datatype": "FP16", "shape": [3, 4]},
                ],
                "outputs": [{"name": "Y", "datatype": "FP32", "shape": [2]}],
            },
            "runtime": {"image": "kiln-runtime:dev"},
            "slo": {"p99LatencyMilliseconds": 50},
            "warmup": warmup_fields,
        }
    )


def test_plan_sends_single_item_batches_of_the_declared_tensors() -> None:
    plan = warmup.plan_for(spec(requests=100, concurrency=4), "m")
    assert plan.inputs == (
        warmup.TensorPlan("IDS", "INT64", (1, 1)),  # a variable dimension is sent with size 1
        warmup.TensorPlan("X", "FP16", (1, 3, 4)),
    )
    assert plan.outputs == ("Y",)
    assert (plan.requests, plan.concurrency, plan.retries) == (100, 4, 2)


def test_bound_defaults_to_the_slo_and_can_be_overridden() -> None:
    assert warmup.plan_for(spec(), "m").p99_bound_ms == 50
    assert warmup.plan_for(spec(p99Milliseconds=20), "m").p99_bound_ms == 20


def test_zero_requests_disables_the_gate() -> None:
    assert not warmup.plan_for(spec(requests=0), "m").enabled


def latencies(cold: list[float], warm: list[float]) -> warmup.WarmupResult:
    return warmup.WarmupResult(latencies_ms=tuple(cold + warm))


def test_cold_first_half_is_not_judged() -> None:
    plan = warmup.plan_for(spec(requests=8, concurrency=1), "m")
    verdict = warmup.judge(plan, latencies([900.0, 400, 100, 60], [5.0, 6, 7, 8]))
    assert verdict.passed and verdict.reason == warmup.REASON_WARMED_UP
    assert verdict.p99_ms == 8.0 and verdict.p50_ms == 6.0
    assert "p99 8.00 ms" in verdict.message


def test_slow_steady_state_fails_with_measured_p99_against_bound() -> None:
    plan = warmup.plan_for(spec(requests=4, concurrency=1), "m")
    verdict = warmup.judge(plan, latencies([1.0, 1.0], [10.0, 75.0]))
    assert not verdict.passed
    assert verdict.reason == warmup.REASON_P99_OVER_BOUND
    assert "75.00 ms" in verdict.message and "50 ms" in verdict.message


def test_any_failed_request_fails_the_attempt() -> None:
    plan = warmup.plan_for(spec(requests=4, concurrency=1), "m")
    result = warmup.WarmupResult(latencies_ms=(1.0, 1.0, 1.0), errors=1, first_error="boom")
    verdict = warmup.judge(plan, result)
    assert verdict.reason == warmup.REASON_REQUEST_ERRORS
    assert "1 of 4" in verdict.message and "boom" in verdict.message


def test_requests_the_timeout_left_unanswered_fail_the_attempt_with_what_to_change() -> None:
    plan = warmup.plan_for(spec(requests=4000, concurrency=1, timeoutSeconds=60), "m")
    result = warmup.WarmupResult(latencies_ms=(3.0, 2.0, 40.0), unanswered=3997)
    verdict = warmup.judge(plan, result)
    assert not verdict.passed
    assert verdict.reason == warmup.REASON_ATTEMPT_TIMED_OUT
    assert verdict.message.startswith("3 of 4000 warm-up requests answered (their p99 40.00 ms)")
    assert "within the attempt's 60s" in verdict.message
    assert "spec.warmup.timeoutSeconds" in verdict.message


def test_a_request_error_is_reported_before_the_timeout() -> None:
    plan = warmup.plan_for(spec(requests=4, concurrency=1), "m")
    result = warmup.WarmupResult(latencies_ms=(), errors=1, first_error="boom", unanswered=3)
    assert warmup.judge(plan, result).reason == warmup.REASON_REQUEST_ERRORS


def test_runtime_never_ready_is_its_own_reason() -> None:
    plan = warmup.plan_for(spec(timeoutSeconds=7), "m")
    verdict = warmup.judge(plan, warmup.WarmupResult(latencies_ms=(), runtime_ready=False))
    assert verdict.reason == warmup.REASON_RUNTIME_NOT_READY
    assert "7s" in verdict.message


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0], 99, 1.0),
        ([1.0, 2, 3, 4], 50, 2.0),
        (list(map(float, range(1, 101))), 99, 99.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert warmup.percentile(values, q) == expected


def test_backoff_doubles_and_is_capped() -> None:
    assert [warmup.backoff_seconds(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert warmup.backoff_seconds(30) == warmup.MAX_BACKOFF_SECONDS

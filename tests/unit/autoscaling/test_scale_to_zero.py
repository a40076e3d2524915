"""Scale to zero in `decide`: to zero only after the idle window with nothing counted or held,
never while the activator holds a request or the metrics are blind; woken by held requests;
woken ahead of a pre-warm window by the last measured cold start."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec, PrewarmSpec, SloSpec
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.policy import decide
from kiln_operator.autoscaling.state import ScalerState

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)  # a Monday
IDLE = 600


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def zero_spec(
    autoscaling: dict[str, Any] | None = None, prewarm: dict[str, Any] | None = None
) -> ScalingSpec:
    return ScalingSpec(
        slo=SloSpec(p99_latency_milliseconds=500),
        autoscaling=AutoscalingSpec.model_validate(
            {"minReplicas": 0, "maxReplicas": 8, "scaleToZero": {"idleSeconds": IDLE}}
            | (autoscaling or {})
        ),
        prewarm=PrewarmSpec.model_validate(
            {"assumedColdStartSeconds": 300, "leadTimeMarginSeconds": 30} | (prewarm or {})
        ),
    )


def idle_pod(ready: int = 1, **extra: Any) -> MetricsObservation:
    """Pods that answered nothing over the window (the counters exist, their rate is 0)."""
    return MetricsObservation(
        ready_replicas=ready,
        p99_latency_seconds=None,
        queue_depth_per_replica=0.0,
        requests_per_second=0.0,
        **({"observed_at": NOW} | extra),
    )


def at_zero(**extra: Any) -> MetricsObservation:
    """No pod: Prometheus returns no series for the service at all."""
    return MetricsObservation(ready_replicas=0, **extra)


MEASURED = ScalerState(capacity_per_replica=100.0, capacity_measured=True)


def test_minreplicas_zero_is_valid_and_the_idle_window_has_a_default_and_bounds() -> None:
    scaling = AutoscalingSpec.model_validate({"minReplicas": 0})
    assert scaling.min_replicas == 0 and scaling.scale_to_zero.idle_seconds == 900
    with pytest.raises(ValidationError):
        AutoscalingSpec.model_validate({"minReplicas": 0, "scaleToZero": {"idleSeconds": 5}})
    with pytest.raises(ValidationError):
        AutoscalingSpec.model_validate({"minReplicas": -1})


def test_the_last_replica_stays_until_the_idle_window_has_passed() -> None:
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE - 1)})
    decision = decide(1, idle_pod(), zero_spec(), state, NOW)
    assert decision.desired_replicas == 1
    assert f"idle for {IDLE - 1}s of scaleToZero.idleSeconds {IDLE}" in decision.message
    assert decision.state.idle_since == ago(IDLE - 1)


def test_after_the_idle_window_the_service_goes_to_zero_at_once_whatever_the_pacing() -> None:
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE), "last_scale_at": ago(5)})
    decision = decide(3, idle_pod(3), zero_spec(), state, NOW)
    assert (decision.desired_replicas, decision.reason) == (0, reasons.IDLE)
    assert f"no request for {IDLE}s (scaleToZero.idleSeconds {IDLE})" in decision.message
    assert decision.state.last_scale_at == NOW


def test_the_idle_clock_starts_at_the_first_pass_without_traffic_and_resets_on_a_request() -> None:
    first = decide(1, idle_pod(), zero_spec(), MEASURED, NOW)
    assert first.state.idle_since == NOW and first.desired_replicas == 1
    busy = MetricsObservation(
        ready_replicas=1, observed_at=NOW, p99_latency_seconds=0.05,
        queue_depth_per_replica=0.0, requests_per_second=0.1,
    )  # fmt: skip
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 10)})
    decision = decide(1, busy, zero_spec(), state, NOW)
    assert decision.state.idle_since is None and decision.desired_replicas == 1


def test_never_to_zero_while_the_activator_holds_a_request() -> None:
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 10)})
    decision = decide(1, idle_pod(held_requests=1), zero_spec(), state, NOW)
    assert decision.desired_replicas == 1
    assert decision.state.idle_since is None
    assert "the activator holds 1 request(s)" in decision.message


def test_never_to_zero_while_blind() -> None:
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 10)})
    blind = MetricsObservation(ready_replicas=1, metrics_error="connection refused")
    decision = decide(1, blind, zero_spec(), state, NOW)
    assert (decision.desired_replicas, decision.reason) == (1, reasons.METRICS_UNAVAILABLE)
    assert decision.state.idle_since is None  # the idle window starts again on fresh metrics


def test_at_zero_absent_series_are_not_blindness_and_the_service_stays_asleep() -> None:
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 2)})
    decision = decide(0, at_zero(held_requests=0), zero_spec(), state, NOW)
    assert (decision.desired_replicas, decision.reason) == (0, reasons.IDLE)
    assert decision.metrics_available
    # without any state (an operator that lost it), nothing held still means no wake
    assert decide(0, at_zero(), zero_spec(), ScalerState(), NOW).desired_replicas == 0


@pytest.mark.parametrize(("held", "woken"), [(1, 1), (16, 1), (17, 2), (40, 3), (10_000, 8)])
def test_held_requests_wake_the_service_sized_by_the_queue_target(held: int, woken: int) -> None:
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 2)})
    decision = decide(0, at_zero(held_requests=held), zero_spec(), state, NOW)
    assert (decision.desired_replicas, decision.reason) == (woken, reasons.WAKE_ON_REQUEST)
    assert f"the activator holds {held} request(s)" in decision.message
    assert decision.state.idle_since is None


def test_held_requests_wake_the_service_even_while_prometheus_is_down() -> None:
    down = at_zero(held_requests=3, metrics_error="connection refused")
    for policy in ("Hold", "ScheduleFloor"):
        spec = zero_spec({"whenMetricsMissing": {"policy": policy}})
        assert decide(0, down, spec, ScalerState(), NOW).desired_replicas == 1


def test_waking_pods_not_ready_yet_never_send_the_service_back_to_zero() -> None:
    state = MEASURED.model_copy(update={"idle_since": None, "last_scale_at": ago(5)})
    warming = MetricsObservation(ready_replicas=0, held_requests=0)
    decision = decide(1, warming, zero_spec(), state, NOW)
    assert decision.desired_replicas == 1


WINDOW = {"name": "morning", "cron": "15 12 * * *", "timeZone": "UTC", "durationMinutes": 60,
          "minReplicas": 2}  # fmt: skip
"""Opens at 12:15 UTC, 15 minutes after NOW."""


def test_a_prewarm_window_wakes_the_service_ahead_by_the_last_measured_cold_start() -> None:
    spec = zero_spec(prewarm={"schedules": [WINDOW]})
    # 300 s assumed, but the gate measured 600 s before the service went to zero: the lead is
    # 600 + 30 s, so at 12:00 (900 s before the opening) it is not yet time ...
    remembered = MEASURED.model_copy(
        update={"idle_since": ago(IDLE * 2), "cold_start_seconds": 600.0}
    )
    assert decide(0, at_zero(), spec, remembered, NOW).desired_replicas == 0
    # ... and at 12:05 (600 s before) it is: woken from zero to the window's floor.
    later = NOW + timedelta(minutes=5)
    decision = decide(0, at_zero(), spec, remembered, later)
    assert (decision.desired_replicas, decision.reason) == (2, reasons.PREWARM_WINDOW)
    # Without a remembered measurement the assumed 300 s applies: still asleep at 12:05.
    forgotten = remembered.model_copy(update={"cold_start_seconds": None})
    assert decide(0, at_zero(), spec, forgotten, later).desired_replicas == 0


def test_the_measured_cold_start_is_remembered_for_the_time_at_zero() -> None:
    decision = decide(1, idle_pod(cold_start_seconds=42.0), zero_spec(), MEASURED, NOW)
    assert decision.state.cold_start_seconds == 42.0
    kept = decide(0, at_zero(), zero_spec(), decision.state, NOW)
    assert kept.state.cold_start_seconds == 42.0


def test_an_open_window_holds_its_floor_and_the_service_sleeps_after_it_closes() -> None:
    spec = zero_spec(prewarm={"schedules": [WINDOW]})
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 2)})
    during = NOW + timedelta(minutes=30)
    assert decide(2, idle_pod(2, observed_at=during), spec, state, during).desired_replicas == 2
    after = NOW + timedelta(minutes=80)
    decision = decide(2, idle_pod(2, observed_at=after), spec, state, after)
    assert (decision.desired_replicas, decision.reason) == (0, reasons.IDLE)


def test_a_service_at_minreplicas_one_never_goes_to_zero() -> None:
    spec = zero_spec({"minReplicas": 1})
    state = MEASURED.model_copy(update={"idle_since": ago(IDLE * 100)})
    decision = decide(1, idle_pod(), spec, state, NOW)
    assert decision.desired_replicas == 1 and decision.state.idle_since is None

"""Table tests for `decide`, each with an explicit `now`."""

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec, PrewarmSpec, SloSpec
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.capacity import BatchWindow
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.policy import decide
from kiln_operator.autoscaling.state import InvalidScalerState, ScalerState

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)  # a Monday


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def make_spec(
    autoscaling: dict[str, Any] | None = None, prewarm: dict[str, Any] | None = None
) -> ScalingSpec:
    return ScalingSpec(
        slo=SloSpec(p99_latency_milliseconds=500),
        autoscaling=AutoscalingSpec.model_validate(
            {"minReplicas": 1, "maxReplicas": 20} | (autoscaling or {})
        ),
        prewarm=PrewarmSpec.model_validate(
            {"assumedColdStartSeconds": 60, "leadTimeMarginSeconds": 30} | (prewarm or {})
        ),
    )


def seen(
    ready: int,
    *,
    p99: float | None = 0.2,
    queue: float | None = 0.5,
    rate: float = 100.0,
    at: datetime = NOW,
    **extra: Any,
) -> MetricsObservation:
    return MetricsObservation(
        ready_replicas=ready,
        observed_at=at,
        p99_latency_seconds=p99,
        queue_depth_per_replica=queue,
        requests_per_second=rate,
        **extra,
    )


MEASURED = ScalerState(capacity_per_replica=100.0, capacity_measured=True)
FULL_BATCHES = BatchWindow(
    rows_per_second=400.0, batches_per_second=12.5, compute_seconds_per_second=4.0,
    ok_per_second=400.0,
)  # fmt: skip
"""Four replicas computing full batches of 32 rows in 0.32 s: 100 requests/s per replica."""


class Case(NamedTuple):
    name: str
    current: int
    observed: MetricsObservation
    state: ScalerState
    spec: ScalingSpec
    replicas: int
    reason: str


TABLE = [
    Case(*row)
    for row in [
        (
            "littles-law-sizes-the-step-from-rate-growth-and-backlog",
            4,
            # saturated: 400 req/s on 4 ready gives a capacity of 100/replica; the queue grew
            # from 0 to 120 in 15 s (+8 req/s); the backlog drains over a 60 s cold start (+2).
            seen(4, p99=0.9, queue=30, rate=400),
            ScalerState(last_queue_total=0, last_observed_at=ago(15)),
            make_spec(),
            math.ceil((400 + 8 + 2) / 75),
            reasons.QUEUE_ABOVE_TARGET,
        ),
        (
            "latency-breach-without-queue-adds-at-least-one",
            4,
            seen(4, p99=0.6, queue=1, rate=200),
            MEASURED,
            make_spec(),
            5,
            reasons.LATENCY_ABOVE_TARGET,
        ),
        (
            "without-any-rate-seen-scales-proportionally-to-the-breach",
            2,
            seen(2, p99=1.0, queue=2, rate=0),
            ScalerState(),
            make_spec(),
            math.ceil(2 * 2.0 / 0.75),
            reasons.LATENCY_ABOVE_TARGET,
        ),
        (
            "one-step-is-rate-limited",
            4,
            seen(4, p99=5, queue=500, rate=4000),
            ScalerState(),
            make_spec(
                {
                    "maxReplicas": 100,
                    "targetUtilizationPercent": 30,
                    "scaleUp": {"maxStepReplicas": 4, "maxStepPercent": 100},
                }
            ),
            8,  # Little's law wants 14; one step adds max(4 replicas, 100 % of 4)
            reasons.QUEUE_ABOVE_TARGET,
        ),
        (
            "capped-at-max-replicas",
            10,
            seen(10, p99=5, queue=500, rate=4000),
            ScalerState(),
            make_spec({"maxReplicas": 12}),
            12,
            reasons.MAX_REPLICAS,
        ),
        (
            "pending-guard-no-stacking-while-new-pods-warm",
            6,
            seen(4, p99=0.9, queue=30, rate=400),
            ScalerState(last_scale_up_at=ago(30), last_scale_at=ago(30)),
            make_spec(),
            6,
            reasons.SCALE_UP_PENDING,
        ),
        (
            "pending-guard-lets-growing-arrivals-raise-the-count",
            6,
            # 400 answered + the queue grew 0 -> 400 in 15 s (+26.7/s): arrivals 426.7/s,
            # 26.7/s beyond the 4 ready replicas; (426.7 + 26.7) / 75 -> 7, more than the 6.
            seen(4, p99=0.9, queue=100, rate=400, batches=FULL_BATCHES),
            ScalerState(
                last_scale_up_at=ago(30),
                last_scale_at=ago(30),
                last_queue_total=0,
                last_observed_at=ago(15),
            ),
            make_spec(),
            7,
            reasons.QUEUE_ABOVE_TARGET,
        ),
        (
            "pending-guard-expires-for-pods-that-never-become-ready",
            6,
            seen(4, p99=0.9, queue=30, rate=400),
            ScalerState(last_scale_up_at=ago(121), last_scale_at=ago(121)),
            make_spec(),
            7,  # Little's law wants 6 (402 / 75), and a breach adds at least one
            reasons.QUEUE_ABOVE_TARGET,
        ),
        (
            "scale-up-stabilization-waits",
            4,
            seen(4, p99=0.9, queue=1, rate=200),
            ScalerState(unhealthy_since=ago(10)),
            make_spec({"scaleUp": {"stabilizationSeconds": 30}}),
            4,
            reasons.SCALE_UP_STABILIZING,
        ),
        (
            "healthy-but-headroom-gone-adds-replicas",
            4,
            seen(4, rate=360),
            MEASURED,
            make_spec(),
            5,  # 360 / (100 * 0.75) = 4.8
            reasons.HEADROOM_LOW,
        ),
        (
            "headroom-needs-a-measured-capacity",
            4,
            seen(4, rate=360),
            ScalerState(capacity_per_replica=90.0),
            make_spec(),
            4,
            reasons.STEADY,
        ),
        (
            "scale-down-held-until-healthy-for-the-hold-window",
            10,
            seen(10, rate=100),
            MEASURED.model_copy(update={"healthy_since": ago(299)}),
            make_spec(),
            10,
            reasons.SCALE_DOWN_HELD,
        ),
        (
            "scale-down-after-the-hold-by-a-bounded-step",
            10,
            seen(10, rate=100),
            MEASURED.model_copy(update={"healthy_since": ago(300)}),
            make_spec(),
            9,
            reasons.LOAD_DECREASED,
        ),
        (
            "scale-down-paced",
            10,
            seen(10, rate=100),
            MEASURED.model_copy(update={"healthy_since": ago(900), "last_scale_at": ago(30)}),
            make_spec(),
            10,
            reasons.SCALE_DOWN_PACED,
        ),
        (
            "scale-down-keeps-the-headroom",
            3,
            seen(3, rate=130),
            MEASURED.model_copy(update={"healthy_since": ago(900)}),
            make_spec({"scaleDown": {"maxStepReplicas": 5}}),
            2,  # 2 replicas run at 65 %: inside the band below 75 % - 10 %; never 1
            reasons.LOAD_DECREASED,
        ),
        (
            "scale-down-waits-below-the-hysteresis-band",
            3,
            seen(3, rate=150),
            MEASURED.model_copy(update={"healthy_since": ago(900)}),
            make_spec({"scaleDown": {"maxStepReplicas": 5}}),
            3,  # 2 replicas would run at exactly 75 %: one noisy minute from scaling back up
            reasons.STEADY,
        ),
        (
            "scale-down-stops-at-min-replicas",
            3,
            seen(3, rate=0, p99=math.nan, queue=0),
            MEASURED.model_copy(update={"healthy_since": ago(900)}),
            make_spec({"minReplicas": 2, "scaleDown": {"maxStepReplicas": 5}}),
            2,
            reasons.MIN_REPLICAS,
        ),
        (
            "below-min-replicas-is-raised",
            0,
            seen(0, rate=0, p99=None, queue=None),
            ScalerState(),
            make_spec({"minReplicas": 2}),
            2,
            reasons.MIN_REPLICAS,
        ),
    ]
]


@pytest.mark.parametrize("case", TABLE, ids=[case.name for case in TABLE])
def test_decide_table(case: Case) -> None:
    decision = decide(case.current, case.observed, case.spec, case.state, NOW)
    assert (decision.desired_replicas, decision.reason) == (case.replicas, case.reason), (
        decision.message
    )


OUTAGES = [
    pytest.param(seen(4, metrics_error="connection refused"), id="prometheus-down"),
    pytest.param(seen(4, at=ago(91)), id="stale"),
    pytest.param(seen(4, p99=math.nan), id="nan-p99-with-traffic"),
    pytest.param(seen(4, queue=None), id="queue-missing"),
    pytest.param(seen(4, rate=math.inf), id="rate-invalid"),
    pytest.param(replace(seen(4), observed_at=None), id="no-timestamp"),
]
# While blind, a daily window from 11:00 to 13:00 Berlin time asks for a floor of 7.
WINDOW = {
    "schedules": [
        {
            "name": "peak",
            "cron": "0 12 * * *",
            "timeZone": "Europe/Berlin",
            "durationMinutes": 120,
            "minReplicas": 7,
        }
    ]
}


@pytest.mark.parametrize("observed", OUTAGES)
@pytest.mark.parametrize(
    ("missing", "replicas"),
    [
        ({"policy": "Hold"}, 4),
        ({"policy": "ScheduleFloor"}, 7),
        ({"policy": "Fixed", "replicas": 9}, 9),
        ({"policy": "Fixed", "replicas": 2}, 4),
    ],
)
def test_blind_never_scales_down_and_follows_the_policy(
    observed: MetricsObservation, missing: dict[str, Any], replicas: int
) -> None:
    spec = make_spec({"whenMetricsMissing": missing}, WINDOW)
    # The remembered state would justify a scale-down: it must be ignored and forgotten.
    state = MEASURED.model_copy(update={"healthy_since": ago(3600)})
    decision = decide(4, observed, spec, state, NOW)
    assert decision.desired_replicas == replicas
    assert decision.reason in {reasons.METRICS_UNAVAILABLE, reasons.PREWARM_WINDOW}
    assert not decision.metrics_available
    assert decision.state.healthy_since is None
    status = decision.status(observed)
    assert status.metrics_available is False


def test_metrics_back_after_an_outage_restart_the_hold_window() -> None:
    spec = make_spec()
    state = MEASURED.model_copy(update={"healthy_since": ago(3600)})
    blind = decide(10, seen(10, metrics_error="timeout"), spec, state, NOW)
    back = decide(10, seen(10, rate=100), spec, blind.state, NOW + timedelta(seconds=15))
    assert (back.desired_replicas, back.reason) == (10, reasons.SCALE_DOWN_HELD)


def test_idle_nan_latency_is_healthy_not_missing() -> None:
    decision = decide(2, seen(2, p99=math.nan, rate=0, queue=0), make_spec(), MEASURED, NOW)
    assert decision.metrics_available
    assert decision.state.healthy_since == NOW


def test_without_demand_the_replicas_come_down_even_before_any_capacity_is_known() -> None:
    """A service that never had traffic has no capacity estimate; set to 3 by hand (or left
    there by a pre-warm window) it still comes down by the hold window and the steps. With
    traffic, the demand is what sizes (here: no step down)."""
    idle = seen(3, p99=math.nan, rate=0, queue=0)
    healthy = ScalerState(healthy_since=ago(300))
    assert healthy.capacity_per_replica is None
    decision = decide(3, idle, make_spec(), healthy, NOW)
    assert (decision.desired_replicas, decision.reason) == (2, reasons.LOAD_DECREASED)
    assert "none needed without demand" in decision.message
    held = decide(3, idle, make_spec(), ScalerState(healthy_since=ago(10)), NOW)
    assert (held.desired_replicas, held.reason) == (3, reasons.SCALE_DOWN_HELD)
    busy = decide(3, seen(3, p99=0.01, rate=5, queue=0), make_spec(), healthy, NOW)
    assert (busy.desired_replicas, busy.reason) == (3, reasons.STEADY)


def test_no_traffic_reads_as_no_traffic_never_as_a_latency_of_zero() -> None:
    idle = seen(2, p99=0.0, rate=0, queue=0)  # some exporters answer 0, not NaN
    decision = decide(2, idle, make_spec(), MEASURED, NOW)
    assert decision.message.startswith("no traffic, ")
    assert "p99" not in decision.message
    observed = decision.status(idle).observed
    assert observed.p99_latency_milliseconds is None
    assert observed.requests_per_second == 0


def test_capacity_from_the_batch_metrics_reaches_the_state_and_the_status() -> None:
    observed = seen(4, p99=0.05, rate=400, queue=0.5, batches=FULL_BATCHES)
    decision = decide(4, observed, make_spec(), ScalerState(), NOW)
    assert decision.state.capacity_per_replica == pytest.approx(100.0)
    assert decision.state.capacity_measured
    capacity = decision.status(observed).capacity
    assert capacity is not None and capacity.measured
    assert capacity.requests_per_second_per_replica == pytest.approx(100.0)
    # 400 req/s at 75 % of 100 per replica needs 6: the headroom scale-up can fire.
    assert (decision.desired_replicas, decision.reason) == (6, reasons.HEADROOM_LOW)


def test_flapping_input_never_scales_down_and_changes_direction_rarely() -> None:
    spec = make_spec()
    state = MEASURED
    current, directions = 6, []
    for step in range(240):  # an hour of 15 s evaluations, breaching every other one
        now = NOW + timedelta(seconds=15 * step)
        breach = step % 2 == 0
        observed = seen(current, p99=0.7 if breach else 0.1, rate=300, at=now)
        decision = decide(current, observed, spec, state, now)
        if decision.desired_replicas != current:
            directions.append(decision.desired_replicas > current)
        current, state = decision.desired_replicas, decision.state
    assert False not in directions, "a scale-down happened although the hold never completed"
    assert len(directions) <= 14  # each scale-up waits on its predecessor's warming


def test_prewarm_raises_the_floor_lead_time_before_opening_on_the_spring_forward_day() -> None:
    # 02:30 Berlin does not exist on 2026-03-29: the window opens 03:30 CEST = 01:30Z.
    spec = make_spec(
        {},
        {
            "schedules": [
                {
                    "name": "night-batch",
                    "cron": "30 2 * * *",
                    "timeZone": "Europe/Berlin",
                    "durationMinutes": 30,
                    "minReplicas": 5,
                }
            ]
        },
    )
    opening = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    lead = timedelta(seconds=45 + 30)  # measured cold start + margin
    before = decide(
        1,
        seen(1, rate=10, at=opening - lead - timedelta(seconds=1), cold_start_seconds=45),
        spec,
        MEASURED,
        opening - lead - timedelta(seconds=1),
    )
    assert before.desired_replicas == 1
    raised = decide(
        1,
        seen(1, rate=10, at=opening - lead, cold_start_seconds=45),
        spec,
        MEASURED,
        opening - lead,
    )
    assert (raised.desired_replicas, raised.reason) == (5, reasons.PREWARM_WINDOW)
    assert raised.window is not None
    assert raised.window.raised_at == opening - lead
    assert raised.window.floor_warm_at_open is None
    at_open = decide(5, seen(5, rate=10, at=opening), spec, raised.state, opening)
    assert at_open.window is not None and at_open.window.floor_warm_at_open is True
    status = at_open.status(seen(5, at=opening))
    assert status.active_window is not None
    assert status.active_window.floor_warm_at_open is True


def test_floor_not_warm_at_open_is_recorded() -> None:
    spec = make_spec({}, WINDOW)
    opening = datetime(2026, 11, 23, 11, 0, tzinfo=UTC)
    decision = decide(7, seen(3, at=opening), spec, MEASURED, opening)
    assert decision.window is not None
    assert decision.window.floor_warm_at_open is False


def test_user_lead_time_overrides_the_measured_cold_start() -> None:
    schedules = [dict(WINDOW["schedules"][0], leadTimeSeconds=1800)]
    spec = make_spec({}, {"schedules": schedules})
    at = datetime(2026, 11, 23, 10, 30, tzinfo=UTC)  # 30 minutes before opening
    assert decide(2, seen(2, at=at), spec, MEASURED, at).desired_replicas == 7
    early = at - timedelta(seconds=1)
    assert decide(2, seen(2, at=early), spec, MEASURED, early).desired_replicas == 2


def test_state_survives_a_restart_through_the_annotation() -> None:
    spec = make_spec()
    first = decide(4, seen(4, p99=0.9, queue=30, rate=400), spec, ScalerState(), NOW)
    restored = ScalerState.from_text(first.state.to_text())
    later = NOW + timedelta(seconds=15)
    observed = seen(4, p99=0.9, queue=40, rate=400, at=later)
    assert decide(first.desired_replicas, observed, spec, restored, later) == decide(
        first.desired_replicas, observed, spec, first.state, later
    )


def test_damaged_state_annotation_is_a_clear_error() -> None:
    with pytest.raises(InvalidScalerState, match="autoscaler-state"):
        ScalerState.from_text('{"healthy_since": "yesterday"}')
    assert ScalerState.from_text(None) == ScalerState()


def test_naive_now_and_negative_replicas_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        decide(1, seen(1), make_spec(), ScalerState(), datetime(2026, 1, 1))
    with pytest.raises(ValueError, match=">= 0"):
        decide(-1, seen(1), make_spec(), ScalerState(), NOW)


def test_status_explains_the_decision() -> None:
    observed = seen(4, p99=0.9, queue=30, rate=400)
    decision = decide(4, observed, make_spec(), ScalerState(), NOW)
    status = decision.status(observed).model_dump(by_alias=True, mode="json")
    assert status["desiredReplicas"] == decision.desired_replicas
    assert status["reason"] == reasons.QUEUE_ABOVE_TARGET
    assert status["observed"]["p99LatencyMilliseconds"] == pytest.approx(900.0)
    assert status["lastScaleTime"] == "2026-11-23T12:00:00Z"
    assert "p99 900ms" in status["message"]

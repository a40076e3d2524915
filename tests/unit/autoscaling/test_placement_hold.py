"""`decide` holds the replicas while pods cannot be placed, each case with an explicit `now`:
whatever would raise them (a breach, lost headroom, the floor, a pre-warm window, the Fixed
policy while blind) is held at the current count with the Kubernetes cause in the message;
lowering them stays allowed; the hold ends with the cause."""

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.policy import decide
from kiln_operator.autoscaling.state import ScalerState
from tests.unit.autoscaling.test_decide import MEASURED, WINDOW, ago, make_spec, seen

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)  # inside WINDOW (11:00-13:00 UTC)
QUOTA = (
    'pods cannot be created (FailedCreate): pods "mlp-5d4f-x" is forbidden: exceeded quota: '
    "gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, "
    "limited: requests.nvidia.com/gpu=2"
)
NO_NODE = (
    "pod mlp-5d4f-y cannot be scheduled: 0/4 nodes are available: 4 node(s) didn't match "
    "Pod's node affinity/selector."
)
BREACH = seen(2, p99=0.9, queue=30, rate=200)
"""Queue and p99 far above target on 2 ready replicas: the policy wants more."""

RAISES = [
    pytest.param(4, BREACH, MEASURED, make_spec(), id="breach"),
    pytest.param(4, seen(4, rate=360), MEASURED, make_spec(), id="headroom-low"),
    pytest.param(2, seen(2, rate=0, queue=0), MEASURED, make_spec({"minReplicas": 5}), id="floor"),
    pytest.param(4, seen(4, rate=10), MEASURED, make_spec({}, WINDOW), id="prewarm-window"),
    pytest.param(
        4,
        seen(2, metrics_error="connection refused"),
        ScalerState(),
        make_spec({"whenMetricsMissing": {"policy": "Fixed", "replicas": 6}}),
        id="blind-fixed",
    ),
    pytest.param(
        4,
        BREACH,
        ScalerState(last_scale_up_at=ago(600), last_scale_at=ago(600)),
        make_spec(),
        id="pending-guard-expired",
    ),
]


@pytest.mark.parametrize(("current", "observed", "state", "spec"), RAISES)
@pytest.mark.parametrize("cause", [QUOTA, NO_NODE], ids=["quota", "no-node"])
def test_a_raise_is_held_at_the_current_count_naming_the_cause(
    current: int, observed: MetricsObservation, state: ScalerState, spec: ScalingSpec, cause: str
) -> None:
    free = decide(current, observed, spec, state, NOW)
    assert free.desired_replicas > current  # the case does raise when pods can be placed

    held = decide(current, _blocked(observed, cause), spec, state, NOW)
    assert (held.desired_replicas, held.reason) == (current, reasons.SCALE_UP_BLOCKED)
    assert held.message.startswith(f"held at {current}, wanted {free.desired_replicas}: {cause}")
    assert held.state.last_scale_at == state.last_scale_at  # no step taken, no pacing started
    status = held.status(observed)
    assert (status.desired_replicas, status.reason) == (current, "ScaleUpBlocked")
    assert cause in status.message


def test_scale_down_is_still_allowed_while_pods_cannot_be_placed() -> None:
    calm = MEASURED.model_copy(update={"healthy_since": ago(300)})
    decision = decide(10, _blocked(seen(10, rate=100), QUOTA), make_spec(), calm, NOW)
    assert (decision.desired_replicas, decision.reason) == (9, reasons.LOAD_DECREASED)


def test_a_decision_that_does_not_raise_keeps_its_own_reason() -> None:
    decision = decide(4, _blocked(seen(4, rate=280), QUOTA), make_spec(), MEASURED, NOW)
    assert (decision.desired_replicas, decision.reason) == (4, reasons.STEADY)
    assert QUOTA not in decision.message


def test_the_hold_ends_with_its_cause_and_the_breach_is_not_waited_for_again() -> None:
    spec = make_spec({"scaleUp": {"stabilizationSeconds": 30}})
    state, current = MEASURED, 4
    for step in range(8):  # two minutes of 15 s evaluations under a quota
        now = NOW + timedelta(seconds=15 * step)
        observed = _blocked(seen(2, p99=0.9, queue=30, rate=200, at=now), QUOTA)
        decision = decide(current, observed, spec, state, now)
        assert decision.desired_replicas == current
        assert decision.reason in {reasons.SCALE_UP_STABILIZING, reasons.SCALE_UP_BLOCKED}
        state = decision.state
    assert decision.reason == reasons.SCALE_UP_BLOCKED

    now = NOW + timedelta(seconds=15 * 8)
    resumed = decide(current, seen(2, p99=0.9, queue=30, rate=200, at=now), spec, state, now)
    assert resumed.desired_replicas > current
    assert resumed.reason == reasons.QUEUE_ABOVE_TARGET
    assert resumed.state.last_scale_at == now


def test_a_rate_only_spec_without_capacity_is_held_too() -> None:
    observed = _blocked(seen(2, p99=1.0, queue=2, rate=0), NO_NODE)
    decision = decide(2, observed, make_spec(), ScalerState(), NOW)
    assert decision.desired_replicas == 2 and decision.reason == reasons.SCALE_UP_BLOCKED
    assert f"wanted {math.ceil(2 * 2.0 / 0.75)}" in decision.message


def _blocked(observed: MetricsObservation, cause: str) -> MetricsObservation:
    return replace(observed, placement_failure=cause)

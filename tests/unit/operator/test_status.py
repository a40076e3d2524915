"""Status: rollout reading, the aggregate Ready, transition times, change-only patches, events."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kiln_operator import constants
from kiln_operator.status import compute_status, find_condition, rollout_state, set_condition
from kiln_operator.status.compute import ChildProblem, ReconcileObservation
from tests.unit import kube_objects

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
FOREIGN_CONDITION = {
    "type": "MetricsAvailable",
    "status": "True",
    "reason": "X",
    "message": "",
    "lastTransitionTime": "2026-03-01T11:00:00Z",
}
"""A condition another writer (the autoscaler) owns."""


def deployment(
    *,
    replicas: int = 2,
    current: int | None = None,
    generation: int = 1,
    observed: int = 1,
    updated: int = 2,
    ready: int = 2,
    available: int = 2,
    progressing_reason: str = "NewReplicaSetAvailable",
) -> dict[str, Any]:
    """``replicas`` wanted, ``current`` existing (default: as many as wanted)."""
    return kube_objects.deployment(
        desired=replicas,
        replicas=replicas if current is None else current,
        generation=generation,
        observed=observed,
        updated=updated,
        ready=ready,
        available=available,
        progressing=progressing_reason,
    )


def observe(
    deploy: dict[str, Any] | None, error: str | None = None, generation: int = 1
) -> ReconcileObservation:
    return ReconcileObservation(
        generation=generation,
        spec_error=error,
        deployment=deploy,
        selector="app=x",
        url="http://x.ns.svc:8000",
        grpc_address="x.ns.svc:8001",
    )


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found = find_condition(status["conditions"], kind)
    assert found is not None
    return found


def test_rollout_states() -> None:
    assert not rollout_state(deployment()).in_progress
    assert rollout_state(deployment(generation=2, observed=1)).in_progress
    assert rollout_state(deployment(updated=1)).in_progress
    assert rollout_state(deployment(current=3)).in_progress  # an old pod still terminating
    assert rollout_state(deployment(available=1)).in_progress
    assert rollout_state(deployment(generation=2, observed=1)).rolling
    assert rollout_state(deployment(current=3)).rolling  # pods of an older template
    scaling_up = rollout_state(deployment(replicas=3, updated=2, current=2, available=2))
    assert scaling_up.in_progress and not scaling_up.rolling
    stuck = rollout_state(deployment(updated=1, progressing_reason="ProgressDeadlineExceeded"))
    assert stuck.deadline_exceeded


def test_ready_when_rolled_out_and_available() -> None:
    update = compute_status({}, observe(deployment()), T0)
    assert update.patch is not None
    ready = condition(update.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"]) == ("True", constants.REASON_AVAILABLE)
    assert ready["observedGeneration"] == 1
    assert update.patch["readyReplicas"] == 2
    assert update.patch["url"] == "http://x.ns.svc:8000"
    assert [e.reason for e in update.events] == [constants.EVENT_READY]


def test_not_ready_while_a_rollout_is_in_progress() -> None:
    update = compute_status({}, observe(deployment(generation=2, observed=1)), T0)
    assert update.patch is not None
    ready = condition(update.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"]) == ("False", constants.REASON_ROLLOUT_IN_PROGRESS)
    progressing = condition(update.patch, constants.CONDITION_PROGRESSING)
    assert progressing["status"] == "True"


def test_a_scale_is_not_a_rollout_ready_stays_true_and_no_event_pair() -> None:
    """The autoscaler adds a pod: the Deployment's generation moves, its controller reports
    later, the new pod warms up; the older pods serve throughout, so Ready never flips."""
    ready = compute_status({}, observe(deployment()), T0)
    status: dict[str, Any] = dict(ready.applied)
    steps = [
        deployment(replicas=3, generation=2, observed=1),  # written, not yet seen
        deployment(replicas=3, generation=2, observed=2, updated=2, current=2),  # pod created
        deployment(replicas=3, generation=2, observed=2, updated=3, available=2, ready=2),
        deployment(replicas=3, generation=2, observed=2, updated=3, available=3, ready=3),
    ]
    for step, live in enumerate(steps, start=1):
        update = compute_status(status, observe(live), T0 + timedelta(seconds=step))
        status = {**status, **(update.patch or {})}
        assert condition(status, constants.CONDITION_READY)["status"] == "True", step
        assert update.events == [], step
    assert condition(status, constants.CONDITION_PROGRESSING)["status"] == "False"


def test_a_spec_change_is_a_rollout_even_before_the_controller_sees_it() -> None:
    status = dict(compute_status({}, observe(deployment()), T0).applied)
    written = deployment(generation=2, observed=1)  # a new pod template, not yet seen
    update = compute_status(status, observe(written, generation=2), T0)
    assert update.patch is not None
    ready = condition(update.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"]) == ("False", constants.REASON_ROLLOUT_IN_PROGRESS)
    seen = deployment(generation=2, observed=2, updated=1, current=3)  # old pods still serve
    update = compute_status({**status, **update.patch}, observe(seen, generation=2), T0)
    assert (
        update.patch is None
        or condition({**status, **update.patch}, constants.CONDITION_READY)["status"] == "False"
    )


def test_not_ready_when_no_pod_is_available() -> None:
    update = compute_status({}, observe(deployment(available=0, ready=0)), T0)
    assert update.patch is not None
    ready = condition(update.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"]) == (
        "False",
        constants.REASON_MINIMUM_REPLICAS_UNAVAILABLE,
    )


def test_not_ready_without_a_deployment_or_with_zero_replicas() -> None:
    missing = compute_status({}, observe(None), T0).patch
    assert missing is not None
    assert (
        condition(missing, constants.CONDITION_READY)["reason"]
        == constants.REASON_DEPLOYMENT_MISSING
    )
    zero = compute_status({}, observe(deployment(replicas=0, updated=0, ready=0, available=0)), T0)
    assert zero.patch is not None
    assert (
        condition(zero.patch, constants.CONDITION_READY)["reason"]
        == constants.REASON_SCALED_TO_ZERO
    )


def test_invalid_spec_is_not_ready_names_the_field_and_warns_once() -> None:
    message = "spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"
    first = compute_status({}, observe(deployment(), error=message), T0)
    assert first.patch is not None
    ready = condition(first.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        constants.REASON_INVALID_SPEC,
        message,
    )
    assert condition(first.patch, constants.CONDITION_SPEC_VALID)["status"] == "False"
    # the running Deployment is still reported: the last valid spec keeps serving
    assert condition(first.patch, constants.CONDITION_DEPLOYMENT_AVAILABLE)["status"] == "True"
    assert [(e.type, e.reason) for e in first.events] == [
        ("Warning", constants.REASON_INVALID_SPEC)
    ]
    again = compute_status(
        first.patch, observe(deployment(), error=message), T0 + timedelta(minutes=1)
    )
    assert again.patch is None
    assert again.events == []


def test_converged_status_produces_no_patch_and_keeps_transition_times() -> None:
    first = compute_status({}, observe(deployment()), T0)
    assert first.patch is not None
    later = compute_status(first.patch, observe(deployment()), T0 + timedelta(hours=1))
    assert later.patch is None
    assert later.events == []


def test_transition_time_moves_only_when_status_changes() -> None:
    first = compute_status({}, observe(deployment()), T0).patch
    assert first is not None
    t1 = T0 + timedelta(minutes=5)
    rolling = compute_status(first, observe(deployment(generation=2, observed=1), generation=2), t1)
    assert rolling.patch is not None
    ready = condition(rolling.patch, constants.CONDITION_READY)
    assert ready["lastTransitionTime"] == "2026-03-01T12:05:00Z"
    spec_valid = condition(rolling.patch, constants.CONDITION_SPEC_VALID)
    assert spec_valid["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    assert spec_valid["observedGeneration"] == 2
    assert rolling.patch["observedGeneration"] == 2
    assert [(e.type, e.reason) for e in rolling.events] == [("Warning", constants.EVENT_NOT_READY)]


def test_only_changed_keys_are_patched_and_foreign_conditions_survive() -> None:
    foreign = FOREIGN_CONDITION
    first = compute_status({"conditions": [foreign]}, observe(deployment()), T0).patch
    assert first is not None
    assert first["conditions"][0] == foreign
    scaled = deployment(replicas=3, updated=3, ready=3, available=3)
    update = compute_status(first, observe(scaled), T0)
    assert update.patch is not None
    assert set(update.patch) == {
        "conditions",
        "replicas",
        "readyReplicas",
        "updatedReplicas",
        "availableReplicas",
    }


def test_set_condition_adds_and_replaces() -> None:
    conditions = set_condition(
        [],
        condition_type="A",
        status="True",
        reason="R",
        message="m",
        observed_generation=None,
        now=T0,
    )
    assert conditions == [
        {
            "type": "A",
            "status": "True",
            "reason": "R",
            "message": "m",
            "lastTransitionTime": "2026-03-01T12:00:00Z",
        }
    ]
    replaced = set_condition(
        conditions,
        condition_type="A",
        status="False",
        reason="S",
        message="",
        observed_generation=4,
        now=T0 + timedelta(seconds=1),
    )
    assert len(replaced) == 1
    assert replaced[0]["lastTransitionTime"] == "2026-03-01T12:00:01Z"
    assert replaced[0]["observedGeneration"] == 4


def test_the_applied_status_holds_only_the_reconcile_loops_own_conditions() -> None:
    foreign = FOREIGN_CONDITION
    update = compute_status({"conditions": [foreign]}, observe(deployment()), T0)
    assert [c["type"] for c in update.applied["conditions"]] == [
        "SpecValid",
        "DeploymentAvailable",
        "Progressing",
        "ReplicasFeasible",
        "Ready",
        "Stalled",
        "Reconciling",
    ]
    assert update.applied["url"] == "http://x.ns.svc:8000"


def test_a_child_problem_reported_twice_is_said_once_and_clears_with_the_next_success() -> None:
    failed = ChildProblem(
        constants.REASON_CHILD_APPLY_FAILED,
        "could not read Deployment ns/x (HTTP 503): unavailable; retrying with backoff",
    )
    serving = deployment()
    problems = replace(observe(serving), child_problems=(failed, failed))
    status = compute_status({}, problems, T0).applied
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ChildApplyFailed",
        failed.message,
    )
    cleared = condition(compute_status(status, observe(serving), T0).applied, "Ready")
    assert (cleared["status"], cleared["reason"]) == ("True", constants.REASON_AVAILABLE)


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
}


def test_at_minreplicas_zero_ready_stays_true_asleep_and_while_waking() -> None:
    asleep = deployment(replicas=0, updated=0, ready=0, available=0)
    observed = replace(observe(asleep), min_replicas=0, cold_start_seconds=8.2)
    update = compute_status({}, observed, T0)
    assert update.patch is not None
    ready = condition(update.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"]) == ("True", constants.REASON_SCALED_TO_ZERO)
    assert ready["message"] == (
        "0 replicas (minReplicas 0, idle); the first request wakes one and waits for it to pass "
        "its warm-up gate, cold start about 8 s"
    )
    floor = condition(update.patch, constants.CONDITION_REPLICA_FLOOR_MET)
    assert floor["status"] == "True"
    # woken: one pod asked for, not ready yet; the activator holds the requests meanwhile
    waking = replace(observed, deployment=deployment(replicas=1, updated=1, ready=0, available=0))
    woken = compute_status(update.applied, waking, T0 + timedelta(minutes=1))
    ready = next(c for c in woken.applied["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", constants.REASON_WAKING)
    assert ready["message"].startswith("waking: 0 of 1 updated pods are available")
    assert not [e for e in woken.events if e.reason == constants.EVENT_NOT_READY]
    # a pod that cannot start is no wake: Ready turns False with its cause
    stuck = replace(
        waking,
        pods=(kube_objects.pod("p", UNSCHEDULABLE),),
    )
    failed = compute_status(woken.applied, stuck, T0 + timedelta(minutes=2))
    ready = next(c for c in failed.applied["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", constants.REASON_UNSCHEDULABLE)

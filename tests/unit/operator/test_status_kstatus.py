"""Stalled and Reconciling: the conditions kstatus (Flux, `kubectl wait`) reads before Ready.

Each state of the service maps to exactly one of stalled (a person must act), reconciling (the
operator is still at work) or converged; the two conditions follow Ready, so a converged
service is never rewritten for them. tests/unit/gitops/test_kstatus_verdicts.py feeds the same
statuses to the kstatus library itself.
"""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kiln_operator import constants
from kiln_operator.status.compute import ChildProblem, ReconcileObservation, compute_status
from tests.unit.kube_objects import deployment, pod

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
INVALID = "spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"
READY_POD = {"type": "Ready", "status": "True"}
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
}
WARMING = {
    "type": constants.CONDITION_WARMED_UP,
    "status": "False",
    "reason": "WarmingUp",
    "message": "sent 12 of 200 warm-up requests",
}
WARMUP_FAILED = {
    "type": constants.CONDITION_WARMED_UP,
    "status": "False",
    "reason": "P99OverBound",
    "message": "warm-up p99 183.2 ms exceeds the bound 50 ms after 200 requests",
}


def observe(
    body: dict[str, Any] | None, *pods: dict[str, Any], min_replicas: int | None = 2
) -> ReconcileObservation:
    return ReconcileObservation(
        generation=3,
        spec_error=None,
        deployment=body,
        selector="s",
        url="u",
        grpc_address="g",
        pods=pods,
        min_replicas=min_replicas,
    )


def kstatus_conditions(observation: ReconcileObservation) -> dict[str, dict[str, Any]]:
    applied = compute_status({}, observation, T0).applied
    return {c["type"]: c for c in applied["conditions"]}


def shape(condition: dict[str, Any]) -> tuple[str, str, str]:
    return condition["status"], condition["reason"], condition["message"]


SERVING = (pod("a", READY_POD), pod("b", READY_POD))
ROLLING = deployment(replicas=3, updated=1, available=2)
"""A rollout whose one new pod is not available while two of the previous spec serve."""
NEW = "2026-11-25T11:59:00Z"

STALLED_CASES = {
    "invalid spec": replace(observe(deployment(), *SERVING), spec_error=INVALID),
    "child refused": replace(
        observe(deployment(), *SERVING),
        child_problems=(ChildProblem(constants.REASON_CHILD_REJECTED, "HTTP 403: denied"),),
    ),
    "rollout stalled": observe(ROLLING, pod("new", UNSCHEDULABLE, created=NEW), *SERVING),
    "rollout stalled by a failed warm-up": observe(
        ROLLING, pod("new", WARMUP_FAILED, created=NEW), *SERVING
    ),
    "warm-up failed, nothing serves": observe(
        deployment(available=0), pod("a", WARMUP_FAILED), pod("b", WARMUP_FAILED)
    ),
    "progress deadline exceeded": observe(
        deployment(updated=1, available=0, progressing="ProgressDeadlineExceeded")
    ),
    "deadline exceeded behind a download failure": replace(
        observe(deployment(updated=1, available=0, progressing="ProgressDeadlineExceeded")),
        download_failure="model download failed: AccessDenied for s3://models/mlp.pt",
    ),
}


@pytest.mark.parametrize("case", STALLED_CASES)
def test_stalled_carries_readys_reason_and_message_and_reconciling_is_false(case: str) -> None:
    conditions = kstatus_conditions(STALLED_CASES[case])
    ready = conditions[constants.CONDITION_READY]
    assert ready["status"] == "False"
    assert shape(conditions[constants.CONDITION_STALLED]) == (
        "True",
        ready["reason"],
        ready["message"],
    )
    assert shape(conditions[constants.CONDITION_RECONCILING]) == ("False", "Stalled", "")
    assert conditions[constants.CONDITION_STALLED]["observedGeneration"] == 3


def test_the_stalled_reasons_are_the_ones_named() -> None:
    reasons = {
        case: kstatus_conditions(observation)[constants.CONDITION_STALLED]["reason"]
        for case, observation in STALLED_CASES.items()
    }
    assert reasons == {
        "invalid spec": "InvalidSpec",
        "child refused": "ChildRejected",
        "rollout stalled": "RolloutStalled",
        "rollout stalled by a failed warm-up": "RolloutStalled",
        "warm-up failed, nothing serves": "WarmupFailed",
        "progress deadline exceeded": "ProgressDeadlineExceeded",
        "deadline exceeded behind a download failure": "ModelDownloadFailed",
    }
    message = kstatus_conditions(STALLED_CASES["rollout stalled by a failed warm-up"])[
        constants.CONDITION_STALLED
    ]["message"]
    assert message.startswith("the rollout is stalled: warm-up of pod new failed (P99OverBound)")


RECONCILING_CASES = {
    "no Deployment yet": (observe(None), "DeploymentMissing"),
    "rolling out": (observe(deployment(updated=1, available=2, replicas=3)), "RolloutInProgress"),
    "first pods starting": (observe(deployment(available=0)), "MinimumReplicasUnavailable"),
    "unschedulable, no deadline yet": (
        observe(deployment(available=0), pod("a", UNSCHEDULABLE)),
        "Unschedulable",
    ),
    "below the floor while serving": (
        observe(
            deployment(desired=3, replicas=3, updated=3, available=1), *SERVING[:1], min_replicas=3
        ),
        "FloorNotMet",
    ),
    "scaled to zero (minReplicas is at least 1: the autoscaler raises it)": (
        observe(deployment(desired=0, replicas=0, updated=0, available=0)),
        "ScaledToZero",
    ),
    "a child write may pass": (
        replace(
            observe(deployment(), *SERVING),
            child_problems=(ChildProblem(constants.REASON_CHILD_APPLY_FAILED, "HTTP 503"),),
        ),
        "ChildApplyFailed",
    ),
    "a re-created service waits for the old children to go": (
        replace(
            observe(deployment(), *SERVING),
            child_problems=(ChildProblem(constants.REASON_CHILD_CONFLICT, "held"),),
        ),
        "ChildConflict",
    ),
}


@pytest.mark.parametrize("case", RECONCILING_CASES)
def test_reconciling_says_what_the_operator_waits_for_and_nothing_is_stalled(case: str) -> None:
    observation, reason = RECONCILING_CASES[case]
    conditions = kstatus_conditions(observation)
    reconciling = conditions[constants.CONDITION_RECONCILING]
    assert (reconciling["status"], reconciling["reason"]) == ("True", reason)
    assert reconciling["message"]
    assert shape(conditions[constants.CONDITION_STALLED]) == ("False", "NotStalled", "")


@pytest.mark.parametrize(
    "observation",
    [
        observe(deployment(), *SERVING),
        # an autoscaler scale-up above the floor: the older pods serve, a scale is not a rollout
        observe(deployment(desired=3, replicas=3, updated=3, available=2), *SERVING),
        # minReplicas 0: asleep, and woken with the first pod still warming (held requests)
        observe(deployment(desired=0, replicas=0, updated=0, available=0), min_replicas=0),
        observe(
            deployment(desired=1, replicas=1, updated=1, available=0),
            pod("w", WARMING),
            min_replicas=0,
        ),
    ],
    ids=["ready", "scaling up above the floor", "at zero", "waking from zero"],
)
def test_converged_is_neither_reconciling_nor_stalled(observation: ReconcileObservation) -> None:
    conditions = kstatus_conditions(observation)
    assert shape(conditions[constants.CONDITION_RECONCILING]) == ("False", "Converged", "")
    assert shape(conditions[constants.CONDITION_STALLED]) == ("False", "NotStalled", "")


def test_the_conditions_change_only_with_ready_and_a_converged_service_writes_nothing() -> None:
    """Warming, then serving, then stalled by a new spec: each step rewrites Ready anyway;
    repeating a step (a resync) writes nothing, and transition times move only on a flip."""
    steps = [
        observe(deployment(available=0)),
        observe(deployment(), *SERVING),
        replace(observe(deployment(), *SERVING), spec_error=INVALID),
    ]
    status: dict[str, Any] = {}
    for minute, observation in enumerate(steps):
        now = T0 + timedelta(minutes=minute)
        update = compute_status(status, observation, now)
        assert update.patch is not None and "conditions" in update.patch
        status = {**status, **update.patch}
        again = compute_status(status, observation, now + timedelta(hours=1))
        assert again.patch is None, minute
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Stalled"]["lastTransitionTime"] == "2026-11-25T12:02:00Z"
    assert by_type["Reconciling"]["lastTransitionTime"] == "2026-11-25T12:01:00Z"
    assert [c["type"] for c in status["conditions"]][-3:] == ["Ready", "Stalled", "Reconciling"]

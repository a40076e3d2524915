"""ReplicasFeasible says when pods asked for cannot exist, in Kubernetes' words: the
ReplicaSet's refused create copied onto the Deployment (a quota), or the scheduler's message on
a pod; Ready keeps serving above the floor and names the cause below it; one event when the
condition turns False, one when it turns back."""

from datetime import UTC, datetime, timedelta
from typing import Any

from kiln_operator import constants
from kiln_operator.status.causes import placement_failure
from kiln_operator.status.compute import ReconcileObservation, StatusUpdate, compute_status
from tests.unit import kube_objects
from tests.unit.kube_objects import pod

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
QUOTA_MESSAGE = (
    'pods "mlp-5d4f-x" is forbidden: exceeded quota: gpu-quota, requested: '
    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: "
    "requests.nvidia.com/gpu=2"
)
REFUSED = {
    "type": "ReplicaFailure",
    "status": "True",
    "reason": "FailedCreate",
    "message": QUOTA_MESSAGE,
}
NO_PRODUCT = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling.",
}
READY = {"type": "Ready", "status": "True"}
AVAILABLE = {"type": "Available", "status": "True"}


def quota_bound(*, min_replicas: int, refused: bool = True) -> ReconcileObservation:
    """4 replicas asked for, a quota of 2 GPUs: 2 pods exist and serve."""
    conditions = [AVAILABLE, REFUSED] if refused else [AVAILABLE]
    return ReconcileObservation(
        generation=2,
        spec_error=None,
        deployment=kube_objects.deployment(
            desired=4, replicas=2, updated=2, available=2, conditions=conditions
        ),
        selector="s",
        url="u",
        grpc_address="g",
        pods=(pod("a", READY), pod("b", READY)),
        min_replicas=min_replicas,
    )


def conditions_of(update: StatusUpdate) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in update.applied["conditions"]}


def test_a_refused_create_is_the_placement_failure_with_the_quotas_message() -> None:
    deployment = kube_objects.deployment(conditions=[REFUSED])
    failure = placement_failure(deployment, [pod("a", NO_PRODUCT)])
    assert failure is not None and failure.reason == constants.REASON_PODS_REFUSED
    assert failure.message == f"pods cannot be created (FailedCreate): {QUOTA_MESSAGE}"


def test_unschedulable_pods_carry_the_schedulers_message_and_are_counted() -> None:
    one = placement_failure(kube_objects.deployment(), [pod("b", NO_PRODUCT), pod("c", READY)])
    assert one is not None and one.reason == constants.REASON_UNSCHEDULABLE
    assert one.message == f"pod b cannot be scheduled: {NO_PRODUCT['message']}"
    two = placement_failure(kube_objects.deployment(), [pod("c", NO_PRODUCT), pod("b", NO_PRODUCT)])
    assert two is not None
    assert two.message.startswith("pod b and 1 more cannot be scheduled: 0/4 nodes are available")


def test_placed_gated_or_departing_pods_and_a_failed_delete_are_no_placement_failure() -> None:
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    leaving = pod("d", NO_PRODUCT)
    leaving["metadata"]["deletionTimestamp"] = "2026-11-25T11:59:00Z"
    pending = pod("e", {"type": "PodScheduled", "status": "True"})
    pods = [pod("a", READY), pod("b", gated), leaving, pending]
    assert placement_failure(kube_objects.deployment(), pods) is None
    assert placement_failure(None, []) is None
    over = {**REFUSED, "status": "False"}
    assert placement_failure(kube_objects.deployment(conditions=[over]), []) is None
    undeletable = {**REFUSED, "reason": "FailedDelete", "message": 'pods "x" is forbidden'}
    assert placement_failure(kube_objects.deployment(conditions=[undeletable]), []) is None


def test_above_the_floor_ready_holds_and_replicas_feasible_names_the_quota() -> None:
    conditions = conditions_of(compute_status({}, quota_bound(min_replicas=2), NOW))
    feasible = conditions["ReplicasFeasible"]
    assert (feasible["status"], feasible["reason"]) == ("False", "PodsRefused")
    assert feasible["message"] == f"pods cannot be created (FailedCreate): {QUOTA_MESSAGE}"
    assert feasible["observedGeneration"] == 2
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert "quota" not in ready["message"]
    assert conditions["ReplicaFloorMet"]["status"] == "True"


def test_below_the_floor_ready_serves_and_its_message_names_the_quota() -> None:
    conditions = conditions_of(compute_status({}, quota_bound(min_replicas=4), NOW))
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert ready["message"] == (
        "2 of 4 pods available, fewer than minReplicas 4: pods cannot be created "
        f"(FailedCreate): {QUOTA_MESSAGE}"
    )
    assert conditions["ReplicaFloorMet"]["status"] == "False"
    assert conditions["ReplicasFeasible"]["reason"] == "PodsRefused"


def test_a_gpu_product_no_node_has_makes_replicas_feasible_false_with_the_schedulers_words() -> (
    None
):
    observation = ReconcileObservation(
        generation=1,
        spec_error=None,
        deployment=kube_objects.deployment(desired=1, replicas=1, updated=1, available=0),
        selector="s",
        url="u",
        grpc_address="g",
        pods=(pod("mlp-1", NO_PRODUCT),),
        min_replicas=1,
    )
    conditions = conditions_of(compute_status({}, observation, NOW))
    feasible = conditions["ReplicasFeasible"]
    assert (feasible["status"], feasible["reason"]) == ("False", "Unschedulable")
    assert "didn't match Pod's node affinity/selector" in feasible["message"]
    assert conditions["Ready"]["reason"] == "Unschedulable"


def test_one_warning_when_pods_cannot_be_placed_and_one_normal_event_when_they_can() -> None:
    blocked = compute_status({}, quota_bound(min_replicas=2), NOW)
    warnings = [e for e in blocked.events if e.reason == "PodsRefused"]
    assert [(e.type, e.message) for e in warnings] == [
        ("Warning", f"pods cannot be created (FailedCreate): {QUOTA_MESSAGE}")
    ]
    later = NOW + timedelta(minutes=1)
    still = compute_status(blocked.applied, quota_bound(min_replicas=2), later)
    assert still.patch is None and still.events == []

    cleared = compute_status(blocked.applied, quota_bound(min_replicas=2, refused=False), later)
    feasible = conditions_of(cleared)["ReplicasFeasible"]
    assert (feasible["status"], feasible["reason"]) == ("True", "AllPodsPlaced")
    assert feasible["lastTransitionTime"] == "2026-11-25T12:01:00Z"
    assert [(e.type, e.reason) for e in cleared.events] == [("Normal", "AllPodsPlaced")]


def test_without_a_deployment_nothing_is_claimed_about_placement() -> None:
    observation = ReconcileObservation(
        generation=1, spec_error=None, deployment=None, selector="s", url="u", grpc_address="g"
    )
    assert "ReplicasFeasible" not in conditions_of(compute_status({}, observation, NOW))

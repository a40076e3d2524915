"""The autoscaler reads placement failures from what the watches cached: a Deployment whose
ReplicaSet cannot create pods, or an unschedulable pod, holds the replicas (no scale request)
and says why in status.autoscaling; once neither is cached, it scales as it wanted."""

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from kiln_operator import constants
from kiln_operator.k8s.autoscaler import Autoscaler
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.resources import Resource
from tests.unit.kube_objects import pod
from tests.unit.operator.conftest import load_sample

NOW = datetime(2026, 11, 25, tzinfo=UTC)
QUOTA = (
    'pods "mlp-5d4f-x" is forbidden: exceeded quota: gpu-quota, requested: '
    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
)
NO_NODE = "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."


class RecordingKube:
    """Records the autoscaler's writes: status.autoscaling applies and scale patches."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.statuses: list[dict[str, Any]] = []
        self.scales: list[int] = []

    async def apply_status(
        self, resource: Resource, namespace: str, name: str, status: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        if "autoscaling" in status:  # not the state's own apply (status.autoscalerState)
            self.statuses.append(status)
        return copy.deepcopy(self.body)

    async def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: dict[str, Any], **options: Any
    ) -> dict[str, Any]:
        if options.get("subresource") == "scale":
            self.scales.append(patch["spec"]["replicas"])
        return copy.deepcopy(self.body)


def evaluated(
    deployment_conditions: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> tuple[Autoscaler, RecordingKube]:
    """A service whose blind policy wants 4 replicas (Fixed), running 2 of them."""
    spec = load_sample("minimal")["spec"]
    spec["autoscaling"] = {
        "minReplicas": 2,
        "maxReplicas": 8,
        "whenMetricsMissing": {"policy": "Fixed", "replicas": 4},
    }
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "mlp", "namespace": "ns", "uid": "isvc-uid", "generation": 1},
        "spec": spec,
    }
    cache = ObjectCache()
    cache.store("inferenceservices", body)
    cache.store(
        "deployments",
        {
            "metadata": {
                "name": "mlp",
                "namespace": "ns",
                "ownerReferences": [{"uid": "isvc-uid", "controller": True}],
            },
            "spec": {"replicas": 2},
            "status": {"replicas": 2, "readyReplicas": 2, "conditions": deployment_conditions},
        },
    )
    for each in pods:
        each["metadata"]["labels"] = {constants.LABEL_INFERENCESERVICE: "mlp"}
        cache.store("pods", each)
    kube = RecordingKube(body)
    return Autoscaler(kube, cache, None), kube  # type: ignore[arg-type]


REFUSED = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA}
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": NO_NODE,
}


@pytest.mark.parametrize(
    ("conditions", "pods", "cause"),
    [
        pytest.param([REFUSED], [], QUOTA, id="quota"),
        pytest.param([], [pod("mlp-1", UNSCHEDULABLE)], NO_NODE, id="no-node"),
    ],
)
async def test_pods_that_cannot_be_placed_hold_the_replicas_and_status_says_why(
    conditions: list[dict[str, Any]], pods: list[dict[str, Any]], cause: str
) -> None:
    autoscaler, kube = evaluated(conditions, pods)
    evaluation = await autoscaler.evaluate("ns", "mlp", NOW)
    assert evaluation is not None
    assert kube.scales == []
    status = kube.statuses[-1]["autoscaling"]
    assert (status["desiredReplicas"], status["reason"]) == (2, "ScaleUpBlocked")
    assert status["message"].startswith("held at 2, wanted 4: ")
    assert cause in status["message"]


async def test_with_every_pod_placed_the_autoscaler_scales_as_it_wanted() -> None:
    placed = {"type": "PodScheduled", "status": "True"}
    autoscaler, kube = evaluated(
        [{"type": "ReplicaFailure", "status": "False"}], [pod("a", placed)]
    )
    await autoscaler.evaluate("ns", "mlp", NOW)
    assert kube.scales == [4]
    assert kube.statuses[-1]["autoscaling"]["reason"] == "MetricsUnavailable"

"""Ready says why, on the real control plane (kube-scheduler, the ReplicaSet controller, the
quota admission, kwok GPU nodes): too few GPUs, no node with the GPU product, a missing
PersistentVolumeClaim and a ResourceQuota each reach Ready's reason and message, from what the
operator watches; the replica floor unmet under a quota has its own condition while Ready stays
True."""

from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    OperatorProcess,
    apply,
    condition,
    get,
    gpu_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

BOUND = 90
"""Seconds within which the cause must reach the condition (the two cores are shared)."""


def test_too_few_gpus_reaches_ready_with_the_schedulers_reason(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, gpu_service("gpus", resources={"gpuCount": 16}))
    ready = wait_condition(
        cluster, namespace, name="gpus", kind="Ready", status="False", reason="Unschedulable",
        timeout=BOUND,
    )  # fmt: skip
    assert "cannot be scheduled: 0/" in ready["message"]
    assert "Insufficient nvidia.com/gpu" in ready["message"]


def test_a_gpu_product_no_node_has_reaches_ready(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    resources = {"gpuCount": 1, "gpuProduct": "NVIDIA-H100-NOWHERE"}
    apply(cluster, namespace, gpu_service("product", resources=resources))
    ready = wait_condition(
        cluster, namespace, name="product", kind="Ready", status="False", reason="Unschedulable",
        timeout=BOUND,
    )  # fmt: skip
    assert "node affinity/selector" in ready["message"]


def test_a_missing_claim_reaches_ready_naming_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    manifest = gpu_service("claim")
    manifest["spec"]["model"]["uri"] = "pvc://no-such-claim/model.pt"
    apply(cluster, namespace, manifest)
    ready = wait_condition(
        cluster, namespace, name="claim", kind="Ready", status="False", reason="Unschedulable",
        timeout=BOUND,
    )  # fmt: skip
    assert 'persistentvolumeclaim "no-such-claim" not found' in ready["message"]


def test_a_quota_refusing_pods_reaches_ready_naming_the_quota(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-gpus-here"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
    }
    apply(cluster, namespace, quota)
    apply(cluster, namespace, gpu_service("quota"))
    ready = wait_condition(
        cluster, namespace, name="quota", kind="Ready", status="False", reason="PodsRefused",
        timeout=BOUND,
    )  # fmt: skip
    assert "pods cannot be created (FailedCreate)" in ready["message"]
    assert "no-gpus-here" in ready["message"]


def test_a_floor_the_quota_cannot_meet_keeps_ready_and_says_so_in_its_own_condition(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "two-pods"},
        "spec": {"hard": {"pods": "2"}},
    }
    apply(cluster, namespace, quota)
    apply(
        cluster, namespace, gpu_service("floor", autoscaling={"minReplicas": 5, "maxReplicas": 5})
    )
    floor = wait_condition(
        cluster, namespace, name="floor", kind="ReplicaFloorMet", status="False",
        reason="FloorNotMet", timeout=BOUND,
    )  # fmt: skip
    assert "of minReplicas 5 pods available" in floor["message"]
    wait_condition(cluster, namespace, name="floor", kind="Ready", status="True", timeout=BOUND)

    def floor_with_cause() -> dict[str, Any] | None:
        found = condition(get(cluster, namespace, "inferenceservice", "floor"), "ReplicaFloorMet")
        message = (found or {}).get("message", "")
        return found if message.startswith("2 of minReplicas 5 pods available: pods") else None

    floor = wait_for(floor_with_cause, timeout=BOUND, description="the floor's cause")
    assert floor["status"] == "False" and floor["reason"] == "FloorNotMet"
    assert "pods cannot be created (FailedCreate)" in floor["message"]
    assert "two-pods" in floor["message"]

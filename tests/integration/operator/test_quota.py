"""Quota awareness on the real control plane (quota admission, the ReplicaSet and Deployment
controllers, kube-scheduler, kwok GPU nodes): a ResourceQuota of 2 GPUs lets 2 of 4 pods exist,
ReplicasFeasible names the quota, and the autoscaler, though its policy wants more, holds the
replicas until the quota is raised; a GPU product no node has reaches ReplicasFeasible with the
scheduler's words within 30 s."""

import time
from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    OperatorProcess,
    apply,
    get,
    gpu_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

SCHEDULING_BOUND = 30
"""Seconds from `kubectl apply` until the condition names the scheduling failure (the issue's)."""
BOUND = 90
"""Seconds for the rest: the two cores are shared, and the ReplicaSet controller retries a
refused create with a growing backoff."""
INTERVAL = 5
"""The service's evaluationIntervalSeconds (the smallest the API allows)."""


def gpu_quota(gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "two-gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }


def live_pods(cluster: Cluster, namespace: str) -> list[str]:
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]


def replicas(cluster: Cluster, namespace: str, name: str) -> int:
    return int(cluster.get_json("deployment", name, "-n", namespace)["spec"]["replicas"])


def autoscaling(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = get(cluster, namespace, "inferenceservice", name) or {}
    found: dict[str, Any] = (body.get("status") or {}).get("autoscaling") or {}
    return found


def test_a_gpu_quota_holds_the_replicas_names_the_quota_and_the_hold_ends_with_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, gpu_quota(2))
    scaling: dict[str, Any] = {
        "minReplicas": 4,
        "maxReplicas": 8,
        "evaluationIntervalSeconds": INTERVAL,
    }
    apply(cluster, namespace, gpu_service("quota", autoscaling=scaling))

    feasible = wait_condition(
        cluster, namespace, name="quota", kind="ReplicasFeasible", status="False",
        reason="PodsRefused", timeout=BOUND,
    )  # fmt: skip
    assert feasible["message"].startswith("pods cannot be created (FailedCreate): pods ")
    assert "exceeded quota: two-gpus" in feasible["message"]
    assert "limited: requests.nvidia.com/gpu=2" in feasible["message"]
    assert len(live_pods(cluster, namespace)) == 2
    assert replicas(cluster, namespace, "quota") == 4

    # No Prometheus for this service: the Fixed policy now wants 6, which the quota forbids.
    scaling["whenMetricsMissing"] = {"policy": "Fixed", "replicas": 6}
    apply(cluster, namespace, gpu_service("quota", autoscaling=scaling))

    def blocked() -> dict[str, Any] | None:
        status = autoscaling(cluster, namespace, "quota")
        return status if status.get("reason") == "ScaleUpBlocked" else None

    status = wait_for(blocked, timeout=BOUND, description="the autoscaler's hold")
    assert status["desiredReplicas"] == 4
    assert status["message"].startswith("held at 4, wanted 6: pods cannot be created")
    assert "exceeded quota: two-gpus" in status["message"]
    deadline = time.monotonic() + 3 * INTERVAL  # three more evaluations
    while time.monotonic() < deadline:
        assert replicas(cluster, namespace, "quota") == 4
        assert len(live_pods(cluster, namespace)) == 2
        time.sleep(1)
    assert autoscaling(cluster, namespace, "quota")["reason"] == "ScaleUpBlocked"

    apply(cluster, namespace, gpu_quota(6))
    wait_condition(
        cluster, namespace, name="quota", kind="ReplicasFeasible", status="True",
        reason="AllPodsPlaced", timeout=BOUND,
    )  # fmt: skip
    wait_for(
        lambda: replicas(cluster, namespace, "quota") == 6,
        timeout=BOUND,
        description="the scale-up after the hold",
    )
    wait_for(
        lambda: len(live_pods(cluster, namespace)) == 6,
        timeout=BOUND,
        description="6 pods under the raised quota",
    )


def test_a_gpu_product_no_node_has_reaches_replicas_feasible_within_30_seconds(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    resources = {"gpuCount": 1, "gpuProduct": "NVIDIA-H100-NOWHERE"}
    apply(cluster, namespace, gpu_service("product", resources=resources))
    feasible = wait_condition(
        cluster, namespace, name="product", kind="ReplicasFeasible", status="False",
        reason="Unschedulable", timeout=SCHEDULING_BOUND,
    )  # fmt: skip
    assert feasible["message"].startswith("pod product-")
    assert "cannot be scheduled: 0/" in feasible["message"]
    assert "didn't match Pod's node affinity/selector" in feasible["message"]

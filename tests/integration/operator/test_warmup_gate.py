"""The warm-up gate end to end: operator, real control plane, real runtimes at the pod IPs.

Each Kiln pod runs Kiln's runtime image under the local cluster's real node (kubelet,
containerd, a CNI bridge), so the operator's warm-up requests, the pod's readiness and the
Service's endpoints are real.
"""

import json
from typing import Any

import pytest

from kiln_localcluster import podnet
from kiln_localcluster.load import ready_endpoints
from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import apply, condition, mlp_service, wait_condition
from tests.sessioncluster import FAKE_NODES, missing_component

pytestmark = pytest.mark.integration

GATE = "serving.kiln.dev/warmed-up"


def pods(cluster: Cluster, namespace: str, service: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "pods", "-n", namespace, "-l", f"serving.kiln.dev/inferenceservice={service}"
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def gate_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    return condition(pod, GATE)


def endpoint_ips(cluster: Cluster, namespace: str, service: str) -> set[str]:
    return set(ready_endpoints(cluster.info, namespace, service))


def wait_gate(
    cluster: Cluster, namespace: str, service: str, *, status: str, timeout: float = 120
) -> dict[str, Any]:
    seen: list[dict[str, Any] | None] = []  # the gates of the last look, for a timeout's message

    def decided() -> dict[str, Any] | None:
        found = pods(cluster, namespace, service)
        seen[:] = [gate_of(pod) for pod in found]
        for pod, gate in zip(found, seen, strict=True):
            if gate and gate["status"] == status and gate.get("reason") != "WarmingUp":
                return pod
        return None

    try:
        return wait_for(decided, timeout=timeout, description=f"a pod's gate {status} in {service}")
    except TimeoutError as error:
        raise TimeoutError(f"{error}; the gates seen last: {seen}") from error


def test_warm_pod_becomes_ready_and_joins_the_service(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any
) -> None:
    apply(cluster, namespace, mlp_service("warm"))
    pod = wait_gate(cluster, namespace, "warm", status="True")
    gate = gate_of(pod)
    assert gate is not None and gate["reason"] == "WarmedUp"
    assert "warm-up p99" in gate["message"] and "within 5000 ms" in gate["message"]
    ip = pod["status"]["podIP"]
    wait_for(
        lambda: ip in endpoint_ips(cluster, namespace, "warm"),
        timeout=30,
        description="the warmed pod in the Service's ready endpoints",
    )
    described = cluster.kubectl("describe", "pod", pod["metadata"]["name"], "-n", namespace)
    assert "serving.kiln.dev/warmed-up" in described.stdout
    summary = wait_for(
        lambda: (
            cluster.get_json("inferenceservice", "warm", "-n", namespace)
            .get("status", {})
            .get("warmup")
        ),
        timeout=30,
        description="status.warmup written by the gate",
    )
    assert summary["warmReplicas"] == 1 and summary["failedReplicas"] == 0
    assert 0 < summary["coldStartP90Seconds"] < 120


def test_pod_over_its_p99_bound_never_becomes_ready(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any
) -> None:
    apply(cluster, namespace, mlp_service("slow", p99Milliseconds=0.001))
    pod = wait_gate(cluster, namespace, "slow", status="False")
    gate = gate_of(pod)
    assert gate is not None and gate["reason"] == "P99OverBound"
    assert "exceeds the bound 0.001 ms" in gate["message"]
    assert condition(pod, "Ready")["status"] == "False"  # type: ignore[index]
    assert endpoint_ips(cluster, namespace, "slow") == set()
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector",
        f"involvedObject.name={pod['metadata']['name']},type=Warning",
    )["items"]  # fmt: skip
    assert any(e["reason"] == "P99OverBound" for e in events)
    # the InferenceService says why it is not Ready, with the gate's verdict
    ready = wait_condition(
        cluster, namespace, name="slow", kind="Ready", status="False", reason="WarmupFailed",
        timeout=60,
    )  # fmt: skip
    assert f"warm-up of pod {pod['metadata']['name']} failed (P99OverBound)" in ready["message"]
    assert "exceeds the bound 0.001 ms" in ready["message"]


def test_runtime_that_never_gets_ready_fails_with_a_timeout_reason(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any
) -> None:
    """A pod its kubelet calls ready whose runtime never answers the gate. On the real node the
    kubelet itself holds a runtime that never gets ready out of ContainersReady (its readiness
    probe is the gate's first check), so the gate's own timeout guards what the kubelet cannot
    see: a pod the operator gets no answer from. A fake node's pod is exactly that: kwok calls
    its containers ready, and nothing answers at its IP (a route keeps the packets here)."""
    if (missing := podnet.available()) is not None:
        missing_component(f"the fake pods' range must stay on this machine: {missing}")
    service = mlp_service("broken", timeoutSeconds=3)
    service["spec"]["resources"]["nodeSelector"] = FAKE_NODES
    apply(cluster, namespace, service)
    pod = wait_gate(cluster, namespace, "broken", status="False")
    gate = gate_of(pod)
    assert gate is not None and gate["reason"] == "RuntimeNotReady"
    assert "3s" in gate["message"]
    ready = wait_condition(
        cluster, namespace, name="broken", kind="Ready", status="False", reason="WarmupFailed",
        timeout=60,
    )  # fmt: skip
    assert "failed (RuntimeNotReady): runtime not ready within 3s" in ready["message"]


def test_operator_restarted_mid_warm_up_finishes_the_job(
    cluster: Cluster, namespace: str, models_claim: str, start_operator: Any
) -> None:
    first = start_operator([namespace])
    # Enough requests at concurrency 1 that the attempt lasts while the operator is killed, and
    # an attempt timeout far from what they take: on the node's 300m of CPU a request took 8 ms
    # on average alone and 34 ms in one CI run (4000 requests then outlived a 60 s timeout).
    apply(
        cluster, namespace,
        mlp_service("restart", requests=2000, concurrency=1, timeoutSeconds=300),
    )  # fmt: skip

    def warming() -> dict[str, Any] | None:
        found = pods(cluster, namespace, "restart")
        gate = gate_of(found[0]) if found else None
        return found[0] if gate and gate.get("reason") == "WarmingUp" else None

    wait_for(warming, timeout=120, description="an attempt under way")
    first.kill()
    left = pods(cluster, namespace, "restart")
    assert [gate_of(pod)["reason"] for pod in left] == ["WarmingUp"], (  # type: ignore[index]
        "the attempt ended before the operator was killed: the test needs more requests"
    )
    start_operator([namespace])
    pod = wait_gate(cluster, namespace, "restart", status="True", timeout=360)
    assert gate_of(pod)["reason"] == "WarmedUp"  # type: ignore[index]
    assert len(pods(cluster, namespace, "restart")) == 1


def test_rollout_keeps_serving_on_warm_pods_until_new_ones_are_gated_in(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any
) -> None:
    service = mlp_service("roll")
    apply(cluster, namespace, service)
    old = wait_gate(cluster, namespace, "roll", status="True")
    old_ip = old["status"]["podIP"]
    wait_for(
        lambda: old_ip in endpoint_ips(cluster, namespace, "roll"),
        timeout=30,
        description="v1 serving",
    )

    service["spec"]["model"]["version"] = "2"
    apply(cluster, namespace, service)
    served_during_rollout: list[set[str]] = []

    def rolled() -> bool:
        ips = endpoint_ips(cluster, namespace, "roll")
        served_during_rollout.append(ips)
        current = pods(cluster, namespace, "roll")
        return (
            len(current) == 1
            and current[0]["metadata"]["uid"] != old["metadata"]["uid"]
            and current[0]["status"].get("podIP") in ips
        )

    wait_for(rolled, timeout=180, interval=0.1, description="v2 gated in and v1 gone")
    assert all(served_during_rollout), json.dumps([sorted(s) for s in served_during_rollout])

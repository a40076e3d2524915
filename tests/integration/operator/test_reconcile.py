"""The reconcile loop against the real control plane: create, update, drift, delete, zero
writes when converged, and a kill -9 in the middle of a reconcile."""

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    RECONCILE_AGENTS,
    AuditLog,
    OperatorProcess,
    apply,
    condition,
    get,
    gpu_service,
    pending_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

IMAGE = "kiln/runtime:dev"
LONG = 120
"""Seconds to wait for convergence: the machine's two cores are shared with other test runs."""


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


def image_of(cluster: Cluster, namespace: str, name: str) -> str | None:
    deployment = get(cluster, namespace, "deployment", name)
    return None if deployment is None else str(container(deployment)["image"])


def pods_of(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name}"
    pods: list[dict[str, Any]] = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
    return pods


def node_selector_of(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    deployment = get(cluster, namespace, "deployment", name)
    if deployment is None:
        return {}
    selector: dict[str, str] = deployment["spec"]["template"]["spec"].get("nodeSelector", {})
    return selector


def absent(cluster: Cluster, namespace: str, kind: str, name: str) -> Callable[[], bool]:
    return lambda: get(cluster, namespace, kind, name) is None


def children_exist(cluster: Cluster, namespace: str, name: str, pdb: bool) -> bool:
    kinds = ["deployment", "service"] + (["poddisruptionbudget"] if pdb else [])
    return all(get(cluster, namespace, kind, name) is not None for kind in kinds)


def test_create_builds_owned_children_and_becomes_ready(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, gpu_service("mlp", autoscaling={"minReplicas": 2, "maxReplicas": 4}))
    wait_for(
        lambda: children_exist(cluster, namespace, "mlp", pdb=True),
        timeout=LONG,
        description="Deployment, Service and PDB",
    )
    isvc = get(cluster, namespace, "inferenceservice", "mlp")
    assert isvc is not None
    deployment = get(cluster, namespace, "deployment", "mlp")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2
    for kind in ("deployment", "service", "poddisruptionbudget"):
        child = get(cluster, namespace, kind, "mlp")
        assert child is not None
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["uid"] == isvc["metadata"]["uid"]

    ready = wait_condition(cluster, namespace, name="mlp", kind="Ready", status="True")
    assert ready["reason"] == "Available"
    status = get(cluster, namespace, "inferenceservice", "mlp")
    assert status is not None
    assert status["status"]["readyReplicas"] == 2
    assert status["status"]["url"] == f"http://mlp.{namespace}.svc:8000"
    assert status["status"]["observedGeneration"] == status["metadata"]["generation"]
    printed = cluster.kubectl("get", "kis", "-n", namespace).stdout
    assert "mlp" in printed and "True" in printed
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector", "involvedObject.name=mlp,reason=Ready"
    )
    assert events["items"], "a Ready event on the transition"


def test_update_rolls_out_and_is_not_ready_while_the_rollout_is_stuck(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    original = gpu_service("mlp")
    apply(cluster, namespace, original)
    wait_condition(cluster, namespace, name="mlp", kind="Ready", status="True")

    # a GPU product no node has: the new pod stays Pending, the rollout cannot finish
    resources = {"gpuCount": 1, "gpuProduct": "NVIDIA-H100-NOWHERE"}
    apply(cluster, namespace, gpu_service("mlp", resources=resources))
    wait_for(
        lambda: (
            node_selector_of(cluster, namespace, "mlp").get("nvidia.com/gpu.product")
            == "NVIDIA-H100-NOWHERE"
        ),
        timeout=LONG,
        description="the new template in the Deployment",
    )
    ready = wait_condition(
        cluster,
        namespace,
        name="mlp",
        kind="Ready",
        status="False",
        reason="RolloutStalled",
        timeout=LONG,
    )
    assert ready["observedGeneration"] == 2
    # it says why, and who keeps serving (not "old pods are terminating": they wait)
    assert "the rollout is stalled: pod mlp-" in ready["message"]
    assert "cannot be scheduled: 0/" in ready["message"]
    assert ready["message"].endswith("; 1 pods of the previous spec keep serving")
    progressing = condition(get(cluster, namespace, "inferenceservice", "mlp"), "Progressing")
    assert progressing is not None and progressing["status"] == "True"
    # maxUnavailable 0: the old pod keeps serving while the new one cannot start
    deployment = get(cluster, namespace, "deployment", "mlp")
    assert deployment is not None
    assert deployment["status"].get("availableReplicas") == 1

    apply(cluster, namespace, original)
    ready = wait_condition(
        cluster, namespace, name="mlp", kind="Ready", status="True", timeout=LONG
    )
    assert ready["observedGeneration"] == 3


def test_converged_objects_cause_zero_writes_across_resyncs_and_restarts(
    cluster: Cluster, namespace: str, start_operator: Any, audit: AuditLog
) -> None:
    first = start_operator([namespace], resync_seconds=2)
    for index in range(3):
        apply(cluster, namespace, pending_service(f"svc-{index}", autoscaling={"minReplicas": 2}))
    for index in range(3):
        wait_condition(
            cluster, namespace, name=f"svc-{index}", kind="SpecValid", status="True", timeout=LONG
        )
    # the Deployments' own status settles (their controller reports on the pods) ...
    audit.wait_quiet(namespace, 3, timeout=LONG, agents=RECONCILE_AGENTS)
    # ... then nothing changes any more, and resyncs must not write
    mark = audit.mark()
    resyncs_before = _resyncs(first)
    # two more resyncs of every object (interval 2 s)
    wait_for(lambda: _resyncs(first) >= resyncs_before + 6, timeout=30, description="six resyncs")
    assert audit.operator_writes(mark, namespace, RECONCILE_AGENTS) == []

    first.stop()
    mark = audit.mark()
    second = start_operator([namespace], resync_seconds=2)
    wait_for(lambda: _resyncs(second) >= 3, timeout=LONG, description="resume and a resync of each")
    assert audit.operator_writes(mark, namespace, RECONCILE_AGENTS) == []


def _resyncs(process: OperatorProcess) -> int:
    return process.output().count(" resynced ")


def test_drift_on_children_is_reverted_and_replicas_are_the_autoscalers_alone(
    cluster: Cluster, namespace: str, operator: OperatorProcess, audit: AuditLog
) -> None:
    interval = 5  # the shortest evaluation interval the API allows
    autoscaling = {"maxReplicas": 2, "evaluationIntervalSeconds": interval}
    apply(cluster, namespace, gpu_service("mlp", autoscaling=autoscaling))
    wait_for(
        lambda: children_exist(cluster, namespace, "mlp", pdb=False),
        timeout=LONG,
        description="children",
    )
    children_at = time.monotonic()
    cluster.kubectl("set", "image", "deployment/mlp", "runtime=evil:latest", "-n", namespace)
    wait_for(
        lambda: image_of(cluster, namespace, "mlp") == IMAGE,
        timeout=30,
        description="the image edit reverted",
    )

    cluster.kubectl("delete", "service", "mlp", "-n", namespace)
    wait_for(
        lambda: get(cluster, namespace, "service", "mlp") is not None,
        timeout=30,
        description="the deleted Service recreated",
    )

    # The autoscaler names a change made outside it only against a count it saw at an earlier
    # pass (kept in its memory): let it pass over the Deployment a few times first. Without
    # this the hand scale could come before its first pass (it failed so once in CI).
    time.sleep(max(0.0, 3 * interval - (time.monotonic() - children_at)))
    mark = audit.mark()
    cluster.kubectl("scale", "deployment/mlp", "--replicas=3", "-n", namespace)
    # Scaled by hand past maxReplicas: the autoscaler takes 3 as the current count and brings it
    # back to maxReplicas at once, saying so (docs/autoscaling.md, "Who writes replicas"). It is
    # blind here (no Prometheus), so a count within the bounds would stay: it never scales down
    # without metrics. More than one replica: a PDB appears.
    scaled_down = wait_for(
        lambda: cluster.get_json(
            "events", "-n", namespace, "--field-selector",
            "involvedObject.name=mlp,reason=ScaledDown",
        )["items"],
        timeout=30, description="the autoscaler's correction",
    )  # fmt: skip
    message = scaled_down[0]["message"]
    assert message.startswith("3 -> 2 (MaxReplicas): "), message
    assert "the Deployment's replicas were set to 3 outside the autoscaler" in message, message
    wait_for(
        lambda: get(cluster, namespace, "poddisruptionbudget", "mlp") is not None,
        timeout=30,
        description="a PDB for more than one replica",
    )
    deployment = get(cluster, namespace, "deployment", "mlp")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2
    # The reconcile loop wrote no replicas: the autoscaler's scale subresource did.
    reconcile_writes = audit.operator_writes(mark, namespace, RECONCILE_AGENTS)
    assert not any(
        w.startswith(("update deployments", "patch deployments")) for w in reconcile_writes
    ), reconcile_writes


def test_deleting_the_service_removes_its_children_through_the_garbage_collector(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, gpu_service("mlp", autoscaling={"minReplicas": 2}))
    wait_for(
        lambda: children_exist(cluster, namespace, "mlp", pdb=True),
        timeout=LONG,
        description="children",
    )
    cluster.kubectl("delete", "inferenceservice", "mlp", "-n", namespace)
    for kind in ("deployment", "service", "poddisruptionbudget"):
        wait_for(
            absent(cluster, namespace, kind, "mlp"),
            timeout=LONG,
            description=f"{kind} garbage-collected",
        )
    wait_for(lambda: not pods_of(cluster, namespace, "mlp"), timeout=LONG, description="pods gone")


def test_killed_mid_reconcile_and_restarted_converges_without_duplicates(
    cluster: Cluster, namespace: str, start_operator: Any, audit: AuditLog
) -> None:
    count = 20
    manifests = [pending_service(f"svc-{i}", autoscaling={"minReplicas": 2}) for i in range(count)]
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests)
    )
    mark = audit.mark()
    first = start_operator([namespace])
    wait_for(
        lambda: len(audit.operator_writes(mark, namespace)) >= 3,
        timeout=LONG,
        interval=0.05,
        description="the first writes",
    )
    first.kill()
    second = start_operator([namespace])
    for i in range(count):
        wait_condition(
            cluster, namespace, name=f"svc-{i}", kind="SpecValid", status="True", timeout=LONG
        )
    deployments = cluster.get_json("deployments", "-n", namespace)["items"]
    assert sorted(d["metadata"]["name"] for d in deployments) == sorted(
        f"svc-{i}" for i in range(count)
    )
    services = cluster.get_json("services", "-n", namespace)["items"]
    assert len(services) == count
    for deployment in deployments:
        assert len(deployment["metadata"]["ownerReferences"]) == 1
    replica_sets = cluster.get_json("replicasets", "-n", namespace)["items"]
    assert len(replica_sets) == count, "one ReplicaSet each: no spurious rollout"
    assert second.process.poll() is None

"""The local control plane behaves like a real cluster in every way Kiln relies on.

Each test exercises a component that a mock would fake: the scheduler's GPU accounting, the
controller manager's Deployment and garbage-collector controllers, the kubelet's readiness gates
(played by kwok), RBAC with real service-account tokens, and PodSecurity admission.
"""

import base64
import json
from typing import Any

import pytest
import yaml

from kiln_localcluster.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TAINT_KEY
from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
GATE = "kiln.test/warmed-up"


def gpu_pod_spec(gpus: int, **extra: Any) -> dict[str, Any]:
    return {
        "tolerations": [GPU_TOLERATION],
        # kwok's fake GPU nodes (the real node would try to pull the image)
        "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", "type": "kwok"},
        "containers": [
            {
                "name": "main",
                "image": "example.invalid/model:1",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }
        ],
        **extra,
    }


def apply(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
    return items


def set_gate(cluster: Cluster, namespace: str, pod: str, status: str) -> None:
    """Set the gate condition as a controller would: a strategic-merge patch of pods/status,
    which merges conditions by type, so the kubelet's (kwok's) conditions stay."""
    patch = {"status": {"conditions": [{"type": GATE, "status": status}]}}
    cluster.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=strategic",
        "-p", json.dumps(patch),
    )  # fmt: skip


def condition(pod: dict[str, Any], kind: str) -> str | None:
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return str(c["status"])
    return None


def test_gpu_deployment_runs_on_fake_gpu_nodes(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "gpu"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "gpu"}},
                "template": {"metadata": {"labels": {"app": "gpu"}}, "spec": gpu_pod_spec(2)},
            },
        },
    )

    def running() -> list[dict[str, Any]] | None:
        found = pods(cluster, namespace, "app=gpu")
        ok = [p for p in found if p["status"].get("phase") == "Running"]
        return ok if len(ok) == 2 else None

    for pod in wait_for(running, timeout=60, description="2 running GPU pods"):
        node = cluster.get_json("node", pod["spec"]["nodeName"])
        assert int(node["status"]["allocatable"][GPU_RESOURCE]) >= 2
        assert node["metadata"]["labels"][GPU_PRODUCT_LABEL] == "NVIDIA-A100-SXM4-80GB"
        assert pod["status"]["podIP"]


def test_pod_wanting_more_gpus_than_any_node_stays_pending(
    cluster: Cluster, namespace: str
) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "too-big"},
            "spec": gpu_pod_spec(9),
        },
    )

    def failed_scheduling() -> dict[str, Any] | None:
        events = cluster.get_json(
            "events", "-n", namespace, "--field-selector", "involvedObject.name=too-big"
        )["items"]
        return next((e for e in events if e["reason"] == "FailedScheduling"), None)

    event = wait_for(failed_scheduling, timeout=60, description="a FailedScheduling event")
    assert "nvidia.com/gpu" in event["message"]
    pod = cluster.get_json("pod", "too-big", "-n", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def test_readiness_gate_holds_pod_unready_until_its_condition_is_true(
    cluster: Cluster, namespace: str
) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gated"},
            "spec": gpu_pod_spec(1, readinessGates=[{"conditionType": GATE}]),
        },
    )
    wait_for(
        lambda: (
            cluster.get_json("pod", "gated", "-n", namespace)["status"].get("phase") == "Running"
        ),
        timeout=60,
        description="the gated pod running",
    )
    pod = cluster.get_json("pod", "gated", "-n", namespace)
    assert condition(pod, "ContainersReady") == "True"
    assert condition(pod, "Ready") == "False"

    set_gate(cluster, namespace, "gated", "True")
    ready = wait_for(
        lambda: (
            (p := cluster.get_json("pod", "gated", "-n", namespace))
            and condition(p, "Ready") == "True"
            and p
        ),
        timeout=30,
        description="the gated pod Ready after its gate turned True",
    )
    assert condition(ready, "ContainersReady") == "True"
    assert condition(ready, GATE) == "True"

    set_gate(cluster, namespace, "gated", "False")
    wait_for(
        lambda: condition(cluster.get_json("pod", "gated", "-n", namespace), "Ready") == "False",
        timeout=30,
        description="the pod unready again after its gate turned False",
    )


def test_deleting_an_owner_deletes_its_dependents(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "owner"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "owner"}},
                "template": {"metadata": {"labels": {"app": "owner"}}, "spec": gpu_pod_spec(1)},
            },
        },
    )
    wait_for(lambda: pods(cluster, namespace, "app=owner"), timeout=60, description="a pod")
    owner = cluster.get_json("deployment", "owner", "-n", namespace)
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "dependent",
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
        },
    )
    cluster.kubectl("delete", "deployment", "owner", "-n", namespace, "--wait=false")

    def all_gone() -> bool:
        left = cluster.get_json("replicasets,pods,configmaps", "-n", namespace)["items"]
        return not [o for o in left if o["metadata"]["name"] != "kube-root-ca.crt"]

    wait_for(all_gone, timeout=60, description="ReplicaSet, pods and ConfigMap collected")


def test_service_account_without_rights_is_forbidden(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = cluster.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    ca = base64.b64decode(
        yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"][
            "certificate-authority-data"
        ]
    )
    ca_file = cluster.kubeconfig.parent / f"ca-{namespace}.crt"
    ca_file.write_bytes(ca)
    try:
        result = cluster.kubectl(
            "--kubeconfig=/dev/null",
            f"--server={cluster.server}",
            f"--certificate-authority={ca_file}",
            f"--token={token}",
            "get",
            "pods",
            "-n",
            namespace,
            check=False,
        )
        whoami = cluster.kubectl(
            "--kubeconfig=/dev/null",
            f"--server={cluster.server}",
            f"--certificate-authority={ca_file}",
            f"--token={token}",
            "auth",
            "whoami",
            "-o",
            "json",
            check=False,
        )
    finally:
        ca_file.unlink()
    assert result.returncode != 0
    assert "Forbidden" in result.stderr
    assert f"system:serviceaccount:{namespace}:nobody" in result.stderr
    # The token itself authenticated: the refusal came from RBAC, not from authentication.
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"].endswith(":nobody")


def test_restricted_namespace_rejects_a_privileged_pod(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    result = cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        check=False,
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "privileged"},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.invalid/x:1",
                            "securityContext": {"privileged": True},
                        }
                    ]
                },
            }
        ),
    )
    assert result.returncode != 0
    assert "violates PodSecurity" in result.stderr
    assert "privileged" in result.stderr

"""spec.pod and spec.route against the real API server, scheduler and Gateway API CRDs.

Each pod field reaches the pods the Deployment controller makes; the real scheduler honours the
node affinity and the topology spread over kwok nodes this test creates (so no other test's pods
share them), and preempts a lower-priority service's pod for a higher-priority one; a changed
pod field rolls the pods. The image pull secret is verified as far as this cluster can: it is in
every pod's spec, admitted by the API server; kwok's nodes pull nothing and no registry is
reachable here, so no kubelet uses it.
The routes are created by the operator, accepted by the pinned Gateway API CRDs (their schema
and CEL rules), read back with the CRDs' defaults, and a route status written as a Gateway
controller would is accepted and left alone by Kiln. No Gateway implementation runs here.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster.nodes import build_gpu_node
from kiln_localcluster.waiting import wait_for
from tests.gotools import gateway_api_crds
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    OperatorProcess,
    apply,
    get,
    gpu_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

GATEWAY_CRDS = ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants")
TEST_LABEL = "kiln.test/pod-shape"


def kubectl_apply(cluster: Cluster, *manifests: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))


def pods_of(cluster: Cluster, namespace: str, service: str) -> list[dict[str, Any]]:
    listed = cluster.get_json(
        "pods", "-n", namespace, "-l", f"serving.kiln.dev/inferenceservice={service}"
    )
    return [pod for pod in listed["items"] if not pod["metadata"].get("deletionTimestamp")]


NODE_GPUS = (4, 1, 4)
"""GPUs of this test's three nodes: the first two are the ones the affinity allows."""


@pytest.fixture
def shape_nodes(cluster: Cluster, namespace: str) -> Iterator[list[str]]:
    """Three kwok GPU nodes of this test alone (NODE_GPUS), labelled with its namespace."""
    nodes = []
    for index, gpus in enumerate(NODE_GPUS):
        # kwok gives pods addresses from the node's range, inside the cluster's pod range
        cidr = f"10.244.{200 + index}.0/24"
        node = build_gpu_node(200 + index, gpus=gpus, product="NVIDIA-TEST", pod_cidr=cidr)
        name = f"shape-{namespace[-6:]}-{index}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["labels"][TEST_LABEL] = namespace
        del node["metadata"]["labels"]["type"]  # not one of the session's fake nodes (FAKE_NODES)
        nodes.append(node)
    kubectl_apply(cluster, *nodes)
    names = [node["metadata"]["name"] for node in nodes]
    cluster.kubectl("wait", "--for=condition=Ready", "--timeout=60s", *(f"node/{n}" for n in names))
    yield names
    cluster.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def classes(cluster: Cluster, namespace: str) -> Iterator[dict[str, str]]:
    """A high and a low PriorityClass and a RuntimeClass, named after the test's namespace."""
    names = {
        "high": f"{namespace}-high",
        "low": f"{namespace}-low",
        "runtime": f"{namespace}-runc",
    }
    kubectl_apply(
        cluster,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": names["high"]},
            "value": 100000,
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": names["low"]},
            "value": 10,
        },
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": names["runtime"]},
            "handler": "runc",
        },
    )
    yield names
    cluster.kubectl(
        "delete",
        f"priorityclass/{names['high']}",
        f"priorityclass/{names['low']}",
        f"runtimeclass/{names['runtime']}",
        "--ignore-not-found",
        "--wait=false",
        check=False,
    )


def on_shape_nodes(manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The service's pods on this test's nodes only (gpu_service put them on FAKE_NODES)."""
    manifest["spec"]["resources"]["nodeSelector"] = {TEST_LABEL: namespace}
    return manifest


def test_every_pod_field_reaches_the_pods_and_the_scheduler_honours_placement(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    shape_nodes: list[str],
    classes: dict[str, str],
) -> None:
    cluster.kubectl("create", "serviceaccount", "model-reader", "-n", namespace)
    cluster.kubectl(
        "create", "secret", "docker-registry", "registry-creds", "-n", namespace,
        "--docker-server=registry.example.com", "--docker-username=u", "--docker-password=p",
    )  # fmt: skip
    allowed = shape_nodes[:2]  # the third node is excluded by the affinity
    pod = {
        "labels": {"cost-center": "ml-42"},
        "annotations": {"example.com/log-route": "inference"},
        "env": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": allowed,
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
            }
        ],
        "priorityClassName": classes["high"],
        "runtimeClassName": classes["runtime"],
        "imagePullSecrets": [{"name": "registry-creds"}],
        "serviceAccountName": "model-reader",
    }
    manifest = gpu_service("shaped", pod=pod, autoscaling={"minReplicas": 4, "maxReplicas": 4})
    apply(cluster, namespace, on_shape_nodes(manifest, namespace))

    # 4 replicas, 1 GPU each, on nodes of 4 and 1 GPUs: GPUs alone would allow 3 + 1; the
    # spread (maxSkew 1) allows 2 + 1, and the fourth pod waits for a place that keeps it
    def placed() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        found = pods_of(cluster, namespace, "shaped")
        bound = [p for p in found if p["spec"].get("nodeName")]
        waiting = [
            p
            for p in found
            if any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]
        return (bound, waiting) if len(bound) == 3 and len(waiting) == 1 else None

    bound, waiting = wait_for(placed, timeout=90, description="3 replicas placed, 1 waiting")
    nodes = sorted(p["spec"]["nodeName"] for p in bound)
    assert nodes == sorted([allowed[0], allowed[0], allowed[1]])  # never the third node
    (unplaced,) = waiting
    reason = next(
        c["message"] for c in unplaced["status"]["conditions"] if c["type"] == "PodScheduled"
    )
    assert "topology spread constraints" in reason, reason
    for runtime_pod in bound + waiting:
        spec = runtime_pod["spec"]
        assert spec["priorityClassName"] == classes["high"]
        assert spec["priority"] == 100000  # resolved by the Priority admission plugin
        assert spec["runtimeClassName"] == classes["runtime"]
        assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
        assert spec["serviceAccountName"] == "model-reader"
        assert runtime_pod["metadata"]["labels"]["cost-center"] == "ml-42"
        assert runtime_pod["metadata"]["annotations"]["example.com/log-route"] == "inference"
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["HTTPS_PROXY"] == "http://proxy.example.com:3128"
        assert "KILN_RUNTIME_CONFIG" in env
        (spread,) = spec["topologySpreadConstraints"]
        assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "shaped"


def test_a_changed_pod_field_rolls_the_pods(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    manifest = gpu_service("relabel", pod={"labels": {"cost-center": "ml-42"}})
    apply(cluster, namespace, manifest)
    first = wait_for(
        lambda: next(iter(pods_of(cluster, namespace, "relabel")), None),
        timeout=60,
        description="the first pod",
    )
    manifest["spec"]["pod"] = {"labels": {"cost-center": "ml-43"}}
    apply(cluster, namespace, manifest)

    def rolled() -> list[dict[str, Any]] | None:
        found = pods_of(cluster, namespace, "relabel")
        names = {p["metadata"]["name"] for p in found}
        if first["metadata"]["name"] in names or not found:
            return None
        return found

    # a new ReplicaSet's pod replaced the old one, as for any change of the spec
    (second,) = wait_for(rolled, timeout=120, description="the pod replaced")
    assert second["metadata"]["labels"]["cost-center"] == "ml-43"
    hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in (first, second)}
    assert len(hashes) == 2


def test_a_higher_priority_service_preempts_a_lower_one(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    shape_nodes: list[str],
    classes: dict[str, str],
) -> None:
    target = shape_nodes[1]  # one GPU
    only_there = {"nodeSelector": {TEST_LABEL: namespace, "kubernetes.io/hostname": target}}
    low = gpu_service("batch", pod={"priorityClassName": classes["low"]})
    low["spec"]["resources"].update(only_there)  # replaces gpu_service's FAKE_NODES
    apply(cluster, namespace, low)
    victim = wait_for(
        lambda: next(
            (p for p in pods_of(cluster, namespace, "batch") if p["spec"].get("nodeName")), None
        ),
        timeout=60,
        description="the low-priority pod holds the node's one GPU",
    )
    high = gpu_service("urgent", pod={"priorityClassName": classes["high"]})
    high["spec"]["resources"].update(only_there)
    apply(cluster, namespace, high)
    winner = wait_for(
        lambda: next(
            (p for p in pods_of(cluster, namespace, "urgent") if p["spec"].get("nodeName")), None
        ),
        timeout=90,
        description="the high-priority pod scheduled in the victim's place",
    )
    assert winner["spec"]["nodeName"] == target
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector",
        f"reason=Preempted,involvedObject.name={victim['metadata']['name']}",
    )  # fmt: skip
    assert events["items"], "the scheduler recorded no preemption of the low-priority pod"
    assert all(not p["spec"].get("nodeName") for p in pods_of(cluster, namespace, "batch"))


@pytest.fixture(scope="session")
def gateway_api(kiln_crds: Cluster) -> Cluster:
    """The pinned Gateway API's CRDs installed (kept for the session, as Kiln's own are)."""
    directory = Path(gateway_api_crds())
    for kind in GATEWAY_CRDS:
        kiln_crds.kubectl("apply", "-f", str(directory / f"gateway.networking.k8s.io_{kind}.yaml"))
    crds = [f"crd/{kind}.gateway.networking.k8s.io" for kind in GATEWAY_CRDS]
    kiln_crds.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
    return kiln_crds


ROUTE = {
    "enabled": True,
    "hostnameTemplate": "{name}.{namespace}.models.example.com",
    "grpcHostnameTemplate": "{name}-grpc.{namespace}.models.example.com",
}


def test_routes_are_accepted_by_the_gateway_api_crds_and_their_status_read_back(
    gateway_api: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster = gateway_api
    kubectl_apply(
        cluster,
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "models", "namespace": namespace},
            "spec": {
                "gatewayClassName": "none",
                "listeners": [
                    {
                        "name": "http",
                        "protocol": "HTTP",
                        "port": 80,
                        "allowedRoutes": {"namespaces": {"from": "Same"}},
                    }
                ],
            },
        },
    )
    route = {**ROUTE, "gateway": {"name": "models", "sectionName": "http"}}
    apply(cluster, namespace, gpu_service("exposed", route=route))
    http = wait_for(
        lambda: get(cluster, namespace, "httproute", "exposed"),
        timeout=60,
        description="the HTTPRoute",
    )
    grpc = wait_for(
        lambda: get(cluster, namespace, "grpcroute", "exposed"),
        timeout=60,
        description="the GRPCRoute",
    )
    assert http["spec"]["hostnames"] == [f"exposed.{namespace}.models.example.com"]
    assert http["spec"]["parentRefs"][0]["name"] == "models"
    backend = http["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["name"], backend["port"]) == ("exposed", 8000)
    assert grpc["spec"]["hostnames"] == [f"exposed-grpc.{namespace}.models.example.com"]
    assert grpc["spec"]["rules"][0]["backendRefs"][0]["port"] == 8001
    assert http["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"

    # what a Gateway controller would report; the CRD's status schema takes it, Kiln keeps it
    parent = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "models"}
    status = {
        "parents": [
            {
                "parentRef": {**parent, "sectionName": "http"},
                "controllerName": "example.com/gateway-controller",
                "conditions": [
                    {
                        "type": "Accepted",
                        "status": "True",
                        "reason": "Accepted",
                        "message": "accepted by the test as a controller would",
                        "observedGeneration": http["metadata"]["generation"],
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            }
        ]
    }
    cluster.kubectl(
        "patch", "httproute", "exposed", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip
    version = get(cluster, namespace, "httproute", "exposed")["metadata"]["resourceVersion"]  # type: ignore[index]
    # a spec change of the service reconciles; the route's status and object stay as they are
    apply(cluster, namespace, gpu_service("exposed", route=route, drain={"maxRequestSeconds": 31}))
    wait_for(
        lambda: (
            (deployment := get(cluster, namespace, "deployment", "exposed"))
            and deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 41
        ),
        timeout=60,
        description="the spec change reconciled",
    )
    read_back = get(cluster, namespace, "httproute", "exposed")
    assert read_back is not None
    assert read_back["metadata"]["resourceVersion"] == version
    (accepted,) = read_back["status"]["parents"][0]["conditions"]
    assert (accepted["type"], accepted["status"]) == ("Accepted", "True")

    # opting out deletes the routes Kiln created
    apply(cluster, namespace, gpu_service("exposed", route={**route, "enabled": False}))
    wait_for(
        lambda: (
            get(cluster, namespace, "httproute", "exposed") is None
            and get(cluster, namespace, "grpcroute", "exposed") is None
        ),
        timeout=60,
        description="the routes deleted",
    )


def test_an_ingress_is_the_route_where_asked_for(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    route = {**ROUTE, "api": "Ingress", "ingressClassName": "nginx"}
    apply(cluster, namespace, gpu_service("plain", route=route))
    ingress = wait_for(
        lambda: get(cluster, namespace, "ingress", "plain"), timeout=60, description="Ingress"
    )
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == f"plain.{namespace}.models.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {
        "name": "plain",
        "port": {"number": 8000},
    }


def test_what_only_the_api_server_checks_of_a_kubernetes_type_reaches_ready(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """A weight outside 1-100 fits the schema (Kubernetes' own has no range); the API server
    refuses the Deployment, and Ready says so with its message naming the field."""
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}
    anti = {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "podAffinityTerm": term}]
    }
    apply(cluster, namespace, gpu_service("weighed", pod={"affinity": {"podAntiAffinity": anti}}))
    ready = wait_condition(
        cluster, namespace, name="weighed", kind="Ready", status="False", reason="ChildRejected"
    )
    assert "weight" in ready["message"], ready["message"]

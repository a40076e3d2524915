"""Profiles and policies against the real API server and operator: a model owner's five-line
InferenceService inherits the rest; a changed platform default rolls the services that use it
and they stay served (the warm-up gate holds new pods); each guardrail is reported by name; a
tightened policy freezes a live service without deleting anything.

Cluster-scoped objects are seen by every test's operator, so each is named after the test's
namespace and no ClusterInferenceProfile here is marked default; the guardrail tests use
InferencePolicies (namespaced), whose narrowing of a ClusterInferencePolicy the unit tests show.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    OperatorProcess,
    apply,
    get,
    mlp_service,
    wait_condition,
)
from tests.integration.operator.test_warmup_gate import endpoint_ips, pods, wait_gate
from tests.sessioncluster import FAKE_NODES

pytestmark = pytest.mark.integration

MODEL = {
    "uri": "/opt/models/mlp.pt",
    "format": "torchscript",
    "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
    "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
}
GROUP = "serving.kiln.dev/v1alpha1"


def kubectl_apply(cluster: Cluster, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


@pytest.fixture
def cluster_profile(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A ClusterInferenceProfile named after the test's namespace, deleted after the test."""
    name = f"platform-{namespace}"
    kubectl_apply(
        cluster,
        {
            "apiVersion": GROUP,
            "kind": "ClusterInferenceProfile",
            "metadata": {"name": name},
            "spec": {
                "description": "CPU serving for tests",
                "defaults": {
                    "runtime": {
                        "image": "kiln/runtime:dev",
                        "batching": {"maxBatchSize": 16, "maxQueueSize": 128},
                    },
                    # on kwok's fake GPU nodes: these services' pods run no container
                    "resources": {
                        "gpuCount": 1,
                        "cpu": "1",
                        "memory": "2Gi",
                        "nodeSelector": FAKE_NODES,
                    },
                    "slo": {"p99LatencyMilliseconds": 100},
                    "warmup": {"requests": 0},
                    "autoscaling": {"maxReplicas": 4},
                },
            },
        },
    )
    yield name
    cluster.kubectl("delete", "clusterinferenceprofile", name, "--ignore-not-found", "--wait=false")


def profile_generation(cluster: Cluster, namespace: str, service: str) -> int:
    body = get(cluster, namespace, "inferenceservice", service)
    assert body is not None
    return int(body["status"]["profiles"][0]["generation"])


def runtime_config(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container.get("env") or []}
    config: dict[str, Any] = json.loads(env["KILN_RUNTIME_CONFIG"])
    return config


def test_a_five_line_service_inherits_the_platform_and_team_defaults(
    cluster: Cluster, namespace: str, operator: OperatorProcess, cluster_profile: str
) -> None:
    kubectl_apply(
        cluster,
        {
            "apiVersion": GROUP,
            "kind": "InferenceProfile",
            "metadata": {"name": cluster_profile, "namespace": namespace},
            "spec": {"defaults": {"runtime": {"batching": {"maxBatchSize": 8}}}},
        },
    )
    service = {"metadata": {"name": "owner"}, "spec": {"profile": cluster_profile, "model": MODEL}}
    apply(cluster, namespace, {"apiVersion": GROUP, "kind": "InferenceService", **service})
    deployment = wait_for(
        lambda: get(cluster, namespace, "deployment", "owner"),
        timeout=60,
        description="the Deployment of a service that names only its model",
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "kiln/runtime:dev"  # the platform's
    assert container["resources"]["limits"]["memory"] == "2Gi"
    config = runtime_config(deployment)
    assert config["batching"]["maxBatchSize"] == 8  # the team's
    assert config["batching"]["maxQueueSize"] == 128  # the platform's
    body = wait_for(
        lambda: (
            (found := get(cluster, namespace, "inferenceservice", "owner"))
            and (found.get("status") or {}).get("profiles")
            and found
        ),
        timeout=60,
        description="status.profiles",
    )
    assert [(p["kind"], p["name"]) for p in body["status"]["profiles"]] == [
        ("InferenceProfile", cluster_profile),
        ("ClusterInferenceProfile", cluster_profile),
    ]
    printed = cluster.kubectl("get", "clusterinferenceprofile", cluster_profile).stdout
    header, row = printed.splitlines()
    assert header.split() == ["NAME", "IMAGE", "GPUS", "P99", "MAX-REPLICAS", "DESCRIPTION", "AGE"]
    assert row.split()[:5] == [cluster_profile, "kiln/runtime:dev", "1", "100", "4"]


def test_a_missing_profile_is_a_condition_and_creates_nothing(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    manifest = {"apiVersion": GROUP, "kind": "InferenceService", "metadata": {"name": "lost"}}
    apply(cluster, namespace, {**manifest, "spec": {"profile": "no-such-profile", "model": MODEL}})
    ready = wait_condition(
        cluster, namespace, name="lost", kind="Ready", status="False", reason="ProfileNotFound"
    )
    assert "'no-such-profile'" in ready["message"]
    assert get(cluster, namespace, "deployment", "lost") is None


def test_each_guardrail_is_reported_by_name_and_limit(
    cluster: Cluster, namespace: str, operator: OperatorProcess, cluster_profile: str
) -> None:
    kubectl_apply(
        cluster,
        {
            "apiVersion": GROUP,
            "kind": "InferencePolicy",
            "metadata": {"name": "team-limits", "namespace": namespace},
            "spec": {
                "maxGpusPerPod": 2,
                "maxGpusPerService": 8,
                "maxReplicas": 6,
                "allowedImages": ["kiln/"],
                "allowedModelUriSchemes": ["file", "pvc"],
                "allowedModelClaims": ["models"],
            },
        },
    )
    header, row = cluster.kubectl("get", "inferencepolicy", "-n", namespace).stdout.splitlines()
    assert header.split() == [
        "NAME", "GPUS/POD", "GPUS/SERVICE", "MAX-REPLICAS", "IMAGES", "SOURCES", "AGE",
    ]  # fmt: skip
    assert row.split()[:5] == ["team-limits", "2", "8", "6", '["kiln/"]']
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "gpus-per-pod": ({"resources": {"gpuCount": 4}}, "gpuCount 4 exceeds maxGpusPerPod 2"),
        "gpus-per-service": (
            {"resources": {"gpuCount": 2}, "autoscaling": {"maxReplicas": 5}},
            "= 10 GPUs exceeds maxGpusPerService 8",
        ),
        "replicas": ({"autoscaling": {"maxReplicas": 7}}, "maxReplicas 7 exceeds maxReplicas 6"),
        "image": ({"runtime": {"image": "evil.example/miner:1"}}, "matches none of allowedImages"),
        "source": (
            {"model": {**MODEL, "uri": "https://models.example/mlp.pt"}},
            "is a https source, not one of allowedModelUriSchemes",
        ),
        "claim": (
            {"model": {**MODEL, "uri": "pvc://team-b/mlp.pt"}},
            "reads claim 'team-b', not one of allowedModelClaims",
        ),
        "prometheus": (
            {"autoscaling": {"prometheusUrl": "http://169.254.169.254/latest"}},
            "is not an endpoint the platform allows",
        ),
    }
    for name, (spec, _) in cases.items():
        body = {"profile": cluster_profile, "model": MODEL, **spec}
        apply(cluster, namespace, {"apiVersion": GROUP, "kind": "InferenceService",
                                   "metadata": {"name": name}, "spec": body})  # fmt: skip
    for name, (_, expected) in cases.items():
        ready = wait_condition(
            cluster, namespace, name=name, kind="Ready", status="False", reason="PolicyViolation"
        )
        assert "InferencePolicy team-limits" in ready["message"] or name == "prometheus"
        assert expected in ready["message"], f"{name}: {ready['message']}"
        assert get(cluster, namespace, "deployment", name) is None
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector", "type=Warning,reason=PolicyViolation"
    )["items"]
    assert {event["involvedObject"]["name"] for event in events} == set(cases)


def test_a_tightened_policy_freezes_a_live_service_and_deletes_nothing(
    cluster: Cluster, namespace: str, operator: OperatorProcess, cluster_profile: str
) -> None:
    manifest = {"apiVersion": GROUP, "kind": "InferenceService", "metadata": {"name": "live"}}
    apply(cluster, namespace, {**manifest, "spec": {"profile": cluster_profile, "model": MODEL}})
    wait_condition(cluster, namespace, name="live", kind="SpecValid", status="True")
    before = wait_for(
        lambda: get(cluster, namespace, "deployment", "live"), timeout=60, description="Deployment"
    )
    kubectl_apply(
        cluster,
        {
            "apiVersion": GROUP,
            "kind": "InferencePolicy",
            "metadata": {"name": "tight", "namespace": namespace},
            "spec": {"maxReplicas": 2},
        },
    )
    ready = wait_condition(
        cluster, namespace, name="live", kind="Ready", status="False", reason="PolicyViolation"
    )
    assert (
        "InferencePolicy tight: spec.autoscaling.maxReplicas 4 exceeds maxReplicas 2"
        in (ready["message"])
    )
    stalled = wait_condition(cluster, namespace, name="live", kind="Stalled", status="True")
    assert stalled["reason"] == "PolicyViolation"
    # the platform's default changes meanwhile: a frozen service does not follow it
    cluster.kubectl(
        "patch", "clusterinferenceprofile", cluster_profile, "--type=merge",
        "-p", '{"spec":{"defaults":{"runtime":{"batching":{"maxQueueSize":64}}}}}',
    )  # fmt: skip
    wait_for(
        lambda: "resolved with ClusterInferenceProfile"
        in ((wait_condition(cluster, namespace, name="live", kind="Ready", status="False"))
            ["message"]),
        timeout=30,
        description="the condition re-judged",
    )  # fmt: skip
    after = get(cluster, namespace, "deployment", "live")
    assert after is not None, "the Deployment was deleted"
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["template"] == before["spec"]["template"]
    assert get(cluster, namespace, "service", "live") is not None
    # loosened again, the service follows the platform's current defaults
    cluster.kubectl("delete", "inferencepolicy", "tight", "-n", namespace)
    wait_condition(cluster, namespace, name="live", kind="SpecValid", status="True")
    rolled = wait_for(
        lambda: (
            (found := get(cluster, namespace, "deployment", "live"))
            and runtime_config(found)["batching"]["maxQueueSize"] == 64
            and found
        ),
        timeout=60,
        description="the Deployment following the new default",
    )
    assert rolled["metadata"]["generation"] > before["metadata"]["generation"]


def test_a_changed_platform_default_rolls_its_services_which_stay_served(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any
) -> None:
    name = f"serving-{namespace}"
    service = mlp_service("rolls")
    platform_batching = {"maxBatchSize": 16, "maxQueueSize": 128, "maxQueueDelayMicroseconds": 500}
    kubectl_apply(
        cluster,
        {
            "apiVersion": GROUP,
            "kind": "ClusterInferenceProfile",
            "metadata": {"name": name},
            "spec": {"defaults": {"runtime": {"batching": platform_batching}}},
        },
    )
    try:
        service["spec"]["profile"] = name
        service["spec"]["runtime"].pop("batching", None)
        apply(cluster, namespace, service)
        old = wait_gate(cluster, namespace, "rolls", status="True")
        wait_for(
            lambda: old["status"]["podIP"] in endpoint_ips(cluster, namespace, "rolls"),
            timeout=30,
            description="served before the change",
        )
        generation = profile_generation(cluster, namespace, "rolls")
        delay = {
            "spec": {"defaults": {"runtime": {"batching": {"maxQueueDelayMicroseconds": 900}}}}
        }
        cluster.kubectl(
            "patch", "clusterinferenceprofile", name, "--type=merge", "-p", json.dumps(delay)
        )  # fmt: skip
        served: list[set[str]] = []

        def rolled() -> bool:
            served.append(endpoint_ips(cluster, namespace, "rolls"))
            current = pods(cluster, namespace, "rolls")
            return (
                len(current) == 1
                and current[0]["metadata"]["uid"] != old["metadata"]["uid"]
                and current[0]["status"].get("podIP") in served[-1]
            )

        wait_for(rolled, timeout=180, interval=0.1, description="the new default gated in")
        assert all(served), "no ready endpoint at some moment of the roll"
        deployment = get(cluster, namespace, "deployment", "rolls")
        assert deployment is not None
        assert runtime_config(deployment)["batching"]["maxQueueDelayMicroseconds"] == 900
        assert profile_generation(cluster, namespace, "rolls") > generation
    finally:
        cluster.kubectl("delete", "clusterinferenceprofile", name, "--ignore-not-found")

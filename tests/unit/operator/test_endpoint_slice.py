"""A service at minReplicas 0: its Service selects nothing, and Kiln's EndpointSlice lists its
serving pods (past the warm-up gate) or, while none serves, the activator's pods."""

import copy
from typing import Any

from kiln_operator import constants
from kiln_operator.builders.compare import build_update, needs_update
from kiln_operator.builders.endpoints import build_endpoint_slice
from kiln_operator.builders.naming import Owner
from kiln_operator.builders.service import build_service
from tests.unit.kube_objects import pod

OWNER = Owner(name="mlp", namespace="models", uid="u-1")
READY = {"type": "ContainersReady", "status": "True"}  # the gate's verdict needs no more
WARM = {"type": constants.CONDITION_WARMED_UP, "status": "True"}
WARMING = {"type": constants.CONDITION_WARMED_UP, "status": "False", "reason": "WarmingUp"}
ACTIVATORS = ["10.1.0.8", "10.1.0.7"]


def runtime_pod(name: str, ip: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    body = pod(name, *conditions)
    body["metadata"]["uid"] = f"uid-{name}"
    body["status"]["podIP"] = ip
    body["spec"] = {
        "readinessGates": [{"conditionType": constants.CONDITION_WARMED_UP}],
        "nodeName": "node-1",
    }
    return body


def addresses(slice_: dict[str, Any]) -> list[str]:
    return [endpoint["addresses"][0] for endpoint in slice_["endpoints"]]


def test_at_zero_and_while_the_first_pod_warms_the_traffic_goes_to_the_activator() -> None:
    for pods in ([], [runtime_pod("mlp-a", "10.2.0.5", WARMING)]):
        slice_ = build_endpoint_slice(OWNER, pods, ACTIVATORS)
        assert addresses(slice_) == ["10.1.0.7", "10.1.0.8"]
        assert [(p["name"], p["port"]) for p in slice_["ports"]] == [("http", 8000), ("grpc", 8001)]
        labels = slice_["metadata"]["labels"]
        assert labels["kubernetes.io/service-name"] == "mlp"
        assert labels["endpointslice.kubernetes.io/managed-by"] != (
            "endpointslice-controller.k8s.io"
        )
        assert slice_["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_once_a_pod_passed_its_gate_the_traffic_goes_straight_to_the_pods() -> None:
    pods = [
        runtime_pod("mlp-b", "10.2.0.6", READY, WARM),
        runtime_pod("mlp-a", "10.2.0.5", WARMING),
    ]
    slice_ = build_endpoint_slice(OWNER, pods, ACTIVATORS)
    assert addresses(slice_) == ["10.2.0.6"]
    (endpoint,) = slice_["endpoints"]
    assert endpoint["targetRef"] == {
        "kind": "Pod", "namespace": "models", "name": "mlp-b", "uid": "uid-mlp-b",
    }  # fmt: skip
    assert endpoint["nodeName"] == "node-1"
    assert [(p["name"], p["port"]) for p in slice_["ports"]] == [
        ("http", 8000), ("grpc", 8001), ("metrics", 8002),
    ]  # fmt: skip


def test_the_switch_is_one_update_and_a_converged_slice_is_not_written() -> None:
    asleep = build_endpoint_slice(OWNER, [], ACTIVATORS)
    live = {**copy.deepcopy(asleep), "metadata": {**asleep["metadata"], "resourceVersion": "7"}}
    live["endpoints"][0]["zone"] = "z1"  # a field the server or another writer added
    assert not needs_update(live, asleep)
    awake = build_endpoint_slice(OWNER, [runtime_pod("mlp-a", "10.2.0.5", READY, WARM)], [])
    assert needs_update(live, awake)
    update = build_update(live, awake, keep_live_spec=True)
    assert addresses(update) == ["10.2.0.5"] and update["metadata"]["resourceVersion"] == "7"
    assert "spec" not in update


def test_the_service_of_a_service_at_zero_selects_no_pod_and_a_selector_set_earlier_goes() -> None:
    selecting = build_service(OWNER, scrape_annotations=False)
    assert selecting["spec"]["selector"]
    bare = build_service(OWNER, scrape_annotations=False, selects_pods=False)
    assert bare["spec"]["selector"] == {}
    assert needs_update(selecting, bare)
    updated = build_update(selecting, bare, keep_live_spec=True)
    assert updated["spec"]["selector"] == {}
    assert not needs_update(updated, bare)

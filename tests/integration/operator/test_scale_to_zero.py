"""A service at minReplicas 0 against the real control plane, with an activator configured: its
Service selects no pod, Kiln's EndpointSlice lists its ready pod, the activator's address while
it is at zero (Ready stays True, ScaledToZero), the pod again when it is back, and the Service
selects its pods again (Kiln's slice deleted) once minReplicas is 1.

The "activator" is an address in the fake nodes' pod range, which this machine routes nowhere
(`kiln_localcluster.podnet`): the operator's calls to it fail at once, as with an activator
that is down (the demand is then unknown), and the API server takes it as an endpoint."""

from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import apply, condition, get, gpu_service

pytestmark = pytest.mark.integration

ACTIVATOR_IP = "10.244.250.7"
LONG = 120


def endpoint_ips(slice_: dict[str, Any] | None) -> list[str]:
    if slice_ is None:
        return []
    return [endpoint["addresses"][0] for endpoint in slice_.get("endpoints") or []]


def test_a_service_at_zero_sends_its_traffic_to_the_activator_and_back_to_its_pods(
    cluster: Cluster, namespace: str, start_operator: Any
) -> None:
    start_operator([namespace], env={"KILN_ACTIVATOR_CONTROL": f"{ACTIVATOR_IP}:9090"})
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "evaluationIntervalSeconds": 5}
    apply(cluster, namespace, gpu_service("zero", autoscaling=autoscaling))

    def slice_() -> dict[str, Any] | None:
        return get(cluster, namespace, "endpointslice", "zero")

    def pod_ips() -> list[str]:
        pods = cluster.get_json("pods", "-n", namespace, "-l", "app.kubernetes.io/instance=zero")[
            "items"
        ]
        return sorted(p["status"]["podIP"] for p in pods if p.get("status", {}).get("podIP"))

    # one pod to begin with (its rollout proven): the slice lists it, with the pod's ports
    wait_for(lambda: endpoint_ips(slice_()) == pod_ips() != [], timeout=LONG,
             description="the slice lists the ready pod")  # fmt: skip
    service = get(cluster, namespace, "service", "zero")
    assert service is not None and not service["spec"].get("selector")
    live = slice_()
    assert live is not None
    assert live["metadata"]["labels"]["kubernetes.io/service-name"] == "zero"
    assert {p["name"]: p["port"] for p in live["ports"]} == {"http": 8000, "grpc": 8001,
                                                            "metrics": 8002}  # fmt: skip
    assert live["endpoints"][0]["targetRef"]["kind"] == "Pod"

    # at zero (scaled by hand: this cluster has no Prometheus to see the idle window), the
    # traffic goes to the activator, and the service is Ready, asleep
    cluster.kubectl("scale", "deployment/zero", "--replicas=0", "-n", namespace)
    wait_for(lambda: endpoint_ips(slice_()) == [ACTIVATOR_IP], timeout=LONG,
             description="the slice lists the activator")  # fmt: skip
    live = slice_()
    assert live is not None
    assert {p["name"]: p["port"] for p in live["ports"]} == {"http": 8000, "grpc": 8001}
    ready = wait_for(
        lambda: (c := condition(get(cluster, namespace, "inferenceservice", "zero"), "Ready"))
        and c["reason"] == "ScaledToZero" and c,
        timeout=LONG, description="Ready says ScaledToZero",
    )  # fmt: skip
    assert ready["status"] == "True"
    assert "the first request wakes one" in ready["message"]

    # awake again: back to the pod
    cluster.kubectl("scale", "deployment/zero", "--replicas=1", "-n", namespace)
    wait_for(lambda: endpoint_ips(slice_()) == pod_ips() != [], timeout=LONG,
             description="the slice lists the pod again")  # fmt: skip

    # minReplicas 1: the Service selects its pods again, Kiln's slice is gone
    autoscaling["minReplicas"] = 1
    apply(cluster, namespace, gpu_service("zero", autoscaling=autoscaling))
    wait_for(lambda: slice_() is None, timeout=LONG, description="Kiln's slice deleted")
    service = get(cluster, namespace, "service", "zero")
    assert service is not None and service["spec"]["selector"]

"""build_endpoint_slice: where a service at `minReplicas: 0` sends its traffic: its ready pods,
or Kiln's activator while it has none.

Why it exists: a Service's endpoints are normally its selector's ready pods, kept by the
EndpointSlice controller; a service at zero has none, so its requests would be refused. For a
service at `minReplicas: 0` (with an activator installed) Kiln's Service has no selector and Kiln
keeps its one EndpointSlice instead: the pods that are Ready (past their warm-up gate, so never
a cold pod) and not being deleted, each with its ports and a reference to the pod (Prometheus'
service discovery reads the pod's labels through it); and while there is none, the activator's
pods on the HTTP and gRPC ports, which hold the requests until a pod is ready. Pure.
"""

from typing import Any

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest, Owner
from kiln_operator.warmup.podstate import Pod, serving_pods

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_MANAGER_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICE_MANAGER = "endpointslice.serving.kiln.dev"
"""Not the EndpointSlice controller's own value, so the controller leaves the slice alone."""

ACTIVATOR_HTTP_PORT = 8000
ACTIVATOR_GRPC_PORT = 8001
"""The activator's client ports (`python -m kiln_runtime.activator`'s defaults)."""


def _port(name: str, number: int, app_protocol: str | None = None) -> dict[str, Any]:
    port: dict[str, Any] = {"name": name, "port": number, "protocol": "TCP"}
    if app_protocol is not None:
        port["appProtocol"] = app_protocol
    return port


def build_endpoint_slice(owner: Owner, pods: list[Pod], activator_ips: list[str]) -> Manifest:
    """The service's EndpointSlice: its serving pods, else the activator's pods."""
    serving = [pod for pod in serving_pods(pods) if ":" not in str(pod["status"]["podIP"])]
    if serving:
        endpoints = [
            {
                "addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {
                    "kind": "Pod",
                    "namespace": owner.namespace,
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"].get("uid", ""),
                },
                **({"nodeName": pod["spec"]["nodeName"]} if pod.get("spec", {}).get("nodeName")
                   else {}),
            }
            for pod in serving
        ]  # fmt: skip
        ports = [
            _port(constants.PORT_NAME_HTTP, constants.HTTP_PORT),
            _port(constants.PORT_NAME_GRPC, constants.GRPC_PORT, "kubernetes.io/h2c"),
            _port(constants.PORT_NAME_METRICS, constants.METRICS_PORT),
        ]
    else:
        endpoints = [
            {"addresses": [ip], "conditions": {"ready": True, "serving": True,
                                               "terminating": False}}
            for ip in sorted(set(activator_ips))
            if ":" not in ip
        ]  # fmt: skip
        ports = [
            _port(constants.PORT_NAME_HTTP, ACTIVATOR_HTTP_PORT),
            _port(constants.PORT_NAME_GRPC, ACTIVATOR_GRPC_PORT, "kubernetes.io/h2c"),
        ]
    metadata = owner.metadata({SERVICE_NAME_LABEL: owner.name, SLICE_MANAGER_LABEL: SLICE_MANAGER})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }

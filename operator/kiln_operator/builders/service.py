"""build_service: the one stable endpoint (HTTP and gRPC) in front of the runtime pods.

Why it exists: clients (tritonclient, curl) address a service, never a pod; only ready pods —
warmed up — are endpoints, which is how the warm-up gate keeps cold pods out of traffic.
"""

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest, Owner, selector_labels


def build_service(owner: Owner, scrape_annotations: bool, selects_pods: bool = True) -> Manifest:
    """The desired Service. `scrape_annotations`: add the plain prometheus.io annotations (when
    no Prometheus Operator is installed to read a ServiceMonitor). `selects_pods` False: no
    selector (an empty one, so a selector set earlier is removed): Kiln keeps the endpoints
    itself (`endpoints.build_endpoint_slice`, a service at minReplicas 0)."""
    metadata = owner.metadata()
    if scrape_annotations:
        metadata["annotations"] = {
            constants.ANNOTATION_PROMETHEUS_SCRAPE: "true",
            constants.ANNOTATION_PROMETHEUS_PORT: str(constants.METRICS_PORT),
            constants.ANNOTATION_PROMETHEUS_PATH: constants.METRICS_PATH,
        }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name) if selects_pods else {},
            "ports": [
                {
                    "name": constants.PORT_NAME_HTTP,
                    "port": constants.HTTP_PORT,
                    "targetPort": constants.PORT_NAME_HTTP,
                    "protocol": "TCP",
                },
                {
                    "name": constants.PORT_NAME_GRPC,
                    "port": constants.GRPC_PORT,
                    "targetPort": constants.PORT_NAME_GRPC,
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {
                    "name": constants.PORT_NAME_METRICS,
                    "port": constants.METRICS_PORT,
                    "targetPort": constants.PORT_NAME_METRICS,
                    "protocol": "TCP",
                },
            ],
        },
    }

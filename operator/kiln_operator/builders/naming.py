"""Names, labels and owner references shared by every child of an InferenceService.

Why it exists: the Deployment's selector, the Service's selector and the PDB's selector must
agree forever (a Deployment's selector is immutable), so they come from one function.
"""

from dataclasses import dataclass
from typing import Any

from kiln_operator import constants

Manifest = dict[str, Any]
"""A Kubernetes object (or part of one) as JSON: what the builders make, the API server returns
and the cache holds. Declared here, in the pure core, for the builders and the k8s layer alike."""


@dataclass(frozen=True)
class Owner:
    """The InferenceService a child belongs to: enough to name it and reference it."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> Manifest:
        """The ownerReference that makes the garbage collector delete the child with its owner."""
        return {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, extra_labels: dict[str, str] | None = None) -> Manifest:
        """metadata for a child: same name as the owner, Kiln's labels, the owner reference."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {**child_labels(self.name), **(extra_labels or {})},
            "ownerReferences": [self.owner_reference()],
        }


def selector_labels(service_name: str) -> dict[str, str]:
    """The pod selector of a service's runtime pods. Never change: Deployment selectors are
    immutable."""
    return {
        constants.LABEL_INSTANCE: service_name,
        constants.LABEL_COMPONENT: constants.COMPONENT_PREDICTOR,
    }


def child_labels(service_name: str) -> dict[str, str]:
    """Labels on every child object and pod of a service."""
    return {
        **selector_labels(service_name),
        constants.LABEL_NAME: service_name,
        constants.LABEL_MANAGED_BY: constants.MANAGER,
        constants.LABEL_PART_OF: "kiln",
        constants.LABEL_INFERENCESERVICE: service_name,
    }


def label_selector_string(service_name: str) -> str:
    """The pod selector as the string form status.selector (scale subresource) needs."""
    return ",".join(
        f"{key}={value}" for key, value in sorted(selector_labels(service_name).items())
    )


def service_host(owner: Owner) -> str:
    """The in-cluster DNS name of a service's Service."""
    return f"{owner.name}.{owner.namespace}.svc"


def http_url(owner: Owner) -> str:
    """The in-cluster URL of the HTTP endpoint, written to status.url."""
    return f"http://{service_host(owner)}:{constants.HTTP_PORT}"


def grpc_address(owner: Owner) -> str:
    """The in-cluster host:port of the gRPC endpoint, written to status.grpcAddress."""
    return f"{service_host(owner)}:{constants.GRPC_PORT}"

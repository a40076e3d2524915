"""spec.pod: how a platform shapes the runtime pods beyond GPUs and resources.

Why it exists: a real cluster places and labels its workloads its own way: affinity and spread
over nodes and zones, a priority class above batch jobs, a runtime class (`nvidia`), pull
secrets of a private registry, a service account holding cloud credentials, labels for cost
allocation, annotations for a mesh, a few environment variables. These are Kubernetes' own types
(`kube.py`, from Kubernetes' published schemas), set once in a profile or per service; Kiln's own
labels, annotations and environment variables are refused here, never silently overwritten.
"""

from typing import Annotated

from pydantic import Field, field_validator

from kiln_operator import constants
from kiln_operator.api.v1alpha1.base import ApiModel
from kiln_operator.api.v1alpha1.kube import (
    Affinity,
    EnvVar,
    LocalObjectReference,
    TopologySpreadConstraint,
)
from kiln_operator.api.v1alpha1.model import DNS_SUBDOMAIN

RESERVED_ENV_PREFIX = "KILN_"
"""Environment variables Kiln sets or may set in its containers (KILN_RUNTIME_CONFIG today)."""
RESERVED_LABELS = frozenset(
    {
        constants.LABEL_NAME,
        constants.LABEL_INSTANCE,
        constants.LABEL_COMPONENT,
        constants.LABEL_MANAGED_BY,
        constants.LABEL_PART_OF,
    }
)
"""The labels Kiln puts on every pod: its selectors and watches depend on them."""
RESERVED_PREFIX = f"{constants.GROUP}/"
"""Label and annotation keys under Kiln's API group are Kiln's own."""

ObjectName = Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN)]


class PodSettings(ApiModel):
    """Pod-level settings of the runtime pods, in Kubernetes' own terms. A profile usually sets
    them for every service (placement, priority, pull secrets); a change rolls the pods through
    the warm-up gate like any other change of the spec."""

    labels: Annotated[
        dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=64, default_factory=dict)
    ]
    """Extra labels on every runtime pod (cost allocation, team). Kiln's own
    (app.kubernetes.io/name, instance, component, managed-by, part-of, and serving.kiln.dev/*)
    are refused. A profile's and the service's labels are merged, the service's value winning."""
    annotations: Annotated[
        dict[str, Annotated[str, Field(max_length=16384)]],
        Field(max_length=64, default_factory=dict),
    ]
    """Extra annotations on every runtime pod (mesh injection, log routing); keys under
    serving.kiln.dev/ are Kiln's own and refused. Merged with a profile's like labels."""
    env: Annotated[list[EnvVar], Field(max_length=64, default_factory=list)]  # type: ignore[valid-type]
    """Extra environment variables of the runtime and model-fetch containers (Kubernetes
    EnvVar: a value, or valueFrom a Secret, ConfigMap or pod field). Names starting with KILN_
    are Kiln's own (KILN_RUNTIME_CONFIG carries the runtime's configuration) and refused. A list:
    a service's replaces its profile's whole."""
    affinity: Affinity | None = None  # type: ignore[valid-type]
    """Kubernetes node affinity, pod affinity and pod anti-affinity of the runtime pods, added
    to the GPU placement Kiln derives from spec.resources (which stays a node selector)."""
    topology_spread_constraints: Annotated[
        list[TopologySpreadConstraint],  # type: ignore[valid-type]
        Field(max_length=16, default_factory=list),
    ]
    """How the replicas spread over nodes, zones or any node label. A constraint without a
    labelSelector counts this service's own pods (Kiln fills in their selector), so a profile
    can say "spread every service over nodes" without naming one."""
    priority_class_name: ObjectName | None = None
    """The PriorityClass of the runtime pods (e.g. inference above batch jobs: the scheduler
    preempts lower-priority pods to place them). Policies may restrict it."""
    runtime_class_name: ObjectName | None = None
    """The RuntimeClass the runtime pods run with (e.g. `nvidia`). Policies may restrict it."""
    image_pull_secrets: Annotated[
        list[LocalObjectReference],  # type: ignore[valid-type]
        Field(max_length=16, default_factory=list),
    ]
    """Secrets of the pods' namespace the kubelet uses to pull the runtime image from a private
    registry."""
    service_account_name: ObjectName | None = None
    """The ServiceAccount the runtime pods run as (cloud credentials through workload
    identity). Its API token is not mounted. spec.model.storage.serviceAccountName, if also set,
    must name the same one. Policies may forbid some."""

    @field_validator("labels")
    @classmethod
    def _kiln_labels_are_kilns(cls, labels: dict[str, str]) -> dict[str, str]:
        taken = sorted(
            key for key in labels if key in RESERVED_LABELS or key.startswith(RESERVED_PREFIX)
        )
        if taken:
            raise ValueError(
                f"{taken} are labels Kiln sets on its pods (its selectors depend on them): "
                "choose other keys"
            )
        return labels

    @field_validator("annotations")
    @classmethod
    def _kiln_annotations_are_kilns(cls, annotations: dict[str, str]) -> dict[str, str]:
        taken = sorted(key for key in annotations if key.startswith(RESERVED_PREFIX))
        if taken:
            raise ValueError(
                f"{taken} are under {RESERVED_PREFIX}, Kiln's own annotations: choose other keys"
            )
        return annotations

    @field_validator("env")
    @classmethod
    def _kiln_env_is_kilns(cls, env: list[ApiModel]) -> list[ApiModel]:
        names = [str(getattr(variable, "name", "")) for variable in env]
        reserved = sorted({name for name in names if name.startswith(RESERVED_ENV_PREFIX)})
        if reserved:
            raise ValueError(
                f"{reserved} cannot be set: variables starting with {RESERVED_ENV_PREFIX} are "
                f"Kiln's own ({constants.ENV_RUNTIME_CONFIG} carries the runtime's "
                "configuration); configure the runtime through the spec instead"
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"{repeated} appear more than once: name each variable once")
        return env

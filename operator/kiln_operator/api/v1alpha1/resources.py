"""spec.resources: what a runtime pod needs from a node — GPUs, CPU, memory, placement.

Why it exists: GPU placement (count, product label, the GPU taint) is the part model owners get
wrong most often; the API states it in Kiln's words and the builders translate it.
"""

from typing import Annotated, Literal

from pydantic import Field

from kiln_operator.api.v1alpha1.base import ApiModel

QUANTITY_PATTERN = (
    r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"  # the pattern Kubernetes' own CRDs use
)
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class Toleration(ApiModel):
    """A Kubernetes toleration (core/v1 Toleration), for taints other than the GPU taint."""

    key: Annotated[str | None, Field(max_length=316, pattern=LABEL_KEY_PATTERN)] = None
    """Taint key; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists matches any value; Equal matches `value`."""
    value: Annotated[str | None, Field(max_length=63)] = None
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: Annotated[int | None, Field(ge=0)] = None
    """For NoExecute: how long the pod stays bound after the taint appears."""


Quantity = Annotated[str, Field(max_length=64, pattern=QUANTITY_PATTERN)]


class ResourcesSpec(ApiModel):
    """Per-pod resources and placement."""

    gpu_count: Annotated[int, Field(ge=0, le=16)] = 1
    """nvidia.com/gpu per pod. 0 runs on CPU (tests, small models): no GPU node selection."""
    gpu_product: Annotated[
        str | None, Field(max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    ] = None
    """Required value of the node label nvidia.com/gpu.product, e.g. NVIDIA-A100-SXM4-80GB.
    Empty: any GPU node."""
    cpu: Quantity = "2"
    """CPU request and limit per pod (a Kubernetes quantity, e.g. 2 or 500m)."""
    memory: Quantity = "8Gi"
    """Memory request and limit per pod (a Kubernetes quantity, e.g. 8Gi)."""
    node_selector: Annotated[dict[str, str], Field(max_length=32, default_factory=dict)]
    """Extra node labels the pod requires, merged with the GPU product selector."""
    tolerations: Annotated[list[Toleration], Field(max_length=32, default_factory=list)]
    """Extra tolerations; the nvidia.com/gpu taint is tolerated automatically when gpuCount > 0."""

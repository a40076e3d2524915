"""The InferenceService resource: its spec (what the model owner asks for) and status.

Why it exists: this is Kiln's whole user interface. The spec's parts live in their own modules;
this module assembles them and holds the checks that span parts (e.g. warm-up batch sizes
against the batching limit). The operator parses every stored object with these models and turns
a ValidationError into Ready=False/InvalidSpec, never into a change of what runs.
"""

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from kiln_operator import constants
from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingSpec,
    AutoscalingStatus,
    PrewarmSpec,
    SloSpec,
)
from kiln_operator.api.v1alpha1.base import ApiModel
from kiln_operator.api.v1alpha1.conditions import Condition
from kiln_operator.api.v1alpha1.drain import DrainSpec
from kiln_operator.api.v1alpha1.model import ModelSpec
from kiln_operator.api.v1alpha1.resources import ResourcesSpec
from kiln_operator.api.v1alpha1.runtime import RuntimeSpec
from kiln_operator.api.v1alpha1.warmup import WarmupSpec, WarmupStatus


class InferenceServiceSpec(ApiModel):
    """What the model owner asks for: a model, how to run it, and the latency it must keep."""

    model: ModelSpec
    """The model file, its format and its input/output tensors."""
    runtime: RuntimeSpec
    """The serving container: image, optimisation, precision, dynamic batching."""
    resources: ResourcesSpec = ResourcesSpec()
    """GPUs, CPU, memory and node placement of each runtime pod."""
    warmup: WarmupSpec = WarmupSpec()
    """The gate a new pod passes before it receives traffic."""
    slo: SloSpec
    """The latency objective the autoscaler keeps."""
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    """Replica bounds and how replicas follow latency and queue depth."""
    prewarm: PrewarmSpec = PrewarmSpec()
    """Scheduled replica floors for known bursts, warmed before they start."""
    drain: DrainSpec = DrainSpec()
    """Graceful shutdown: how long in-flight requests may take to finish."""

    @model_validator(mode="after")
    def _warmup_batches_fit(self) -> "InferenceServiceSpec":
        limit = self.runtime.batching.max_batch_size
        too_big = [size for size in self.warmup.batch_sizes if size > limit]
        if too_big:
            raise ValueError(
                f"warmup.batchSizes {too_big} exceed runtime.batching.maxBatchSize ({limit})"
            )
        return self

    @model_validator(mode="after")
    def _gpu_settings_need_a_gpu(self) -> "InferenceServiceSpec":
        if self.resources.gpu_count == 0:
            if self.resources.gpu_product is not None:
                raise ValueError("resources.gpuProduct is set but resources.gpuCount is 0")
            if self.runtime.optimization.cuda_graphs:
                raise ValueError(
                    "runtime.optimization.cudaGraphs needs a GPU but resources.gpuCount is 0"
                )
        return self

    def model_name(self, service_name: str) -> str:
        """The protocol's model name: spec.model.name, else the InferenceService's name."""
        return self.model.name or service_name


class InferenceServiceStatus(ApiModel):
    """What the operator observed; written only by the operator."""

    observed_generation: Annotated[int | None, Field(ge=0)] = None
    """metadata.generation of the spec this status describes."""
    conditions: Annotated[list[Condition], Field(max_length=32, default_factory=list)]
    """Ready (aggregate), SpecValid, DeploymentAvailable and Progressing."""
    replicas: Annotated[int | None, Field(ge=0)] = None
    """Runtime pods that exist (the Deployment's status.replicas)."""
    ready_replicas: Annotated[int | None, Field(ge=0)] = None
    """Runtime pods that are ready, i.e. warmed up and passing their readiness probe."""
    updated_replicas: Annotated[int | None, Field(ge=0)] = None
    """Runtime pods running the current spec."""
    available_replicas: Annotated[int | None, Field(ge=0)] = None
    """Runtime pods ready for at least the Deployment's minReadySeconds."""
    selector: str | None = None
    """Label selector of the runtime pods, for the scale subresource."""
    url: str | None = None
    """In-cluster URL of the HTTP endpoint (Open Inference Protocol)."""
    grpc_address: str | None = None
    """In-cluster host:port of the gRPC endpoint (Open Inference Protocol)."""
    autoscaling: AutoscalingStatus | None = None
    """The autoscaler's last decision and the metrics it saw."""
    warmup: WarmupStatus | None = None
    """Warm and failed pods and their cold-start times, from the warm-up gate."""


class InferenceService(ApiModel):
    """The whole object as stored by the API server."""

    api_version: Literal["serving.kiln.dev/v1alpha1"] = "serving.kiln.dev/v1alpha1"
    """Versioned schema of this object."""
    kind: Literal["InferenceService"] = constants.KIND
    """REST resource this object represents."""
    metadata: Annotated[dict[str, Any], Field(default_factory=dict)]
    """Standard object metadata."""
    spec: InferenceServiceSpec
    """What the model owner asks for."""
    status: InferenceServiceStatus = InferenceServiceStatus()
    """What the operator observed."""

"""spec.runtime: the serving container — image, graph optimisation, numeric precision, batching.

Why it exists: these settings are rendered verbatim into the runtime's config (the
operator/runtime contract), so their ranges are checked here, before a pod ever starts.
"""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kiln_operator.api.v1alpha1.base import ApiModel

IMAGE_PATTERN = r"^[a-z0-9]+([._/:@-][a-zA-Z0-9_.-]+)*$"


class OptimizationSpec(ApiModel):
    """How the runtime prepares the model's graph before serving."""

    mode: Literal["eager", "script", "compile"] = "eager"
    """eager: run as loaded (any format); script: freeze and optimize_for_inference (torchscript
    only); compile: torch.compile (torch_export only). onnx runs eager."""
    precision: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    """Numeric precision of the weights and activations. fp16/bf16 need a GPU; int8 is dynamic
    quantisation of linear layers, CPU only (gpuCount 0) and torchscript only. onnx: fp32 only."""
    cuda_graphs: bool = False
    """Capture CUDA graphs per batch size (needs gpuCount > 0; not for onnx). Needs static input
    shapes."""


class BatchingSpec(ApiModel):
    """Dynamic batching: requests wait at most maxQueueDelayMicroseconds to share a batch."""

    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = 32
    """Largest batch the model runs at once."""
    max_queue_delay_microseconds: Annotated[int, Field(ge=0, le=1_000_000)] = 2000
    """Longest a request waits for others to fill a batch: the cap on latency batching adds."""
    max_queue_size: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Requests allowed to wait; beyond it the runtime rejects at once (429, RESOURCE_EXHAUSTED)."""

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> "BatchingSpec":
        if self.max_batch_size > self.max_queue_size:
            raise ValueError(
                f"maxBatchSize ({self.max_batch_size}) exceeds maxQueueSize "
                f"({self.max_queue_size}): a full batch could never form"
            )
        return self


class ConnectionsSpec(ApiModel):
    """How long a client's gRPC connection lives. kube-proxy balances connections, not requests:
    a client that connected before a scale-up keeps every request on its first pod until its
    connection ends. The runtime ends each connection after maxAgeSeconds (±10 % jitter) with a
    GOAWAY that lets in-flight calls finish; gRPC clients reconnect at once, through the Service,
    and so spread over the new replicas."""

    max_age_seconds: Annotated[int, Field(ge=0, le=86_400)] = 30
    """Age at which the runtime asks a gRPC client to reconnect; 0 keeps connections forever."""
    max_age_grace_seconds: Annotated[int, Field(ge=1, le=3_600)] = 10
    """How long calls still running on an aged connection may take before it is closed."""


class RuntimeSpec(ApiModel):
    """The serving container."""

    image: Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_PATTERN)]
    """Container image of Kiln's runtime (package kiln_runtime), e.g. kiln/runtime:dev."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""
    optimization: OptimizationSpec = OptimizationSpec()
    """Graph preparation and precision."""
    batching: BatchingSpec = BatchingSpec()
    """Dynamic batching limits."""
    connections: ConnectionsSpec = ConnectionsSpec()
    """gRPC connection lifetime, so long-lived clients spread over new replicas."""

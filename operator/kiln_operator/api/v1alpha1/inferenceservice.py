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
from kiln_operator.api.v1alpha1.model import DNS_SUBDOMAIN, ModelSpec
from kiln_operator.api.v1alpha1.pod import PodSettings
from kiln_operator.api.v1alpha1.profile import ResolvedProfile
from kiln_operator.api.v1alpha1.resources import ResourcesSpec
from kiln_operator.api.v1alpha1.rollout import RolloutSpec, RolloutStatus
from kiln_operator.api.v1alpha1.route import RouteSpec
from kiln_operator.api.v1alpha1.runtime import RuntimeSpec
from kiln_operator.api.v1alpha1.warmup import WarmupSpec, WarmupStatus


class InferenceServiceSpec(ApiModel):
    """What the model owner asks for: a model, how to run it, and the latency it must keep."""

    profile: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """The profile whose defaults fill the fields this spec leaves out: the namespace's
    InferenceProfile of this name over the ClusterInferenceProfile of this name. Empty: the
    ClusterInferenceProfile marked default (and the namespace's InferenceProfile of its name),
    else Kiln's built-in defaults only."""
    model: ModelSpec
    """The model file, its format and its input/output tensors."""
    runtime: RuntimeSpec
    """The serving container: image, optimisation, precision, dynamic batching. Required
    unless the profile provides runtime.image."""
    resources: ResourcesSpec = ResourcesSpec()
    """GPUs, CPU, memory and node placement of each runtime pod."""
    warmup: WarmupSpec = WarmupSpec()
    """The gate a new pod passes before it receives traffic."""
    slo: SloSpec
    """The latency objective the autoscaler keeps. Required unless the profile provides it."""
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    """Replica bounds and how replicas follow latency and queue depth."""
    prewarm: PrewarmSpec = PrewarmSpec()
    """Scheduled replica floors for known bursts, warmed before they start."""
    drain: DrainSpec = DrainSpec()
    """Graceful shutdown: how long in-flight requests may take to finish."""
    pod: PodSettings = PodSettings()
    """Pod-level settings a platform usually sets in a profile: affinity, topology spread,
    priority and runtime class, pull secrets, service account, extra labels, annotations and
    environment variables."""
    route: RouteSpec = RouteSpec()
    """Exposure outside the cluster (opt-in): Gateway API routes or an Ingress."""
    rollout: RolloutSpec = RolloutSpec()
    """How a new version reaches the pods: at once (the default), or as a canary promoted or
    rolled back by its measured p99 and errors."""

    @model_validator(mode="after")
    def _one_service_account(self) -> "InferenceServiceSpec":
        storage = self.model.storage
        own = storage.service_account_name if storage is not None else None
        wanted = self.pod.service_account_name
        if own is not None and wanted is not None and own != wanted:
            raise ValueError(
                f"pod.serviceAccountName {wanted!r} and model.storage.serviceAccountName {own!r} "
                "name different ServiceAccounts, and a pod runs as one: set the same name, or "
                "only one of them"
            )
        return self

    def service_account_name(self) -> str | None:
        """The runtime pods' ServiceAccount: spec.pod's, else the model storage's; None: the
        namespace's default."""
        storage = self.model.storage
        if self.pod.service_account_name is not None:
            return self.pod.service_account_name
        return storage.service_account_name if storage is not None else None

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
    def _only_a_deterministic_model_is_cached(self) -> "InferenceServiceSpec":
        if self.runtime.cache is not None and not self.model.deterministic:
            raise ValueError(
                "runtime.cache serves a stored answer in place of the model's, which is only "
                "right for a model that answers the same inputs alike: set model.deterministic "
                "to true if it does, else remove runtime.cache"
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

    @model_validator(mode="after")
    def _optimization_fits_format_and_device(self) -> "InferenceServiceSpec":
        """Refuse what the runtime refuses at start-up (its execution plan): the same rules here
        turn a crash-looping pod into Ready=False/InvalidSpec naming the field.

        onnx runs as exported (eager, fp32, no CUDA graphs); torch.compile needs a torch.export
        program and freezing a TorchScript one; INT8 dynamic quantization is a TorchScript pass
        that runs on CPU only, and the operator asks for CUDA whenever gpuCount > 0. Every
        problem is reported at once, so one edit can fix them all.
        """
        optimization = self.runtime.optimization
        model_format = self.model.format
        gpu_count = self.resources.gpu_count
        problems: list[str] = []
        if model_format == "onnx" and optimization.mode != "eager":
            problems.append(
                f"runtime.optimization.mode {optimization.mode!r} is not available for "
                "model.format 'onnx': use 'eager' (onnxruntime optimizes the graph itself)"
            )
        elif optimization.mode == "compile" and model_format != "torch_export":
            problems.append(
                f"runtime.optimization.mode 'compile' needs model.format 'torch_export', not "
                f"{model_format!r} (torch.compile cannot compile TorchScript): use mode 'script' "
                "or 'eager', or export the model with torch.export"
            )
        elif optimization.mode == "script" and model_format != "torchscript":
            problems.append(
                f"runtime.optimization.mode 'script' needs model.format 'torchscript', not "
                f"{model_format!r}: use mode 'compile' or 'eager'"
            )
        if model_format == "onnx" and optimization.precision != "fp32":
            problems.append(
                f"runtime.optimization.precision {optimization.precision!r} is not available for "
                "model.format 'onnx', which runs in the precision it was exported in: use "
                "'fp32' and export the model in the precision you want"
            )
        elif optimization.precision == "int8":
            if gpu_count > 0:
                problems.append(
                    "runtime.optimization.precision 'int8' (dynamic quantization) is CPU only but "
                    f"resources.gpuCount is {gpu_count}: set resources.gpuCount to 0, or use "
                    "precision 'fp16', 'bf16' or 'fp32' on a GPU"
                )
            if model_format != "torchscript":
                problems.append(
                    "runtime.optimization.precision 'int8' (dynamic quantization) needs "
                    f"model.format 'torchscript', not {model_format!r}: use precision 'fp32', "
                    "'fp16' or 'bf16', or save the model with torch.jit.save"
                )
        if model_format == "onnx" and optimization.cuda_graphs:
            problems.append(
                "runtime.optimization.cudaGraphs is not available for model.format 'onnx': "
                "set it to false"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def model_name(self, service_name: str) -> str:
        """The protocol's model name: spec.model.name, else the InferenceService's name."""
        return self.model.name or service_name


class InferenceServiceStatus(ApiModel):
    """What the operator observed; written only by the operator."""

    observed_generation: Annotated[int | None, Field(ge=0)] = None
    """metadata.generation of the spec this status describes; 0 until the operator first
    writes status (the CRD's default, so kstatus and Argo CD read a new object as in
    progress)."""
    conditions: Annotated[list[Condition], Field(max_length=32, default_factory=list)]
    """Ready (aggregate), SpecValid, DeploymentAvailable, Progressing, ReplicaFloorMet,
    ReplicasFeasible (False while pods asked for cannot be created or scheduled, with Kubernetes'
    message), Stalled and Reconciling (kstatus's: Flux and `kubectl wait` read them),
    MetricsAvailable (the autoscaler's)."""
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
    autoscaler_state: Annotated[str | None, Field(max_length=8192)] = None
    """The autoscaler's memory across operator restarts, as JSON (cooldowns, the hold window,
    the capacity fit, pre-warm bookkeeping): internal, its fields may change between versions.
    Kept in status, the operator's own part of the object, so the autoscaler never writes the
    object's metadata (earlier versions kept it in the annotation
    `serving.kiln.dev/autoscaler-state`, which is still read while this is empty)."""
    rollout: RolloutStatus | None = None
    """The canary of the last new version (spec.rollout.canary): phase, step, shares, replicas
    of both versions and the last verdict with its numbers."""
    warmup: WarmupStatus | None = None
    """Warm and failed pods and their cold-start times, from the warm-up gate."""
    profiles: Annotated[list[ResolvedProfile] | None, Field(max_length=2)] = None
    """The profiles the spec was resolved against (namespace's first, then the cluster's);
    empty when none applies and Kiln's built-in defaults fill what the spec leaves out."""


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

"""Platform profiles and policies: the defaults and the limits a platform team sets for tenants.

Why it exists: a platform offering self-serve model hosting sets defaults once (runtime image,
resources, batching, warm-up, SLO and autoscaling behaviour, the Prometheus endpoint) so a model
owner's InferenceService names little more than its model, and sets limits no tenant's spec may
pass (GPUs, replicas, images, model sources, the addresses the operator may reach). KServe
answers the first part with a ClusterServingRuntime/ServingRuntime pair; Kubernetes answers
"classes with a default" with StorageClass. Kiln has four kinds:

- ClusterInferenceProfile (cluster-scoped): the platform's defaults. The one with
  `spec.default: true` serves InferenceServices that name no profile.
- InferenceProfile (namespaced): a team's override of the cluster profile of the same name, for
  its namespace.
- ClusterInferencePolicy (cluster-scoped): limits every InferenceService must keep.
- InferencePolicy (namespaced): narrower limits for one namespace; it can never widen one.

The defaults are partial copies of the InferenceService's spec parts (`partial_model`): the
same fields, bounds and descriptions, each optional.
"""

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from kiln_operator.api.dotsegments import (
    IMAGE_RULE,
    URL_RULE,
    has_dot_segment,
    image_has_dot_segment,
)
from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec, PrewarmSpec, SloSpec
from kiln_operator.api.v1alpha1.base import ApiModel
from kiln_operator.api.v1alpha1.drain import DrainSpec
from kiln_operator.api.v1alpha1.partial import partial_model
from kiln_operator.api.v1alpha1.pod import PodSettings
from kiln_operator.api.v1alpha1.resources import ResourcesSpec
from kiln_operator.api.v1alpha1.route import RouteSpec
from kiln_operator.api.v1alpha1.runtime import RuntimeSpec
from kiln_operator.api.v1alpha1.warmup import WarmupSpec

__all__ = ["InferencePolicySpec", "ModelUriScheme", "ProfileDefaults", "ProfileSpec"]

PartialRuntimeSpec = partial_model(RuntimeSpec)
PartialResourcesSpec = partial_model(ResourcesSpec)
PartialWarmupSpec = partial_model(WarmupSpec)
PartialSloSpec = partial_model(SloSpec)
PartialAutoscalingSpec = partial_model(AutoscalingSpec)
PartialPrewarmSpec = partial_model(PrewarmSpec, exclude=frozenset({"schedules"}))
PartialDrainSpec = partial_model(DrainSpec)
PartialPodSettings = partial_model(PodSettings)
PartialRouteSpec = partial_model(RouteSpec)

ModelUriScheme = Literal["pvc", "s3", "https", "file"]
"""How spec.model.uri names its source: a claim, a bucket, a web server, the image (file:///
and a bare /path)."""


class ProfileDefaults(ApiModel):
    """Values for the fields an InferenceService leaves out, by the spec part they fill. A field
    set here and in the InferenceService takes the InferenceService's value; lists (tolerations,
    warm-up batch sizes) are replaced whole, never merged."""

    runtime: PartialRuntimeSpec | None = None  # type: ignore[valid-type]
    """Default spec.runtime: image, pull policy, optimisation, precision, batching, connections."""
    resources: PartialResourcesSpec | None = None  # type: ignore[valid-type]
    """Default spec.resources: GPUs, GPU product, CPU, memory, node selector, tolerations."""
    warmup: PartialWarmupSpec | None = None  # type: ignore[valid-type]
    """Default spec.warmup: the warm-up gate's requests, concurrency, bound and timeouts."""
    slo: PartialSloSpec | None = None  # type: ignore[valid-type]
    """Default spec.slo: the p99 latency objective."""
    autoscaling: PartialAutoscalingSpec | None = None  # type: ignore[valid-type]
    """Default spec.autoscaling: replica bounds, targets, scaling behaviour, the Prometheus
    endpoint (which the policies' allowedPrometheusUrls must still allow)."""
    prewarm: PartialPrewarmSpec | None = None  # type: ignore[valid-type]
    """Default spec.prewarm margins (lead-time margin, assumed cold start); schedules are each
    service's own."""
    drain: PartialDrainSpec | None = None  # type: ignore[valid-type]
    """Default spec.drain: graceful shutdown timings."""
    pod: PartialPodSettings | None = None  # type: ignore[valid-type]
    """Default spec.pod: affinity, topology spread (e.g. every service spread over nodes),
    priority and runtime class, pull secrets, service account, pod labels, annotations and
    environment variables. Labels and annotations merge key by key with the service's; the
    service's env list replaces the profile's whole."""
    route: PartialRouteSpec | None = None  # type: ignore[valid-type]
    """Default spec.route: the platform's Gateway, the hostname templates, the Ingress class;
    a model owner then opts in with route.enabled (or the profile enables it for all)."""


class ProfileSpec(ApiModel):
    """A set of defaults for InferenceServices."""

    default: bool = False
    """ClusterInferenceProfile only: serves every InferenceService that names no profile (if
    several say so, the one whose name sorts first; a namespace's InferenceProfile of that name
    overrides it there). Ignored on an InferenceProfile."""
    description: Annotated[str, Field(max_length=1024)] = ""
    """What the profile is for, for the people choosing one."""
    defaults: ProfileDefaults = ProfileDefaults()
    """Values for the fields an InferenceService using this profile leaves out."""


class InferencePolicySpec(ApiModel):
    """Limits an InferenceService must keep. Every policy that applies to a service is enforced
    (every ClusterInferencePolicy, and every InferencePolicy of its namespace), so a namespace's
    policy can only narrow the cluster's. A field left out sets no limit."""

    max_gpus_per_pod: Annotated[int | None, Field(ge=0, le=16)] = None
    """The most spec.resources.gpuCount may be."""
    max_gpus_per_service: Annotated[int | None, Field(ge=0, le=1_000_000)] = None
    """The most GPUs one service may hold at its ceiling: gpuCount x autoscaling.maxReplicas."""
    max_replicas: Annotated[int | None, Field(ge=1, le=10_000)] = None
    """The most spec.autoscaling.maxReplicas may be."""
    allow_scale_to_zero: bool | None = None
    """False forbids spec.autoscaling.minReplicas 0: every service keeps a replica (and its
    GPUs) while idle, and no request ever waits for a cold start."""
    min_scale_to_zero_idle_seconds: Annotated[int | None, Field(ge=30, le=604_800)] = None
    """The shortest spec.autoscaling.scaleToZero.idleSeconds a service at `minReplicas: 0` may
    set: a floor on how often a rarely used model is stopped and started again."""
    allowed_images: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=512)]] | None, Field(max_length=64)
    ] = None
    """Image prefixes spec.runtime.image must start with, e.g. `registry.example.com/kiln/`. A
    prefix matches at a path, tag or digest boundary only (`registry.example.com/kiln` does not
    allow `registry.example.com/kiln-evil/x`). A prefix with a `.` or `..` path component makes the
    policy invalid, so it allows nothing."""
    allowed_model_uri_schemes: Annotated[list[ModelUriScheme] | None, Field(max_length=4)] = None
    """The sources spec.model.uri may name: pvc, s3, https, file (a path inside the image)."""
    allowed_model_claims: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]] | None, Field(max_length=256)
    ] = None
    """PersistentVolumeClaims a pvc:// model may be read from."""
    allowed_redis_addresses: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=261)]] | None, Field(max_length=64)
    ] = None
    """Redis servers (host:port, exactly as written in the service) that
    spec.runtime.cache.redis.address may name: without it a service's pods connect to any
    address its spec gives. An empty list forbids a shared cache."""
    allowed_tracing_endpoints: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=2048)]] | None, Field(max_length=64)
    ] = None
    """OTLP endpoints (URLs, exactly as written in the service) that
    spec.runtime.tracing.otlpEndpoint may name: without it a service's pods send their spans to
    any address its spec gives. An empty list forbids tracing."""
    allowed_prometheus_urls: Annotated[
        list[Annotated[str, Field(max_length=512, pattern=r"^https?://[^\s]+$")]] | None,
        Field(max_length=64),
    ] = None
    """Prometheus endpoints the operator may query for a service (spec.autoscaling.prometheusUrl):
    an entry allows its scheme, host and port exactly and any path below its own; without a
    port it allows every port of that host. The operator's own Prometheus (its
    KILN_PROMETHEUS_URL) is always allowed. Without any entry in any policy, only the operator's
    own, those of ClusterInferenceProfiles and the operator's KILN_ALLOWED_PROMETHEUS_URLS are.
    Paths are compared normalized (`/prom/../p7` is `/p7`); an entry whose path holds a `.` or
    `..` segment or a percent-encoded dot makes the policy invalid, so it allows nothing."""
    allowed_priority_classes: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]] | None, Field(max_length=64)
    ] = None
    """PriorityClasses spec.pod.priorityClassName may name; a service naming none is allowed
    (the cluster's default priority applies)."""
    allowed_runtime_classes: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]] | None, Field(max_length=64)
    ] = None
    """RuntimeClasses spec.pod.runtimeClassName may name; a service naming none is allowed."""
    required_pod_labels: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=316)]] | None, Field(max_length=64)
    ] = None
    """Label keys every service must set in spec.pod.labels (its own or its profile's), e.g.
    `cost-center`."""
    forbidden_service_accounts: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]] | None, Field(max_length=64)
    ] = None
    """ServiceAccounts the runtime pods may not run as (spec.pod.serviceAccountName, or
    spec.model.storage.serviceAccountName). `default` here forbids leaving it unset, which runs
    the pods as the namespace's default ServiceAccount."""

    @field_validator("allowed_images")
    @classmethod
    def _images_without_dot_segments(cls, prefixes: list[str] | None) -> list[str] | None:
        for prefix in prefixes or ():
            if image_has_dot_segment(prefix):
                raise ValueError(f"{prefix!r}: {IMAGE_RULE}")
        return prefixes

    @field_validator("allowed_prometheus_urls")
    @classmethod
    def _urls_without_dot_segments(cls, urls: list[str] | None) -> list[str] | None:
        for url in urls or ():
            if has_dot_segment(urlsplit(url).path):
                raise ValueError(f"{url!r}: {URL_RULE}")
        return urls


class ResolvedProfile(ApiModel):
    """A profile an InferenceService's spec was resolved against, as the operator read it."""

    kind: Literal["ClusterInferenceProfile", "InferenceProfile"]
    """The profile's kind."""
    name: Annotated[str, Field(max_length=253)]
    """The profile's name (an InferenceProfile's is in the service's namespace)."""
    generation: Annotated[int, Field(ge=0)]
    """The profile's metadata.generation the running spec was resolved with: a change of the
    profile rolls the service like a change of its own spec."""

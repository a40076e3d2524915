"""Check a resolved InferenceService spec against the platform's policies.

Why it exists: in a shared cluster some fields are dangerous: GPUs are scarce, an image runs
with the cluster's network identity, a model source can be another team's data, and the
Prometheus URL is fetched by the operator itself from its own network identity (a tenant must not
point it at an address the platform did not allow). Every ClusterInferencePolicy and every
InferencePolicy of the service's namespace applies, so a namespace's policy narrows the
cluster's and never widens it. The operator enforces the result on every reconcile (Ready=False,
PolicyViolation, the service frozen); an admission webhook can refuse the same at apply.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from kiln_operator import constants
from kiln_operator.api.dotsegments import normalized_path
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.profile import InferencePolicySpec

IMAGE_BOUNDARIES = ("/", ":", "@")
"""Where an allowed image prefix may end inside an image reference: a path, tag or digest."""


@dataclass(frozen=True)
class Policy:
    """One policy, named as a condition message names it."""

    kind: str
    name: str
    spec: InferencePolicySpec

    @property
    def label(self) -> str:
        """How a message names the policy: kind and name."""
        return f"{self.kind} {self.name}"


def parse_policies(
    cluster_policies: Sequence[Mapping[str, Any]], namespace_policies: Sequence[Mapping[str, Any]]
) -> tuple[list[Policy], list[str]]:
    """The policies that apply, and a problem per policy that does not parse (stored under an
    older schema): such a policy refuses every service it applies to, as a lock fails closed."""
    policies: list[Policy] = []
    problems: list[str] = []
    for kind, bodies in (
        (constants.CLUSTER_POLICY_KIND, cluster_policies),
        (constants.POLICY_KIND, namespace_policies),
    ):
        for body in bodies:
            name = str((body.get("metadata") or {}).get("name", ""))
            try:
                policies.append(
                    Policy(kind, name, InferencePolicySpec.model_validate(body.get("spec") or {}))
                )
            except ValidationError as error:
                said = "; ".join(
                    f"{'.'.join(str(part) for part in found['loc'])}: {found['msg']}"
                    for found in error.errors()[:3]
                )
                problems.append(
                    f"{kind} {name} does not parse ({error.error_count()} errors: {said}), so it "
                    "allows nothing: fix it"
                )
    return policies, problems


def image_allowed(image: str, prefix: str) -> bool:
    """Whether `image` starts with `prefix` at a path, tag or digest boundary."""
    if not image.startswith(prefix):
        return False
    rest = image[len(prefix) :]
    return not rest or prefix.endswith(IMAGE_BOUNDARIES) or rest.startswith(IMAGE_BOUNDARIES)


def url_allowed(url: str, entry: str) -> bool:
    """Whether `url` falls under an allow-list `entry`: the same scheme and host, the same port
    (any port when the entry names none), and a path at or below the entry's, both compared
    as the HTTP client requests them (normalized: `/prom/../p7` is `/p7`, not below `/prom`)."""
    try:
        wanted, given = urlsplit(entry), urlsplit(url)
        wanted_port, given_port = wanted.port, given.port
    except ValueError:
        return False
    if (given.scheme, given.hostname) != (wanted.scheme, wanted.hostname) or given.username:
        return False
    if wanted_port is not None and given_port != wanted_port:
        return False
    base, path = normalized_path(wanted.path).rstrip("/"), normalized_path(given.path)
    return path == base or path.startswith(base + "/") or not base


def model_source(uri: str) -> str:
    """The scheme a model URI names its source with (a bare /path is a file in the image)."""
    return "file" if uri.startswith("/") else uri.split("://", 1)[0]


@dataclass(frozen=True)
class PrometheusAllowList:
    """Where the operator may send a service's metric queries, before the policies narrow it."""

    operator_url: str | None
    """The operator's own Prometheus (KILN_PROMETHEUS_URL): always allowed."""
    platform_entries: tuple[str, ...]
    """Entries the platform set outside policies: the operator's KILN_ALLOWED_PROMETHEUS_URLS
    and the Prometheus URLs of ClusterInferenceProfiles."""


def _prometheus_violations(
    url: str | None, policies: Sequence[Policy], allow: PrometheusAllowList
) -> list[str]:
    if url is None or url == allow.operator_url:
        return []
    listing = [policy for policy in policies if policy.spec.allowed_prometheus_urls is not None]
    base = list(allow.platform_entries) + [
        entry
        for policy in listing
        if policy.kind == constants.CLUSTER_POLICY_KIND
        for entry in policy.spec.allowed_prometheus_urls or ()
    ]
    if not any(url_allowed(url, entry) for entry in base):
        return [
            f"spec.autoscaling.prometheusUrl {url!r} is not an endpoint the platform allows "
            "(a ClusterInferencePolicy's allowedPrometheusUrls, a ClusterInferenceProfile's "
            "prometheusUrl, or the operator's KILN_ALLOWED_PROMETHEUS_URLS): leave it out to "
            "use the operator's Prometheus"
        ]
    return [
        f"{policy.label}: spec.autoscaling.prometheusUrl {url!r} is not in allowedPrometheusUrls "
        f"{policy.spec.allowed_prometheus_urls}"
        for policy in listing
        if not any(url_allowed(url, entry) for entry in policy.spec.allowed_prometheus_urls or ())
    ]


def _policy_violations(spec: InferenceServiceSpec, policy: Policy) -> list[str]:
    limits, label = policy.spec, policy.label
    gpus, ceiling = spec.resources.gpu_count, spec.autoscaling.max_replicas
    problems: list[str] = []
    if limits.max_gpus_per_pod is not None and gpus > limits.max_gpus_per_pod:
        problems.append(
            f"{label}: spec.resources.gpuCount {gpus} exceeds maxGpusPerPod "
            f"{limits.max_gpus_per_pod}"
        )
    if limits.max_gpus_per_service is not None and gpus * ceiling > limits.max_gpus_per_service:
        problems.append(
            f"{label}: gpuCount {gpus} x autoscaling.maxReplicas {ceiling} = {gpus * ceiling} "
            f"GPUs exceeds maxGpusPerService {limits.max_gpus_per_service}"
        )
    if limits.max_replicas is not None and ceiling > limits.max_replicas:
        problems.append(
            f"{label}: spec.autoscaling.maxReplicas {ceiling} exceeds maxReplicas "
            f"{limits.max_replicas}"
        )
    problems += _zero_violations(spec, policy)
    image = spec.runtime.image
    if limits.allowed_images is not None and not any(
        image_allowed(image, prefix) for prefix in limits.allowed_images
    ):
        problems.append(
            f"{label}: spec.runtime.image {image!r} matches none of allowedImages "
            f"{limits.allowed_images}"
        )
    uri = spec.model.uri
    scheme = model_source(uri)
    if (
        limits.allowed_model_uri_schemes is not None
        and scheme not in limits.allowed_model_uri_schemes
    ):
        problems.append(
            f"{label}: spec.model.uri {uri!r} is a {scheme} source, not one of "
            f"allowedModelUriSchemes {limits.allowed_model_uri_schemes}"
        )
    claim = spec.model.pvc_claim
    if (
        claim is not None
        and limits.allowed_model_claims is not None
        and claim not in limits.allowed_model_claims
    ):
        problems.append(
            f"{label}: spec.model.uri reads claim {claim!r}, not one of allowedModelClaims "
            f"{limits.allowed_model_claims}"
        )
    cache = spec.runtime.cache
    redis = None if cache is None or cache.redis is None else cache.redis.address
    if (
        redis is not None
        and limits.allowed_redis_addresses is not None
        and redis not in limits.allowed_redis_addresses
    ):
        problems.append(
            f"{label}: spec.runtime.cache.redis.address {redis!r} is not one of "
            f"allowedRedisAddresses {limits.allowed_redis_addresses}"
        )
    tracing = spec.runtime.tracing
    endpoint = None if tracing is None else tracing.otlp_endpoint
    if (
        endpoint is not None
        and limits.allowed_tracing_endpoints is not None
        and endpoint not in limits.allowed_tracing_endpoints
    ):
        problems.append(
            f"{label}: spec.runtime.tracing.otlpEndpoint {endpoint!r} is not one of "
            f"allowedTracingEndpoints {limits.allowed_tracing_endpoints}"
        )
    return problems + _pod_violations(spec, policy)


def _zero_violations(spec: InferenceServiceSpec, policy: Policy) -> list[str]:
    """The scale-to-zero rules: zero allowed at all, and the shortest idle window."""
    limits, label, scaling = policy.spec, policy.label, spec.autoscaling
    if scaling.min_replicas != 0:
        return []
    if limits.allow_scale_to_zero is False:
        return [
            f"{label}: spec.autoscaling.minReplicas 0 (scale to zero) is forbidden by "
            "allowScaleToZero false: set minReplicas to 1 or more"
        ]
    idle, shortest = scaling.scale_to_zero.idle_seconds, limits.min_scale_to_zero_idle_seconds
    if shortest is not None and idle < shortest:
        return [
            f"{label}: spec.autoscaling.scaleToZero.idleSeconds {idle} is shorter than "
            f"minScaleToZeroIdleSeconds {shortest}"
        ]
    return []


DEFAULT_SERVICE_ACCOUNT = "default"
"""What a pod runs as when its spec names no ServiceAccount."""


def _pod_violations(spec: InferenceServiceSpec, policy: Policy) -> list[str]:
    """The rules on spec.pod: priority and runtime classes, required labels, service accounts."""
    limits, label, pod = policy.spec, policy.label, spec.pod
    problems: list[str] = []
    priority = pod.priority_class_name
    if (
        priority is not None
        and limits.allowed_priority_classes is not None
        and priority not in limits.allowed_priority_classes
    ):
        problems.append(
            f"{label}: spec.pod.priorityClassName {priority!r} is not one of "
            f"allowedPriorityClasses {limits.allowed_priority_classes}"
        )
    runtime = pod.runtime_class_name
    if (
        runtime is not None
        and limits.allowed_runtime_classes is not None
        and runtime not in limits.allowed_runtime_classes
    ):
        problems.append(
            f"{label}: spec.pod.runtimeClassName {runtime!r} is not one of "
            f"allowedRuntimeClasses {limits.allowed_runtime_classes}"
        )
    missing = [key for key in limits.required_pod_labels or () if key not in pod.labels]
    if missing:
        problems.append(
            f"{label}: spec.pod.labels lacks {missing}, which requiredPodLabels "
            f"{limits.required_pod_labels} asks every service to set"
        )
    account = spec.service_account_name()
    runs_as = account if account is not None else DEFAULT_SERVICE_ACCOUNT
    if runs_as in (limits.forbidden_service_accounts or ()):
        field = "spec.pod.serviceAccountName" if account is not None else "no serviceAccountName"
        problems.append(
            f"{label}: the pods would run as ServiceAccount {runs_as!r} ({field}), which "
            f"forbiddenServiceAccounts {limits.forbidden_service_accounts} forbids: name "
            "another in spec.pod.serviceAccountName"
        )
    return problems


def violations(
    spec: InferenceServiceSpec,
    policies: Sequence[Policy],
    prometheus: PrometheusAllowList,
) -> list[str]:
    """Every rule the resolved spec breaks, each message naming the policy, the field and the
    limit; empty when the spec keeps them all."""
    problems = [problem for policy in policies for problem in _policy_violations(spec, policy)]
    return problems + _prometheus_violations(spec.autoscaling.prometheus_url, policies, prometheus)

"""Profiles and policies, pure: which value wins, which profile applies, which rule a spec breaks,
and that every failure is a reason and a message, never an exception."""

from typing import Any

import pytest
import yaml

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.profiles.effective import PlatformState, effective_spec
from kiln_operator.profiles.guardrails import image_allowed, url_allowed
from kiln_operator.profiles.resolution import Resolved, Unresolved, merged, resolve
from tests.unit.operator.conftest import REPO

MODEL = {
    "uri": "/opt/models/mlp.pt",
    "format": "torchscript",
    "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
    "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
}
"""A model owner's five-line spec: only the model; the rest comes from the profiles."""


def profile(
    name: str, defaults: dict[str, Any], *, default: bool = False, generation: int = 1, **extra: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation, **extra},
        "spec": {"default": default, "defaults": defaults},
    }


def policy(name: str, **limits: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": limits}


PLATFORM = profile(
    "gpu",
    {
        "runtime": {
            "image": "registry.example.com/kiln/runtime:1.4",
            "batching": {"maxBatchSize": 64, "maxQueueSize": 512},
        },
        "resources": {"gpuCount": 1, "memory": "16Gi"},
        "slo": {"p99LatencyMilliseconds": 80},
        "autoscaling": {"maxReplicas": 8, "scaleDown": {"stabilizationSeconds": 600}},
        "prewarm": {"leadTimeMarginSeconds": 120},
    },
    default=True,
    generation=3,
)
TEAM = profile(
    "gpu",
    {"runtime": {"batching": {"maxBatchSize": 16}}, "slo": {"p99LatencyMilliseconds": 40}},
    generation=7,
)


def spec_of(state: PlatformState, spec: dict[str, Any]) -> InferenceServiceSpec:
    effective = effective_spec("mlp", spec, state)
    assert effective.spec is not None, effective.message
    return effective.spec


def test_the_service_wins_over_its_namespace_which_wins_over_the_cluster() -> None:
    state = PlatformState(cluster_profiles=[PLATFORM], namespace_profiles=[TEAM])
    spec = spec_of(state, {"model": MODEL, "slo": {"p99LatencyMilliseconds": 25}})
    assert spec.slo.p99_latency_milliseconds == 25  # the service's own
    assert spec.runtime.batching.max_batch_size == 16  # the team's
    assert spec.runtime.batching.max_queue_size == 512  # the platform's, beside the team's
    assert spec.runtime.image == "registry.example.com/kiln/runtime:1.4"
    assert spec.resources.memory == "16Gi"
    assert spec.autoscaling.scale_down.stabilization_seconds == 600
    assert spec.autoscaling.scale_down.period_seconds == 60  # Kiln's built-in default
    assert spec.prewarm.lead_time_margin_seconds == 120
    effective = effective_spec("mlp", {"model": MODEL}, state)
    assert [(p.kind, p.name, p.generation) for p in effective.profiles] == [
        ("InferenceProfile", "gpu", 7),
        ("ClusterInferenceProfile", "gpu", 3),
    ]


def test_lists_are_replaced_whole_and_objects_merged_key_by_key() -> None:
    base = {"resources": {"tolerations": [{"key": "a"}, {"key": "b"}], "cpu": "4"}}
    own = {"resources": {"tolerations": [{"key": "c"}]}}
    assert merged(base, own) == {"resources": {"tolerations": [{"key": "c"}], "cpu": "4"}}
    assert merged({"a": {"b": 1}}, {"a": 2}) == {"a": 2}


def test_a_named_profile_is_used_and_the_default_only_when_none_is_named() -> None:
    small = profile("small", {"resources": {"gpuCount": 0, "cpu": "1"}})
    state = [PLATFORM, small]
    named = resolve({"model": MODEL, "profile": "small"}, state, [])
    assert isinstance(named, Resolved) and named.spec["resources"] == {"gpuCount": 0, "cpu": "1"}
    unnamed = resolve({"model": MODEL}, state, [])
    assert isinstance(unnamed, Resolved) and unnamed.spec["resources"]["gpuCount"] == 1
    assert [p.name for p in unnamed.profiles] == ["gpu"]


def test_without_any_profile_the_built_in_defaults_apply() -> None:
    result = resolve({"model": MODEL, "slo": {"p99LatencyMilliseconds": 5}}, [], [])
    assert isinstance(result, Resolved) and result.profiles == ()
    missing = effective_spec("mlp", {"model": MODEL}, PlatformState())
    assert missing.spec is None and missing.reason == constants.REASON_INVALID_SPEC
    assert "spec.runtime: Field required" in (missing.message or "")


def test_several_defaults_pick_the_first_by_name() -> None:
    other = profile("aaa", {"slo": {"p99LatencyMilliseconds": 9}}, default=True)
    result = resolve({"model": MODEL}, [PLATFORM, other], [])
    assert isinstance(result, Resolved) and [p.name for p in result.profiles] == ["aaa"]


def test_a_team_profile_alone_serves_its_namespace() -> None:
    result = effective_spec(
        "mlp",
        {"model": MODEL, "profile": "team", "runtime": {"image": "kiln/runtime:dev"}},
        PlatformState(
            namespace_profiles=[profile("team", {"slo": {"p99LatencyMilliseconds": 30}})]
        ),
    )
    assert result.spec is not None and result.spec.slo.p99_latency_milliseconds == 30


def test_a_missing_or_broken_profile_is_a_reason_not_an_exception() -> None:
    missing = effective_spec("mlp", {"model": MODEL, "profile": "nope"}, PlatformState())
    assert (missing.spec, missing.reason) == (None, constants.REASON_PROFILE_NOT_FOUND)
    assert "'nope'" in (missing.message or "")
    broken = profile("gpu", {"runtime": {"batching": {"maxBatchSize": 0}}}, default=True)
    result = effective_spec("mlp", {"model": MODEL}, PlatformState(cluster_profiles=[broken]))
    assert (result.spec, result.reason) == (None, constants.REASON_PROFILE_INVALID)
    assert "ClusterInferenceProfile gpu" in (result.message or "")


def test_a_profile_value_that_breaks_a_cross_field_check_names_the_field_and_profile() -> None:
    wide = profile(
        "gpu", {"runtime": {"image": "x", "batching": {"maxBatchSize": 600}}}, default=True
    )
    result = effective_spec(
        "mlp", {"model": MODEL, "slo": {"p99LatencyMilliseconds": 5}},
        PlatformState(cluster_profiles=[wide]),
    )  # fmt: skip
    assert result.reason == constants.REASON_INVALID_SPEC
    assert "maxBatchSize (600) exceeds maxQueueSize (256)" in (result.message or "")
    assert "resolved with ClusterInferenceProfile gpu" in (result.message or "")


@pytest.mark.parametrize(
    ("limits", "spec", "expected"),
    [
        (
            {"maxGpusPerPod": 1},
            {"resources": {"gpuCount": 2}},
            "ClusterInferencePolicy limits: spec.resources.gpuCount 2 exceeds maxGpusPerPod 1",
        ),
        (
            {"maxGpusPerService": 6},
            {"autoscaling": {"maxReplicas": 7}},
            "gpuCount 1 x autoscaling.maxReplicas 7 = 7 GPUs exceeds maxGpusPerService 6",
        ),
        (
            {"maxReplicas": 4},
            {},
            "spec.autoscaling.maxReplicas 8 exceeds maxReplicas 4",
        ),
        (
            {"allowedImages": ["registry.example.com/kiln"]},
            {"runtime": {"image": "registry.example.com/kiln-evil/runtime:1"}},
            "spec.runtime.image 'registry.example.com/kiln-evil/runtime:1' matches none",
        ),
        (
            {"allowedModelUriSchemes": ["pvc", "s3"]},
            {},
            "spec.model.uri '/opt/models/mlp.pt' is a file source",
        ),
        (
            {"allowedModelClaims": ["models"]},
            {"model": {**MODEL, "uri": "pvc://other-team/mlp.pt"}},
            "reads claim 'other-team', not one of allowedModelClaims ['models']",
        ),
        (
            {"allowedRedisAddresses": ["redis.cache.svc:6379"]},
            {
                "model": {**MODEL, "deterministic": True},
                "runtime": {"cache": {"redis": {"address": "10.0.0.9:6379"}}},
            },
            "spec.runtime.cache.redis.address '10.0.0.9:6379' is not one of "
            "allowedRedisAddresses ['redis.cache.svc:6379']",
        ),
        (
            {"allowedTracingEndpoints": ["http://otel.observability:4318/v1/traces"]},
            {"runtime": {"tracing": {"otlpEndpoint": "http://10.0.0.9:4318/v1/traces"}}},
            "spec.runtime.tracing.otlpEndpoint 'http://10.0.0.9:4318/v1/traces' is not one of "
            "allowedTracingEndpoints ['http://otel.observability:4318/v1/traces']",
        ),
        (
            {"allowScaleToZero": False},
            {"autoscaling": {"minReplicas": 0}},
            "spec.autoscaling.minReplicas 0 (scale to zero) is forbidden by allowScaleToZero false",
        ),
        (
            {"minScaleToZeroIdleSeconds": 1800},
            {"autoscaling": {"minReplicas": 0, "scaleToZero": {"idleSeconds": 600}}},
            "spec.autoscaling.scaleToZero.idleSeconds 600 is shorter than "
            "minScaleToZeroIdleSeconds 1800",
        ),
        (
            {"allowedPrometheusUrls": ["http://prometheus.monitoring:9090"]},
            {"autoscaling": {"prometheusUrl": "http://prometheus.monitoring:9091"}},
            "'http://prometheus.monitoring:9091' is not an endpoint the platform allows",
        ),
    ],
)
def test_each_guardrail_names_its_policy_rule_and_limit(
    limits: dict[str, Any], spec: dict[str, Any], expected: str
) -> None:
    state = PlatformState(
        cluster_profiles=[PLATFORM], cluster_policies=[policy("limits", **limits)]
    )
    result = effective_spec("mlp", {"model": MODEL, **spec}, state)
    assert result.spec is None and result.reason == constants.REASON_POLICY_VIOLATION
    assert expected in (result.message or "")


def test_a_spec_within_every_limit_runs() -> None:
    limits = policy(
        "all",
        maxGpusPerPod=1, maxGpusPerService=8, maxReplicas=8,
        allowedImages=["registry.example.com/kiln/"], allowedModelUriSchemes=["file", "pvc"],
        allowedModelClaims=["models"], allowedPrometheusUrls=["http://prom:9090"],
    )  # fmt: skip
    state = PlatformState(cluster_profiles=[PLATFORM], cluster_policies=[limits])
    assert spec_of(state, {"model": MODEL}).resources.gpu_count == 1
    claim = {**MODEL, "uri": "pvc://models/mlp.pt"}
    assert spec_of(state, {"model": claim, "autoscaling": {"prometheusUrl": "http://prom:9090"}})
    cached = {"redis": {"address": "redis.cache.svc:6379"}}
    allowed = policy("cache", allowedRedisAddresses=["redis.cache.svc:6379"])
    state = PlatformState(cluster_profiles=[PLATFORM], cluster_policies=[limits, allowed])
    deterministic = {**MODEL, "deterministic": True}
    served = spec_of(state, {"model": deterministic, "runtime": {"cache": cached}})
    assert served.runtime.cache is not None and served.runtime.cache.redis is not None
    collector = "http://otel.observability:4318/v1/traces"
    traced = policy("traces", allowedTracingEndpoints=[collector])
    state = PlatformState(cluster_profiles=[PLATFORM], cluster_policies=[limits, traced])
    tracing = {"tracing": {"otlpEndpoint": collector}}
    assert spec_of(state, {"model": MODEL, "runtime": tracing}).runtime.tracing is not None


def test_a_namespace_policy_narrows_the_cluster_policy_and_never_widens_it() -> None:
    cluster = policy("cluster", maxReplicas=10, allowedImages=["registry.example.com/kiln/"])
    widen = policy("team", maxReplicas=100, allowedImages=["docker.io/"])
    state = PlatformState(
        cluster_profiles=[PLATFORM], cluster_policies=[cluster], namespace_policies=[widen]
    )
    result = effective_spec(
        "mlp",
        {"model": MODEL, "autoscaling": {"maxReplicas": 20}, "runtime": {"image": "docker.io/x"}},
        state,
    )
    message = result.message or ""
    assert (
        "ClusterInferencePolicy cluster: spec.autoscaling.maxReplicas 20 exceeds maxReplicas 10"
        in message
    )
    assert "ClusterInferencePolicy cluster: spec.runtime.image 'docker.io/x'" in message
    narrow = policy("team", maxReplicas=4)
    narrowed = PlatformState(
        cluster_profiles=[PLATFORM], cluster_policies=[cluster], namespace_policies=[narrow]
    )
    result = effective_spec("mlp", {"model": MODEL}, narrowed)
    assert "InferencePolicy team: spec.autoscaling.maxReplicas 8 exceeds maxReplicas 4" in (
        result.message or ""
    )


def test_a_tenant_cannot_point_the_operator_at_an_address_the_platform_did_not_allow() -> None:
    state = PlatformState(
        cluster_profiles=[PLATFORM], operator_prometheus_url="http://prometheus.monitoring:9090"
    )
    for url in (
        "http://169.254.169.254/latest",
        "http://kube-apiserver:6443",
        "http://prometheus.monitoring:9090.evil.example",
    ):
        result = effective_spec(
            "mlp", {"model": MODEL, "autoscaling": {"prometheusUrl": url}}, state
        )
        assert result.reason == constants.REASON_POLICY_VIOLATION, url
        assert "is not an endpoint the platform allows" in (result.message or "")
    own = {"model": MODEL, "autoscaling": {"prometheusUrl": "http://prometheus.monitoring:9090"}}
    assert spec_of(state, own).autoscaling.prometheus_url == "http://prometheus.monitoring:9090"
    assert spec_of(state, {"model": MODEL}).autoscaling.prometheus_url is None


def test_prometheus_urls_the_platform_set_are_allowed() -> None:
    team_url = {"model": MODEL, "autoscaling": {"prometheusUrl": "http://prom.team-a:9090/api"}}
    by_setting = PlatformState(
        cluster_profiles=[PLATFORM], allowed_prometheus_urls=("http://prom.team-a:9090",)
    )
    assert spec_of(by_setting, team_url)
    by_policy = PlatformState(
        cluster_profiles=[PLATFORM],
        cluster_policies=[policy("p", allowedPrometheusUrls=["http://prom.team-a"])],
    )
    assert spec_of(by_policy, team_url)
    in_profile = profile(
        "gpu",
        {
            **PLATFORM["spec"]["defaults"],
            "autoscaling": {"prometheusUrl": "http://prom.shared:9090"},
        },
        default=True,
    )
    assert spec_of(PlatformState(cluster_profiles=[in_profile]), {"model": MODEL})
    # a tenant's own InferencePolicy cannot allow an address on its own
    by_tenant = PlatformState(
        cluster_profiles=[PLATFORM],
        namespace_policies=[policy("mine", allowedPrometheusUrls=["http://prom.team-a:9090"])],
    )
    assert effective_spec("mlp", team_url, by_tenant).reason == constants.REASON_POLICY_VIOLATION
    # ... but it narrows what the platform allows
    narrowed = PlatformState(
        cluster_profiles=[PLATFORM],
        allowed_prometheus_urls=("http://prom.team-a:9090",),
        namespace_policies=[policy("mine", allowedPrometheusUrls=["http://prom.team-b:9090"])],
    )
    message = effective_spec("mlp", team_url, narrowed).message or ""
    assert "InferencePolicy mine: spec.autoscaling.prometheusUrl" in message
    assert "'http://prom.team-a:9090/api' is not in allowedPrometheusUrls" in message
    assert "is not in allowedPrometheusUrls ['http://prom.team-b:9090']" in message


def test_a_policy_that_does_not_parse_allows_nothing() -> None:
    broken = policy("old", maxReplicas=0)
    result = effective_spec(
        "mlp",
        {"model": MODEL},
        PlatformState(cluster_profiles=[PLATFORM], cluster_policies=[broken]),
    )
    assert result.reason == constants.REASON_POLICY_VIOLATION
    assert "ClusterInferencePolicy old does not parse" in (result.message or "")


@pytest.mark.parametrize(
    ("image", "prefix", "allowed"),
    [
        ("registry.example.com/kiln/runtime:1", "registry.example.com/kiln/", True),
        ("registry.example.com/kiln/runtime:1", "registry.example.com/kiln", True),
        ("registry.example.com/kiln-evil/runtime:1", "registry.example.com/kiln", False),
        ("kiln/runtime:dev", "kiln/runtime", True),
        ("kiln/runtime-debug:dev", "kiln/runtime", False),
        ("kiln/runtime@sha256:ab", "kiln/runtime", True),
    ],
)
def test_image_prefixes_match_at_a_boundary(image: str, prefix: str, allowed: bool) -> None:
    assert image_allowed(image, prefix) is allowed


@pytest.mark.parametrize(
    ("url", "entry", "allowed"),
    [
        ("http://prom:9090", "http://prom:9090", True),
        ("http://prom:9090/api/v1", "http://prom:9090", True),
        ("http://prom:9091", "http://prom:9090", False),
        ("http://prom:9091", "http://prom", True),
        ("https://prom:9090", "http://prom:9090", False),
        ("http://prom.evil:9090", "http://prom:9090", False),
        ("http://user@prom:9090", "http://prom:9090", False),
        ("http://prom:9090/other", "http://prom:9090/tenant", False),
        ("http://prom:9090/tenant/x", "http://prom:9090/tenant", True),
        ("http://prom:notaport", "http://prom", False),
    ],
)
def test_prometheus_allow_list_entries(url: str, entry: str, allowed: bool) -> None:
    assert url_allowed(url, entry) is allowed


def test_resolution_never_changes_its_inputs() -> None:
    spec = {"model": MODEL}
    before = repr((spec, PLATFORM, TEAM))
    assert isinstance(resolve(spec, [PLATFORM], [TEAM]), Resolved)
    assert repr((spec, PLATFORM, TEAM)) == before
    assert not isinstance(resolve(None, [], []), Unresolved)


def test_the_platform_samples_resolve_the_five_line_service_within_the_limits() -> None:
    """manifests/samples/platform/ (docs/platform.md): the model owner's service names only its
    model; the rest comes from the team's and the platform's profiles, within both policies."""
    folder = REPO / "manifests" / "samples" / "platform"
    loaded = {path.stem: yaml.safe_load(path.read_text()) for path in folder.glob("*.yaml")}
    assert set(loaded) == {
        "cluster-profile", "team-profile", "cluster-policy", "team-policy", "service",
    }  # fmt: skip
    state = PlatformState(
        cluster_profiles=[loaded["cluster-profile"]],
        namespace_profiles=[loaded["team-profile"]],
        cluster_policies=[loaded["cluster-policy"]],
        namespace_policies=[loaded["team-policy"]],
    )
    spec = spec_of(state, loaded["service"]["spec"])
    assert spec.runtime.image == "registry.example.com/kiln/runtime:0.1"
    assert (spec.runtime.batching.max_batch_size, spec.slo.p99_latency_milliseconds) == (8, 40)
    assert spec.autoscaling.max_replicas == 8 and spec.resources.gpu_count == 1
    assert list(loaded["service"]["spec"]) == ["model"]


def test_scale_to_zero_within_the_policy_runs_with_the_profiles_idle_window() -> None:
    defaults = PLATFORM["spec"]["defaults"]
    zero_profile = profile(
        "sparse",
        {**defaults, "autoscaling": {"minReplicas": 0, "scaleToZero": {"idleSeconds": 3600}}},
        default=True,
    )
    limits = policy("zero", allowScaleToZero=True, minScaleToZeroIdleSeconds=1800)
    state = PlatformState(cluster_profiles=[zero_profile], cluster_policies=[limits])
    served = spec_of(state, {"model": MODEL})
    assert served.autoscaling.min_replicas == 0
    assert served.autoscaling.scale_to_zero.idle_seconds == 3600
    # A namespace's policy narrows: a longer shortest window refuses the profile's.
    narrow = policy("team", minScaleToZeroIdleSeconds=7200)
    state = PlatformState(
        cluster_profiles=[zero_profile], cluster_policies=[limits], namespace_policies=[narrow]
    )
    result = effective_spec("mlp", {"model": MODEL}, state)
    assert result.reason == constants.REASON_POLICY_VIOLATION
    assert "InferencePolicy team: spec.autoscaling.scaleToZero.idleSeconds 3600" in (
        result.message or ""
    )
    # minReplicas 1 keeps a replica: the zero rules do not apply to it.
    forbid = policy("nozero", allowScaleToZero=False)
    state = PlatformState(cluster_profiles=[zero_profile], cluster_policies=[forbid])
    assert spec_of(state, {"model": MODEL, "autoscaling": {"minReplicas": 1}})

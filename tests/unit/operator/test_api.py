"""The v1alpha1 models: samples parse, defaults are the documented ones, bad specs are refused
with a message that names the field, and the optimisations refused are the runtime's."""

import itertools
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from kiln_operator.api.v1alpha1 import InferenceService, InferenceServiceSpec
from kiln_operator.api.v1alpha1.model import ModelFormat
from kiln_operator.api.v1alpha1.runtime import GrpcLimitsSpec, HttpLimitsSpec, OptimizationSpec
from kiln_operator.api.validation import SpecError, parse_spec
from kiln_operator.builders import build_runtime_config
from kiln_runtime.config import FORMATS, MODES, PRECISIONS, ConfigError, parse_config
from kiln_runtime.execution_plan import plan_execution
from tests.unit.operator.conftest import (
    SAMPLES,
    corpus,
    expectation,
    load_sample,
    sample_spec,
)


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_sample_is_a_valid_inference_service(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    parsed = InferenceService.model_validate(manifest)
    assert parsed.kind == "InferenceService"
    result = parse_spec(manifest["metadata"]["name"], manifest["spec"])
    assert isinstance(result, InferenceServiceSpec), result


def test_minimal_sample_gets_the_documented_defaults() -> None:
    spec = sample_spec("minimal")
    assert spec.model.version == "1"
    assert spec.runtime.optimization.mode == "eager"
    assert spec.runtime.optimization.precision == "fp32"
    assert spec.runtime.batching.max_batch_size == 32
    assert spec.runtime.batching.max_queue_delay_microseconds == 2000
    assert spec.resources.gpu_count == 1
    assert spec.warmup.requests == 200
    assert spec.drain.termination_grace_period_seconds == 5 + 30 + 5
    assert spec.autoscaling.min_replicas == 1
    assert spec.prewarm.schedules == []


def test_model_name_defaults_to_the_service_name() -> None:
    assert sample_spec("minimal").model_name("mlp") == "mlp"
    assert sample_spec("full").model_name("anything") == "resnet50"


def test_pvc_uri_is_mounted_and_image_paths_are_used_as_they_are() -> None:
    full = sample_spec("full").model
    assert full.pvc_claim == "model-store"
    assert full.path_in_container("/models") == "/models/model-store/resnet50/model.pt2"
    minimal = sample_spec("minimal").model
    assert minimal.pvc_claim is None
    assert minimal.path_in_container("/models") == "/opt/models/mlp.pt"
    with_scheme = minimal.model_copy(update={"uri": "file:///opt/models/mlp.pt"})
    assert with_scheme.path_in_container("/models") == "/opt/models/mlp.pt"


def test_the_corpus_is_large_enough_and_covers_both_layers() -> None:
    assert len(corpus("schema")) + len(corpus("semantic")) >= 15
    assert len(corpus("schema")) >= 5
    assert len(corpus("semantic")) >= 5


@pytest.mark.parametrize("path", corpus("schema") + corpus("semantic"), ids=lambda p: p.name)
def test_every_bad_manifest_is_refused_naming_its_field(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    result = parse_spec(manifest["metadata"]["name"], manifest["spec"])
    assert isinstance(result, SpecError)
    assert expectation(path) in result.message


def with_optimization(
    model_format: str, gpu_count: int, **optimization: str | bool
) -> dict[str, Any]:
    """The minimal sample's spec with another model format, GPU count and optimization."""
    spec: dict[str, Any] = load_sample("minimal")["spec"]
    spec["model"]["format"] = model_format
    spec["resources"] = {"gpuCount": gpu_count}
    spec["runtime"]["optimization"] = optimization
    return spec


@pytest.mark.parametrize(
    ("spec", "field", "remedy"),
    [
        (
            with_optimization("onnx", 1, mode="compile"),
            "runtime.optimization.mode 'compile' is not available for model.format 'onnx'",
            "use 'eager'",
        ),
        (
            with_optimization("onnx", 1, precision="fp16"),
            "runtime.optimization.precision 'fp16' is not available for model.format 'onnx'",
            "use 'fp32'",
        ),
        (
            with_optimization("onnx", 1, cudaGraphs=True),
            "runtime.optimization.cudaGraphs is not available for model.format 'onnx'",
            "set it to false",
        ),
        (
            with_optimization("torchscript", 1, mode="compile"),
            "runtime.optimization.mode 'compile' needs model.format 'torch_export'",
            "use mode 'script' or 'eager'",
        ),
        (
            with_optimization("torch_export", 1, mode="script"),
            "runtime.optimization.mode 'script' needs model.format 'torchscript'",
            "use mode 'compile' or 'eager'",
        ),
        (
            with_optimization("torchscript", 1, precision="int8"),
            "runtime.optimization.precision 'int8' (dynamic quantization) is CPU only",
            "set resources.gpuCount to 0",
        ),
        (
            with_optimization("torch_export", 0, precision="int8"),
            "runtime.optimization.precision 'int8' (dynamic quantization) needs model.format "
            "'torchscript'",
            "use precision 'fp32', 'fp16' or 'bf16'",
        ),
    ],
    ids=[
        "onnx-not-eager",
        "onnx-not-fp32",
        "onnx-cuda-graphs",
        "compile-needs-torch-export",
        "script-needs-torchscript",
        "int8-on-a-gpu",
        "int8-needs-torchscript",
    ],
)
def test_optimizations_the_runtime_refuses_are_refused_naming_the_field(
    spec: dict[str, Any], field: str, remedy: str
) -> None:
    result = parse_spec("mlp", spec)
    assert isinstance(result, SpecError)
    assert result.problems[0].startswith(f"spec: {field}"), result.message
    assert remedy in result.message


@pytest.mark.parametrize(
    "spec",
    [
        with_optimization("torchscript", 1, mode="script", precision="fp16", cudaGraphs=True),
        with_optimization("torchscript", 0, mode="script", precision="int8"),
        with_optimization("torch_export", 1, mode="compile", precision="bf16", cudaGraphs=True),
        with_optimization("torch_export", 0, mode="eager", precision="fp16"),
        with_optimization("onnx", 1, mode="eager", precision="fp32"),
        with_optimization("onnx", 0),
    ],
    ids=[
        "torchscript-script-fp16-cuda-graphs",
        "torchscript-script-int8-cpu",
        "torch-export-compile-bf16-cuda-graphs",
        "torch-export-eager-fp16-cpu",
        "onnx-eager-fp32",
        "onnx-defaults-cpu",
    ],
)
def test_optimizations_the_runtime_runs_are_accepted(spec: dict[str, Any]) -> None:
    assert isinstance(parse_spec("mlp", spec), InferenceServiceSpec)


def test_every_unsupported_optimization_is_reported_at_once() -> None:
    spec = with_optimization("onnx", 1, mode="compile", precision="fp16", cudaGraphs=True)
    result = parse_spec("mlp", spec)
    assert isinstance(result, SpecError)
    for field in ("mode", "precision", "cudaGraphs"):
        assert f"runtime.optimization.{field} " in result.message


def runtime_starts(spec: dict[str, Any]) -> bool:
    """Whether the runtime's start-up check passes for this spec's model format and optimization,
    on the device the operator asks for (CUDA when gpuCount > 0) with a GPU visible as asked."""
    gpu = spec["resources"]["gpuCount"] > 0
    config = parse_config(
        {
            "model": {key: spec["model"][key] for key in ("format", "inputs", "outputs")},
            "optimization": {**spec["runtime"]["optimization"], "device": "cuda" if gpu else "cpu"},
        },
        model_name="mlp",
    )
    try:
        plan_execution(config, cuda_available=gpu)
    except ConfigError:
        return False
    return True


def test_the_api_refuses_exactly_the_optimizations_the_runtime_refuses() -> None:
    """Every combination of format, mode, precision, CUDA graphs and GPU: an accepted spec, as the
    operator renders it, starts; a refused one would crash-loop, except CUDA graphs without a
    GPU, which the runtime switches off but the API refuses as a mistake."""
    assert get_args(ModelFormat) == FORMATS
    assert get_args(OptimizationSpec.model_fields["mode"].annotation) == MODES
    assert get_args(OptimizationSpec.model_fields["precision"].annotation) == PRECISIONS
    disagreements = []
    for fmt, mode, precision, graphs, gpus in itertools.product(
        FORMATS, MODES, PRECISIONS, (False, True), (0, 1)
    ):
        spec = with_optimization(fmt, gpus, mode=mode, precision=precision, cudaGraphs=graphs)
        result = parse_spec("mlp", spec)
        if isinstance(result, InferenceServiceSpec):
            rendered = build_runtime_config(result, "mlp")
            try:
                plan_execution(parse_config(rendered), cuda_available=gpus > 0)
            except ConfigError as error:
                disagreements.append(f"accepted, runtime refuses: {spec} ({error})")
        elif runtime_starts(spec) and not (graphs and gpus == 0):
            disagreements.append(f"refused, runtime starts: {spec} ({result.message})")
    assert disagreements == []


def test_with_imitated_gpus_every_accepted_gpu_spec_starts_without_cuda() -> None:
    """A GPU service's runtime demands CUDA, and fails on a node without it; where the platform
    declares its GPUs imitated, every GPU spec the API accepts starts on a CPU-only node."""
    refused_without_cuda, failures = 0, []
    for fmt, mode, precision, graphs in itertools.product(
        FORMATS, MODES, PRECISIONS, (False, True)
    ):
        spec = with_optimization(fmt, 1, mode=mode, precision=precision, cudaGraphs=graphs)
        result = parse_spec("mlp", spec)
        if not isinstance(result, InferenceServiceSpec):
            continue
        with pytest.raises(ConfigError, match="no CUDA device is visible"):
            plan_execution(parse_config(build_runtime_config(result, "mlp")), cuda_available=False)
        refused_without_cuda += 1
        imitated = build_runtime_config(result, "mlp", imitated_gpus=True)
        try:
            plan = plan_execution(parse_config(imitated), cuda_available=False)
        except ConfigError as error:
            failures.append(f"{spec['model']['format']} {spec['runtime']['optimization']}: {error}")
            continue
        assert plan.device == "cpu" and not plan.cuda_graphs
    assert refused_without_cuda > 0
    assert failures == []


def test_several_problems_are_all_reported() -> None:
    spec = load_sample("full")["spec"]
    spec["autoscaling"]["minReplicas"] = 20
    spec["prewarm"]["schedules"][0]["timeZone"] = "Nowhere/Atlantis"
    result = parse_spec("resnet50", spec)
    assert isinstance(result, SpecError)
    assert any(p.startswith("spec.autoscaling: minReplicas (20)") for p in result.problems)
    assert any(p.startswith("spec.prewarm.schedules[0].timeZone:") for p in result.problems)


def test_a_missing_spec_is_an_error_not_a_crash() -> None:
    result = parse_spec("mlp", None)
    assert isinstance(result, SpecError)
    assert "spec.model: Field required" in result.message


def test_a_valid_spec_parses() -> None:
    result = parse_spec("mlp", load_sample("minimal")["spec"])
    assert isinstance(result, InferenceServiceSpec)


@pytest.mark.parametrize(
    ("name", "valid"),
    [("mlp", True), ("a" * 63, True), ("a" * 64, False), ("mlp.v2", False), ("1mlp", False)],
)
def test_the_name_must_be_usable_as_a_service_name(name: str, valid: bool) -> None:
    result = parse_spec(name, load_sample("minimal")["spec"])
    assert isinstance(result, InferenceServiceSpec) is valid


def test_models_are_immutable() -> None:
    spec = sample_spec("minimal")
    with pytest.raises(ValueError, match="frozen"):
        spec.runtime.image = "other"  # type: ignore[misc]


def spec_with_limits(limits: dict[str, Any]) -> InferenceServiceSpec:
    document = load_sample("minimal")["spec"]
    document["runtime"] = {**document["runtime"], "limits": limits}
    result = parse_spec("mlp", document)
    assert isinstance(result, InferenceServiceSpec), result
    return result


def test_limits_left_out_render_no_section() -> None:
    config = build_runtime_config(spec_with_limits({}), "mlp")
    assert "http" not in config and "http2" not in config  # the runtime's defaults


def test_limits_set_reach_the_runtime_which_accepts_them() -> None:
    limits = {
        "http": {"maxConnections": 10, "healthConnections": 0, "headerTimeoutSeconds": 5},
        "grpc": {"maxConnections": 20, "healthConnections": 2, "resetsPerSecond": 50},
    }
    config = build_runtime_config(spec_with_limits(limits), "mlp")
    assert config["http"] == limits["http"]  # only what is set
    assert config["http2"] == limits["grpc"]
    parsed = parse_config(config)
    assert (parsed.http.max_connections, parsed.http.health_connections) == (10, 0)
    assert parsed.http.header_timeout_seconds == 5.0
    assert (parsed.http2.max_connections, parsed.http2.health_connections) == (20, 2)
    assert parsed.http2.resets_per_second == 50.0


@pytest.mark.parametrize("bound", ["ge", "le"])
def test_every_limit_the_api_accepts_the_runtime_accepts(bound: str) -> None:
    """Each field at its lowest and at its highest bound: a spec the operator admits never
    crash-loops on a limit the runtime refuses."""
    parts: dict[str, dict[str, int]] = {}
    for part, model in (("http", HttpLimitsSpec), ("grpc", GrpcLimitsSpec)):
        values = {}
        for name, info in model.model_fields.items():
            (value,) = [getattr(m, bound) for m in info.metadata if hasattr(m, bound)]
            values[info.alias or name] = value
        parts[part] = values
    parts["grpc"]["processBufferBytes"] = max(  # its one cross-field rule
        parts["grpc"]["processBufferBytes"], parts["grpc"]["connectionBufferBytes"]
    )
    config = build_runtime_config(spec_with_limits(parts), "mlp")
    assert set(config["http"]) == set(parts["http"])
    parse_config(config)  # raises ConfigError on a refused value or an unknown key


def spec_with_cache(cache: dict[str, Any] | None, *, deterministic: bool = True) -> Any:
    document = load_sample("minimal")["spec"]
    document["model"] = {**document["model"], "deterministic": deterministic}
    if cache is not None:
        document["runtime"] = {**document["runtime"], "cache": cache}
    return parse_spec("mlp", document)


def test_no_cache_renders_no_section_and_a_model_is_not_deterministic_unless_said() -> None:
    spec = parse_spec("mlp", load_sample("minimal")["spec"])
    assert isinstance(spec, InferenceServiceSpec) and not spec.model.deterministic
    assert "cache" not in build_runtime_config(spec, "mlp")


def test_a_cache_needs_a_model_declared_deterministic() -> None:
    refused = spec_with_cache({}, deterministic=False)
    assert isinstance(refused, SpecError)
    assert "model.deterministic" in str(refused)


def test_the_cache_reaches_the_runtime_keyed_by_the_service() -> None:
    cache = {
        "maxBytes": 1 << 20, "ttlSeconds": 30, "maxEntryBytes": 4096,
        "redis": {"address": "redis.cache.svc:6379", "secretName": "redis-mlp",
                  "timeoutMilliseconds": 5},
    }  # fmt: skip
    spec = spec_with_cache(cache)
    assert isinstance(spec, InferenceServiceSpec), spec
    config = build_runtime_config(spec, "mlp", namespace="team-a")
    parsed = parse_config(config)
    assert parsed.cache is not None and parsed.cache.redis is not None
    assert parsed.cache.key_prefix == "kiln:team-a/mlp:"
    assert (parsed.cache.max_bytes, parsed.cache.ttl_seconds) == (1 << 20, 30.0)
    assert parsed.cache.max_entry_bytes == 4096
    assert (parsed.cache.redis.host, parsed.cache.redis.port) == ("redis.cache.svc", 6379)
    assert parsed.cache.redis.timeout_seconds == 0.005


@pytest.mark.parametrize("bound", ["ge", "le"])
def test_every_cache_setting_the_api_accepts_the_runtime_accepts(bound: str) -> None:
    from kiln_operator.api.v1alpha1.runtime import RedisCacheSpec, ResponseCacheSpec

    def values(model: Any) -> dict[str, Any]:
        found = {}
        for name, info in model.model_fields.items():
            bounds = [getattr(m, bound) for m in info.metadata if hasattr(m, bound)]
            if bounds and info.annotation is int:
                found[info.alias or name] = bounds[0]
        return found

    cache = values(ResponseCacheSpec)
    cache["maxEntryBytes"] = min(cache["maxEntryBytes"], cache["maxBytes"])
    cache["redis"] = {"address": "[::1]:6379", **values(RedisCacheSpec)}
    spec = spec_with_cache(cache)
    assert isinstance(spec, InferenceServiceSpec), spec
    parse_config(build_runtime_config(spec, "mlp", namespace="ns"))

"""The v1alpha1 models: samples parse, defaults are the documented ones, bad specs are refused
with a message that names the field."""

from pathlib import Path

import pytest
import yaml

from kiln_operator.api.v1alpha1 import InferenceService, InferenceServiceSpec
from kiln_operator.api.validation import SpecError, parse_spec
from tests.unit.operator.conftest import INVALID_SPECS, SAMPLES, load_sample, sample_spec


def corpus(layer: str) -> list[Path]:
    return sorted(INVALID_SPECS.glob(f"{layer}-*.yaml"))


def expectation(path: Path) -> str:
    return next(
        line.removeprefix("# expect: ").strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect: ")
    )


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_sample_is_a_valid_inference_service(path: Path) -> None:
    parsed = InferenceService.model_validate(yaml.safe_load(path.read_text()))
    assert parsed.kind == "InferenceService"


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
    assert full.path_in_container("/models") == "/models/model-store/resnet50/model.onnx"
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

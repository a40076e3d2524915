"""The generated CRD: pinned by the committed file, structural, and self-describing."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kiln_operator.api import crdgen
from kiln_operator.api.v1alpha1 import InferenceServiceStatus
from tests.unit.operator.conftest import REPO

CRDS = REPO / "crds"


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def version() -> dict[str, Any]:
    versions: list[dict[str, Any]] = crdgen.build_crd()["spec"]["versions"]
    return versions[0]


def test_committed_crds_are_what_the_models_generate() -> None:
    assert (CRDS / crdgen.CRD_FILE_NAME).read_text() == crdgen.render_crd()
    assert sorted(p.name for p in CRDS.iterdir()) == sorted(
        [crdgen.CRD_FILE_NAME, crdgen.KUSTOMIZATION]
        + [crdgen.peering_crd_file_name(scope) for scope in crdgen.PEERING_KINDS]
        + [crdgen.platform_crd_file_name(kind) for kind in crdgen.PLATFORM_KINDS]
    )
    for scope in crdgen.PEERING_KINDS:
        assert (CRDS / crdgen.peering_crd_file_name(scope)).read_text() == (
            crdgen.render_peering_crd(scope)
        )
    for kind in crdgen.PLATFORM_KINDS:
        assert (CRDS / crdgen.platform_crd_file_name(kind)).read_text() == (
            crdgen.render_platform_crd(kind)
        )


def test_crdgen_writes_every_file(tmp_path: Path) -> None:
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / crdgen.CRD_FILE_NAME).read_text() == crdgen.render_crd()
    kinds = {
        yaml.safe_load((tmp_path / crdgen.peering_crd_file_name(scope)).read_text())["spec"][
            "names"
        ]["kind"]
        for scope in crdgen.PEERING_KINDS
    }
    assert kinds == {"ClusterKopfPeering", "KopfPeering"}
    listed = yaml.safe_load((tmp_path / crdgen.KUSTOMIZATION).read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in tmp_path.iterdir() if p.name != crdgen.KUSTOMIZATION
    )
    assert len(listed) == 7


def platform_schemas() -> list[dict[str, Any]]:
    return [
        crdgen.build_platform_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for kind in crdgen.PLATFORM_KINDS
    ]


def test_every_field_has_a_description() -> None:
    for schema in [version()["schema"]["openAPIV3Schema"], *platform_schemas()]:
        undocumented = [
            path
            for path, node in walk(schema)
            if path
            and path != ".metadata"
            and not path.endswith(("[]", "{}"))
            and not node.get("description")
        ]
        assert undocumented == []


def test_the_schema_is_structural() -> None:
    for path, node in (
        pair
        for schema in [version()["schema"]["openAPIV3Schema"], *platform_schemas()]
        for pair in walk(schema)
    ):
        assert "$ref" not in node, path
        assert "anyOf" not in node, path
        assert "allOf" not in node, path
        assert "title" not in node, path
        assert "type" in node, path
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_optional_fields_are_nullable_and_required_ones_required() -> None:
    spec = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["required"]) == {"model"}  # runtime and slo may come from a profile
    assert "required" not in spec["properties"]["runtime"]  # nor runtime.image
    assert "required" not in spec["properties"]["slo"]
    model = spec["properties"]["model"]
    assert model["properties"]["name"]["nullable"] is True
    assert set(model["required"]) == {"uri", "format", "inputs", "outputs"}


def test_a_profile_offers_the_spec_parts_it_fills_with_their_bounds() -> None:
    profile = crdgen.build_platform_crd("ClusterInferenceProfile")
    assert profile["spec"]["scope"] == "Cluster"
    schema = profile["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    defaults = schema["properties"]["spec"]["properties"]["defaults"]["properties"]
    assert set(defaults) == {
        "runtime", "resources", "warmup", "slo", "autoscaling", "prewarm", "drain", "pod", "route",
    }  # fmt: skip
    assert "schedules" not in defaults["prewarm"]["properties"]
    batch = defaults["runtime"]["properties"]["batching"]["properties"]["maxBatchSize"]
    assert (batch["minimum"], batch["maximum"], batch.get("default")) == (1, 4096, None)
    policy = crdgen.build_platform_crd("InferencePolicy")
    assert policy["spec"]["scope"] == "Namespaced"
    columns = [c["name"] for c in policy["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:3] == ["GPUs/Pod", "GPUs/Service", "Max-Replicas"]


def test_scalar_defaults_are_published_and_object_defaults_are_not() -> None:
    spec = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    batching = spec["runtime"]["properties"]["batching"]
    assert batching["properties"]["maxBatchSize"]["default"] == 32
    assert "default" not in batching
    assert "default" not in spec["resources"]


def test_an_unwritten_status_defaults_to_an_unobserved_generation() -> None:
    """The API server drops status on create but defaults what it reads from storage: a new
    object shows observedGeneration 0, behind its generation, so kstatus reads InProgress."""
    status = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["default"] == {"observedGeneration": 0}
    assert set(status["default"]) <= set(status["properties"])  # kept by pruning
    parsed = InferenceServiceStatus.model_validate(status["default"])
    assert parsed.observed_generation == 0 and parsed.conditions == []


def test_tensor_lists_and_conditions_are_keyed_by_name_and_type() -> None:
    schema = version()["schema"]["openAPIV3Schema"]["properties"]
    inputs = schema["spec"]["properties"]["model"]["properties"]["inputs"]
    assert inputs["x-kubernetes-list-type"] == "map"
    assert inputs["x-kubernetes-list-map-keys"] == ["name"]
    conditions = schema["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_names_subresources_and_printer_columns() -> None:
    crd = crdgen.build_crd()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["kis"]
    assert "isvc" not in names["shortNames"]
    subresources = version()["subresources"]
    assert subresources["status"] == {}
    assert subresources["scale"]["labelSelectorPath"] == ".status.selector"
    columns = [column["name"] for column in version()["additionalPrinterColumns"]]
    assert columns == [
        *("Ready", "Replicas", "Warm", "P99", "Queue"),
        *("Canary", "Step", "Share", "Verdict", "URL", "Age"),
    ]


def test_printer_columns_point_at_fields_that_exist() -> None:
    status = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in version()["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if not path.startswith(".status.") or "[?" in path:
            continue
        node = status
        for part in path.removeprefix(".status.").split("."):
            node = node["properties"][part]
        assert node["type"] in ("integer", "number", "string"), path


KUBERNETES_TYPED = (
    "spec.pod.affinity",
    "spec.pod.topologySpreadConstraints",
    "spec.pod.env",
    "spec.pod.imagePullSecrets",
)
"""Fields of Kubernetes' own types (api/v1alpha1/kube.py): the reference shows each with an
example and points to Kubernetes' documentation (and `kubectl explain`) for their fields."""


def test_the_api_reference_documents_every_field() -> None:
    reference = (REPO / "docs" / "api.md").read_text()
    root = version()["schema"]["openAPIV3Schema"]["properties"]
    assert [field for field in KUBERNETES_TYPED if f"`{field}`" not in reference] == []
    missing = [
        f"{part}{path}"
        for part in ("spec", "status")
        for path, node in walk(root[part])
        if path
        and not path.endswith(("[]", "{}"))
        and not f"{part}{path}".startswith(tuple(f"{t}." for t in KUBERNETES_TYPED))
        and not f"{part}{path}".startswith(tuple(f"{t}[]" for t in KUBERNETES_TYPED))
        and node.get("type") != "object"
        and f"`{part}{path}`" not in reference
        and f"`{part}{path}[]`" not in reference
    ]
    assert missing == []


def test_the_api_reference_names_every_printer_column_in_order() -> None:
    reference = (REPO / "docs" / "api.md").read_text()
    start = reference.index("`kubectl get kis` prints ")
    sentence = " ".join(reference[start : reference.index(".", start)].split())
    columns = [column["name"] for column in version()["additionalPrinterColumns"]]
    found = [sentence.find(f" {name}") for name in columns]
    assert -1 not in found, f"{sentence!r} lacks a column of {columns}"
    assert found == sorted(found), sentence


def test_what_explain_says_needs_a_gpu_is_refused_without_one() -> None:
    """`kubectl explain` must not claim a GPU is needed for what validation accepts with
    gpuCount 0 (fp16 and bf16 run on the CPU too; int8 is the CPU-only one)."""
    import re

    from kiln_operator.api.v1alpha1 import InferenceServiceSpec

    spec = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    optimization = spec["properties"]["runtime"]["properties"]["optimization"]["properties"]
    precision = optimization["precision"]
    claimed = {
        value
        for group in re.findall(r"([\w/]+) needs? (?:a GPU|gpuCount > 0)", precision["description"])
        for value in group.split("/")
    }
    sample = yaml.safe_load((REPO / "manifests" / "samples" / "minimal.yaml").read_text())
    for value in precision["enum"]:
        document = sample["spec"] | {
            "resources": {**sample["spec"].get("resources", {}), "gpuCount": 0},
            "runtime": {
                **sample["spec"].get("runtime", {}),
                "optimization": {"precision": value},
            },
        }
        accepted = True
        try:
            InferenceServiceSpec.model_validate(document)
        except ValueError:
            accepted = False
        assert not (accepted and value in claimed), f"{value}: {precision['description']!r}"

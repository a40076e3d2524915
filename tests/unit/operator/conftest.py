"""Shared helpers for the operator's unit tests: samples, the invalid corpus, golden files."""

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_operator.api.v1alpha1 import InferenceServiceSpec

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SAMPLES = REPO / "manifests" / "samples"
INVALID_SPECS = HERE / "invalid_specs"
GOLDEN = HERE / "golden"
UPDATE_GOLDEN = os.environ.get("KILN_UPDATE_GOLDEN") == "1"
"""KILN_UPDATE_GOLDEN=1 rewrites the golden files instead of comparing (review the diff)."""


def load_sample(name: str) -> dict[str, Any]:
    """A sample manifest from manifests/samples/ as a dict."""
    loaded: dict[str, Any] = yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())
    return loaded


def sample_spec(name: str) -> InferenceServiceSpec:
    """A sample's spec, validated."""
    return InferenceServiceSpec.model_validate(load_sample(name)["spec"])


def assert_golden(name: str, manifest: Any) -> None:
    """`manifest` as YAML equals tests/unit/operator/golden/<name>."""
    text = yaml.safe_dump(manifest, sort_keys=True, width=100)
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.write_text(text)
    if not path.exists():
        pytest.fail(f"golden file {name} missing: run with KILN_UPDATE_GOLDEN=1 and review it")
    assert text == path.read_text(), f"{name} differs from its golden file"


def corpus(layer: str) -> list[Path]:
    """The invalid-spec manifests of one layer ("schema" or "semantic"), in name order."""
    return sorted(INVALID_SPECS.glob(f"{layer}-*.yaml"))


def expectation(path: Path) -> str:
    """The message an invalid manifest must produce (its `# expect:` line)."""
    return next(
        line.removeprefix("# expect: ").strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect: ")
    )

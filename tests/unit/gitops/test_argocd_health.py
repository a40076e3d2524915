"""Kiln's Argo CD health check (manifests/argocd/resource_customizations), run by Argo CD's own Lua
evaluation: the compiled Go test of e2e/gotools/argocdhealth imports Argo CD's util/lua, installs
health.lua as an argocd-cm override and checks every case of health_test.yaml."""

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.sessioncluster import REPO

CUSTOMIZATIONS = REPO / "manifests" / "argocd" / "resource_customizations"
CHECK = CUSTOMIZATIONS / "serving.kiln.dev" / "InferenceService"
PREFIX = "TestHealthScripts/serving.kiln.dev/InferenceService/"

pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)


@pytest.fixture(scope="module")
def argocd_health() -> Path:
    return go_tool("argocd-health")


def evaluate(binary: Path, customizations: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "-customizations", str(customizations), "-test.v", "-test.count=1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def cases() -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = yaml.safe_load((CHECK / "health_test.yaml").read_text())["tests"]
    return loaded


def test_every_case_passes_argo_cds_own_evaluation(argocd_health: Path) -> None:
    result = evaluate(argocd_health, CUSTOMIZATIONS)
    assert result.returncode == 0, result.stdout + result.stderr
    for case in cases():
        assert f"--- PASS: {PREFIX}{case['inputPath']}" in result.stdout


def test_the_cases_cover_each_health_and_every_testdata_file() -> None:
    by_status: dict[str, set[str]] = {}
    for case in cases():
        status = case["healthStatus"]["status"]
        by_status.setdefault(status, set()).add(Path(case["inputPath"]).stem)
    assert by_status == {
        "Progressing": {
            "new",
            "new-status-defaulted",
            "generation-not-observed",
            "ready-judged-for-old-generation",
            "rollout-in-progress",
            "first-pod-warming",
            "prewarm-floor-warming",
            "canary-progressing",
        },
        "Degraded": {
            "canary-rolled-back",
            "invalid-spec",
            "warmup-failed",
            "rollout-stalled",
            "rollout-stalled-new-pods",
        },
        "Healthy": {"healthy", "healthy-while-scaling-up", "scaled-to-zero"},
    }
    referenced = {case["inputPath"] for case in cases()}
    assert referenced == {f"testdata/{p.name}" for p in (CHECK / "testdata").iterdir()}


def test_a_wrong_expectation_fails_argo_cds_evaluation(argocd_health: Path, tmp_path: Path) -> None:
    copy = tmp_path / "resource_customizations"
    shutil.copytree(CUSTOMIZATIONS, copy)
    tests = copy / "serving.kiln.dev" / "InferenceService" / "health_test.yaml"
    document = yaml.safe_load(tests.read_text())
    (healthy,) = [c for c in document["tests"] if c["inputPath"] == "testdata/healthy.yaml"]
    healthy["healthStatus"]["status"] = "Progressing"
    tests.write_text(yaml.safe_dump(document))
    result = evaluate(argocd_health, copy)
    assert result.returncode != 0
    assert f"--- FAIL: {PREFIX}testdata/healthy.yaml" in result.stdout
    assert 'got "Healthy"' in result.stdout


def test_a_script_outside_argo_cds_sandbox_fails(argocd_health: Path, tmp_path: Path) -> None:
    """argocd-cm overrides run without Lua's string library: a check using it would not work."""
    copy = tmp_path / "resource_customizations"
    shutil.copytree(CUSTOMIZATIONS, copy)
    script = copy / "serving.kiln.dev" / "InferenceService" / "health.lua"
    script.write_text('return {status = "Healthy", message = string.format("%d", 1)}\n')
    result = evaluate(argocd_health, copy)
    assert result.returncode != 0
    assert "Argo CD got no health from the script" in result.stdout

"""Fixtures of the chart's tests: Helm, built once and run with its state out of the home."""

import pytest

from tests.gotools import go_tool


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`helm` with its state directories in a temporary place, not the user's home."""
    home = tmp_path_factory.mktemp("helm")
    binary = go_tool("helm")
    env = [f"HELM_{kind}_HOME={home / kind.lower()}" for kind in ("CACHE", "CONFIG", "DATA")]
    return ["env", *env, str(binary)]

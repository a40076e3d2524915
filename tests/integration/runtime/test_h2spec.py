"""h2spec, the HTTP/2 conformance suite, against a real runtime process's gRPC port.

Every case passes, in the default and the strict mode: none is excused. h2spec is built (pinned)
and cached by ``runtime_image/tools/go-tool.sh``.
"""

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sessioncluster import missing_component

from .conftest import ModelFactory
from .runtime_process import HOST, Runtime, running

pytestmark = pytest.mark.integration

GO_TOOL = Path(__file__).parents[3] / "runtime_image" / "tools" / "go-tool.sh"


@pytest.fixture(scope="module")
def h2spec() -> str:
    built = subprocess.run(
        ["bash", str(GO_TOOL), "h2spec"], check=False, capture_output=True, text=True, timeout=900
    )
    if built.returncode != 0:
        missing_component(f"h2spec could not be built: {built.stderr[-2000:]}")
    return built.stdout.strip()


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    with running(example_model("mlp"), tmp_path_factory.mktemp("logs")) as served:
        yield served


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_h2spec_passes_in_full(h2spec: str, runtime: Runtime, strict: bool) -> None:
    command = [h2spec, "-h", HOST, "-p", str(runtime.grpc_port), "-o", "2"]
    completed = subprocess.run(
        command + (["-S"] if strict else []),
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = re.search(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed", completed.stdout)
    assert summary is not None, completed.stdout[-3000:]
    tests, passed, skipped, failed = (int(n) for n in summary.groups())
    assert (failed, skipped) == (0, 0), completed.stdout[-6000:]
    assert passed == tests >= 145

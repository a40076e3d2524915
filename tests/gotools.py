"""The pinned Go tools and manifests the tests use — Helm, kstatus, Argo CD's own health
evaluation, Prometheus with Kubernetes discovery, the Gateway API's and the Prometheus Operator's
CRDs — and kubectl.

Why it exists: each is a pinned upstream program, built once through the Go module proxy and
cached outside the checkout (e2e/gotools/build.sh, e2e/cluster/binaries.sh); unit and integration
tests resolve them the same way. Without Go or the proxy a developer's run skips and CI fails
(`missing_component`), never a silent pass.
"""

import subprocess
from pathlib import Path

from tests.sessioncluster import REPO, missing_component

BUILD = REPO / "e2e" / "gotools" / "build.sh"
BUILD_TIMEOUT_SECONDS = 3000
"""The first build of Argo CD's module graph takes many minutes on two shared cores."""
FIRST_BUILD_TEST_TIMEOUT = BUILD_TIMEOUT_SECONDS + 300
"""pytest-timeout for a test whose fixture may do that first build."""


def _resolve(command: list[str], what: str) -> str:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        missing_component(f"{what}: not built within {BUILD_TIMEOUT_SECONDS} s")
        raise
    if result.returncode != 0:
        missing_component(f"{what} unavailable: {result.stderr.strip()[-1500:]}")
    return result.stdout.strip().splitlines()[-1]


def go_tool(name: str) -> Path:
    """The cached executable of `name` (helm, kstatus, argocd-health, jaeger), built if missing."""
    return Path(_resolve(["bash", str(BUILD), name], f"the Go tool {name}"))


def kubectl() -> Path:
    """The local cluster's pinned kubectl (its `kustomize` renders the kustomize base)."""
    directory = _resolve(["bash", str(REPO / "e2e" / "cluster" / "binaries.sh")], "kubectl")
    return Path(directory) / "kubectl"


def gateway_api_crds() -> Path:
    """The directory of the pinned Gateway API's standard-channel CRDs (e2e/gotools)."""
    return go_tool("gateway-api-crds")


def prometheus_operator_crds() -> Path:
    """The directory of the pinned Prometheus Operator's monitoring.coreos.com CRDs."""
    return go_tool("prometheus-operator-crds")


def discovering_prometheus() -> Path:
    """Prometheus built from its module with Kubernetes service discovery (Debian's has none)."""
    return go_tool("prometheus")

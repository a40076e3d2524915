"""The test session's one local cluster, shared by the e2e and integration tiers.

Why it exists: `make test` runs every tier in one pytest session, and only one real node can run
on a machine at a time (its bridge, its pod range and containerd's image store are
machine-wide). So both tiers use one cluster, started once: the control plane, kwok's fake GPU
nodes (for tests whose pods need no container: scheduling, reconciling, many objects) and the
real node (kubelet, containerd, kube-proxy) that runs Kiln's runtime image for tests that need a
server behind a pod. Tests choose where their pods go: the fake nodes carry the label
`type=kwok`, the real node is `kubernetes.io/hostname=kiln-node`.
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln_localcluster import node
from kiln_localcluster.cluster import ClusterInfo, ClusterOptions, LocalCluster

REPO = Path(__file__).resolve().parents[1]
STATE_DIR = REPO / ".kiln"
RUNTIME_IMAGE = os.environ.get("KILN_E2E_RUNTIME_IMAGE", "kiln/runtime:dev")
FAKE_NODES = {"type": "kwok"}
"""A node selector for kwok's fake GPU nodes: pods placed there run no container."""
REAL_NODE = {"kubernetes.io/hostname": node.NODE_NAME}
"""A node selector for the real node: pods placed there run Kiln's image under its kubelet."""


def missing_component(reason: str) -> None:
    """Skip for lack of `reason` on a developer's machine; fail in CI, which must run it all."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs every test: install what it needs)")
    pytest.skip(reason)


@dataclass(frozen=True)
class SessionCluster:
    local: LocalCluster
    info: ClusterInfo

    @property
    def has_real_node(self) -> bool:
        return self.local.options.real_node


def start() -> tuple[SessionCluster, bool]:
    """The cluster of this checkout, with the real node where this machine can run one; and
    whether this call started it (a cluster already running, e.g. `make cluster-up --real-node`,
    is reused and left running)."""
    local = LocalCluster(STATE_DIR, ClusterOptions(real_node=node.available() is None))
    reused = local.reusable() is not None
    return SessionCluster(local, local.up()), not reused


def provide_runtime_image(cluster: SessionCluster) -> None:
    """Kiln's runtime image, built from this checkout, imported into the real node's containerd.

    Built every session (Docker's layer cache makes an unchanged one quick): a stale image would
    test the operator of today against yesterday's runtime."""
    if not cluster.has_real_node:
        missing_component(node.available() or "the local cluster has no real node")
    subprocess.run(
        ["make", "image-runtime", f"RUNTIME_IMAGE={RUNTIME_IMAGE}"],
        cwd=REPO, check=True, timeout=1800,
    )  # fmt: skip
    cluster.local.import_image(RUNTIME_IMAGE)


def write_example_model(models: Path) -> Path:
    """The example MLP at `models/mlp/model.pt`, readable by the image's unprivileged user."""
    subprocess.run(
        [sys.executable, "-m", "kiln_runtime", "example-model", "--kind", "mlp",
         "--out", str(models / "mlp")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    for path in [models, *models.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return models

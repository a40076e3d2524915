"""Fixtures for integration tests: the real local control plane, a namespace per test.

The cluster is session-scoped: a cluster already running for this checkout (``make cluster-up``)
is reused and left running; otherwise one is started and stopped at the end of the session
(``KILN_KEEP_CLUSTER=1`` keeps it).
"""

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster.cluster import ClusterInfo, LocalCluster, kubectl
from kiln_localcluster.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Cluster:
    """A running local cluster, as the tests see it."""

    info: ClusterInfo

    @property
    def kubeconfig(self) -> Path:
        return Path(self.info.kubeconfig)

    @property
    def server(self) -> str:
        return self.info.server

    @property
    def bin_dir(self) -> Path:
        return Path(self.info.bin_dir)

    @property
    def audit_log(self) -> Path:
        return Path(self.info.audit_log)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return kubectl(self.info, *args, input=input, check=check)

    def get_json(self, *args: str) -> Any:
        """``kubectl get … -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    local = LocalCluster(REPO / ".kiln")
    info = local.info()
    started_here = info is None
    if info is None:
        info = local.up()
    yield Cluster(info)
    if started_here and not os.environ.get("KILN_KEEP_CLUSTER"):
        local.down()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default service account), deleted after the test."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=30,
        description=f"default service account in {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)

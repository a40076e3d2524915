"""Fixtures for integration tests: the real local control plane, a namespace per test.

The cluster is the session's one local cluster (``tests/sessioncluster.py``, shared with the
e2e tier): a cluster already running for this checkout (``make cluster-up``) is reused and left
running; otherwise one is started and stopped at the end of the session (``KILN_KEEP_CLUSTER=1``
keeps it). Its kwok GPU nodes take the pods that need no container; tests that need a server
behind a pod run Kiln's image on its real node.
"""

import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster import prometheus
from kiln_localcluster.cluster import ClusterInfo, kubectl
from kiln_localcluster.processes import stop
from kiln_localcluster.targets import targets_file
from kiln_localcluster.waiting import wait_for
from tests.sessioncluster import REPO, SessionCluster


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
def cluster(local_cluster: SessionCluster) -> Cluster:
    return Cluster(local_cluster.info)


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


@pytest.fixture
def start_prometheus(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], prometheus.LocalPrometheus]]:
    """Start a real Prometheus scraping the cluster's Kiln pods; each is stopped afterwards."""
    if (missing := prometheus.available()) is not None:
        pytest.fail(f"{missing}: run `make system-deps`")
    started: list[prometheus.LocalPrometheus] = []

    def start() -> prometheus.LocalPrometheus:
        instance = prometheus.start_prometheus(
            targets_file(REPO / ".kiln" / "cluster"), tmp_path_factory.mktemp("prometheus")
        )
        started.append(instance)
        return instance

    yield start
    for instance in started:
        stop(instance.process)

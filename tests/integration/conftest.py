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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster import podnet, prometheus
from kiln_localcluster.cluster import ClusterInfo, LocalCluster, kubectl
from kiln_localcluster.processes import stop
from kiln_localcluster.targets import targets_file
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


def missing_component(reason: str) -> None:
    """Skip for lack of `reason` on a developer's machine; fail in CI, which must run it all."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs every test: install what it needs)")
    pytest.skip(reason)


@pytest.fixture
def pod_network() -> None:
    """Tests whose pods run real processes need the pod runner's network namespaces (root)."""
    if (missing := podnet.available()) is not None:
        missing_component(missing)


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

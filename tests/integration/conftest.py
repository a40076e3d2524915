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
from kiln_localcluster.discovery import ServiceAccount, start_discovering_prometheus
from kiln_localcluster.processes import stop
from kiln_localcluster.waiting import wait_for
from tests.gotools import discovering_prometheus
from tests.sessioncluster import REPO, SessionCluster

PROMETHEUS_MANIFESTS = REPO / "manifests" / "prometheus"
SCRAPE_CONFIG = PROMETHEUS_MANIFESTS / "scrape-config.yaml"
"""The scrape configuration docs/prometheus.md ships for a Prometheus without its Operator."""
PROMETHEUS_ACCOUNT = ServiceAccount(namespace="monitoring", name="prometheus")
"""The ServiceAccount manifests/prometheus/rbac.yaml creates and binds."""


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


@pytest.fixture(scope="session")
def prometheus_account(cluster: Cluster) -> ServiceAccount:
    """manifests/prometheus/rbac.yaml applied as shipped (its namespace created first)."""
    namespace = PROMETHEUS_ACCOUNT.namespace
    if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", str(PROMETHEUS_MANIFESTS / "rbac.yaml"))
    return PROMETHEUS_ACCOUNT


@pytest.fixture
def start_prometheus(
    cluster: Cluster, prometheus_account: ServiceAccount, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], prometheus.LocalPrometheus]]:
    """Start a real Prometheus scraping the cluster's Kiln pods every second: it discovers them
    with the scrape configuration docs/prometheus.md ships and its own ServiceAccount's token,
    as a user's Prometheus does (kiln_localcluster.discovery); each is stopped afterwards."""
    binary = discovering_prometheus()
    started: list[prometheus.LocalPrometheus] = []

    def start() -> prometheus.LocalPrometheus:
        instance = start_discovering_prometheus(
            binary, cluster.info, prometheus_account, scrape_config_file=SCRAPE_CONFIG,
            directory=tmp_path_factory.mktemp("prometheus"),
        )  # fmt: skip
        started.append(instance)
        return instance

    yield start
    for instance in started:
        stop(instance.process)

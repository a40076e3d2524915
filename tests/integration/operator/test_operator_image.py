"""The operator image: built from operator/Dockerfile, run as a container against the local
cluster (host network, a kubeconfig mounted read-only), it reconciles an InferenceService.

kwok nodes run no containers, so the operator Deployment in manifests/ cannot run here; this is
the proof that the image itself works.
"""

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import apply, condition, gpu_service
from tests.sessioncluster import REPO

pytestmark = [pytest.mark.integration, pytest.mark.docker]

IMAGE = "kiln/operator:dev"


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def operator_image() -> str:
    if shutil.which("docker") is None or docker("info").returncode != 0:
        pytest.fail("no Docker engine answering: run `make docker-up`")
    # Always build: unchanged layers come from the cache, changed code never runs stale.
    subprocess.run(
        ["make", "image-operator", f"OPERATOR_IMAGE={IMAGE}"], cwd=REPO, check=True,
        timeout=1200, capture_output=True,
    )  # fmt: skip
    return IMAGE


@pytest.fixture
def operator_container(
    operator_image: str, kiln_crds: Cluster, namespace: str, tmp_path: Path
) -> Iterator[str]:
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copyfile(kiln_crds.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)  # the image runs as an unprivileged user
    name = f"kiln-operator-test-{uuid.uuid4().hex[:8]}"
    started = docker(
        "run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "-v", f"{kubeconfig}:/etc/kiln/kubeconfig:ro", "-e", "KUBECONFIG=/etc/kiln/kubeconfig",
        operator_image, "run", "--standalone", "--namespace", namespace,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        docker("rm", "-f", name)


def test_operator_container_reconciles_an_inferenceservice(
    cluster: Cluster, namespace: str, operator_container: str
) -> None:
    apply(cluster, namespace, gpu_service("from-image"))

    def reconciled() -> bool:
        found = cluster.kubectl("get", "deployment", "from-image", "-n", namespace, check=False)
        body = cluster.get_json("inferenceservice", "from-image", "-n", namespace)
        valid = condition(body, "SpecValid")
        return found.returncode == 0 and valid is not None and valid["status"] == "True"

    try:
        wait_for(reconciled, timeout=90, description="the containerised operator's reconcile")
    except TimeoutError:
        print(docker("logs", operator_container).stdout[-4000:])
        raise
    user = docker("exec", operator_container, "id", "-u").stdout.strip()
    assert user == "10001"

"""The real-node benchmarks' shared set-up: the local cluster with its real node, Kiln's runtime
image imported, the CRDs, the operator as a process of this machine (without Prometheus: replicas
change only when a benchmark says so), and the example MLP.

Why it exists: `bench_grpc_pinning` and `bench_cold_start` measure on the same kind of cluster
as the end-to-end suite (`tests/e2e/conftest.py`), outside pytest, each in one run.
"""

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln_localcluster.cluster import ClusterInfo, ClusterOptions, LocalCluster, kubectl
from kiln_localcluster.volumes import provision_claim
from kiln_localcluster.waiting import wait_for
from tests.sessioncluster import write_example_model

REPO = Path(__file__).resolve().parents[2]
STATE_DIR = REPO / ".kiln" / "e2e"
IMAGE = "kiln/runtime:dev"


@dataclass(frozen=True)
class BenchCluster:
    info: ClusterInfo
    models: Path
    """A directory holding the example MLP at `mlp/model.pt`, readable by the image's user."""

    def namespace_with_models(self, namespace: str) -> None:
        """A namespace enforcing Pod Security `restricted`, with the claim `models`."""
        kubectl(self.info, "create", "namespace", namespace)
        kubectl(self.info, "label", "namespace", namespace,
                "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
        provision_claim(self.info, namespace, "models", self.models)


@contextlib.contextmanager
def bench_cluster(name: str) -> Iterator[BenchCluster]:
    """Start it all (the image built from this checkout first); stop it all afterwards."""
    subprocess.run(["make", "image-runtime", f"RUNTIME_IMAGE={IMAGE}"], cwd=REPO, check=True)
    local = LocalCluster(STATE_DIR, ClusterOptions(nodes=0, real_node=True))
    local.down()
    info = local.up()
    operator: subprocess.Popen[bytes] | None = None
    try:
        local.import_image(IMAGE)
        kubectl(info, "apply", "-k", str(REPO / "crds"))
        # `kubectl wait` fails outright while the new CRD has no conditions yet: poll instead.
        wait_for(lambda: kubectl(info, "get", "crd/inferenceservices.serving.kiln.dev", "-o",
                                 "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                                 check=False).stdout.strip() == "True",
                 timeout=60, description="the InferenceService CRD established")  # fmt: skip
        models = write_example_model(STATE_DIR / "models" / name)
        with (STATE_DIR / f"bench-{name}-operator.log").open("wb") as log:
            operator = subprocess.Popen(
                [sys.executable, "-m", "kiln_operator", "run", "--standalone"],
                env={**os.environ, "KUBECONFIG": info.kubeconfig, "KILN_IMITATED_GPUS": "true"},
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        yield BenchCluster(info, models)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        local.down()

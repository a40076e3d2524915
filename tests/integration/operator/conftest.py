"""Fixtures for the operator's integration tests: CRDs installed, an operator process per test
(bound to the test's namespace, so tests and other engineers' runs never share one), the audit
log as the write counter, and helpers to apply InferenceServices."""

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster.volumes import provision_claim
from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.sessioncluster import (
    FAKE_NODES,
    REAL_NODE,
    REPO,
    RUNTIME_IMAGE,
    SessionCluster,
    write_example_model,
)

SAMPLES = REPO / "manifests" / "samples"
OPERATOR_AGENTS = ("kiln-operator", "kopf")
"""User agents of the operator's own clients and of kopf's client: their writes are the
operator's writes in the audit log."""
RECONCILE_AGENTS = ("kiln-operator/reconcile", "kopf")
"""The reconcile loop's client, and kopf's (its handled-state annotations): the writes of the
reconcile loop, without those of the autoscaler and the warm-up gate."""
WATCHED = {"inferenceservices", "deployments", "services", "poddisruptionbudgets"}


KILN_CRDS = (
    "inferenceservices.serving.kiln.dev", "clusterinferenceprofiles.serving.kiln.dev",
    "inferenceprofiles.serving.kiln.dev", "clusterinferencepolicies.serving.kiln.dev",
    "inferencepolicies.serving.kiln.dev", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev",
)  # fmt: skip


def install_crds(cluster: Cluster) -> None:
    """Apply the generated CRDs and wait until each is established. `kubectl wait` fails at
    once on a CRD created a moment ago whose status the API server has not written yet, so it
    is retried."""
    cluster.kubectl("apply", "-k", str(REPO / "crds"))
    crds = [f"crd/{name}" for name in KILN_CRDS]
    wait_for(
        lambda: (
            cluster.kubectl(
                "wait", "--for=condition=Established", "--timeout=10s", *crds, check=False
            ).returncode
            == 0
        ),
        timeout=60,
        description="Kiln's CRDs established",
    )


@pytest.fixture(scope="session")
def kiln_crds(cluster: Cluster) -> Cluster:
    """The generated CRDs, installed and established."""
    install_crds(cluster)
    return cluster


RECONCILE_ONLY = """
import logging, os, sys
import kopf
from kiln_operator.handlers import inferenceservice  # registers the reconcile loop only
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
namespaces = sys.argv[1:]
kopf.run(standalone=True, clusterwide=False, namespaces=namespaces,
         liveness_endpoint=os.environ.get("KILN_LIVENESS") or None,
         memo=kopf.Memo(namespaces=namespaces))
"""
"""The operator with only the reconcile loop's handlers (for measuring that loop alone)."""


class OperatorProcess:
    """One `python -m kiln_operator run` process; stopped by its own PID only."""

    def __init__(
        self,
        cluster: Cluster,
        log: Path,
        namespaces: list[str],
        *,
        standalone: bool = True,
        priority: int | None = None,
        kubeconfig: Path | None = None,
        resync_seconds: float = 3,
        liveness: str | None = None,
        reconcile_only: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = log
        if reconcile_only:  # the reconcile loop's handlers, without the autoscaler and warm-up
            args = [sys.executable, "-c", RECONCILE_ONLY, *namespaces]
        else:
            args = [sys.executable, "-m", "kiln_operator", "run"]
            args += ["--standalone"] if standalone else []
            args += ["--priority", str(priority)] if priority is not None else []
            for namespace in namespaces:
                args += ["--namespace", namespace]
            args += ["--liveness", liveness] if liveness else []
        environment = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or cluster.kubeconfig),
            "KILN_RESYNC_SECONDS": str(resync_seconds),
            "KILN_PEERING_LIFETIME_SECONDS": "10",
            "KILN_LIVENESS": liveness or "",
            # the tests' Prometheus servers listen on loopback, each on its own port
            "KILN_ALLOWED_PROMETHEUS_URLS": "http://127.0.0.1",
            # as the operator's image sets it (operator/Dockerfile)
            "MALLOC_ARENA_MAX": "2",
            # The real node advertises GPUs it does not have: GPU services' runtimes run on its
            # CPU (the fake nodes' pods run nothing, so the setting changes nothing for them).
            "KILN_IMITATED_GPUS": "true",
            **(env or {}),
        }
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        self._log_file = log.open("w")
        self.process = subprocess.Popen(
            args, env=environment, stdout=self._log_file, stderr=subprocess.STDOUT, cwd=REPO
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        """SIGKILL: no clean-up, as when a node dies."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log_file.close()


@pytest.fixture
def start_operator(kiln_crds: Cluster) -> Iterator[Any]:
    """Start operator processes; every one started is stopped after the test.

    Their logs live in a directory of their own, not under pytest's basetemp: concurrent pytest
    sessions on one machine rotate old basetemps away, even while a test still writes to them.
    """
    started: list[OperatorProcess] = []
    logs = Path(tempfile.mkdtemp(prefix="kiln-operator-logs-"))

    def start(namespaces: list[str], **options: Any) -> OperatorProcess:
        process = OperatorProcess(
            kiln_crds, logs / f"operator-{len(started)}.log", namespaces, **options
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    # Captured: pytest shows a fixture's teardown output with a failed test's report only.
    for log in sorted(logs.glob("*.log")):
        print(f"--- last lines of {log.name}", *log.read_text().splitlines()[-60:], sep="\n")
    shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture
def operator(start_operator: Any, namespace: str) -> OperatorProcess:
    """A standalone operator serving only this test's namespace."""
    process: OperatorProcess = start_operator([namespace])
    return process


class AuditLog:
    """The API server's audit log of write requests, read from a mark onwards."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size

    def operator_writes(
        self, since: int, namespace: str, agents: tuple[str, ...] = OPERATOR_AGENTS
    ) -> list[str]:
        """'verb resource/name' of every write the operator (or, with `agents`, the part of it
        with those user agents) made in the namespace since."""
        with self.path.open("rb") as log:
            log.seek(since)
            lines = log.read().decode().splitlines()
        writes = []
        for line in lines:
            if not line.strip():
                continue
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            if (
                entry.get("userAgent", "").startswith(agents)
                and ref.get("namespace") == namespace
                and ref.get("resource") in WATCHED
            ):
                sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
                writes.append(f"{entry['verb']} {ref['resource']}{sub}/{ref.get('name', '')}")
        return writes

    def wait_quiet(
        self,
        namespace: str,
        seconds: float,
        timeout: float,
        agents: tuple[str, ...] = OPERATOR_AGENTS,
    ) -> None:
        """Wait until the operator has made no write in the namespace for `seconds` in a row."""

        def quiet() -> bool:
            mark = self.mark()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if self.operator_writes(mark, namespace, agents):
                    return False
                time.sleep(0.5)
            return True

        wait_for(quiet, timeout=timeout, interval=0, description="no operator writes for a while")


@pytest.fixture
def audit(cluster: Cluster) -> AuditLog:
    return AuditLog(cluster.audit_log)


def sample(name: str, service_name: str, **spec_updates: Any) -> dict[str, Any]:
    """A sample InferenceService renamed, with top-level spec parts replaced."""
    manifest: dict[str, Any] = yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())
    manifest = copy.deepcopy(manifest)
    manifest["metadata"] = {"name": service_name}
    manifest["spec"].update(spec_updates)
    return manifest


def on_fake_nodes(manifest: dict[str, Any]) -> dict[str, Any]:
    """The service's pods placed on kwok's fake GPU nodes only, never on the real node: they
    run no container there."""
    resources = dict(manifest["spec"].get("resources") or {})
    resources["nodeSelector"] = {**FAKE_NODES, **resources.get("nodeSelector", {})}
    manifest["spec"]["resources"] = resources
    return manifest


def gpu_service(service_name: str, **spec_updates: Any) -> dict[str, Any]:
    """The minimal sample: one GPU per pod, on the fake GPU nodes. Without the warm-up gate
    unless `warmup` is given: no runtime answers behind kwok's pods, and the gate has tests of
    its own (`mlp_service`, on the real node)."""
    return on_fake_nodes(
        sample("minimal", service_name, **{"warmup": {"requests": 0}, **spec_updates})
    )


def pending_service(service_name: str, **spec_updates: Any) -> dict[str, Any]:
    """The CPU sample (gpuCount 0), held to the fake GPU nodes, whose GPU taint it does not
    tolerate: its pods stay Pending. For tests of many objects: no container runs for them."""
    return on_fake_nodes(sample("cpu-test", service_name, **spec_updates))


def apply(
    cluster: Cluster, namespace: str, manifest: dict[str, Any], check: bool = True
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=check
    )


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def getter(cluster: Cluster, namespace: str, kind: str, name: str) -> Callable[[], Any]:
    """A predicate for wait_for: the object, or None while it does not exist."""
    return lambda: get(cluster, namespace, kind, name)


def condition(body: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    if body is None:
        return None
    return next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == kind),
        None,
    )


def wait_condition(
    cluster: Cluster,
    namespace: str,
    *,
    name: str,
    kind: str,
    status: str,
    reason: str | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    def holds() -> dict[str, Any] | None:
        found = condition(get(cluster, namespace, "inferenceservice", name), kind)
        if found and found["status"] == status and (reason is None or found["reason"] == reason):
            return found
        return None

    result: dict[str, Any] = wait_for(
        holds, timeout=timeout, description=f"{name}: {kind}={status} ({reason or 'any reason'})"
    )
    return result


# --- a real model behind the pods: Kiln's image on the real node ---------------------------------


@pytest.fixture(scope="session")
def model_dir(real_node: SessionCluster) -> Path:
    """The example MLP written once per session (mlp/model.pt + config.json), readable by the
    runtime image's user; the real node's kubelet mounts it from the claim `models`."""
    return write_example_model(REPO / ".kiln" / "models" / "integration")


def mlp_service(name: str, **warmup: Any) -> dict[str, Any]:
    """The example MLP from the claim `models` on the real node, in Kiln's runtime image: one
    (imitated) GPU per pod, a CPU share small enough for three pods on the node, a generous
    warm-up bound."""
    return sample(
        "minimal",
        name,
        resources={"gpuCount": 1, "cpu": "300m", "memory": "1Gi", "nodeSelector": REAL_NODE},
        runtime={"image": RUNTIME_IMAGE, "imagePullPolicy": "Never"},
        model={
            "uri": "pvc://models/mlp/model.pt",
            "format": "torchscript",
            "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
            "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
        },
        # The bound is generous: these tests check the gate, not the speed of a shared CPU.
        warmup={
            "requests": 64,
            "concurrency": 8,
            "timeoutSeconds": 60,
            "retries": 0,
            "p99Milliseconds": 5000,
            **warmup,
        },
    )


@pytest.fixture
def models_claim(cluster: Cluster, namespace: str, model_dir: Path) -> str:
    """The claim `models` in the test's namespace, bound to the example model's directory (a
    real volume for the real node's kubelet)."""
    provision_claim(cluster.info, namespace, "models", model_dir)
    return "models"

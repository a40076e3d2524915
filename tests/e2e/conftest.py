"""The end-to-end suite's cluster: any kubeconfig, or the local cluster with a real node.

Why it exists: the integration tier checks each part against a real control plane; this suite
checks what a user's cluster does with Kiln's output — the runtime image under a real kubelet,
the generated pod spec under Pod Security `restricted`, traffic through a Service's cluster IP.

- `KILN_E2E_KUBECONFIG` set: that cluster is used as it is (Kiln's CRD and operator installed,
  e.g. by `e2e/kind.sh`; the runtime image `KILN_E2E_RUNTIME_IMAGE` loaded on its nodes, with the
  example model at `KILN_E2E_MODEL_URI`); Services are reached through `kubectl port-forward`.
- Otherwise the suite uses the session's one local cluster (`tests/sessioncluster.py`, shared
  with the integration tier): the control plane, its real node (containerd, kubelet,
  kube-proxy) with the runtime image imported, and kwok's fake GPU nodes, which this suite's
  pods never reach (they are CPU services, untolerated by the fake nodes' GPU taint, or say
  where they go). The CRDs are installed and the operator runs as a process of this machine,
  serving every namespace while this suite runs and stopped after it, so that the integration
  tier's own operators are alone afterwards.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster.cluster import LocalCluster, resolve_binaries
from kiln_localcluster.volumes import provision_claim
from kiln_localcluster.waiting import wait_for
from tests.sessioncluster import REPO, SessionCluster, write_example_model

STATE_DIR = REPO / ".kiln" / "e2e"
"""This suite's files on the local cluster (models, the operator's log, a bucket's data)."""
EXTERNAL_MODEL_URI = os.environ.get("KILN_E2E_MODEL_URI", "")
"""On a cluster of the user's: the example MLP's path inside the runtime image (`e2e/kind.sh`
bakes it in), since the suite cannot write to that cluster's nodes."""
RUNTIME_UID = 10001


@dataclass
class E2ECluster:
    """A cluster the suite drives with kubectl; `local` when it is this machine's."""

    kubeconfig: Path
    kubectl_path: Path
    local: LocalCluster | None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def _start_operator(
    cluster: E2ECluster, log: Path, prometheus: str, extra_env: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "KILN_RESYNC_SECONDS": "5",
        "KILN_PROMETHEUS_URL": prometheus,
        # The real node advertises GPUs it does not have: GPU services' runtimes run on its CPU.
        "KILN_IMITATED_GPUS": "true",
        **extra_env,
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kiln_operator", "run", "--standalone"],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip


def namespace_state(cluster: E2ECluster, namespace: str) -> str:
    """What a failed test's namespace holds, for its report: pods with their containers'
    states, the namespace's events, the InferenceServices' conditions, the containers' last log
    lines and the operator's; the reasons an e2e failure shows nothing of otherwise."""
    parts: list[str] = []
    for args in (
        ("get", "pods,deployments,services,endpointslices", "-o", "wide"),
        ("get", "inferenceservices", "-o",
         "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions}{\"\\n\"}{end}"),
        ("get", "events", "--sort-by=.lastTimestamp"),
        ("get", "pods", "-o",
         "jsonpath={range .items[*]}{.metadata.name} on {.spec.nodeName}: "
         "init {.status.initContainerStatuses[*].state} "
         "containers {.status.containerStatuses[*].state} "
         "conditions {.status.conditions}{\"\\n\"}{end}"),
    ):  # fmt: skip
        result = cluster.kubectl(*args, "-n", namespace, check=False, timeout=20)
        parts.append(f"$ kubectl {' '.join(args[:2])}\n{result.stdout}{result.stderr}")
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False, timeout=20)
    for pod in pods.stdout.split():
        logs = cluster.kubectl(
            "logs", "-n", namespace, pod, "--all-containers", "--prefix", "--tail=30",
            check=False, timeout=20,
        )  # fmt: skip
        parts.append(f"$ kubectl logs {pod}\n{logs.stdout}{logs.stderr}")
    log = STATE_DIR / "operator.log"
    if cluster.local is not None and log.exists():
        tail = log.read_text(errors="replace").splitlines()[-40:]
        parts.append("operator log, last lines:\n" + "\n".join(tail))
    return "\n".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that had a namespace reports what the namespace held when it failed."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    if report.when != "call" or not report.failed or "namespace" not in funcargs:
        return report
    try:
        state = namespace_state(funcargs["cluster"], funcargs["namespace"])
    except Exception as error:  # the report must not hide the test's own failure
        state = f"could not read the namespace's state: {error!r}"
    report.sections.append(("namespace state at failure", state))
    return report


def install_crds(cluster: E2ECluster) -> None:
    """Kiln's CRDs applied, and waited for until the API serves InferenceServices."""
    cluster.kubectl("apply", "-k", str(REPO / "crds"))
    # `kubectl wait` fails outright while a new CRD has no conditions yet: poll instead
    wait_for(
        lambda: cluster.kubectl(
            "get", "crd/inferenceservices.serving.kiln.dev", "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False,
        ).stdout.strip() == "True",
        timeout=60, description="the InferenceService CRD established",
    )  # fmt: skip


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> E2ECluster:
    external = os.environ.get("KILN_E2E_KUBECONFIG")
    # Resolved only when not given: resolving builds the local cluster's binaries where they
    # are not cached, which a kind user (e2e/kind.sh) does not need.
    given = os.environ.get("KILN_E2E_KUBECTL")
    kubectl_path = Path(given) if given else resolve_binaries() / "kubectl"
    if external:
        return E2ECluster(Path(external), kubectl_path, local=None)
    session: SessionCluster = request.getfixturevalue("real_node")
    cluster = E2ECluster(Path(session.info.kubeconfig), kubectl_path, local=session.local)
    install_crds(cluster)
    return cluster


class HostOperator:
    """The operator as a process of this machine (the local cluster), stopped while a test runs
    its own operator in the cluster (`paused`): two operators must never serve one namespace."""

    def __init__(
        self,
        cluster: E2ECluster,
        log: Path,
        prometheus: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self._cluster, self._log, self._prometheus = cluster, log, prometheus
        self._extra_env = dict(extra_env or {})
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = _start_operator(self._cluster, self._log, self._prometheus, self._extra_env)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.stop()
        try:
            yield
        finally:
            self.start()


@pytest.fixture(scope="package")
def operator(cluster: E2ECluster) -> Iterator[HostOperator | None]:
    """On the local cluster, Kiln's operator serving every namespace for as long as this suite
    runs (on a user's cluster, the operator installed there: None)."""
    if cluster.local is None:
        yield None
        return
    info = cluster.local.recorded_info()
    assert info is not None
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    host = HostOperator(cluster, STATE_DIR / "operator.log", info.prometheus)
    host.start()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def namespace(
    cluster: E2ECluster, operator: HostOperator | None, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace that enforces Pod Security `restricted`, deleted afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl(
        "label", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        timeout=30,
        description=f"default service account in {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@dataclass(frozen=True)
class Model:
    """Where the example MLP is: its URI in the spec, and the claim holding it (if any)."""

    uri: str
    claim: str | None


@pytest.fixture
def model(cluster: E2ECluster, namespace: str) -> Model:
    """The example MLP; on the local cluster on a claim `models` bound to a real volume (a
    directory of the node, mounted read-only by the kubelet)."""
    if cluster.local is None:
        if not EXTERNAL_MODEL_URI:
            pytest.fail("KILN_E2E_KUBECONFIG needs KILN_E2E_MODEL_URI (see e2e/kind.sh)")
        return Model(uri=EXTERNAL_MODEL_URI, claim=None)
    models = write_example_model(STATE_DIR / "models" / namespace)
    info = cluster.local.recorded_info()
    assert info is not None
    provision_claim(info, namespace, "models", models)
    return Model(uri="pvc://models/mlp/model.pt", claim="models")


@contextlib.contextmanager
def service_address(cluster: E2ECluster, namespace: str, name: str) -> Iterator[dict[int, str]]:
    """`host:port` for each of the Service's ports: its cluster IP on the local cluster (through
    kube-proxy), a `kubectl port-forward` elsewhere (a user's host seldom routes cluster IPs)."""
    service = cluster.get_json("service", name, "-n", namespace)
    ports = [p["port"] for p in service["spec"]["ports"]]
    if cluster.local is not None:
        yield {port: f"{service['spec']['clusterIP']}:{port}" for port in ports}
        return
    forward = subprocess.Popen(
        [str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", "port-forward",
         "-n", namespace, f"service/{name}", *(f":{port}" for port in ports)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        local: dict[int, str] = {}
        while len(local) < len(ports):
            line = forward.stdout.readline()
            if not line:
                raise AssertionError("kubectl port-forward ended before forwarding")
            if match := re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)", line):
                local[int(match.group(2))] = f"127.0.0.1:{match.group(1)}"
        yield local
    finally:
        forward.terminate()
        forward.wait(timeout=10)

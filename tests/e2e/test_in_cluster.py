"""Kiln installed as a platform team installs it: the operator as two pods on the real node,
installed by the README's own `helm install`, with the chart's ServiceAccount and RBAC only.

Why it exists: every other test runs the operator as a process of this machine with an admin
kubeconfig. Here it runs in the cluster — in-cluster credentials, the chart's ClusterRole, kopf's
peering between two replicas, Pod Security `restricted`, the webhook reached by the API server
through its Service with the chart's own CA bundle — and a whole user path runs against it:
apply → warm-up gate → Ready → load through the cluster IP → scale up and down → delete, with
nothing left. Then what the ServiceAccount may do is compared with the committed list
(manifests/operator-rights.txt), the webhook is timed with every operator pod gone, and
`helm uninstall` is shown to leave every InferenceService serving. Before all that, Kiln is
installed once with `kubectl apply -k` (the kustomize manifests) and serves an InferenceService.
The upgrade and rollback of a serving release are tests/e2e/test_upgrade.py.

The local cluster relays the API server and Prometheus to the real node's bridge address
(kiln_localcluster.relay), as a cluster's network gives pods their API server; the chart's
values for this cluster are in e2e/cluster/kiln-values.yaml (the image imported, not pulled).
The operator process the rest of the suite uses is stopped while this module runs: two
operators must never serve one namespace.
"""

import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster import node
from kiln_localcluster.waiting import wait_for
from tests.e2e.conftest import E2ECluster, HostOperator, Model, service_address
from tests.e2e.test_real_node import (
    GATE,
    GRPC,
    HTTP,
    infer_grpc,
    infer_http,
    inference_service,
    runtime_pods,
)
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.sessioncluster import REPO, missing_component

pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)

SYSTEM = "kiln-system"
RELEASE = "kiln"
OPERATOR = "kiln-operator"
"""The chart's name for every object of the release `kiln` (Deployment, ServiceAccount, RBAC)."""
SERVICE_ACCOUNT = f"system:serviceaccount:{SYSTEM}:{OPERATOR}"
IMAGE = "kiln/operator:e2e"
"""The operator image under the tag e2e/cluster/kiln-values.yaml names."""
LOCAL_VALUES = "e2e/cluster/kiln-values.yaml"
INSTALL = (
    f"kubectl create namespace {SYSTEM}",
    f"kubectl label namespace {SYSTEM} pod-security.kubernetes.io/enforce=restricted",
    "kubectl apply --server-side --force-conflicts -f manifests/charts/kiln/crds/",
    f"helm install {RELEASE} manifests/charts/kiln -n {SYSTEM} --set webhook.enabled=true"
    " --set prometheus.url=http://prometheus-operated.monitoring.svc:9090",
)
"""The README's install, word for word (test_the_readme_shows_these_commands)."""
UNINSTALL = (f"helm uninstall {RELEASE} -n {SYSTEM}", "bash manifests/uninstall-crds.sh")
"""The README's uninstall, word for word."""
KUSTOMIZE_OVERLAY = "e2e/cluster/kustomize/"
"""manifests/ with the local cluster's image tag, pull policy and node (as kiln-values.yaml)."""
KUSTOMIZE_INSTALL = f"kubectl apply -k {KUSTOMIZE_OVERLAY}"
"""The README's kustomize install as the test runs it (the README shows `manifests/`, and this
overlay as a user's example)."""
RIGHTS = REPO / "manifests" / "operator-rights.txt"
DENIED = 'admission webhook "validate.inferenceservices.serving.kiln.dev" denied the request'
MIN_ABOVE_MAX = "spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"
WEBHOOK_TIMEOUT_SECONDS = 5
RESUMED, PAUSED = "Resuming operations after the pause", "Pausing operations in favour of"
LOAD_CALLS = 200
"""Calls through the cluster IP per protocol: bounded in count, and each in time (5 s)."""
CHILD_KINDS = "deployments,replicasets,pods,services,poddisruptionbudgets,endpointslices"


class Tools:
    """kubectl and helm as the README's commands run them: from the repository's root."""

    def __init__(self, cluster: E2ECluster, helm: Path, home: Path) -> None:
        self.cluster = cluster
        self.binaries = {"kubectl": str(cluster.kubectl_path), "helm": str(helm)}
        self.env = {
            **os.environ,
            # the README's scripts call `kubectl`: the cluster's pinned one
            "PATH": f"{cluster.kubectl_path.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig),
            **{
                f"HELM_{kind}_HOME": str(home / kind.lower())
                for kind in ("CACHE", "CONFIG", "DATA")
            },
        }

    def run(
        self,
        command: str,
        *extra: str,
        input: str | None = None,
        check: bool = True,
        cwd: Path = REPO,
    ) -> subprocess.CompletedProcess[str]:
        """One README command (its first word resolved to the pinned binary), plus `extra`, run
        from the root of this checkout (or of another tree of the repository: `cwd`)."""
        argv = shlex.split(command)
        argv[0] = self.binaries.get(argv[0], argv[0])
        result = subprocess.run(
            [*argv, *extra], cwd=cwd, env=self.env, input=input, capture_output=True,
            text=True, timeout=300, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"{command} failed:\n{result.stdout}{result.stderr}")
        return result


def operator_pods(cluster: E2ECluster) -> list[dict[str, Any]]:
    listing = cluster.get_json("pods", "-n", SYSTEM, "-l", f"app.kubernetes.io/name={OPERATOR}")
    return [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_operator_ready(cluster: E2ECluster) -> None:
    try:
        wait_for(
            lambda: len(pods := operator_pods(cluster)) == 2 and all(ready(p) for p in pods),
            timeout=120, interval=1, description="2 operator pods Ready",
        )  # fmt: skip
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{operator_state(cluster)}") from error


def operator_state(cluster: E2ECluster) -> str:
    """The operator pods as `kubectl describe` shows them, and their last log lines."""
    parts = [cluster.kubectl("describe", "pods", "-n", SYSTEM, check=False).stdout[-6000:]]
    for pod, log in operator_logs(cluster).items():
        parts.append(f"$ kubectl logs {pod}\n" + "\n".join(log.splitlines()[-30:]))
    return "\n".join(parts)


def operator_logs(cluster: E2ECluster) -> dict[str, str]:
    return {
        pod["metadata"]["name"]: cluster.kubectl(
            "logs", "-n", SYSTEM, pod["metadata"]["name"], check=False
        ).stdout
        for pod in operator_pods(cluster)
    }


def acting(log: str) -> bool:
    """Whether the replica's last peering decision was to act."""
    decisions = [line for line in log.splitlines() if RESUMED in line or PAUSED in line]
    return bool(decisions) and RESUMED in decisions[-1]


@pytest.fixture(scope="module")
def tools(
    cluster: E2ECluster, operator: HostOperator | None, tmp_path_factory: pytest.TempPathFactory
) -> Tools:
    """kubectl and helm for the README's commands, this checkout's operator image built and
    imported into the node; `kiln-system` not there yet."""
    if cluster.local is None or operator is None:
        missing_component("the operator image is imported into the local cluster's node")
        raise AssertionError("unreachable")
    tools = Tools(cluster, go_tool("helm"), tmp_path_factory.mktemp("helm"))
    subprocess.run(
        ["make", "image-operator", f"OPERATOR_IMAGE={IMAGE}"], cwd=REPO, check=True,
        timeout=1200, capture_output=True,
    )  # fmt: skip
    cluster.local.import_image(IMAGE)
    if cluster.kubectl("get", "namespace", SYSTEM, check=False).returncode == 0:
        pytest.fail(f"namespace {SYSTEM} exists already (from another test?): delete it first")
    return tools


def test_kubectl_apply_k_installs_operator_pods_that_serve_an_inferenceservice(
    cluster: E2ECluster, tools: Tools, operator: HostOperator, namespace: str, model: Model
) -> None:
    """The kustomize install (manifests/, through the local cluster's overlay): the operator's
    two pods Ready, one InferenceService served to Ready; then everything but the CRDs removed
    (the rest of the suite's InferenceServices need them), before the Helm install below."""
    rendered = list(yaml.safe_load_all(tools.run(f"kubectl kustomize {KUSTOMIZE_OVERLAY}").stdout))
    installed = [o for o in rendered if o and o["kind"] != "CustomResourceDefinition"]
    with operator.paused():
        try:
            started = time.monotonic()
            applied = tools.run(KUSTOMIZE_INSTALL)
            print(f"\n$ {KUSTOMIZE_INSTALL}\n{applied.stdout}")
            wait_operator_ready(cluster)
            pods_ready = time.monotonic() - started
            name = "mlp"
            spec = yaml.safe_load(inference_service(name, model))
            spec["spec"]["resources"] = {"gpuCount": 0, "cpu": "300m", "memory": "1Gi"}
            started = time.monotonic()
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(spec))
            cluster.kubectl(
                "wait", "-n", namespace, "--for=condition=Ready", f"inferenceservice/{name}",
                "--timeout=240s", timeout=250,
            )  # fmt: skip
            to_ready = time.monotonic() - started
            with service_address(cluster, namespace, name) as address:
                assert infer_http(address[HTTP]).shape == (1, 10)
            for pod in operator_pods(cluster):
                assert pod["spec"]["serviceAccountName"] == OPERATOR
                assert image_of(pod) == IMAGE
            cluster.kubectl("delete", "inferenceservice", name, "-n", namespace, "--wait=true")
        finally:
            cluster.kubectl(
                "delete", "--ignore-not-found", "--wait=true", "-f", "-",
                input=yaml.safe_dump_all(installed), check=False, timeout=180,
            )  # fmt: skip
    print(
        f"kubectl apply -k -> 2 operator pods Ready {pods_ready:.1f} s; an InferenceService"
        f" applied -> Ready {to_ready:.1f} s, answered through its cluster IP"
    )


def image_of(pod: dict[str, Any]) -> str:
    (container,) = pod["spec"]["containers"]
    image: str = container["image"]
    return image


@pytest.fixture(scope="module")
def kiln(cluster: E2ECluster, tools: Tools, operator: HostOperator) -> Iterator[Tools]:
    """Kiln installed by the README's commands into `kiln-system`, the suite's own operator
    stopped meanwhile; uninstalled and its namespace deleted afterwards."""
    assert cluster.local is not None
    prometheus = cluster.local.pod_prometheus_url()
    if cluster.kubectl("get", "namespace", SYSTEM, check=False).returncode == 0:
        pytest.fail(f"namespace {SYSTEM} exists already (from another test?): delete it first")
    with operator.paused():
        try:
            started = time.monotonic()
            for command in INSTALL[:-1]:
                print(f"\n$ {command}\n{tools.run(command).stdout}", end="")
            installed = tools.run(
                INSTALL[-1], "-f", LOCAL_VALUES, "--set", f"prometheus.url={prometheus}"
            )
            print(f"$ {INSTALL[-1]}\n{installed.stdout}", end="")
            wait_operator_ready(cluster)
            print(f"\nhelm install -> 2 operator pods Ready: {time.monotonic() - started:.1f} s")
            yield tools
        finally:
            tools.run(UNINSTALL[0], "--wait", check=False)
            cluster.kubectl("delete", "namespace", SYSTEM, "--wait=true", check=False, timeout=120)


def test_the_operator_runs_as_two_restricted_pods_one_acting(
    cluster: E2ECluster, kiln: Tools
) -> None:
    pods = operator_pods(cluster)
    assert len(pods) == 2
    for pod in pods:
        spec = pod["spec"]
        assert spec["serviceAccountName"] == OPERATOR
        assert spec["nodeName"] == node.NODE_NAME
        (container,) = spec["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}
        assert "memory" in container["resources"]["limits"]
        # in a namespace that enforces `restricted`: admitted means compliant
    labels = cluster.get_json("namespace", SYSTEM)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    wait_for(
        lambda: sum(acting(log) for log in operator_logs(cluster).values()) == 1,
        timeout=90, interval=2, description="exactly one peered replica acting",
    )  # fmt: skip


def test_an_inferenceservice_from_apply_to_delete_against_the_in_cluster_operator(
    cluster: E2ECluster, kiln: Tools, namespace: str, model: Model
) -> None:
    name = "mlp"
    spec = yaml.safe_load(inference_service(name, model))
    spec["spec"]["resources"] = {"gpuCount": 0, "cpu": "300m", "memory": "1Gi"}
    spec["spec"]["slo"] = {"p99LatencyMilliseconds": 250}
    spec["spec"]["autoscaling"] = {
        "minReplicas": 1, "maxReplicas": 2,
        "evaluationIntervalSeconds": 5, "metricsWindowSeconds": 15,
        "scaleDown": {"stabilizationSeconds": 15, "periodSeconds": 0, "maxStepReplicas": 1},
    }  # fmt: skip
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(spec))
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", f"inferenceservice/{name}",
        "--timeout=240s", timeout=250,
    )  # fmt: skip
    to_ready = time.monotonic() - started
    (pod,) = runtime_pods(cluster, namespace)
    gate = next(c for c in pod["status"]["conditions"] if c["type"] == GATE)
    assert gate["status"] == "True", gate

    failures: list[str] = []
    load_started = time.monotonic()
    with service_address(cluster, namespace, name) as address:
        for call, target in ((infer_http, address[HTTP]), (infer_grpc, address[GRPC])):
            for _ in range(LOAD_CALLS):
                try:
                    assert call(target).shape == (1, 10)
                except Exception as error:  # every failure is the test's finding
                    failures.append(f"{type(error).__name__}: {error}")
    load_seconds = time.monotonic() - load_started
    assert failures == [], failures[:5]

    def pods_ready(count: int) -> bool:
        pods = runtime_pods(cluster, namespace)
        return len(pods) == count and all(ready(p) for p in pods)

    scale_started = time.monotonic()
    cluster.kubectl(
        "patch", "inferenceservice", name, "-n", namespace, "--type=merge",
        "-p", '{"spec": {"autoscaling": {"minReplicas": 2}}}',
    )  # fmt: skip
    wait_for(lambda: pods_ready(2), timeout=240, interval=1, description="scaled up to 2")
    up_seconds = time.monotonic() - scale_started
    scale_started = time.monotonic()
    cluster.kubectl(
        "patch", "inferenceservice", name, "-n", namespace, "--type=merge",
        "-p", '{"spec": {"autoscaling": {"minReplicas": 1}}}',
    )  # fmt: skip
    wait_for(lambda: pods_ready(1), timeout=180, interval=1, description="scaled down to 1")
    down_seconds = time.monotonic() - scale_started
    reasons = {e["reason"] for e in cluster.get_json("events", "-n", namespace)["items"]}
    assert {"ScaledUp", "ScaledDown"} <= reasons, reasons

    cluster.kubectl("delete", "inferenceservice", name, "-n", namespace, "--wait=true")
    wait_for(
        lambda: cluster.kubectl("get", CHILD_KINDS, "-n", namespace, "-o", "name").stdout == "",
        timeout=120, interval=1, description="every child of the InferenceService gone",
    )  # fmt: skip
    for pod_name, log in operator_logs(cluster).items():
        assert "Forbidden" not in log and " 403" not in log, (pod_name, log[-3000:])
    print(
        f"\nin-cluster operator: apply -> Ready {to_ready:.1f} s; {2 * LOAD_CALLS} calls through"
        f" the cluster IP in {load_seconds:.1f} s, 0 failed; 1 -> 2 Ready {up_seconds:.1f} s;"
        f" 2 -> 1 {down_seconds:.1f} s; deleted, nothing left"
    )


def committed_rights() -> set[tuple[str, str]]:
    """manifests/operator-rights.txt: `resource verbs` per line (comments say why)."""
    rights = set()
    for line in RIGHTS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            resource, verbs = line.split()
            rights.add((resource, verbs))
    return rights


def listed_rights(cluster: E2ECluster, namespace: str) -> set[tuple[str, str]]:
    """`kubectl auth can-i --list` as the operator's ServiceAccount in `namespace`, as
    `resource verbs` pairs (a non-resource URL as `url:<path>`; verbs sorted, comma-joined)."""
    text = cluster.kubectl(
        "auth", "can-i", "--list", f"--as={SERVICE_ACCOUNT}", "-n", namespace
    ).stdout
    rights = set()
    for line in text.splitlines()[1:]:
        match = re.match(r"^(\S*)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$", line)
        assert match is not None, line
        resource, urls, names, verbs = match.groups()
        assert names == "", line  # no right is limited to named objects
        verb_list = ",".join(sorted(verbs.split()))
        if resource:
            rights.add((resource, verb_list))
        for url in urls.split():
            rights.add((f"url:{url}", verb_list))
    return rights


def test_the_service_accounts_rights_are_the_committed_list(
    cluster: E2ECluster, kiln: Tools, namespace: str
) -> None:
    committed = committed_rights()
    for where in (SYSTEM, namespace, "default"):
        assert listed_rights(cluster, where) == committed, where
    # Cluster-wide: every namespaced right holds in all namespaces at once (the watches), and
    # Secrets are out of reach everywhere.
    for resource, verb in (
        ("inferenceservices.serving.kiln.dev", "watch"), ("pods", "patch"),
        ("deployments.apps", "update"), ("clusterkopfpeerings.kopf.dev", "patch"),
    ):  # fmt: skip
        assert (
            cluster.kubectl(
                "auth", "can-i", verb, resource, "--all-namespaces", f"--as={SERVICE_ACCOUNT}"
            ).stdout.strip()
            == "yes"
        ), (verb, resource)
    for verb in ("get", "list", "watch"):
        refused = cluster.kubectl(
            "auth", "can-i", verb, "secrets", "--all-namespaces", f"--as={SERVICE_ACCOUNT}",
            check=False,
        )  # fmt: skip
        assert refused.stdout.strip() == "no", verb


def invalid_service(name: str, model: Model) -> str:
    body = yaml.safe_load(inference_service(name, model))
    body["spec"]["autoscaling"] = {"minReplicas": 5, "maxReplicas": 2}
    return yaml.safe_dump(body)


def test_the_webhook_refuses_through_its_service_and_admits_once_every_operator_pod_is_gone(
    cluster: E2ECluster, kiln: Tools, namespace: str, model: Model
) -> None:
    configuration = cluster.get_json("validatingwebhookconfiguration", OPERATOR)
    (webhook,) = configuration["webhooks"]
    assert webhook["clientConfig"]["service"]["name"] == f"{OPERATOR}-webhook"
    assert "url" not in webhook["clientConfig"]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] == WEBHOOK_TIMEOUT_SECONDS

    manifest = invalid_service("refused", model)
    started = time.monotonic()
    refused = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
    refused_seconds = time.monotonic() - started
    assert refused.returncode != 0 and DENIED in refused.stderr, refused.stderr
    assert MIN_ABOVE_MAX in refused.stderr, refused.stderr
    assert (
        cluster.kubectl(
            "get", "inferenceservice", "refused", "-n", namespace, check=False
        ).returncode
        != 0
    )

    cluster.kubectl("scale", "deployment", OPERATOR, "-n", SYSTEM, "--replicas=0")
    wait_for(
        lambda: cluster.get_json(
            "pods", "-n", SYSTEM, "-l", f"app.kubernetes.io/name={OPERATOR}"
        )["items"] == [],
        timeout=60, interval=0.5, description="every operator pod deleted",
    )  # fmt: skip
    try:
        timings = []
        for _ in range(3):
            started = time.monotonic()
            admitted = cluster.kubectl(
                "apply", "-n", namespace, "--dry-run=server", "-f", "-", input=manifest,
                check=False,
            )  # fmt: skip
            timings.append(time.monotonic() - started)
            assert admitted.returncode == 0, admitted.stderr
        assert max(timings) < WEBHOOK_TIMEOUT_SECONDS + 2, timings
    finally:
        cluster.kubectl("scale", "deployment", OPERATOR, "-n", SYSTEM, "--replicas=2")
        wait_operator_ready(cluster)
    print(
        f"\nwebhook through its Service: refused apply {refused_seconds:.2f} s; with every"
        f" operator pod deleted an apply takes {', '.join(f'{t:.2f}' for t in timings)} s"
        " (admitted: failurePolicy Ignore)"
    )


def test_helm_uninstall_leaves_every_inferenceservice_serving(
    cluster: E2ECluster, kiln: Tools, namespace: str, model: Model
) -> None:
    name = "mlp"  # the model's name, which the clients ask for
    spec = yaml.safe_load(inference_service(name, model))
    spec["spec"]["resources"] = {"gpuCount": 0, "cpu": "300m", "memory": "1Gi"}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(spec))
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", f"inferenceservice/{name}",
        "--timeout=240s", timeout=250,
    )  # fmt: skip
    (before,) = runtime_pods(cluster, namespace)

    kiln.run(UNINSTALL[0])
    wait_for(lambda: operator_pods(cluster) == [], timeout=60, description="operator pods gone")
    assert (
        cluster.kubectl("get", "validatingwebhookconfiguration", OPERATOR, check=False).returncode
        != 0
    )
    time.sleep(5)  # anything the uninstall would take down has begun to go
    assert cluster.get_json("inferenceservice", name, "-n", namespace)["metadata"]["name"] == name
    (after,) = runtime_pods(cluster, namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"] and ready(after)
    with service_address(cluster, namespace, name) as address:
        assert infer_http(address[HTTP]).shape == (1, 10)
        assert infer_grpc(address[GRPC]).shape == (1, 10)

    # Removing the CRDs says what it would delete and deletes nothing unless told so.
    declined = kiln.run(UNINSTALL[1], input="no\n", check=False)
    assert declined.returncode != 0
    assert f"inferenceservices.serving.kiln.dev/{name} in {namespace}" in declined.stdout, (
        declined.stdout
    )
    assert "customresourcedefinition.apiextensions.k8s.io/inferenceservices.serving.kiln.dev" in (
        declined.stdout
    )
    assert "nothing deleted" in declined.stdout
    assert (
        cluster.kubectl("get", "crd", "inferenceservices.serving.kiln.dev", check=False).returncode
        == 0
    )
    assert cluster.get_json("inferenceservice", name, "-n", namespace)["metadata"]["name"] == name


def readme_commands() -> str:
    """The README's "Installing Kiln on a cluster" section, continuation lines joined."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Installing Kiln on a cluster", 1)[1].split("\n## ", 1)[0]
    return re.sub(r"\\\n\s*", "", section)


def test_the_readme_shows_these_commands() -> None:
    section = readme_commands()
    for command in (*INSTALL, *UNINSTALL, "kubectl apply -k manifests/", KUSTOMIZE_INSTALL):
        assert f"\n{command}" in section or f"\n$ {command}" in section, command
    overlay = (REPO / KUSTOMIZE_OVERLAY / "kustomization.yaml").read_text()
    assert overlay.split("apiVersion:", 1)[1] in section  # the overlay, shown whole

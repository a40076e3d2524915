"""`helm install`, `upgrade` and `uninstall` of Kiln's chart on the local cluster: the CRDs and the
operator arrive, its pods pass the restricted Pod Security profile, an upgrade changes the
Deployment, a bad value is refused without touching the release, and uninstall removes exactly
the release's objects (Helm never deletes CRDs, so InferenceServices survive); the webhook's
generated certificate is made once and kept by upgrades."""

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import get
from tests.sessioncluster import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)]

CHART = REPO / "manifests" / "charts" / "kiln"
Helm = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def helm(cluster: Cluster, tmp_path: Path) -> Helm:
    binary = go_tool("helm")
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        **{
            f"HELM_{kind}_HOME": str(tmp_path / kind.lower())
            for kind in ("CACHE", "CONFIG", "DATA")
        },
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary), *args], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args[:2])} failed:\n{result.stderr}")
        return result

    return run


@pytest.fixture
def release(helm: Helm, namespace: str) -> Iterator[str]:
    """A release name unique to the test (its ClusterRole is cluster-wide); uninstalled after."""
    name = f"kiln-{namespace[-6:]}"
    yield name
    helm("uninstall", name, "--namespace", namespace, "--wait", check=False)


def deployment(cluster: Cluster, namespace: str, release: str) -> dict[str, Any] | None:
    return get(cluster, namespace, "deployment", f"{release}-operator")


def cluster_object(cluster: Cluster, kind: str, name: str) -> bool:
    return cluster.kubectl("get", kind, name, check=False).returncode == 0


def test_install_upgrade_and_uninstall(
    cluster: Cluster, namespace: str, helm: Helm, release: str
) -> None:
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    helm("install", release, str(CHART), "--namespace", namespace)
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/inferenceservices.serving.kiln.dev", "crd/clusterkopfpeerings.kopf.dev",
    )  # fmt: skip
    installed = deployment(cluster, namespace, release)
    assert installed is not None
    assert installed["spec"]["replicas"] == 2
    assert installed["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert get(cluster, namespace, "serviceaccount", f"{release}-operator") is not None
    assert cluster_object(cluster, "clusterrole", f"{release}-operator")
    binding = cluster.get_json("clusterrolebinding", f"{release}-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{release}-operator", "namespace": namespace}
    ]
    # restricted admission would refuse a non-compliant pod: the ReplicaSet could not create it
    wait_for(
        lambda: cluster.get_json(
            "pods", "-n", namespace, "-l", f"app.kubernetes.io/name={release}-operator"
        )["items"],
        timeout=60,
        description="the operator's pods admitted under the restricted profile",
    )

    helm(
        "upgrade", release, str(CHART), "--namespace", namespace,
        "--set", "replicas=1", "--set", "peering.enabled=false", "--set", "logLevel=debug",
    )  # fmt: skip
    upgraded = deployment(cluster, namespace, release)
    assert upgraded is not None
    assert upgraded["spec"]["replicas"] == 1
    args = upgraded["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" in args and "--verbose" in args

    refused = helm(
        "upgrade", release, str(CHART), "--namespace", namespace, "--set", "replicas=two",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "at '/replicas': got string, want integer" in refused.stderr
    history = helm("history", release, "--namespace", namespace, "--output", "json").stdout
    assert history.count('"revision"') == 2, "a refused upgrade leaves no revision behind"
    unchanged = deployment(cluster, namespace, release)
    assert unchanged is not None
    assert unchanged["metadata"]["generation"] == upgraded["metadata"]["generation"]

    helm("uninstall", release, "--namespace", namespace, "--wait")
    assert deployment(cluster, namespace, release) is None
    assert get(cluster, namespace, "serviceaccount", f"{release}-operator") is None
    assert not cluster_object(cluster, "clusterrole", f"{release}-operator")
    assert not cluster_object(cluster, "clusterrolebinding", f"{release}-operator")
    # crds/ is never deleted by Helm: uninstalling the operator keeps every InferenceService
    assert cluster_object(cluster, "crd", "inferenceservices.serving.kiln.dev")


def test_the_webhook_certificate_is_generated_once_and_kept_by_upgrades(
    cluster: Cluster, namespace: str, helm: Helm, release: str
) -> None:
    """The chart generates the webhook's CA and certificate at install; `helm upgrade` finds the
    Secret (lookup) and keeps both, so the configuration's bundle never changes under running
    replicas. Scoped by watchNamespaces to the test's namespace, where nothing is created."""
    scoped = ("--set", "webhook.enabled=true", "--set", f"watchNamespaces={{{namespace}}}")
    helm("install", release, str(CHART), "--namespace", namespace, *scoped)

    def bundle() -> tuple[str, str]:
        secret = cluster.get_json("secret", f"{release}-operator-webhook-tls", "-n", namespace)
        configuration = cluster.get_json("validatingwebhookconfiguration", f"{release}-operator")
        (webhook,) = configuration["webhooks"]
        assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == [namespace]
        return secret["data"]["ca.crt"], webhook["clientConfig"]["caBundle"]

    installed_ca, installed_bundle = bundle()
    assert installed_ca == installed_bundle
    assert get(cluster, namespace, "service", f"{release}-operator-webhook") is not None

    helm(
        "upgrade", release, str(CHART), "--namespace", namespace, *scoped,
        "--set", "logLevel=debug",
    )  # fmt: skip
    assert bundle() == (installed_ca, installed_bundle)

    helm("uninstall", release, "--namespace", namespace, "--wait")
    assert not cluster_object(cluster, "validatingwebhookconfiguration", f"{release}-operator")
    assert get(cluster, namespace, "secret", f"{release}-operator-webhook-tls") is None

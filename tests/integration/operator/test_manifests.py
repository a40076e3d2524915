"""`kubectl apply -k manifests/` installs Kiln on the local cluster; the operator's pod passes the
restricted Pod Security profile; and the ClusterRole — no wildcards, no Secrets — is enough for
the operator to do its whole job under its own service account."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    apply,
    get,
    getter,
    gpu_service,
    wait_condition,
)
from tests.sessioncluster import REPO

pytestmark = pytest.mark.integration

SYSTEM = "kiln-system"


def rendered(cluster: Cluster) -> list[dict[str, Any]]:
    text = cluster.kubectl("kustomize", str(REPO / "manifests")).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def service_account_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig that authenticates as the operator's service account."""
    token = cluster.kubectl("create", "token", "kiln-operator", "-n", SYSTEM).stdout.strip()
    config: dict[str, Any] = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "kiln-operator", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "kiln-operator"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_cluster_role_is_least_privilege(cluster: Cluster) -> None:
    (role,) = [doc for doc in rendered(cluster) if doc["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"]
        assert "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_apply_k_installs_everything_and_the_operator_pod_is_admitted(
    cluster: Cluster,
) -> None:
    for _ in range(2):  # a second apply is a no-op, not an error
        cluster.kubectl("apply", "-k", str(REPO / "manifests"))
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered(cluster)}
    assert ("CustomResourceDefinition", "inferenceservices.serving.kiln.dev") in kinds
    assert ("Deployment", "kiln-operator") in kinds
    namespace = get(cluster, "", "namespace", SYSTEM)
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # restricted admission would refuse a non-compliant pod: the ReplicaSet could not create it
    wait_for(
        lambda: cluster.get_json(
            "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/name=kiln-operator"
        )["items"],
        timeout=60,
        description="the operator's pods admitted under the restricted profile",
    )


def test_the_service_account_can_do_the_operators_whole_job(
    cluster: Cluster, namespace: str, start_operator: Any, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-k", str(REPO / "manifests"))
    kubeconfig = service_account_kubeconfig(cluster, tmp_path / "operator.kubeconfig")
    operator = start_operator([namespace], standalone=False, kubeconfig=kubeconfig)
    apply(cluster, namespace, gpu_service("rbac", autoscaling={"minReplicas": 2}))
    for kind in ("deployment", "service", "poddisruptionbudget"):
        wait_for(
            getter(cluster, namespace, kind, "rbac"),
            timeout=60,
            description=f"the {kind} written by the service account",
        )
    wait_condition(cluster, namespace, name="rbac", kind="SpecValid", status="True")
    assert "Forbidden" not in operator.output()
    assert " 403" not in operator.output()

"""Against the real API server and operator: Kiln never writes or deletes what it does not
control, and a child the API server refuses becomes a condition.

A Service and a Deployment named like the InferenceService, created by someone else first:
neither is changed, the Ready condition names both (ChildConflict), and deleting the
InferenceService leaves them. Once the foreign objects go, Kiln creates its own. A Deployment
the API server refuses (over a quota) gives Ready=False with the server's answer
(ChildRejected), cleared once a retry succeeds."""

import time
from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    AuditLog,
    OperatorProcess,
    apply,
    get,
    gpu_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

NAME = "foreign"


def foreign_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "labels": {"team": "other"}},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def foreign_deployment() -> dict[str, Any]:
    labels = {"app": "theirs"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "labels": {"team": "other"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "theirs:1"}]},
            },
        },
    }


CONTROLLER_ANNOTATIONS = ("deployment.kubernetes.io/",)
"""Annotation prefixes the Deployment controller writes on its own (the revision)."""


def fingerprint(body: dict[str, Any] | None) -> tuple[Any, ...]:
    """Everything Kiln could change: identity, owners, labels, annotations, the whole spec (a
    Service's selector included) and the generation (bumped by any spec write, even one
    undone). Not the resourceVersion: the Deployment controller's own writes (status, its
    revision annotation) bump it whenever they land."""
    assert body is not None, "the foreign object was deleted"
    meta = body["metadata"]
    annotations = {
        key: value
        for key, value in (meta.get("annotations") or {}).items()
        if not key.startswith(CONTROLLER_ANNOTATIONS)
    }
    return (
        meta["uid"],
        meta.get("generation"),
        meta.get("ownerReferences"),
        meta.get("labels"),
        annotations,
        body["spec"],
    )


def changes_by_operator(audit: AuditLog, mark: int, namespace: str) -> list[str]:
    """The operator's updates, patches and deletes of the foreign objects since `mark` (its
    create attempts are expected: the API server answers 409)."""
    changes = []
    for write in audit.operator_writes(mark, namespace):
        verb, target = write.split(" ", 1)  # "update deployments/foreign", "patch services/…"
        foreign = target.startswith(("deployments/", "services/")) and target.endswith(f"/{NAME}")
        if foreign and verb != "create":
            changes.append(write)
    return changes


def test_foreign_objects_are_never_written_named_in_ready_and_survive_deletion(
    cluster: Cluster, namespace: str, operator: OperatorProcess, audit: AuditLog
) -> None:
    mark = audit.mark()
    apply(cluster, namespace, foreign_service())
    apply(cluster, namespace, foreign_deployment())
    before = {
        kind: fingerprint(get(cluster, namespace, kind, NAME)) for kind in ("service", "deployment")
    }

    apply(cluster, namespace, gpu_service(NAME))
    ready = wait_condition(
        cluster, namespace, name=NAME, kind="Ready", status="False", reason="ChildConflict",
        timeout=60,
    )  # fmt: skip
    assert f"Service {namespace}/{NAME} already exists" in ready["message"]
    assert f"Deployment {namespace}/{NAME} already exists" in ready["message"]

    time.sleep(5)  # retries run meanwhile (backoff 1, 2 s): none may write
    for kind in ("service", "deployment"):
        assert fingerprint(get(cluster, namespace, kind, NAME)) == before[kind], kind

    cluster.kubectl("delete", "inferenceservice", NAME, "-n", namespace, "--wait=true")
    time.sleep(3)  # the garbage collector would have acted by now on an owner reference
    for kind in ("service", "deployment"):
        assert fingerprint(get(cluster, namespace, kind, NAME)) == before[kind], kind
    assert changes_by_operator(audit, mark, namespace) == []


def test_kiln_takes_the_name_once_the_foreign_object_is_gone(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, foreign_service())
    apply(cluster, namespace, gpu_service(NAME))
    wait_condition(
        cluster, namespace, name=NAME, kind="Ready", status="False", reason="ChildConflict",
        timeout=60,
    )  # fmt: skip
    cluster.kubectl("delete", "service", NAME, "-n", namespace, "--wait=true")

    def ours() -> dict[str, Any] | None:
        service = get(cluster, namespace, "service", NAME)
        owners = (service or {}).get("metadata", {}).get("ownerReferences") or []
        return service if any(o.get("kind") == "InferenceService" for o in owners) else None

    wait_for(ours, timeout=30, description="Kiln's own Service after the foreign one went")
    body = get(cluster, namespace, "inferenceservice", NAME)
    assert body is not None
    reasons = [c["reason"] for c in body["status"]["conditions"] if c["type"] == "Ready"]
    assert reasons != ["ChildConflict"]


def test_a_deployment_the_api_server_refuses_becomes_child_rejected_until_it_is_not(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # A quota on the number of Deployments: the API server refuses the create (HTTP 403), a
    # refusal no check of the spec can foresee. Removing the quota lets a retry succeed.
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-deployments"},
        "spec": {"hard": {"count/deployments.apps": "0"}},
    }
    apply(cluster, namespace, quota)
    apply(cluster, namespace, gpu_service("refused"))
    ready = wait_condition(
        cluster, namespace, name="refused", kind="Ready", status="False", reason="ChildRejected",
        timeout=60,
    )  # fmt: skip
    assert f"refused to create Deployment {namespace}/refused (HTTP 403)" in ready["message"]
    assert "no-deployments" in ready["message"]
    assert get(cluster, namespace, "deployment", "refused") is None

    cluster.kubectl("delete", "resourcequota", "no-deployments", "-n", namespace)
    wait_for(
        lambda: get(cluster, namespace, "deployment", "refused"),
        timeout=90,
        description="the Deployment once the quota is gone (a retry with backoff)",
    )
    wait_for(
        lambda: (
            (body := get(cluster, namespace, "inferenceservice", "refused")) is not None
            and all(
                c["reason"] != "ChildRejected"
                for c in body["status"]["conditions"]
                if c["type"] == "Ready"
            )
        ),
        timeout=60,
        description="ChildRejected cleared by the successful create",
    )

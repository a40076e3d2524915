"""kopf's finalizer: the operator puts none on InferenceServices (it has no kopf daemon or
timer), and removes exactly the one an earlier version left (`kopf.zalando.org/KopfFinalizerMarker`,
put there for its per-service daemons), so no service stays stuck in deletion waiting for a
finalizer nobody removes. Other finalizers stay."""

from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    AuditLog,
    apply,
    get,
    gpu_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
OTHER_FINALIZER = "example.com/someone-elses"
LONG = 90


def with_finalizers(name: str, *finalizers: str) -> dict[str, Any]:
    manifest = gpu_service(name)
    manifest["metadata"]["finalizers"] = list(finalizers)
    return manifest


def finalizers_of(cluster: Cluster, namespace: str, name: str) -> list[str] | None:
    body = get(cluster, namespace, "inferenceservice", name)
    return None if body is None else list(body["metadata"].get("finalizers") or [])


def test_an_earlier_versions_kopf_finalizer_is_removed_and_new_services_get_none(
    cluster: Cluster, namespace: str, start_operator: Any, audit: AuditLog
) -> None:
    # as an earlier operator left them: a live service, and one whose deletion waits
    apply(cluster, namespace, with_finalizers("kept", KOPF_FINALIZER, OTHER_FINALIZER))
    apply(cluster, namespace, with_finalizers("deleting", KOPF_FINALIZER))
    cluster.kubectl("delete", "inferenceservice", "deleting", "-n", namespace, "--wait=false")
    deleting = get(cluster, namespace, "inferenceservice", "deleting")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    try:
        mark = audit.mark()
        start_operator([namespace])
        wait_for(
            lambda: get(cluster, namespace, "inferenceservice", "deleting") is None,
            timeout=LONG,
            description="the service stuck in deletion gone",
        )
        wait_for(
            lambda: finalizers_of(cluster, namespace, "kept") == [OTHER_FINALIZER],
            timeout=LONG,
            description="kopf's finalizer removed, the other kept",
        )

        apply(cluster, namespace, gpu_service("new"))
        wait_for(
            lambda: get(cluster, namespace, "deployment", "new"),
            timeout=LONG,
            description="the new service's Deployment",
        )
        wait_condition(cluster, namespace, name="new", kind="SpecValid", status="True")
        # the autoscaler's pass (no Prometheus here) ran on it too
        wait_condition(cluster, namespace, name="new", kind="MetricsAvailable", status="False")
        assert finalizers_of(cluster, namespace, "new") == []
        kopf_writes = audit.operator_writes(mark, namespace, ("kopf",))
        assert not [w for w in kopf_writes if w.endswith("/new")], kopf_writes
    finally:  # the namespace's deletion must not wait for the other finalizer
        cluster.kubectl(
            "patch", "inferenceservice", "kept", "-n", namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip

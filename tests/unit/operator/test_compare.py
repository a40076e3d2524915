"""Deciding "differs" against what the API server returns: defaults and normalised quantities
are not drift; a changed image, a removed toleration or a lost owner reference are."""

import copy
from typing import Any

from kiln_operator.builders import Owner, build_deployment, build_service
from kiln_operator.builders.compare import build_update, covers, needs_update
from tests.unit.operator.conftest import sample_spec

OWNER = Owner(name="resnet50", namespace="vision", uid="uid-1")


def as_served(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server hands back: defaults added, quantities canonical, bookkeeping."""
    live = copy.deepcopy(desired)
    live["metadata"].update(
        {"uid": "child-uid", "resourceVersion": "42", "generation": 3, "managedFields": [{}]}
    )
    live["metadata"]["annotations"] = {
        **live["metadata"].get("annotations", {}),
        "deployment.kubernetes.io/revision": "3",
    }
    live["status"] = {"replicas": 2, "readyReplicas": 2}
    if live["kind"] == "Deployment":
        live["spec"].setdefault("replicas", 2)
        pod = live["spec"]["template"]["spec"]
        pod.update({"dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "x"})
        container = pod["containers"][0]
        container["terminationMessagePath"] = "/dev/termination-log"
        container["livenessProbe"].update({"timeoutSeconds": 1, "successThreshold": 1})
        container["resources"]["limits"]["cpu"] = "4000m"  # same quantity, other spelling
    if live["kind"] == "Service":
        live["spec"].update({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]})
    return live


def deployment() -> dict[str, Any]:
    return build_deployment(sample_spec("full"), OWNER)


def test_a_served_object_covers_its_desired_manifest() -> None:
    desired = deployment()
    assert not needs_update(as_served(desired), desired)
    service = build_service(OWNER, scrape_annotations=True)
    assert not needs_update(as_served(service), service)


def test_an_edited_image_is_drift() -> None:
    desired = deployment()
    live = as_served(desired)
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    assert needs_update(live, desired)


def test_a_removed_toleration_is_drift() -> None:
    desired = deployment()
    live = as_served(desired)
    live["spec"]["template"]["spec"]["tolerations"].pop()
    assert needs_update(live, desired)


def test_a_lost_owner_reference_or_label_is_drift() -> None:
    desired = deployment()
    live = as_served(desired)
    live["metadata"]["ownerReferences"] = []
    assert needs_update(live, desired)
    live = as_served(desired)
    del live["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert needs_update(live, desired)


def test_replicas_changed_by_the_autoscaler_are_not_drift() -> None:
    desired = deployment()
    live = as_served(desired)
    live["spec"]["replicas"] = 7
    assert not needs_update(live, desired)


def test_stale_scrape_annotations_are_drift_and_foreign_annotations_are_not() -> None:
    without = build_service(OWNER, scrape_annotations=False)
    live = as_served(build_service(OWNER, scrape_annotations=True))
    assert needs_update(live, without)
    live_foreign = as_served(without)
    live_foreign["metadata"]["annotations"]["team"] = "vision"
    assert not needs_update(live_foreign, without)


def test_update_keeps_replicas_and_resource_version_and_replaces_the_template() -> None:
    desired = deployment()
    live = as_served(desired)
    live["spec"]["replicas"] = 7
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    body = build_update(live, desired, keep_live_spec=False)
    assert body["spec"]["replicas"] == 7
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["spec"]["template"] == desired["spec"]["template"]
    assert "status" not in body
    assert not needs_update({**body, "status": live["status"]}, desired)


def test_service_update_keeps_the_cluster_ip_and_foreign_annotations() -> None:
    desired = build_service(OWNER, scrape_annotations=False)
    live = as_served(build_service(OWNER, scrape_annotations=True))
    live["metadata"]["annotations"]["team"] = "vision"
    body = build_update(live, desired, keep_live_spec=True)
    assert body["spec"]["clusterIP"] == "10.96.0.10"
    assert body["metadata"]["annotations"] == {
        "deployment.kubernetes.io/revision": "3",
        "team": "vision",
    }


def test_update_adopts_an_orphan_without_dropping_other_owners() -> None:
    desired = deployment()
    live = as_served(desired)
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "other"}
    live["metadata"]["ownerReferences"] = [foreign]
    body = build_update(live, desired, keep_live_spec=False)
    assert body["metadata"]["ownerReferences"] == [foreign, *desired["metadata"]["ownerReferences"]]


def test_covers_treats_missing_and_empty_alike_and_compares_quantities() -> None:
    assert covers({}, {"volumes": []})
    assert covers(
        {"resources": {"limits": {"memory": "1Gi"}}},
        {"resources": {"limits": {"memory": "1024Mi"}}},
    )
    assert not covers(
        {"resources": {"limits": {"memory": "1Gi"}}}, {"resources": {"limits": {"memory": "1G"}}}
    )
    assert not covers({"image": "1000m"}, {"image": "1"})  # quantities only under resources
    assert not covers({"args": ["a"]}, {"args": ["a", "b"]})


def test_a_field_removed_from_the_spec_is_drift_on_the_live_object() -> None:
    with_product = build_deployment(sample_spec("full"), OWNER)
    spec = sample_spec("full")
    plain = spec.model_copy(
        update={
            "resources": spec.resources.model_copy(
                update={"gpu_product": None, "node_selector": {}, "tolerations": []}
            ),
            "drain": spec.drain.model_copy(update={"pre_stop_delay_seconds": 0}),
        }
    )
    desired = build_deployment(plain, OWNER)
    assert needs_update(as_served(with_product), desired)
    live = as_served(desired)
    assert not needs_update(live, desired)
    live["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "A100"}
    assert needs_update(live, desired)


def test_a_left_over_gpu_limit_is_drift() -> None:
    cpu_spec = sample_spec("cpu-test")
    desired = build_deployment(cpu_spec, OWNER)
    live = as_served(desired)
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert needs_update(live, desired)

"""The autoscaler's first word on a new service comes with its first ready replica, its first
metrics or its first change of replicas: before that it has nothing to report or explain, and a
write per new service would only add to a thousand services' creation. A service it has written
on is kept up to date even when no replica is ready."""

from datetime import UTC, datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.k8s.autoscaler import Autoscaler
from kiln_operator.k8s.cache import ObjectCache
from tests.unit.operator.conftest import load_sample
from tests.unit.operator.test_autoscaler_placement import RecordingKube

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def service(autoscaling: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = load_sample("minimal")["spec"]
    spec["autoscaling"] = autoscaling
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "mlp", "namespace": "ns", "uid": "isvc-uid", "generation": 1},
        "spec": spec,
    }
    if status is not None:
        body["status"] = status
    return body


def autoscaler(body: dict[str, Any], replicas: int, ready: int) -> tuple[Autoscaler, RecordingKube]:
    """No Prometheus: the service is blind, its metrics unavailable."""
    cache = ObjectCache()
    cache.store("inferenceservices", body)
    owner = [{"uid": "isvc-uid", "controller": True}]
    cache.store(
        "deployments",
        {
            "metadata": {"name": "mlp", "namespace": "ns", "ownerReferences": owner},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "readyReplicas": ready},
        },
    )
    kube = RecordingKube(body)
    return Autoscaler(kube, cache, None), kube  # type: ignore[arg-type]


async def test_nothing_is_written_on_a_new_service_before_a_replica_is_ready() -> None:
    scaler, kube = autoscaler(service({"minReplicas": 1, "maxReplicas": 4}), replicas=1, ready=0)
    evaluation = await scaler.evaluate("ns", "mlp", NOW)
    assert evaluation is not None and evaluation.decision.desired_replicas == 1
    assert kube.statuses == [] and kube.scales == []


async def test_the_first_ready_replica_brings_the_first_status() -> None:
    scaler, kube = autoscaler(service({"minReplicas": 1, "maxReplicas": 4}), replicas=1, ready=1)
    await scaler.evaluate("ns", "mlp", NOW)
    (status,) = kube.statuses
    (condition,) = status["conditions"]
    assert condition["type"] == constants.CONDITION_METRICS_AVAILABLE
    assert condition["status"] == "False"
    assert "no Prometheus URL" in condition["message"]


async def test_a_change_of_replicas_is_explained_before_any_replica_is_ready() -> None:
    blind = {"minReplicas": 1, "maxReplicas": 8,
             "whenMetricsMissing": {"policy": "Fixed", "replicas": 3}}  # fmt: skip
    scaler, kube = autoscaler(service(blind), replicas=1, ready=0)
    await scaler.evaluate("ns", "mlp", NOW)
    assert kube.scales == [3]
    (status,) = kube.statuses
    assert status["autoscaling"]["desiredReplicas"] == 3


async def test_a_service_it_has_written_on_is_kept_current_without_ready_replicas() -> None:
    earlier = {"autoscaling": {"desiredReplicas": 2, "reason": "LatencyHigh",
                               "message": "p99 180 ms over the SLO"}}  # fmt: skip
    body = service({"minReplicas": 1, "maxReplicas": 4}, status=earlier)
    scaler, kube = autoscaler(body, replicas=1, ready=0)
    await scaler.evaluate("ns", "mlp", NOW)
    (status,) = kube.statuses
    assert status["autoscaling"]["reason"] != "LatencyHigh"

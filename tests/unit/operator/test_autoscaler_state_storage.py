"""The autoscaler keeps its memory in the InferenceService's status, never in its metadata: an
upgrade of Kiln (or any restart) writes nothing of a user's object but its status.

It reads the annotation an earlier version kept the state in while status holds none, so the
first passes after an upgrade decide from what the old operator left, and write nothing when
nothing changed."""

import copy
from datetime import UTC, datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.autoscaling.state import (
    STATE_ANNOTATION,
    STATE_FIELD,
    ScalerState,
    written_state_text,
)
from kiln_operator.k8s.autoscaler import STATE_FIELD_MANAGER, Autoscaler
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.resources import Resource
from tests.unit.operator.conftest import load_sample

NOW = datetime(2026, 12, 6, tzinfo=UTC)


class StatusKube:
    """Records the autoscaler's writes of the InferenceService and applies its status ones."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.writes: list[tuple[str, str, str]] = []
        """(kind of write, resource, field manager or "")."""

    async def apply_status(
        self, resource: Resource, namespace: str, name: str, status: dict[str, Any], manager: str
    ) -> dict[str, Any]:
        self.writes.append(("status", resource.plural, manager))
        self.body.setdefault("status", {}).update(copy.deepcopy(status))
        return copy.deepcopy(self.body)

    async def merge_patch(self, resource: Resource, *_: Any, **__: Any) -> dict[str, Any]:
        self.writes.append(("merge-patch", resource.plural, ""))
        return copy.deepcopy(self.body)

    def of_the_service(self) -> list[tuple[str, str, str]]:
        return [write for write in self.writes if write[1] == "inferenceservices"]


def service() -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "mlp", "namespace": "ns", "uid": "isvc-uid", "resourceVersion": "1"},
        "spec": load_sample("minimal")["spec"],
    }


def autoscaler_of(body: dict[str, Any]) -> tuple[Autoscaler, StatusKube]:
    cache = ObjectCache()
    cache.store("inferenceservices", body)
    ours = {"uid": "isvc-uid", "controller": True}
    cache.store(
        "deployments",
        {
            "metadata": {"name": "mlp", "namespace": "ns", "ownerReferences": [ours]},
            # none yet: the floor (minReplicas 1) scales it up, a change its state remembers
            "spec": {"replicas": 0},
            "status": {},
        },
    )
    kube = StatusKube(copy.deepcopy(body))
    return Autoscaler(kube, cache, None), kube  # type: ignore[arg-type]


async def test_the_state_is_written_to_status_and_the_metadata_never() -> None:
    autoscaler, kube = autoscaler_of(service())
    await autoscaler.evaluate("ns", "mlp", NOW)  # no Prometheus: blind, MetricsAvailable=False
    assert ("merge-patch", "deployments", "") in kube.writes  # scaled to its floor
    assert ("status", "inferenceservices", STATE_FIELD_MANAGER) in kube.of_the_service()
    assert all(kind == "status" for kind, _, _ in kube.of_the_service())
    assert "annotations" not in kube.body["metadata"]
    written = kube.body["status"][STATE_FIELD]
    assert ScalerState.from_text(written) == ScalerState.from_text(written_state_text(kube.body))


async def test_after_an_upgrade_the_earlier_versions_annotation_is_read_and_not_rewritten() -> None:
    first, kube = autoscaler_of(service())
    await first.evaluate("ns", "mlp", NOW)
    # What a version before status.autoscalerState left on the object: the same state, in the
    # annotation.
    left = copy.deepcopy(kube.body)
    left["metadata"]["annotations"] = {STATE_ANNOTATION: left["status"].pop(STATE_FIELD)}
    assert written_state_text(left) == left["metadata"]["annotations"][STATE_ANNOTATION]

    upgraded, kube = autoscaler_of(left)
    await upgraded.evaluate("ns", "mlp", NOW)
    # the state read from the annotation is current: nothing to write
    assert kube.of_the_service() == []
    assert kube.body["metadata"]["annotations"] == left["metadata"]["annotations"]


def test_status_wins_over_the_annotation_once_written() -> None:
    body = service()
    body["metadata"]["annotations"] = {STATE_ANNOTATION: '{"capacity_per_replica": 1.0}'}
    body["status"] = {STATE_FIELD: '{"capacity_per_replica": 2.0}'}
    assert ScalerState.from_text(written_state_text(body)).capacity_per_replica == 2.0
    del body["status"]
    assert ScalerState.from_text(written_state_text(body)).capacity_per_replica == 1.0
    del body["metadata"]["annotations"]
    assert written_state_text(body) is None

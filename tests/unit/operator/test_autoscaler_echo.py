"""The autoscaler's own writes do not trigger a reconcile: it remembers the resourceVersions of
its status and state writes, and the InferenceService's watch event carrying one of them is
dropped. Any other version (someone's change) and a listing after a start still queue one."""

import copy
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast

import kopf
import pytest
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from kiln_operator import constants
from kiln_operator.handlers import inferenceservice
from kiln_operator.k8s.autoscaler import OWN_VERSIONS_KEPT, Autoscaler
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.resources import Resource
from kiln_operator.k8s.scheduler import Scheduler
from tests.unit.operator.conftest import load_sample
from tests.unit.operator.test_child_events import NoOwnWrites, RecordingQueue

# kopf types a decorated handler as its own callback protocol; called here as kopf would.
inferenceservice_event = cast(
    Callable[..., Awaitable[None]], inferenceservice.inferenceservice_event
)
NOW = datetime(2026, 11, 25, tzinfo=UTC)


class VersionedKube:
    """Answers the autoscaler's writes of the InferenceService with a new resourceVersion each."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.versions: list[str] = []

    def _written(self) -> dict[str, Any]:
        version = str(100 + len(self.versions))
        self.versions.append(version)
        self.body["metadata"]["resourceVersion"] = version
        return copy.deepcopy(self.body)

    async def apply_status(self, resource: Resource, *_: Any, **__: Any) -> dict[str, Any]:
        return self._written()

    async def merge_patch(self, resource: Resource, *_: Any, **__: Any) -> dict[str, Any]:
        return self._written()


def service() -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "mlp", "namespace": "ns", "uid": "isvc-uid", "resourceVersion": "1"},
        "spec": load_sample("minimal")["spec"],
    }


def autoscaler_with_service() -> tuple[Autoscaler, VersionedKube]:
    cache = ObjectCache()
    cache.store("inferenceservices", service())
    ours = {"uid": "isvc-uid", "controller": True}
    deployment = {"metadata": {"name": "mlp", "namespace": "ns", "ownerReferences": [ours]}}
    cache.store(
        "deployments", {**deployment, "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    )
    kube = VersionedKube(service())
    return Autoscaler(kube, cache, None), kube  # type: ignore[arg-type]


async def test_the_versions_it_wrote_are_its_own_and_no_others() -> None:
    autoscaler, kube = autoscaler_with_service()
    await autoscaler.evaluate("ns", "mlp", NOW)  # no Prometheus: MetricsAvailable=False, state
    assert kube.versions, "the first evaluation writes its condition"
    for version in kube.versions:
        assert autoscaler.is_own_write("ns", "mlp", version)
    assert not autoscaler.is_own_write("ns", "mlp", "1")  # the version before its writes
    assert not autoscaler.is_own_write("ns", "mlp", None)
    assert not autoscaler.is_own_write("ns", "other", kube.versions[0])

    autoscaler.forget("ns", "mlp")
    assert not autoscaler.is_own_write("ns", "mlp", kube.versions[-1])


def test_only_the_last_few_versions_are_kept() -> None:
    autoscaler, _ = autoscaler_with_service()
    versions = [str(n) for n in range(OWN_VERSIONS_KEPT + 2)]
    for version in versions:
        autoscaler._written("ns", "mlp", {"metadata": {"resourceVersion": version}})
    assert [autoscaler.is_own_write("ns", "mlp", v) for v in versions] == (
        [False] * 2 + [True] * OWN_VERSIONS_KEPT
    )


@pytest.mark.parametrize(
    ("event", "own", "queued"),
    [
        ("MODIFIED", True, []),  # the echo of its own write: dropped
        ("MODIFIED", False, [("ns", "mlp", "spec", False)]),  # someone's change
        (None, True, [("ns", "mlp", "listing", True)]),  # a listing after a start reads afresh
    ],
)
async def test_the_echo_of_its_own_write_queues_no_reconcile(
    event: str | None, own: bool, queued: list[tuple[str, str, str, bool]]
) -> None:
    autoscaler, kube = autoscaler_with_service()
    await autoscaler.evaluate("ns", "mlp", NOW)
    body = service()
    body["metadata"]["resourceVersion"] = kube.versions[-1] if own else "99"
    queue = RecordingQueue()
    scheduler = Scheduler(ToggleSet(any))
    memo = kopf.Memo(
        cache=ObjectCache(),
        reconciler=NoOwnWrites(),
        workqueue=queue,
        scheduler=scheduler,
        shared_autoscaler={"autoscaler": autoscaler},
    )
    await inferenceservice_event(
        type=event, body=body, namespace="ns", name="mlp", meta=body["metadata"], memo=memo
    )
    assert queue.added == queued
    assert len(scheduler) == 1  # an echo too: every event of a live service keeps it tracked

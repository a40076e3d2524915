"""Child events queue their InferenceService's reconcile: listings after a start read afresh.

The watches of InferenceServices, Deployments, Services, PDBs and Kiln's pods list in no fixed
order after a start. A reconcile queued by one watch's listing, run from a cache that has not
yet seen the service's children, would try to create them again (a 409 each, and a write
request on a converged object), so a listing asks for a fresh read.
"""

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest

from kiln_operator import constants
from kiln_operator.handlers import inferenceservice, platform, warmup_gate
from kiln_operator.handlers.warmup_gate import _queue_status
from kiln_operator.k8s.cache import ObjectCache

# kopf types a decorated handler as its own callback protocol; called here as kopf would.
child_changed = cast(Callable[..., Awaitable[None]], inferenceservice.child_changed)
pod_warmup_gate = cast(Callable[..., Awaitable[None]], warmup_gate.pod_warmup_gate)
platform_object_changed = cast(Callable[..., Awaitable[None]], platform.platform_object_changed)


class RecordingQueue:
    def __init__(self) -> None:
        self.added: list[tuple[str, str, str, bool]] = []

    def add(self, namespace: str, name: str, *, trigger: str, fresh: bool = False) -> None:
        self.added.append((namespace, name, trigger, fresh))

    def forget(self, namespace: str, name: str) -> None:
        self.added = [entry for entry in self.added if entry[:2] != (namespace, name)]


class NoOwnWrites:
    def is_own_write(self, plural: str, namespace: str, name: str, version: Any) -> bool:
        return False

    def forget(self, namespace: str, name: str) -> None:
        """Nothing kept."""


def deployment() -> dict[str, Any]:
    labels = {constants.LABEL_INFERENCESERVICE: "svc", constants.LABEL_MANAGED_BY: "kiln"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": "ns", "name": "svc", "resourceVersion": "7", "labels": labels},
    }


@pytest.mark.parametrize(
    ("event", "queued"),
    [(None, ("ns", "svc", "listing", True)), ("MODIFIED", ("ns", "svc", "child", False))],
)
async def test_a_listing_asks_for_a_fresh_read_and_a_change_does_not(
    event: str | None, queued: tuple[str, str, str, bool]
) -> None:
    body = deployment()
    queue = RecordingQueue()
    memo = SimpleNamespace(cache=ObjectCache(), reconciler=NoOwnWrites(), workqueue=queue)
    await child_changed(
        type=event,
        namespace="ns",
        name="svc",
        labels=body["metadata"]["labels"],
        meta=body["metadata"],
        body=body,
        resource=kopf.Resource("apps", "v1", "deployments"),
        memo=memo,
    )
    assert queue.added == [queued]
    assert memo.cache.get("deployments", "ns", "svc") is not None


@pytest.mark.parametrize(
    ("ready", "queued"), [("False", [("ns", "svc", "pod", False)]), ("True", [])]
)
def test_a_pod_that_does_not_serve_queues_its_services_status(
    ready: str, queued: list[tuple[str, str, str, bool]]
) -> None:
    """Why a service is not Ready is read from its pods: a pod event that may change it (the
    scheduler's verdict, a crash, a warm-up verdict) queues a reconcile; a Ready pod's does not
    (its Deployment's status change queues one already)."""
    queue = RecordingQueue()
    pod = {
        "metadata": {
            "namespace": "ns",
            "name": "svc-abc",
            "labels": {constants.LABEL_INFERENCESERVICE: "svc"},
        },
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }
    _queue_status(SimpleNamespace(workqueue=queue), pod, fresh=False)
    assert queue.added == queued


@pytest.mark.parametrize(("event", "fresh"), [(None, True), ("MODIFIED", False)])
async def test_a_pods_listing_asks_for_a_fresh_read_and_a_change_does_not(
    event: str | None, fresh: bool
) -> None:
    """The pods watch may list before the children's after a start: its reconcile must not
    take children the cache has not seen yet for missing (seen in the zero-writes test)."""
    queue = RecordingQueue()
    pod = {
        "metadata": {
            "namespace": "ns",
            "name": "svc-abc",
            "uid": "u1",
            "labels": {constants.LABEL_INFERENCESERVICE: "svc"},
        },
        "status": {"phase": "Pending", "conditions": []},
    }
    memo = SimpleNamespace(cache=ObjectCache(), workqueue=queue, warmup_tasks={})
    await pod_warmup_gate(type=event, body=pod, memo=memo)
    assert queue.added == [("ns", "svc", "pod", fresh)]


@pytest.mark.parametrize(("event", "fresh"), [(None, True), ("MODIFIED", False)])
async def test_a_platform_objects_listing_asks_for_a_fresh_read(
    event: str | None, fresh: bool
) -> None:
    """A profile or policy that applies anew queues the services it applies to; when that comes
    from its watch's listing after a start, their reconciles read afresh."""
    queue = RecordingQueue()
    cache = ObjectCache()
    cache.store(constants.PLURAL, {"metadata": {"namespace": "ns", "name": "svc"}})
    memo = SimpleNamespace(
        cache=cache, workqueue=queue, platform=SimpleNamespace(observe=lambda *_: True)
    )
    resource = kopf.Resource(constants.GROUP, constants.VERSION, constants.PROFILE_PLURAL)
    await platform_object_changed(type=event, body={}, namespace="ns", resource=resource, memo=memo)
    assert queue.added == [("ns", "svc", constants.PROFILE_PLURAL, fresh)]

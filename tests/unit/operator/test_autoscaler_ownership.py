"""The autoscaler never scales a Deployment the InferenceService does not control: a foreign
Deployment holding the name (ChildConflict) is left as it is, without a request."""

from datetime import UTC, datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.k8s.autoscaler import Autoscaler
from kiln_operator.k8s.cache import ObjectCache
from tests.unit.operator.conftest import load_sample


class NoRequests:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the autoscaler made a request: {name}")


def cache_with(deployment_owner_uid: str | None) -> ObjectCache:
    cache = ObjectCache()
    cache.store(
        "inferenceservices",
        {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "metadata": {"name": "mlp", "namespace": "ns", "uid": "isvc-uid"},
            "spec": load_sample("minimal")["spec"],
        },
    )
    meta: dict[str, Any] = {"name": "mlp", "namespace": "ns"}
    if deployment_owner_uid is not None:
        meta["ownerReferences"] = [{"uid": deployment_owner_uid, "controller": True}]
    cache.store("deployments", {"metadata": meta, "spec": {"replicas": 1}})
    return cache


async def test_a_foreign_deployment_is_never_scaled() -> None:
    now = datetime(2026, 11, 25, tzinfo=UTC)
    for owner in (None, "someone-else"):
        autoscaler = Autoscaler(NoRequests(), cache_with(owner), None)  # type: ignore[arg-type]
        assert await autoscaler.evaluate("ns", "mlp", now) is None

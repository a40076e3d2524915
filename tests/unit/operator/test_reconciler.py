"""The reconcile loop's effects against an in-memory API server: writes only what differs,
retries 409 conflicts on a fresh read, never writes replicas, never touches children of an
invalid spec, and reads its watch-fed cache instead of the API server."""

import asyncio
import copy
import json
from typing import Any

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import ApiError
from kiln_operator.k8s.peering import ensure_peering_object
from kiln_operator.k8s.reconciler import CONFLICT_ATTEMPTS, Reconciler
from kiln_operator.k8s.resources import (
    CRDS,
    DEPLOYMENTS,
    INFERENCE_SERVICES,
    PDBS,
    SERVICE_MONITORS,
    SERVICES,
    Resource,
)
from tests.unit.operator.conftest import load_sample

NAMESPACE = "vision"


class FakeKube:
    """Objects by (plural, namespace, name); counts writes; can fail the next N replaces."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Manifest] = {}
        self.writes: list[tuple[str, str]] = []
        self.reads: list[str] = []
        self.conflicts_left = 0
        self.version = 0

    def _key(
        self, resource: Resource, namespace: str | None, name: str
    ) -> tuple[str, str | None, str]:
        return (resource.plural, namespace, name)

    def _stamp(self, body: Manifest) -> Manifest:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"].setdefault("uid", f"uid-{self.version}")
        return stored

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Manifest | None:
        self.reads.append(resource.plural)
        found = self.objects.get(self._key(resource, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        key = self._key(resource, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, "POST", resource.plural, "AlreadyExists")
        self.writes.append(("create", resource.plural))
        self.objects[key] = self._stamp(body)
        return copy.deepcopy(self.objects[key])

    async def replace(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        key = self._key(resource, namespace, body["metadata"]["name"])
        self.writes.append(("replace", resource.plural))
        if self.conflicts_left > 0:
            self.conflicts_left -= 1
            raise ApiError(409, "PUT", resource.plural, "the object has been modified")
        if (
            body["metadata"].get("resourceVersion")
            != self.objects[key]["metadata"]["resourceVersion"]
        ):
            raise ApiError(409, "PUT", resource.plural, "stale resourceVersion")
        self.objects[key] = self._stamp(body)
        return copy.deepcopy(self.objects[key])

    async def delete(self, resource: Resource, namespace: str | None, name: str, uid: str) -> None:
        self.writes.append(("delete", resource.plural))
        self.objects.pop(self._key(resource, namespace, name), None)

    async def apply_status(
        self, resource: Resource, namespace: str | None, name: str, status: Manifest, manager: str
    ) -> Manifest:
        """Server-side apply, as far as status needs it: conditions merge by type."""
        self.writes.append(("status", resource.plural))
        stored = self.objects[self._key(resource, namespace, name)]
        old = stored.get("status", {})
        mine = {c["type"]: c for c in status.get("conditions", [])}
        kept = [c for c in old.get("conditions", []) if c["type"] not in mine]
        stored["status"] = {**old, **status, "conditions": kept + list(mine.values())}
        return copy.deepcopy(stored)


def add_service(kube: FakeKube, spec: dict[str, Any], name: str = "mlp") -> None:
    kube.objects[(INFERENCE_SERVICES.plural, NAMESPACE, name)] = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "isvc-uid", "generation": 1},
        "spec": spec,
    }


def reconciler(kube: FakeKube, cache: ObjectCache | None = None) -> Reconciler:
    """A reconciler with its own cache (empty, as right after a start, unless given)."""
    return Reconciler(kube, cache if cache is not None else ObjectCache())  # type: ignore[arg-type]


def deliver(kube: FakeKube, cache: ObjectCache, resource: Resource, name: str = "mlp") -> None:
    """What a watch does: the cache gets the object as the API server now has it."""
    cache.observe(resource.plural, "MODIFIED", kube.objects[(resource.plural, NAMESPACE, name)])


def live(kube: FakeKube, resource: Resource, name: str = "mlp") -> Manifest:
    return kube.objects[(resource.plural, NAMESPACE, name)]


async def test_first_reconcile_creates_children_then_converges_with_zero_writes() -> None:
    kube = FakeKube()
    spec = load_sample("minimal")["spec"]
    spec["autoscaling"] = {"minReplicas": 2, "maxReplicas": 4}
    add_service(kube, spec)
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert sorted(kube.writes) == sorted(
        [
            ("create", "deployments"),
            ("create", "services"),
            ("create", "poddisruptionbudgets"),
            ("status", "inferenceservices"),
        ]
    )
    assert live(kube, DEPLOYMENTS)["spec"]["replicas"] == 2
    assert outcome.spec_error is None
    kube.writes.clear()
    again = reconciler(kube)
    await again.reconcile(NAMESPACE, "mlp")
    await again.reconcile(NAMESPACE, "mlp")
    assert kube.writes == []


class ReportingKube(FakeKube):
    """While the Service's create waits for its cluster IP, the Deployment controller reports on
    the Deployment just created and the watch delivers that report to the cache."""

    def __init__(self, cache: ObjectCache) -> None:
        super().__init__()
        self.cache = cache

    async def create(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        if resource is SERVICES:
            await asyncio.sleep(0)  # the Deployment's create runs first
            deployment = self.objects[(DEPLOYMENTS.plural, NAMESPACE, "mlp")]
            self.objects[(DEPLOYMENTS.plural, NAMESPACE, "mlp")] = self._stamp(
                {**deployment, "status": {"observedGeneration": 1, "replicas": 1,
                                          "updatedReplicas": 1, "unavailableReplicas": 1}}
            )  # fmt: skip
            deliver(self, self.cache, DEPLOYMENTS)
        return await super().create(resource, namespace, body)


async def test_a_new_services_status_is_written_once_from_the_deployments_newest_report() -> None:
    cache = ObjectCache()
    kube = ReportingKube(cache)
    add_service(kube, load_sample("minimal")["spec"])
    loop = reconciler(kube, cache)
    await loop.reconcile(NAMESPACE, "mlp")
    status = live(kube, INFERENCE_SERVICES)["status"]
    assert (status["replicas"], status["updatedReplicas"]) == (1, 1)
    assert [w for w in kube.writes if w[0] == "status"] == [("status", "inferenceservices")]
    # the report's own watch event changes nothing more
    kube.writes.clear()
    deliver(kube, cache, DEPLOYMENTS)
    await loop.reconcile(NAMESPACE, "mlp")
    assert kube.writes == []


async def test_drift_is_reverted_but_replicas_are_left_to_the_autoscaler() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    deployment = live(kube, DEPLOYMENTS)
    deployment["spec"]["replicas"] = 5
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    kube.writes.clear()
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    deployment = live(kube, DEPLOYMENTS)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == ("kiln/runtime:dev")
    assert deployment["spec"]["replicas"] == 5
    # five replicas now deserve a PodDisruptionBudget
    assert ("create", "poddisruptionbudgets") in kube.writes


def runtime_device(deployment: Manifest) -> str:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config = next(e for e in container["env"] if e["name"] == constants.ENV_RUNTIME_CONFIG)
    return str(json.loads(config["value"])["optimization"]["device"])


async def test_turning_imitated_gpus_on_and_off_rolls_the_gpu_pods_between_cpu_and_cuda() -> None:
    kube = FakeKube()
    spec = load_sample("minimal")["spec"]
    spec["resources"] = {"gpuCount": 1}
    add_service(kube, spec, name="resnet50")
    imitated = Reconciler(kube, ObjectCache(), imitated_gpus=True)  # type: ignore[arg-type]
    await imitated.reconcile(NAMESPACE, "resnet50")
    deployment = live(kube, DEPLOYMENTS, "resnet50")
    assert runtime_device(deployment) == "cpu"
    assert (
        constants.ANNOTATION_IMITATED_GPUS
        in deployment["spec"]["template"]["metadata"]["annotations"]
    )
    kube.writes.clear()
    await Reconciler(kube, ObjectCache(), imitated_gpus=True).reconcile(  # type: ignore[arg-type]
        NAMESPACE, "resnet50"
    )
    assert kube.writes == []  # converged: the annotation is no drift
    await reconciler(kube).reconcile(NAMESPACE, "resnet50")
    deployment = live(kube, DEPLOYMENTS, "resnet50")
    assert runtime_device(deployment) == "cuda"
    assert "annotations" not in deployment["spec"]["template"]["metadata"]


async def test_conflicts_are_retried_on_a_fresh_read() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    live(kube, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    kube.conflicts_left = 2
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert [w for w in kube.writes if w == ("replace", "deployments")] == [
        ("replace", "deployments")
    ] * 3
    assert live(kube, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["image"] != "evil:1"


async def test_endless_conflicts_surface_so_the_work_queue_retries_later() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    live(kube, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    kube.conflicts_left = 100
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert kube.writes.count(("replace", "deployments")) == CONFLICT_ATTEMPTS
    [problem] = outcome.child_problems
    assert problem.reason == constants.REASON_CHILD_APPLY_FAILED
    assert f"HTTP 409 on each of {CONFLICT_ATTEMPTS} attempts" in problem.message


async def test_an_invalid_spec_changes_no_child_and_reports_the_field() -> None:
    kube = FakeKube()
    spec = load_sample("minimal")["spec"]
    add_service(kube, spec)
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    before = {
        plural: copy.deepcopy(obj)
        for (plural, _, _), obj in kube.objects.items()
        if plural != INFERENCE_SERVICES.plural
    }
    broken = copy.deepcopy(spec)
    broken["autoscaling"] = {"minReplicas": 5, "maxReplicas": 2}
    broken["runtime"]["image"] = "new:2"
    kube.objects[(INFERENCE_SERVICES.plural, NAMESPACE, "mlp")]["spec"] = broken
    kube.writes.clear()
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert outcome.spec_error is not None
    assert "spec.autoscaling: minReplicas (5)" in outcome.spec_error
    assert kube.writes == [("status", "inferenceservices")]
    after = {
        plural: obj
        for (plural, _, _), obj in kube.objects.items()
        if plural != INFERENCE_SERVICES.plural
    }
    assert after == before
    status = live(kube, INFERENCE_SERVICES)["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec"


async def test_a_service_monitor_replaces_scrape_annotations_when_its_crd_exists() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert "prometheus.io/scrape" in live(kube, SERVICES)["metadata"]["annotations"]
    kube.objects[(CRDS.plural, None, "servicemonitors.monitoring.coreos.com")] = {
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"}
    }
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert (SERVICE_MONITORS.plural, NAMESPACE, "mlp") in kube.objects
    assert "annotations" not in live(kube, SERVICES)["metadata"]


async def test_a_pdb_is_removed_when_one_replica_is_left() -> None:
    kube = FakeKube()
    spec = load_sample("minimal")["spec"]
    spec["autoscaling"] = {"minReplicas": 2}
    add_service(kube, spec)
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert (PDBS.plural, NAMESPACE, "mlp") in kube.objects
    spec["autoscaling"] = {"minReplicas": 1}
    live(kube, DEPLOYMENTS)["spec"]["replicas"] = 1
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert (PDBS.plural, NAMESPACE, "mlp") in kube.objects, "a cold cache has not seen it"
    await reconciler(kube).reconcile(NAMESPACE, "mlp", fresh=True)  # the resync reads the API
    assert (PDBS.plural, NAMESPACE, "mlp") not in kube.objects


async def test_concurrent_triggers_create_each_child_once_and_announce_once() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    shared = reconciler(kube)
    outcomes = await asyncio.gather(*(shared.reconcile(NAMESPACE, "mlp") for _ in range(5)))
    assert kube.writes.count(("create", "deployments")) == 1
    assert sum(len(o.events) for o in outcomes) <= 1


async def test_a_deleted_service_is_not_reconciled() -> None:
    kube = FakeKube()
    outcome = await reconciler(kube).reconcile(NAMESPACE, "gone")
    assert outcome.writes == []
    assert kube.writes == []


async def test_events_echoing_its_own_writes_are_recognised() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    shared = reconciler(kube)
    await shared.reconcile(NAMESPACE, "mlp")
    version = live(kube, DEPLOYMENTS)["metadata"]["resourceVersion"]
    assert shared.is_own_write("deployments", NAMESPACE, "mlp", version)
    assert not shared.is_own_write("deployments", NAMESPACE, "mlp", "someone-else's")
    assert not shared.is_own_write("services", NAMESPACE, "other", version)


async def test_the_peering_object_is_created_once_and_a_racing_peer_is_tolerated() -> None:
    kube = FakeKube()
    assert await ensure_peering_object(kube, "kiln-operator", NAMESPACE)  # type: ignore[arg-type]
    assert not await ensure_peering_object(kube, "kiln-operator", NAMESPACE)  # type: ignore[arg-type]
    created = kube.objects[("kopfpeerings", NAMESPACE, "kiln-operator")]
    assert created["kind"] == "KopfPeering"
    assert await ensure_peering_object(kube, "kiln-operator", None)  # type: ignore[arg-type]
    assert kube.objects[("clusterkopfpeerings", None, "kiln-operator")]["kind"] == (
        "ClusterKopfPeering"
    )

    class Racing(FakeKube):
        async def get(
            self, resource: Resource, namespace: str | None, name: str
        ) -> Manifest | None:
            return None  # the peer's create lands between our read and our write

    racing = Racing()
    racing.objects[("clusterkopfpeerings", None, "kiln-operator")] = {"metadata": {}}
    assert not await ensure_peering_object(racing, "kiln-operator", None)  # type: ignore[arg-type]


async def test_status_is_applied_without_touching_other_writers_conditions() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    stored = live(kube, INFERENCE_SERVICES)["status"]
    foreign = {
        "type": "MetricsAvailable",
        "status": "False",
        "reason": "MetricsUnavailable",
        "message": "",
        "lastTransitionTime": "2026-03-01T12:00:00Z",
    }
    stored["conditions"].append(foreign)
    live(kube, DEPLOYMENTS)["status"] = {"observedGeneration": 1, "replicas": 1}
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    conditions = live(kube, INFERENCE_SERVICES)["status"]["conditions"]
    assert foreign in conditions
    assert {c["type"] for c in conditions} == {
        "SpecValid",
        "DeploymentAvailable",
        "Progressing",
        "ReplicaFloorMet",
        "ReplicasFeasible",
        "Ready",
        "Stalled",
        "Reconciling",
        "MetricsAvailable",
    }


async def test_a_converged_object_costs_no_request_once_the_watches_delivered_it() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    cache = ObjectCache()
    shared = reconciler(kube, cache)
    await shared.reconcile(NAMESPACE, "mlp")
    kube.reads.clear()
    kube.writes.clear()
    for _ in range(3):
        await shared.reconcile(NAMESPACE, "mlp")
    assert (kube.reads, kube.writes) == ([], [])


async def test_a_delivered_deployment_status_reaches_the_status_without_a_read() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    cache = ObjectCache()
    shared = reconciler(kube, cache)
    await shared.reconcile(NAMESPACE, "mlp")
    live(kube, DEPLOYMENTS)["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
    }
    deliver(kube, cache, DEPLOYMENTS)
    kube.reads.clear()
    kube.writes.clear()
    await shared.reconcile(NAMESPACE, "mlp")
    assert kube.writes == [("status", "inferenceservices")]
    assert kube.reads == []
    assert live(kube, INFERENCE_SERVICES)["status"]["updatedReplicas"] == 1


async def test_drift_delivered_by_the_watch_is_reverted_and_replicas_kept() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    cache = ObjectCache()
    shared = reconciler(kube, cache)
    await shared.reconcile(NAMESPACE, "mlp")
    deployment = live(kube, DEPLOYMENTS)
    deployment["spec"]["replicas"] = 3
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    deliver(kube, cache, DEPLOYMENTS)
    kube.writes.clear()
    await shared.reconcile(NAMESPACE, "mlp")
    assert ("replace", "deployments") in kube.writes
    deployment = live(kube, DEPLOYMENTS)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "kiln/runtime:dev"
    assert deployment["spec"]["replicas"] == 3


async def test_children_the_cache_has_not_seen_are_adopted_not_duplicated() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    kube.writes.clear()
    await reconciler(kube).reconcile(NAMESPACE, "mlp")  # a restarted operator, cold cache
    assert kube.writes == []
    assert sum(1 for key in kube.objects if key[0] == DEPLOYMENTS.plural) == 1

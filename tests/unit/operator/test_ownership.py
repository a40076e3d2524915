"""The reconcile loop writes only children the InferenceService controls: a name held by
another object is reported (ChildConflict, naming kind and object) and never written; a child
the API server refuses is reported with the server's answer (ChildRejected), one it fails or
never answers for likewise (ChildApplyFailed), each cleared by a later success."""

import copy
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import (
    MAX_ANSWER,
    REQUEST_TIMEOUT_SECONDS,
    ApiError,
    KubeClient,
    NoAnswer,
)
from kiln_operator.k8s.reconciler import ChildrenNotApplied
from kiln_operator.k8s.resources import DEPLOYMENTS, INFERENCE_SERVICES, PDBS, SERVICES, Resource
from tests.unit.operator.conftest import load_sample
from tests.unit.operator.test_reconciler import NAMESPACE, FakeKube, add_service, live, reconciler


def foreign(kind: str, api_version: str, controller: dict[str, Any] | None) -> Manifest:
    meta: dict[str, Any] = {"name": "mlp", "namespace": NAMESPACE, "labels": {"team": "other"}}
    if controller is not None:
        meta["ownerReferences"] = [{**controller, "controller": True}]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": meta,
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]},
    }


def ready(kube: FakeKube) -> dict[str, Any]:
    conditions = live(kube, INFERENCE_SERVICES)["status"]["conditions"]
    found: dict[str, Any] = next(c for c in conditions if c["type"] == "Ready")
    return found


def put(kube: FakeKube, resource: Resource, body: Manifest) -> Manifest:
    stored = kube._stamp(body)
    kube.objects[(resource.plural, NAMESPACE, "mlp")] = stored
    return copy.deepcopy(stored)


async def test_a_foreign_service_and_deployment_are_never_written_and_named() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    service = put(kube, SERVICES, foreign("Service", "v1", None))
    other_owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "other"}
    deployment = put(kube, DEPLOYMENTS, foreign("Deployment", "apps/v1", other_owner))

    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")

    assert live(kube, SERVICES) == service
    assert live(kube, DEPLOYMENTS) == deployment
    assert [w for w in kube.writes if w[0] != "create"] == [("status", "inferenceservices")]
    assert {p.reason for p in outcome.child_problems} == {constants.REASON_CHILD_CONFLICT}
    condition = ready(kube)
    assert condition["status"] == "False"
    assert condition["reason"] == "ChildConflict"
    assert f"Service {NAMESPACE}/mlp already exists" in condition["message"]
    assert "it has no controller owner" in condition["message"]
    assert f"Deployment {NAMESPACE}/mlp already exists" in condition["message"]
    assert "its controller is ReplicaSet x" in condition["message"]
    assert any(e.reason == "ChildConflict" for e in outcome.events)
    assert str(ChildrenNotApplied(outcome)).count("already exists") == 2


async def test_a_foreign_object_in_the_cache_is_not_written_either() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    deployment = put(kube, DEPLOYMENTS, foreign("Deployment", "apps/v1", None))
    cache = ObjectCache()
    cache.store(DEPLOYMENTS.plural, deployment)  # carried the managed-by label, say
    await reconciler(kube, cache).reconcile(NAMESPACE, "mlp")
    assert live(kube, DEPLOYMENTS) == deployment
    assert cache.get(DEPLOYMENTS.plural, NAMESPACE, "mlp") is None  # the autoscaler sees none


async def test_once_the_foreign_object_is_gone_kiln_creates_its_own_and_ready_clears() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])
    put(kube, SERVICES, foreign("Service", "v1", None))
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert ready(kube)["reason"] == "ChildConflict"
    del kube.objects[(SERVICES.plural, NAMESPACE, "mlp")]
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert outcome.child_problems == []
    owners = live(kube, SERVICES)["metadata"]["ownerReferences"]
    assert owners[0]["uid"] == "isvc-uid"
    assert ready(kube)["reason"] != "ChildConflict"


async def test_a_pdb_is_deleted_only_when_the_service_is_its_controller() -> None:
    kube = FakeKube()
    add_service(kube, load_sample("minimal")["spec"])  # one replica: no PDB wanted
    merely_referencing = {"apiVersion": "x/v1", "kind": "X", "name": "x", "uid": "isvc-uid"}
    pdb = foreign("PodDisruptionBudget", "policy/v1", None)
    pdb["metadata"]["ownerReferences"] = [merely_referencing]  # an owner, not the controller
    kube.objects[(PDBS.plural, NAMESPACE, "mlp")] = kube._stamp(pdb)
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert (PDBS.plural, NAMESPACE, "mlp") in kube.objects
    assert ("delete", PDBS.plural) not in kube.writes


class RefusingKube(FakeKube):
    """Refuses Deployment writes with a 422 Status, as the API server does, while `refusing`."""

    refusing = True

    def _refuse(self, method: str, resource: Resource) -> None:
        if self.refusing and resource is DEPLOYMENTS:
            status = {
                "kind": "Status",
                "status": "Failure",
                "reason": "Invalid",
                "code": 422,
                "message": 'Deployment.apps "mlp" is invalid: spec.template.spec.containers[0]'
                '.resources.requests[cpu]: Invalid value: "-1": must be greater than or equal '
                "to 0",
            }
            raise ApiError(422, method, resource.path(NAMESPACE), json.dumps(status))

    async def create(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        self._refuse("POST", resource)
        return await super().create(resource, namespace, body)

    async def replace(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        self._refuse("PUT", resource)
        return await super().replace(resource, namespace, body)


async def test_a_refused_child_becomes_ready_false_child_rejected_with_the_servers_answer() -> None:
    kube = RefusingKube()
    add_service(kube, load_sample("minimal")["spec"])
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    condition = ready(kube)
    assert (condition["status"], condition["reason"]) == ("False", "ChildRejected")
    assert condition["message"] == (
        f"the API server refused to create Deployment {NAMESPACE}/mlp (HTTP 422): "
        'Deployment.apps "mlp" is invalid: spec.template.spec.containers[0].resources'
        '.requests[cpu]: Invalid value: "-1": must be greater than or equal to 0'
    )
    assert (SERVICES.plural, NAMESPACE, "mlp") in kube.objects  # the rest is still applied
    assert [e.reason for e in outcome.events] == ["ChildRejected"]

    again = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert again.events == []  # the same refusal is announced once

    kube.refusing = False
    cleared = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert cleared.child_problems == []
    assert ready(kube)["reason"] != "ChildRejected"


async def test_a_refused_update_keeps_reporting_the_live_deployment() -> None:
    kube = RefusingKube()
    kube.refusing = False
    spec = load_sample("minimal")["spec"]
    add_service(kube, spec)
    running = reconciler(kube)  # its cache keeps what it created: the next write is an update
    await running.reconcile(NAMESPACE, "mlp")
    kube.objects[(INFERENCE_SERVICES.plural, NAMESPACE, "mlp")]["spec"]["runtime"]["image"] = "n:2"
    kube.refusing = True
    outcome = await running.reconcile(NAMESPACE, "mlp", fresh=True)
    assert [p.reason for p in outcome.child_problems] == ["ChildRejected"]
    assert "refused to update Deployment" in ready(kube)["message"]
    available = next(
        c
        for c in live(kube, INFERENCE_SERVICES)["status"]["conditions"]
        if c["type"] == "DeploymentAvailable"
    )
    assert available["reason"] != "DeploymentMissing"


def test_the_answer_is_trimmed_to_what_a_person_reads() -> None:
    error = ApiError(422, "POST", "/x", json.dumps({"message": "word " * 400}))
    assert len(error.answer) == 512 and error.answer.endswith("…")
    assert ApiError(500, "POST", "/x", "not json\n at all").answer == "not json at all"
    assert ApiError(422, "POST", "/x", "{}").is_rejection
    assert not ApiError(409, "POST", "/x", "{}").is_rejection


class FailingKube(FakeKube):
    """Fails requests for the `failing` kinds with `failure` (an API server's answer or none)
    while `failure` is set; `reading` fails their GETs too."""

    failure: Exception | None = None
    failing: tuple[Resource, ...] = (DEPLOYMENTS,)
    reading = False

    def _fail(self, resource: Resource) -> None:
        if self.failure is not None and resource in self.failing:
            raise self.failure

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Manifest | None:
        if self.reading:
            self._fail(resource)
        return await super().get(resource, namespace, name)

    async def create(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        self._fail(resource)
        return await super().create(resource, namespace, body)

    async def replace(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        self._fail(resource)
        return await super().replace(resource, namespace, body)

    async def delete(self, resource: Resource, namespace: str | None, name: str, uid: str) -> None:
        self._fail(resource)
        await super().delete(resource, namespace, name, uid)


def server_error(status: int, method: str, message: str) -> ApiError:
    body = {"kind": "Status", "status": "Failure", "code": status, "message": message}
    return ApiError(status, method, DEPLOYMENTS.path(NAMESPACE), json.dumps(body))


async def test_a_server_error_becomes_child_apply_failed_and_a_later_success_clears_it() -> None:
    kube = FailingKube()
    kube.failure = server_error(503, "POST", "etcdserver:\n  request timed out")
    add_service(kube, load_sample("minimal")["spec"])

    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")

    condition = ready(kube)
    assert (condition["status"], condition["reason"]) == ("False", "ChildApplyFailed")
    assert condition["message"] == (
        f"could not create Deployment {NAMESPACE}/mlp (HTTP 503): etcdserver: request timed "
        "out; retrying with backoff"
    )
    assert (SERVICES.plural, NAMESPACE, "mlp") in kube.objects  # the rest is still applied
    assert [e.reason for e in outcome.events] == ["ChildApplyFailed"]
    assert "HTTP 503" in str(ChildrenNotApplied(outcome))  # the work queue backs off on it

    kube.failure = None
    cleared = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert cleared.child_problems == []
    assert ready(kube)["reason"] != "ChildApplyFailed"


async def test_no_answer_from_the_api_server_becomes_child_apply_failed() -> None:
    kube = FailingKube()
    kube.failure = NoAnswer("POST", SERVICES.path(NAMESPACE), TimeoutError())
    kube.failing = (SERVICES,)
    add_service(kube, load_sample("minimal")["spec"])
    await reconciler(kube).reconcile(NAMESPACE, "mlp")
    condition = ready(kube)
    assert condition["reason"] == "ChildApplyFailed"
    assert condition["message"] == (
        f"could not create Service {NAMESPACE}/mlp: no answer within "
        f"{REQUEST_TIMEOUT_SECONDS:g} s; retrying with backoff"
    )
    assert (DEPLOYMENTS.plural, NAMESPACE, "mlp") in kube.objects


async def test_a_failed_update_keeps_reporting_the_live_deployment() -> None:
    kube = FailingKube()
    add_service(kube, load_sample("minimal")["spec"])
    running = reconciler(kube)  # its cache keeps what it created: the next write is an update
    await running.reconcile(NAMESPACE, "mlp")
    kube.objects[(INFERENCE_SERVICES.plural, NAMESPACE, "mlp")]["spec"]["runtime"]["image"] = "n:2"
    kube.failure = server_error(500, "PUT", "Internal error occurred: " + "x" * 2000)
    outcome = await running.reconcile(NAMESPACE, "mlp", fresh=True)
    [problem] = outcome.child_problems
    assert problem.message.startswith(f"could not update Deployment {NAMESPACE}/mlp (HTTP 500)")
    assert len(problem.message) < MAX_ANSWER + 100  # the server's message trimmed
    conditions = live(kube, INFERENCE_SERVICES)["status"]["conditions"]
    available = next(c for c in conditions if c["type"] == "DeploymentAvailable")
    assert available["reason"] != "DeploymentMissing"


async def test_a_failed_fresh_read_is_reported_and_the_cached_copy_serves() -> None:
    kube = FailingKube()
    add_service(kube, load_sample("minimal")["spec"])
    running = reconciler(kube)
    await running.reconcile(NAMESPACE, "mlp")
    kube.failure = server_error(503, "GET", "the server is currently unable to handle the request")
    kube.reading = True
    writes = len(kube.writes)

    outcome = await running.reconcile(NAMESPACE, "mlp", fresh=True)  # the resync

    assert {p.reason for p in outcome.child_problems} == {"ChildApplyFailed"}
    assert ready(kube)["message"] == (
        f"could not read Deployment {NAMESPACE}/mlp (HTTP 503): the server is currently unable "
        "to handle the request; retrying with backoff"
    )
    assert [w for w in kube.writes[writes:] if w[0] != "status"] == []
    conditions = live(kube, INFERENCE_SERVICES)["status"]["conditions"]
    available = next(c for c in conditions if c["type"] == "DeploymentAvailable")
    assert available["reason"] != "DeploymentMissing"  # from the cache


async def test_a_failed_delete_is_reported() -> None:
    kube = FailingKube()
    kube.failing = (PDBS,)
    spec = load_sample("minimal")["spec"]
    add_service(kube, spec)
    running = reconciler(kube)
    await running.reconcile(NAMESPACE, "mlp")
    ours = {"kind": "InferenceService", "uid": "isvc-uid", "controller": True}
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "mlp", "namespace": NAMESPACE, "ownerReferences": [ours]},
    }
    put(kube, PDBS, pdb)  # one replica wants none: the reconcile deletes it
    kube.failure = server_error(429, "DELETE", "too many requests, please try again later")
    outcome = await running.reconcile(NAMESPACE, "mlp", fresh=True)
    [problem] = outcome.child_problems
    assert (problem.reason, problem.message) == (
        "ChildApplyFailed",
        f"could not delete PodDisruptionBudget {NAMESPACE}/mlp (HTTP 429): too many requests, "
        "please try again later; retrying with backoff",
    )


@pytest.mark.parametrize(
    ("cause", "answer"),
    [
        (TimeoutError(), f"no answer within {REQUEST_TIMEOUT_SECONDS:g} s"),
        (
            aiohttp.ClientConnectionError("connection\n reset"),
            "connection failed: connection reset",
        ),
    ],
)
async def test_the_client_turns_a_timeout_or_a_lost_connection_into_no_answer(
    cause: Exception, answer: str
) -> None:
    async def unanswered(*_: Any, **options: Any) -> None:
        assert options["_request_timeout"] == REQUEST_TIMEOUT_SECONDS  # every request is bounded
        raise cause

    async with KubeClient(client.Configuration()) as kube:
        kube._api.call_api = unanswered  # type: ignore[method-assign]
        with pytest.raises(NoAnswer) as raised:
            await kube.create(DEPLOYMENTS, NAMESPACE, {"metadata": {"name": "mlp"}})
    assert (raised.value.method, raised.value.answer) == ("POST", answer)

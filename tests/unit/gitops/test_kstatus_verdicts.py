"""kstatus's verdict (the library Flux and `kubectl wait` use, behind e2e/gotools/kstatus) on
InferenceServices whose status the operator's own compute_status wrote, one per state, without a
cluster: the states a live cluster reaches only slowly (a passed progress deadline, a failed
warm-up) are checked here; tests/integration/gitops/test_kstatus.py checks live objects."""

import json
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kiln_operator import constants
from kiln_operator.api import crdgen
from kiln_operator.status.compute import ChildProblem, ReconcileObservation, compute_status
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.unit.kube_objects import deployment, pod

pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
GENERATION = 3
INVALID = "spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"
READY_POD = {"type": "Ready", "status": "True"}
WARMUP_FAILED = {
    "type": constants.CONDITION_WARMED_UP,
    "status": "False",
    "reason": "P99OverBound",
    "message": "warm-up p99 183.2 ms exceeds the bound 50 ms after 200 requests",
}
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
}


@pytest.fixture(scope="module")
def kstatus_binary() -> Path:
    return go_tool("kstatus")


def observe(body: dict[str, Any] | None, *pods: dict[str, Any]) -> ReconcileObservation:
    return ReconcileObservation(
        generation=GENERATION,
        spec_error=None,
        deployment=body,
        selector="serving.kiln.dev/inferenceservice=mlp",
        url="http://mlp.models.svc:8000",
        grpc_address="mlp.models.svc:8001",
        pods=pods,
        min_replicas=2,
    )


def service(name: str, status: dict[str, Any] | None, generation: int = GENERATION) -> Any:
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": "models", "generation": generation},
        "spec": {},
    }
    return body if status is None else {**body, "status": status}


def written(observation: ReconcileObservation) -> dict[str, Any]:
    """The status as the operator writes it (its server-side apply body)."""
    return compute_status({}, observation, NOW).applied


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def verdicts(binary: Path, objects: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    result = subprocess.run(
        [str(binary)], input=json.dumps(listed), capture_output=True, text=True, timeout=30,
        check=True,
    )  # fmt: skip
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {line["name"]: (line["status"], line["message"]) for line in lines}


SERVING = (pod("a", READY_POD), pod("b", READY_POD))
ROLLING = deployment(replicas=3, updated=1, available=2)
NEW_POD = "2026-11-25T11:59:00Z"
DEADLINE = deployment(updated=1, available=0, progressing="ProgressDeadlineExceeded")
STATUSES = {
    "ready": written(observe(deployment(), *SERVING)),
    "warming": written(observe(deployment(available=0))),
    "rolling-out": written(observe(ROLLING)),
    "below-the-floor": written(observe(deployment(available=1), pod("a", READY_POD))),
    "invalid-spec": written(replace(observe(deployment(), *SERVING), spec_error=INVALID)),
    "child-refused": written(
        replace(
            observe(deployment(), *SERVING),
            child_problems=(
                ChildProblem(
                    constants.REASON_CHILD_REJECTED,
                    "the API server refused to create Service models/mlp (HTTP 403): denied",
                ),
            ),
        )
    ),
    "rollout-stalled": written(
        observe(ROLLING, pod("n", UNSCHEDULABLE, created=NEW_POD), *SERVING)
    ),
    "warmup-failed": written(observe(deployment(available=0), pod("a", WARMUP_FAILED))),
    "deadline-exceeded": written(observe(DEADLINE)),
    "at-zero": written(
        replace(observe(deployment(desired=0, replicas=0, updated=0, available=0)), min_replicas=0)
    ),
}


def test_each_state_gets_the_conformant_verdict_from_the_kstatus_library(
    kstatus_binary: Path,
) -> None:
    objects = [service(name, status) for name, status in STATUSES.items()]
    got = verdicts(kstatus_binary, objects)

    def reconciling(name: str) -> tuple[str, str]:
        kept = condition(STATUSES[name], constants.CONDITION_RECONCILING)
        return "InProgress", kept["message"]

    def stalled(name: str) -> tuple[str, str]:
        return "Failed", condition(STATUSES[name], constants.CONDITION_READY)["message"]

    assert got == {
        "ready": ("Current", "Resource is Ready"),
        "warming": reconciling("warming"),
        "rolling-out": reconciling("rolling-out"),
        "below-the-floor": reconciling("below-the-floor"),
        "invalid-spec": ("Failed", INVALID),
        "child-refused": stalled("child-refused"),
        "rollout-stalled": stalled("rollout-stalled"),
        "warmup-failed": stalled("warmup-failed"),
        "deadline-exceeded": stalled("deadline-exceeded"),
        "at-zero": ("Current", "Resource is Ready"),
    }
    assert got["rollout-stalled"][1].startswith("the rollout is stalled: pod n cannot be")
    assert got["warmup-failed"][1].endswith("exceeds the bound 50 ms after 200 requests")


def test_a_new_object_is_in_progress_until_the_operator_writes_status(
    kstatus_binary: Path,
) -> None:
    """Until its first write the operator has said nothing: the CRD's status default (which
    the API server applies to every object it reads) keeps kstatus from reading Current, as
    it does for an object without status; a spec change is in progress until judged."""
    default = crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unobserved = default["properties"]["status"]["default"]
    judged_before = written(observe(deployment(), *SERVING))  # for generation 3
    got = verdicts(
        kstatus_binary,
        [
            service("new", unobserved, generation=1),
            service("no-status", None, generation=1),
            service("changed", judged_before, generation=GENERATION + 1),
        ],
    )
    behind = "InferenceService generation is {}, but latest observed generation is {}"
    assert got == {
        "new": ("InProgress", behind.format(1, 0)),
        "no-status": ("Current", "Resource is current"),
        "changed": ("InProgress", behind.format(4, 3)),
    }

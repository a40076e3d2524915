"""kstatus — the conventions Flux's health checks, `kpt live` and cli-utils' appliers judge custom
resources by — computed by the real library (e2e/gotools/kstatus) on live InferenceServices.

Each state's exact verdict is asserted, with the message kstatus takes from the condition it
decided by: InProgress while warming (Reconciling) and before the operator's first status write
(the CRD's status default: observedGeneration 0), Current when Ready, Failed on an invalid spec
and on a stalled rollout (Stalled). tests/unit/gitops/test_kstatus_verdicts.py covers the states
a live cluster reaches only slowly (a passed progress deadline, a failed warm-up).
"""

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster.waiting import wait_for
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    OperatorProcess,
    apply,
    condition,
    get,
    gpu_service,
    wait_condition,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)]

LONG = 120
"""Seconds to wait for convergence: the machine's two cores are shared with other test runs."""


@pytest.fixture(scope="module")
def kstatus_binary() -> Path:
    return go_tool("kstatus")


def kstatus(binary: Path, obj: dict[str, Any]) -> dict[str, str]:
    """kstatus's verdict on one object: {"status": InProgress|Current|Failed|…, "message"}."""
    result = subprocess.run(
        [str(binary)], input=json.dumps(obj), capture_output=True, text=True, timeout=30,
        check=True,
    )  # fmt: skip
    (line,) = result.stdout.splitlines()
    verdict: dict[str, str] = json.loads(line)
    return verdict


def live(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found = get(cluster, namespace, "inferenceservice", name)
    assert found is not None
    return found


def test_the_command_reads_a_list_and_refuses_garbage(kstatus_binary: Path) -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}},
            {
                "apiVersion": "serving.kiln.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "b", "namespace": "n", "generation": 2},
                "status": {"observedGeneration": 1},
            },
        ],
    }
    result = subprocess.run(
        [str(kstatus_binary)], input=json.dumps(listed), capture_output=True, text=True,
        timeout=30, check=True,
    )  # fmt: skip
    verdicts = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(v["name"], v["status"]) for v in verdicts] == [("a", "Current"), ("b", "InProgress")]
    garbage = subprocess.run(
        [str(kstatus_binary)], input="{not json", capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert garbage.returncode == 1 and "not a Kubernetes object" in garbage.stderr


def test_in_progress_while_warming_current_when_ready_failed_when_the_rollout_stalls(
    cluster: Cluster, namespace: str, operator: OperatorProcess, kstatus_binary: Path
) -> None:
    # Warming: the warm-up gate holds the pod unready (kwok's pod has no runtime to answer; the
    # attempt's 300 s timeout, after which the warm-up fails, is far off).
    apply(cluster, namespace, gpu_service("warming", warmup={"requests": 8, "retries": 0}))
    wait_condition(
        cluster, namespace, name="warming", kind="Reconciling", status="True", timeout=LONG
    )  # fmt: skip
    body = live(cluster, namespace, "warming")
    reconciling = condition(body, "Reconciling")
    assert reconciling is not None
    verdict = kstatus(kstatus_binary, body)
    assert (verdict["status"], verdict["message"]) == ("InProgress", reconciling["message"])

    apply(cluster, namespace, gpu_service("mlp"))
    wait_condition(cluster, namespace, name="mlp", kind="Ready", status="True", timeout=LONG)
    verdict = kstatus(kstatus_binary, live(cluster, namespace, "mlp"))  # minReplicas 1: met
    assert (verdict["status"], verdict["message"]) == ("Current", "Resource is Ready")

    # A rollout that cannot finish: a GPU product no node has keeps the new pod Pending.
    resources = {"gpuCount": 1, "gpuProduct": "NVIDIA-H100-NOWHERE"}
    apply(cluster, namespace, gpu_service("mlp", resources=resources))
    wait_condition(
        cluster, namespace, name="mlp", kind="Ready", status="False",
        reason="RolloutStalled", timeout=LONG,
    )  # fmt: skip
    body = live(cluster, namespace, "mlp")
    ready, stalled = condition(body, "Ready"), condition(body, "Stalled")
    assert ready is not None and stalled is not None
    assert (stalled["status"], stalled["reason"]) == ("True", "RolloutStalled")
    assert stalled["message"] == ready["message"]
    verdict = kstatus(kstatus_binary, body)
    assert (verdict["status"], verdict["message"]) == ("Failed", ready["message"])


def test_failed_on_an_invalid_spec(
    cluster: Cluster, namespace: str, operator: OperatorProcess, kstatus_binary: Path
) -> None:
    apply(cluster, namespace, gpu_service("bad", autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    wait_condition(
        cluster, namespace, name="bad", kind="SpecValid", status="False", reason="InvalidSpec",
        timeout=LONG,
    )  # fmt: skip
    body = live(cluster, namespace, "bad")
    spec_valid = condition(body, "SpecValid")
    assert spec_valid is not None
    verdict = kstatus(kstatus_binary, body)
    assert (verdict["status"], verdict["message"]) == ("Failed", spec_valid["message"])


def test_in_progress_before_the_operator_has_seen_it(
    cluster: Cluster, namespace: str, kiln_crds: Cluster, kstatus_binary: Path
) -> None:
    """No operator serves this namespace, so no status is ever written: the API server drops
    status on create but applies the CRD's status default to what it reads back."""
    apply(cluster, namespace, gpu_service("unseen"))
    wait_for(lambda: get(cluster, namespace, "inferenceservice", "unseen"), timeout=30,
             description="the object")  # fmt: skip
    body = live(cluster, namespace, "unseen")
    assert (body["metadata"]["generation"], body.get("status")) == (1, {"observedGeneration": 0})
    verdict = kstatus(kstatus_binary, body)
    assert (verdict["status"], verdict["message"]) == (
        "InProgress",
        "InferenceService generation is 1, but latest observed generation is 0",
    )

"""The operator's own metrics: a reconcile's outcome and reason, the work queue's depth and
oldest key, the API client's requests by verb and code, Prometheus query errors by kind, and
per-service series that go when their InferenceService does."""

import asyncio
import socket

import pytest
import requests
from kubernetes_asyncio import client
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client import REGISTRY

from kiln_operator import constants, telemetry
from kiln_operator.autoscaling.prometheus import PrometheusSource
from kiln_operator.k8s.client import KubeClient, NoAnswer
from kiln_operator.k8s.resources import DEPLOYMENTS
from kiln_operator.k8s.workqueue import Request, WorkQueue


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port: int = listener.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"writes": False, "deleted": True}, ("gone", "")),
        (
            {"writes": True, "spec_error_reason": constants.REASON_INVALID_SPEC},
            ("spec_error", constants.REASON_INVALID_SPEC),
        ),
        (
            {"writes": True, "child_problem": constants.REASON_CHILD_CONFLICT},
            ("child_problem", constants.REASON_CHILD_CONFLICT),
        ),
        ({"writes": True}, ("applied", "")),
        ({"writes": False}, ("converged", "")),
    ],
)
def test_a_reconciles_outcome_names_what_it_did_and_the_condition_reason(
    kwargs: dict[str, object], expected: tuple[str, str]
) -> None:
    arguments = {"deleted": False, "spec_error_reason": None, "child_problem": None, **kwargs}
    assert telemetry.reconcile_outcome(**arguments) == expected  # type: ignore[arg-type]


def test_a_reconcile_error_reason_is_a_bounded_name() -> None:
    assert telemetry.error_reason(NoAnswer("GET", "/x", OSError("refused"))) == "NoAnswer"
    assert telemetry.error_reason(KeyError("spec")) == "Unexpected"
    assert telemetry.error_reason(ValueError("a message with a name in it")) == "Unexpected"


async def test_the_work_queue_reports_its_depth_its_oldest_key_and_its_retries() -> None:
    now = [100.0]
    release = asyncio.Event()
    failed_once: set[str] = set()

    async def work(namespace: str, name: str, request: Request) -> None:
        await release.wait()
        if name not in failed_once:
            failed_once.add(name)
            raise RuntimeError("the API server said no")

    queue = WorkQueue(work, workers=1, clock=lambda: now[0], base_seconds=60)
    telemetry.watch_workqueue(lambda: len(queue), queue.oldest_seconds, lambda: queue.active)
    assert value("kiln_operator_workqueue_oldest_seconds") == 0
    adds = value("kiln_operator_workqueue_adds_total", trigger="spec")
    queue.add("ns", "a", trigger="spec")
    now[0] = 103.0
    queue.add("ns", "b", trigger="spec")
    queue.add("ns", "b", trigger="spec")  # waiting already: not a second add
    now[0] = 110.0
    assert value("kiln_operator_workqueue_depth") == 2
    assert value("kiln_operator_workqueue_oldest_seconds") == 10
    assert value("kiln_operator_workqueue_adds_total", trigger="spec") == adds + 2
    retries = value("kiln_operator_workqueue_retries_total")
    queue.start()
    await asyncio.sleep(0.02)
    assert value("kiln_operator_workqueue_active") == 1
    assert value("kiln_operator_workqueue_depth") == 1
    assert value("kiln_operator_workqueue_oldest_seconds") == 7  # b's, since a is taken
    release.set()
    await asyncio.sleep(0.02)
    assert value("kiln_operator_workqueue_depth") == 0
    assert value("kiln_operator_workqueue_active") == 0
    assert value("kiln_operator_workqueue_retries_total") == retries + 2
    await queue.close()


async def test_an_api_request_without_an_answer_is_counted_with_code_none() -> None:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # nothing listens
    before = value(
        "kiln_operator_api_requests_total",
        client="telemetry-test",
        resource="deployments",
        verb="list",
        code="none",
    )
    async with KubeClient(configuration, component="telemetry-test") as kube:
        with pytest.raises(NoAnswer):
            await kube.list(DEPLOYMENTS, "ns")
    assert (
        value(
            "kiln_operator_api_requests_total",
            client="telemetry-test",
            resource="deployments",
            verb="list",
            code="none",
        )
        == before + 1
    )


async def test_an_unreachable_prometheus_counts_as_unreachable_and_its_query_is_timed() -> None:
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}")
    errors = value(
        "kiln_operator_prometheus_query_errors_total", query="signals", kind="unreachable"
    )
    timed = value("kiln_operator_prometheus_query_duration_seconds_count", query="signals")
    try:
        snapshot = await source.snapshot(60, 0)
    finally:
        source.close()
    assert snapshot.error is not None
    assert (
        value("kiln_operator_prometheus_query_errors_total", query="signals", kind="unreachable")
        == errors + 1
    )
    assert (
        value("kiln_operator_prometheus_query_duration_seconds_count", query="signals") == timed + 1
    )


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (requests.ReadTimeout("slow"), "unreachable"),
        (requests.ConnectionError("refused"), "unreachable"),
        (PrometheusApiClientException("HTTP Status Code 400 (bad_data)"), "error"),
        (ValueError("not JSON"), "invalid"),
    ],
)
def test_query_errors_are_sorted_into_kinds(error: Exception, kind: str) -> None:
    def counts() -> dict[str, float]:
        kinds = ("unreachable", "error", "invalid")
        name = "kiln_operator_prometheus_query_errors_total"
        return {k: value(name, query="kinds-test", kind=k) for k in kinds}

    before = counts()
    with pytest.raises(type(error)), telemetry.prometheus_query("kinds-test"):
        raise error
    after = counts()
    assert {k for k in after if after[k] != before[k]} == {kind}
    assert after[kind] == before[kind] + 1


def test_a_deleted_services_series_go_and_other_services_stay() -> None:
    telemetry.observe_decision(
        "tel-ns", "gone", reason="Steady", desired=2, previous=2, slo_p99_seconds=0.1
    )
    telemetry.observe_decision(
        "tel-ns", "gone", reason="LatencyAboveTarget", desired=3, previous=2, slo_p99_seconds=0.1
    )
    telemetry.observe_decision(
        "tel-ns", "stays", reason="Steady", desired=1, previous=1, slo_p99_seconds=0.1
    )
    telemetry.WARMUP_GATES.labels("tel-ns", "gone", "passed").inc()
    labels = {"namespace": "tel-ns", "inferenceservice": "gone"}
    assert value("kiln_operator_autoscaler_desired_replicas", **labels) == 3
    telemetry.forget_service("tel-ns", "gone")
    for name in (
        "kiln_operator_autoscaler_desired_replicas",
        "kiln_operator_autoscaler_current_replicas",
    ):
        assert REGISTRY.get_sample_value(name, labels) is None
    for reason in ("Steady", "LatencyAboveTarget"):
        assert (
            REGISTRY.get_sample_value(
                "kiln_operator_autoscaler_decisions_total", {**labels, "reason": reason}
            )
            is None
        )
    assert (
        REGISTRY.get_sample_value(
            "kiln_operator_warmup_gates_total", {**labels, "result": "passed"}
        )
        is None
    )
    assert (
        value(
            "kiln_operator_autoscaler_decisions_total",
            namespace="tel-ns",
            inferenceservice="stays",
            reason="Steady",
        )
        == 1
    )


def test_a_condition_keeps_one_series_with_its_current_reason() -> None:
    def ready(status: str, reason: str) -> dict[str, str]:
        return {"type": "Ready", "status": status, "reason": reason}

    stalled = {"type": "Stalled", "status": "True", "reason": "CrashLoop"}
    ignored = {"type": "SpecValid", "status": "True", "reason": "Valid"}
    telemetry.observe_conditions("cond-ns", "svc", [ready("False", "WarmingUp"), stalled, ignored])
    labels = {"namespace": "cond-ns", "inferenceservice": "svc"}
    name = "kiln_operator_inferenceservice_condition"
    assert value(name, **labels, condition="Ready", reason="WarmingUp") == 0
    assert value(name, **labels, condition="Stalled", reason="CrashLoop") == 1
    assert (
        REGISTRY.get_sample_value(name, {**labels, "condition": "SpecValid", "reason": "Valid"})
        is None
    )
    telemetry.observe_conditions("cond-ns", "svc", [ready("True", "Available")])
    assert (
        REGISTRY.get_sample_value(name, {**labels, "condition": "Ready", "reason": "WarmingUp"})
        is None
    )
    assert (
        REGISTRY.get_sample_value(name, {**labels, "condition": "Stalled", "reason": "CrashLoop"})
        is None
    )
    assert value(name, **labels, condition="Ready", reason="Available") == 1

"""The operator's own /metrics on the real control plane: a created service's reconciles (applied,
then converged) and the API requests that made its children, a missing profile's reconcile
counted with its condition reason, the work queue's gauges, the autoscaler's decision per
service; and the per-service series gone once the service is deleted."""

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kiln_localcluster.processes import free_ports
from kiln_localcluster.waiting import wait_for
from kiln_operator.constants import GROUP, VERSION
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    OperatorProcess,
    apply,
    gpu_service,
    wait_condition,
)

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def test_the_operator_counts_its_reconciles_api_requests_queue_and_decisions(
    cluster: Cluster, namespace: str, start_operator: Any
) -> None:
    (port,) = free_ports(1)
    operator: OperatorProcess = start_operator(
        [namespace], env={"KILN_OPERATOR_METRICS_PORT": str(port)}
    )
    metered = gpu_service("metered")
    apply(cluster, namespace, metered)
    lost = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": "lost"},
    }
    apply(
        cluster,
        namespace,
        {**lost, "spec": {"profile": "no-such-profile", "model": metered["spec"]["model"]}},
    )
    wait_condition(
        cluster, namespace, name="lost", kind="Ready", status="False", reason="ProfileNotFound"
    )
    service = {"namespace": namespace, "inferenceservice": "metered"}

    def settled() -> Samples | None:
        samples = scrape(port)
        converged = total(samples, "kiln_operator_reconciles_total", outcome="converged")
        decided = total(samples, "kiln_operator_autoscaler_decisions_total", **service)
        return samples if converged >= 1 and decided >= 1 else None

    samples: Samples = wait_for(
        settled, timeout=90, description="a converged reconcile and an autoscaler decision"
    )
    assert total(samples, "kiln_operator_reconciles_total", outcome="applied") >= 1
    assert (
        total(
            samples,
            "kiln_operator_reconciles_total",
            outcome="spec_error",
            reason="ProfileNotFound",
        )
        >= 1
    )
    assert total(samples, "kiln_operator_reconcile_duration_seconds_count") >= 3
    # the reconcile loop's own client created the Deployment and the Service
    for resource in ("deployments", "services"):
        assert (
            total(
                samples,
                "kiln_operator_api_requests_total",
                client="reconcile",
                resource=resource,
                verb="create",
                code="201",
            )
            >= 1
        ), resource
    assert total(samples, "kiln_operator_api_requests_total", verb="patch", code="200") >= 1
    assert total(samples, "kiln_operator_api_request_duration_seconds_count", verb="create") >= 2
    assert ("kiln_operator_workqueue_depth", frozenset()) in samples
    assert samples[("kiln_operator_workqueue_oldest_seconds", frozenset())] < 60
    assert total(samples, "kiln_operator_workqueue_adds_total") >= 2
    assert total(samples, "kiln_operator_autoscaler_desired_replicas", **service) >= 1
    assert total(samples, "kiln_operator_autoscaler_current_replicas", **service) >= 0

    cluster.kubectl("delete", "inferenceservice", "metered", "-n", namespace)
    wait_for(
        lambda: total(scrape(port), "kiln_operator_autoscaler_decisions_total", **service) == 0,
        timeout=60,
        description="the deleted service's decision series dropped",
    )
    assert total(scrape(port), "kiln_operator_autoscaler_desired_replicas", **service) == 0
    assert operator.process.poll() is None

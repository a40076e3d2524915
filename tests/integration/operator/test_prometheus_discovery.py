"""Prometheus finds Kiln's runtime pods itself, as a user's Prometheus without the Prometheus
Operator does: the scrape configuration docs/prometheus.md ships (manifests/prometheus/, the file
itself), Kubernetes pod discovery against the local API server with the shipped ServiceAccount's
own token and rights, on the real node. A runtime pod becomes a target with Kiln's three labels
once it runs, its metrics are queryable (the warm-up's 64 requests, counted by the pod), and the
target goes when the service is deleted. The times are printed (`-s`) for the report.
"""

import json
import time
import urllib.request
from typing import Any

import pytest

from kiln_localcluster.discovery import ServiceAccount
from kiln_localcluster.load import ready_endpoints
from kiln_localcluster.prometheus import LocalPrometheus
from kiln_localcluster.waiting import wait_for
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import apply, mlp_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)]


def active_targets(prometheus: LocalPrometheus | str) -> list[dict[str, Any]]:
    """A Prometheus's active targets (by its URL, or the one started here)."""
    base = prometheus if isinstance(prometheus, str) else prometheus.url
    with urllib.request.urlopen(f"{base}/api/v1/targets?state=active", timeout=5) as response:
        targets: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
        return targets


def pods_of(cluster: Cluster, namespace: str, service: str) -> list[dict[str, Any]]:
    listed = cluster.get_json(
        "pods", "-n", namespace, "-l", f"serving.kiln.dev/inferenceservice={service}"
    )
    return list(listed["items"])


def can_i(cluster: Cluster, account: ServiceAccount, *what: str) -> bool:
    subject = f"system:serviceaccount:{account.namespace}:{account.name}"
    result = cluster.kubectl("auth", "can-i", *what, f"--as={subject}", check=False)
    return result.stdout.strip() == "yes"


def test_the_shipped_rbac_grants_pod_discovery_and_nothing_more(
    cluster: Cluster, prometheus_account: ServiceAccount
) -> None:
    assert can_i(cluster, prometheus_account, "list", "pods", "--all-namespaces")
    assert can_i(cluster, prometheus_account, "watch", "pods", "--all-namespaces")
    for verb, resource in [("get", "secrets"), ("list", "secrets"), ("get", "pods"),
                           ("create", "pods"), ("list", "services")]:  # fmt: skip
        assert not can_i(cluster, prometheus_account, verb, resource, "--all-namespaces")


def test_prometheus_discovers_runtime_pods_with_its_own_token_and_scrapes_them(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    prometheus = start_prometheus()
    apply(cluster, namespace, mlp_service("found"))

    # side by side, for the report: the cluster's own Prometheus, fed by the file targets
    # kiln_localcluster.targets writes (make cluster-up, the demo and the e2e tier use it)
    file_fed = cluster.info.prometheus
    running_at = discovered_at = up_at = file_up_at = None
    target: dict[str, Any] = {}
    deadline = time.monotonic() + 240
    while (up_at is None or (file_up_at is None and file_fed)) and time.monotonic() < deadline:
        now = time.monotonic()
        if running_at is None and any(
            p["status"].get("phase") == "Running" for p in pods_of(cluster, namespace, "found")
        ):
            running_at = now
        mine = [t for t in active_targets(prometheus) if t["labels"].get("namespace") == namespace]
        if mine and discovered_at is None:
            discovered_at, target = now, mine[0]
        if mine and mine[0]["health"] == "up" and up_at is None:
            up_at, target = now, mine[0]
        if (
            file_fed
            and file_up_at is None
            and any(
                t["labels"].get("namespace") == namespace and t["health"] == "up"
                for t in active_targets(file_fed)
            )
        ):
            file_up_at = now
        time.sleep(0.2)
    assert running_at is not None and up_at is not None, f"no target up: {target}"
    assert discovered_at is not None
    print(
        f"\n[discovery] pod Running -> target discovered {discovered_at - running_at:.1f} s, "
        f"-> first scrape up {up_at - running_at:.1f} s; file targets: first scrape up "
        + (f"{file_up_at - running_at:.1f} s" if file_up_at is not None else "never")
    )

    (pod,) = pods_of(cluster, namespace, "found")
    labels = target["labels"]
    assert labels["job"] == "kiln-runtime"
    assert (labels["namespace"], labels["pod"], labels["inferenceservice"]) == (
        namespace, pod["metadata"]["name"], "found",
    )  # fmt: skip
    assert labels["instance"] == f"{pod['status']['podIP']}:8002"
    assert target["scrapeUrl"] == f"http://{pod['status']['podIP']}:8002/metrics"

    # the pod's own counts, read through the labels the autoscaler's queries use
    wait_for(
        lambda: ready_endpoints(cluster.info, namespace, "found"),
        timeout=240,
        description="found serving (its warm-up done)",
    )
    selector = f'namespace="{namespace}",inferenceservice="found"'
    warmed = wait_for(
        lambda: prometheus.query(f"sum(kiln_warmup_requests_total{{{selector}}})"),
        timeout=30,
        description="the warm-up's requests in Prometheus",
    )
    assert float(warmed[0]["value"][1]) == 64
    (depth,) = prometheus.query(f"kiln_queue_depth{{{selector}}}")
    assert depth["metric"]["pod"] == pod["metadata"]["name"]

    # every target is one of Kiln's pods (the API server sends no other pod)
    for other in active_targets(prometheus):
        assert other["labels"].get("inferenceservice"), other["labels"]

    cluster.kubectl("delete", "inferenceservice", "found", "-n", namespace)
    deleted_at = time.monotonic()
    wait_for(
        lambda: (
            not any(t["labels"].get("namespace") == namespace for t in active_targets(prometheus))
        ),
        timeout=120,
        description="the deleted service's target dropped",
    )
    print(f"[discovery] service deleted -> target dropped {time.monotonic() - deleted_at:.1f} s")

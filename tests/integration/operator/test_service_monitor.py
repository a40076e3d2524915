"""Kiln's ServiceMonitors against the real Prometheus Operator CRDs, on the real control plane.

The monitoring.coreos.com CRDs are the Prometheus Operator's own, pinned from its Go module
(e2e/gotools, PROMETHEUS_OPERATOR_VERSION), installed for these tests only and removed after (a
cluster with them makes every operator build ServiceMonitors instead of scrape annotations).
Both ServiceMonitors Kiln renders pass the CRD's schema with strict field validation (an unknown
or misspelt field is refused, not silently pruned), server-side dry run and apply alike; the
operator creates its per-service one through the same schema; each selects exactly its Service
and names a port that Service has. No Prometheus Operator runs here: what it would scrape is
what the selectors select, shown against the live objects.
"""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster.waiting import wait_for
from kiln_operator.builders.compare import covers
from kiln_operator.builders.naming import Owner
from kiln_operator.builders.service_monitor import build_service_monitor
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool, prometheus_operator_crds
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import OperatorProcess, apply, get, gpu_service
from tests.sessioncluster import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)]

MONITORING_CRDS = ("servicemonitors",)
CHART = REPO / "manifests" / "charts" / "kiln"


@pytest.fixture
def monitoring_crds(kiln_crds: Cluster) -> Iterator[Cluster]:
    """The pinned Prometheus Operator's ServiceMonitor CRD, for one test."""
    directory = Path(prometheus_operator_crds())
    files = [str(directory / f"monitoring.coreos.com_{kind}.yaml") for kind in MONITORING_CRDS]
    kiln_crds.kubectl("apply", "--server-side", *[arg for f in files for arg in ("-f", f)])
    crds = [f"crd/{kind}.monitoring.coreos.com" for kind in MONITORING_CRDS]
    wait_for(
        lambda: (
            kiln_crds.kubectl(
                "wait", "--for=condition=Established", "--timeout=10s", *crds, check=False
            ).returncode
            == 0
        ),
        timeout=60,
        description="the ServiceMonitor CRD established",
    )
    yield kiln_crds
    kiln_crds.kubectl("delete", *crds, "--wait=true", "--timeout=60s", check=False)


def strictly_applied(cluster: Cluster, manifest: dict[str, Any], *flags: str) -> str:
    """`kubectl apply --server-side --validate=strict`: the API server refuses an unknown field."""
    return cluster.kubectl(
        "apply", "--server-side", "--field-manager=kiln-test", "--validate=strict", *flags,
        "-f", "-", input=json.dumps(manifest),
    ).stdout  # fmt: skip


def selected(
    cluster: Cluster, namespace: str, kind: str, match_labels: dict[str, str]
) -> list[str]:
    """The names of the objects of `kind` a ServiceMonitor's matchLabels select."""
    selector = ",".join(f"{key}={value}" for key, value in sorted(match_labels.items()))
    listed = cluster.get_json(kind, "-n", namespace, "-l", selector)
    return [item["metadata"]["name"] for item in listed["items"]]


def port_names(service: dict[str, Any]) -> set[str]:
    return {port["name"] for port in service["spec"]["ports"]}


def test_the_operator_s_service_monitor_passes_the_crd_and_selects_its_service(
    monitoring_crds: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster = monitoring_crds
    apply(cluster, namespace, gpu_service("monitored"))
    live = wait_for(
        lambda: get(cluster, namespace, "servicemonitor", "monitored"),
        timeout=60,
        description="the ServiceMonitor the operator creates",
    )
    service = get(cluster, namespace, "service", "monitored")
    assert service is not None
    # with the CRD present the plain scrape annotations are left off the Service
    assert "prometheus.io/scrape" not in (service["metadata"].get("annotations") or {})

    owner = Owner("monitored", namespace, live["metadata"]["ownerReferences"][0]["uid"])
    desired = build_service_monitor(owner)
    # the CRD's defaults (a relabeling's `action: replace`) are added, nothing Kiln sets is pruned
    assert covers(live["spec"], desired["spec"]), live["spec"]
    # the builder's object, under a name of the test's own: refused on any unknown field
    as_built = {**desired, "metadata": {"name": "as-built", "namespace": namespace}}
    strictly_applied(cluster, as_built, "--dry-run=server")
    assert get(cluster, namespace, "servicemonitor", "as-built") is None
    strictly_applied(cluster, as_built)
    applied = get(cluster, namespace, "servicemonitor", "as-built")
    assert applied is not None and covers(applied["spec"], desired["spec"])

    # converged despite those defaults: a reconcile of the service leaves the monitor alone
    version = live["metadata"]["resourceVersion"]
    apply(cluster, namespace, gpu_service("monitored", drain={"maxRequestSeconds": 31}))
    wait_for(
        lambda: (
            (deployment := get(cluster, namespace, "deployment", "monitored"))
            and deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 41
        ),
        timeout=60,
        description="the spec change reconciled",
    )
    after = get(cluster, namespace, "servicemonitor", "monitored")
    assert after is not None and after["metadata"]["resourceVersion"] == version

    spec = live["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [namespace]}
    assert selected(cluster, namespace, "services", spec["selector"]["matchLabels"]) == [
        "monitored"
    ]
    assert {endpoint["port"] for endpoint in spec["endpoints"]} <= port_names(service)

    # the schema is really enforced: a misspelt field and a wrong value are refused
    refusable = {**as_built, "metadata": {"name": "refused", "namespace": namespace}}
    wrong = json.loads(json.dumps(refusable))
    wrong["spec"]["endpoints"][0]["intervall"] = "15s"
    refused = cluster.kubectl(
        "apply", "--server-side", "--validate=strict", "--dry-run=server", "-f", "-",
        input=json.dumps(wrong), check=False,
    )  # fmt: skip
    assert refused.returncode != 0, "a misspelt field was accepted"
    assert ".spec.endpoints[0].intervall: field not declared in schema" in refused.stderr
    wrong = json.loads(json.dumps(refusable))
    wrong["spec"]["endpoints"][0]["scheme"] = "ftp"
    refused = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=json.dumps(wrong),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "scheme" in refused.stderr, refused.stderr


def helm_template(*values: str) -> list[dict[str, Any]]:
    """The chart rendered by the pinned Helm, without a cluster."""
    result = subprocess.run(
        [str(go_tool("helm")), "template", "kiln", str(CHART), *values],
        capture_output=True, text=True, timeout=120, check=True, env={**os.environ},
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_chart_s_service_monitor_passes_the_crd_and_selects_the_metrics_service(
    monitoring_crds: Cluster, namespace: str
) -> None:
    cluster = monitoring_crds
    rendered = helm_template(
        "--namespace", namespace, "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=monitoring",
    )  # fmt: skip
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in rendered:
        by_kind.setdefault(doc["kind"], []).append(doc)
    (monitor,) = by_kind["ServiceMonitor"]
    (metrics_service,) = [
        s for s in by_kind["Service"] if s["metadata"]["name"].endswith("-metrics")
    ]
    (deployment,) = by_kind["Deployment"]

    for manifest in (metrics_service, monitor):
        # a client-side `kubectl apply --dry-run=server` (as `helm install` and Argo CD
        # validate), then server-side apply, dry run and for real
        cluster.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-f", "-",
            input=json.dumps(manifest),
        )  # fmt: skip
        strictly_applied(cluster, manifest, "--dry-run=server")
        strictly_applied(cluster, manifest)
    live = get(cluster, namespace, "servicemonitor", monitor["metadata"]["name"])
    assert live is not None and live["spec"]["endpoints"] == monitor["spec"]["endpoints"]
    assert live["metadata"]["labels"]["release"] == "monitoring"

    # no namespaceSelector: the Prometheus Operator looks in the ServiceMonitor's own namespace
    assert "namespaceSelector" not in live["spec"]
    match = live["spec"]["selector"]["matchLabels"]
    assert selected(cluster, namespace, "services", match) == [metrics_service["metadata"]["name"]]
    service = get(cluster, namespace, "service", metrics_service["metadata"]["name"])
    assert service is not None
    assert {endpoint["port"] for endpoint in live["spec"]["endpoints"]} <= port_names(service)
    # and the port the Service forwards to is one the operator's container declares
    (metrics_port,) = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
    containers = deployment["spec"]["template"]["spec"]["containers"]
    declared = {port["name"] for c in containers for port in c.get("ports", [])}
    assert metrics_port["targetPort"] in declared
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()

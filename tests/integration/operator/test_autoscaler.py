"""The SLO autoscaler end to end: real Prometheus scraping Kiln's runtime image at its pods' IPs on
the local cluster's real node.

Load drives p99 over the SLO, so the service scales up; when the load stops it scales back down,
but only after the hold window; with Prometheus gone it never scales down; a pre-warm window a
few minutes ahead raises the replicas before it opens.
"""

import asyncio
import datetime
import functools
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kiln_localcluster.load import ready_endpoints, run_load
from kiln_localcluster.processes import stop
from kiln_localcluster.prometheus import LocalPrometheus
from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import AuditLog, apply, condition, mlp_service

pytestmark = pytest.mark.integration

HOLD_SECONDS = 20
STEADY_SECONDS = 30


def scaled_service(name: str, prometheus: LocalPrometheus, **autoscaling: Any) -> dict[str, Any]:
    service = mlp_service(name)
    # An SLO a loaded CPU cannot meet: load makes the service unhealthy, idleness healthy.
    service["spec"]["slo"] = autoscaling.pop("slo", None) or {"p99LatencyMilliseconds": 2}
    service["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "prometheusUrl": prometheus.url,
        "evaluationIntervalSeconds": 5,
        "metricsWindowSeconds": 15,
        "staleAfterSeconds": 15,
        "scaleUp": {"stabilizationSeconds": 0},
        "scaleDown": {"stabilizationSeconds": HOLD_SECONDS, "periodSeconds": 0},
        **autoscaling,
    }
    return service


def replicas(cluster: Cluster, namespace: str, name: str) -> int:
    return int(cluster.get_json("deployment", name, "-n", namespace)["spec"]["replicas"])


def autoscaling_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = cluster.get_json("inferenceservice", name, "-n", namespace)
    status: dict[str, Any] = (body.get("status") or {}).get("autoscaling") or {}
    return status


@contextmanager
def load(cluster: Cluster, namespace: str, service: str) -> Iterator[None]:
    """Bounded background load (at most 120 s / 200k requests) until the block ends."""
    stopping = threading.Event()

    def endpoints() -> list[str]:
        return ready_endpoints(cluster.info, namespace, service)

    thread = threading.Thread(target=lambda: asyncio.run(run_load(
        endpoints, service, seconds=120, max_requests=200_000, concurrency=16, stop=stopping,
    )))  # fmt: skip
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        thread.join(timeout=30)


def started_service(
    cluster: Cluster, namespace: str, name: str, prometheus: LocalPrometheus, **autoscaling: Any
) -> None:
    """Apply the service and wait until it serves (the first pod of a fresh cluster is slow)."""
    apply(cluster, namespace, scaled_service(name, prometheus, **autoscaling))
    wait_for(
        lambda: ready_endpoints(cluster.info, namespace, name), timeout=240,
        description=f"{name} serving",
    )  # fmt: skip


def test_scales_up_under_load_and_down_after_the_hold(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    prometheus = start_prometheus()
    started_service(cluster, namespace, "busy", prometheus)
    with load(cluster, namespace, "busy"):
        wait_for(
            lambda: replicas(cluster, namespace, "busy") > 1,
            timeout=90,
            description="a scale-up under load",
        )
        status = autoscaling_status(cluster, namespace, "busy")
        assert status["metricsAvailable"] is True
        assert status["observed"]["p99LatencyMilliseconds"] > 2
        capacity = wait_for(
            lambda: autoscaling_status(cluster, namespace, "busy").get("capacity"),
            timeout=30, description="a capacity measured from the batch metrics",
        )  # fmt: skip
        assert capacity["requestsPerSecondPerReplica"] > 0
        event = wait_for(
            lambda: cluster.get_json(
                "events", "-n", namespace, "--field-selector",
                "involvedObject.name=busy,reason=ScaledUp",
            )["items"],
            timeout=30, description="a ScaledUp event",
        )[0]  # fmt: skip
        assert "->" in event["message"]
    load_stopped = time.monotonic()
    wait_for(
        lambda: replicas(cluster, namespace, "busy") == 1,
        timeout=150,
        description="the scale-down once the load stopped",
    )
    assert time.monotonic() - load_stopped >= HOLD_SECONDS


def queries_answered(prometheus: LocalPrometheus) -> float:
    """Instant queries Prometheus has answered, from its own /metrics."""
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line
    )


@pytest.mark.usefixtures("models_claim", "operator")
def test_one_query_per_cycle_for_every_service_and_a_quiet_steady_status(
    cluster: Cluster, namespace: str, start_prometheus: Any, audit: AuditLog
) -> None:
    prometheus = start_prometheus()
    names = ["quiet-a", "quiet-b", "quiet-c"]
    for name in names:
        # An SLO an idle service always meets: nothing to scale, so nothing to write.
        started_service(
            cluster, namespace, name, prometheus, slo={"p99LatencyMilliseconds": 60_000}
        )

    def read(name: str) -> dict[str, Any] | None:
        """The status once the warm-up gate's requests have left the 15 s rate window."""
        status = autoscaling_status(cluster, namespace, name)
        idle = status.get("observed", {}).get("requestsPerSecond") == 0
        return status if status.get("metricsAvailable") and idle else None

    for name in names:
        status = wait_for(
            functools.partial(read, name), timeout=90, description=f"{name} idle, read"
        )
        # No traffic reads as no traffic: no p99 of 0, the message says so.
        assert "p99LatencyMilliseconds" not in status["observed"]
        assert status["observed"]["requestsPerSecond"] == 0
        assert status["message"].startswith("no traffic"), status["message"]
        assert status["updatedAt"]
    # Settled: no write for longer than the 15 s rate window and an evaluation interval (5 s).
    # On the real node the last service's warm-up traffic leaves the windows in steps the
    # status follows (a write every 10 s, seen by the rehearsal), so a shorter quiet spell can
    # fall between two (a CI rehearsal saw one write after a quiet spell of 12 s).
    audit.wait_quiet(namespace, seconds=20, timeout=120)

    mark, queries_before, started = audit.mark(), queries_answered(prometheus), time.monotonic()
    settled = {n: autoscaling_status(cluster, namespace, n) for n in names}
    written_at = {n: status["updatedAt"] for n, status in settled.items()}
    time.sleep(STEADY_SECONDS)
    elapsed = time.monotonic() - started
    queries = queries_answered(prometheus) - queries_before
    # Three services evaluated every 5 s for 30 s: 18 evaluations; one shared snapshot at
    # most 2.5 s old serves them all. Per service, it would be 18 x the queries per service.
    assert queries <= elapsed / 2.5 + 2, queries
    assert queries >= elapsed / 5 - 2, queries  # and the services were evaluated meanwhile
    writes = audit.operator_writes(mark, namespace)
    assert writes == [], {  # what moved, should a write come: the status before and after
        n: (settled[n], autoscaling_status(cluster, namespace, n)) for n in names
    }
    assert {n: autoscaling_status(cluster, namespace, n)["updatedAt"] for n in names} == written_at


def test_prometheus_down_never_scales_down(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    prometheus = start_prometheus()
    started_service(cluster, namespace, "blind", prometheus, whenMetricsMissing={"policy": "Hold"})
    with load(cluster, namespace, "blind"):
        wait_for(
            lambda: replicas(cluster, namespace, "blind") > 1,
            timeout=90,
            description="a scale-up under load",
        )
        stop(prometheus.process)
    scaled_to = replicas(cluster, namespace, "blind")
    wait_for(
        lambda: autoscaling_status(cluster, namespace, "blind").get("metricsAvailable") is False,
        timeout=30,
        description="the status saying metrics are unavailable",
    )
    # Well past the hold window with no load: a sighted autoscaler would have scaled down.
    observed_until = time.monotonic() + HOLD_SECONDS + 15
    while time.monotonic() < observed_until:
        assert replicas(cluster, namespace, "blind") == scaled_to
        time.sleep(1)
    assert "Prometheus" in autoscaling_status(cluster, namespace, "blind")["message"]
    body = cluster.get_json("inferenceservice", "blind", "-n", namespace)
    metrics = condition(body, "MetricsAvailable")
    assert metrics is not None and metrics["status"] == "False"
    assert metrics["reason"] == "MetricsUnavailable" and "Prometheus" in metrics["message"]


def test_prewarm_window_raises_replicas_before_it_opens(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    prometheus = start_prometheus()
    opens = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=4)).replace(
        second=0, microsecond=0
    )
    service = scaled_service("peak", prometheus)
    service["spec"]["prewarm"] = {"schedules": [{
        "name": "soon", "cron": f"{opens.minute} {opens.hour} * * *", "timeZone": "UTC",
        "durationMinutes": 10, "minReplicas": 3, "leadTimeSeconds": 600,
    }]}  # fmt: skip
    apply(cluster, namespace, service)

    def raised() -> dict[str, Any] | None:
        window = autoscaling_status(cluster, namespace, "peak").get("activeWindow")
        return window if window and replicas(cluster, namespace, "peak") == 3 else None

    window = wait_for(raised, timeout=90, description="the pre-warm floor applied")
    assert datetime.datetime.now(datetime.UTC) < opens  # raised before the window opens
    assert window["name"] == "soon"
    assert datetime.datetime.fromisoformat(window["opensAt"]) == opens

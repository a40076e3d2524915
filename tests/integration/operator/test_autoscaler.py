"""The SLO autoscaler end to end: real Prometheus scraping Kiln's runtime image at its pods' IPs on
the local cluster's real node.

Load drives p99 over the SLO, so the service scales up; when the load stops it scales back down,
but only after the hold window; a queue over its target scales up while the p99 meets the SLO;
the warm-up gate's own requests never count as load; a count set by hand (`kubectl scale` of
the InferenceService or of its Deployment) ends where docs/autoscaling.md says; with Prometheus
gone it never scales down; a pre-warm window a few minutes ahead raises the replicas before it
opens.
"""

import asyncio
import datetime
import functools
import json
import re
import threading
import time
import urllib.parse
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


def events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The service's events with this reason, oldest first."""
    found: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", namespace, "--field-selector",
        f"involvedObject.name={name},reason={reason}",
    )["items"]  # fmt: skip
    return sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def query(prometheus: LocalPrometheus, promql: str) -> float | None:
    """The value of an instant query that returns one series, or None when it returns none."""
    url = f"{prometheus.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@contextmanager
def load(cluster: Cluster, namespace: str, service: str, concurrency: int = 16) -> Iterator[None]:
    """Bounded background load (at most 120 s / 200k requests) until the block ends."""
    stopping = threading.Event()

    def endpoints() -> list[str]:
        return ready_endpoints(cluster.info, namespace, service)

    thread = threading.Thread(target=lambda: asyncio.run(run_load(
        endpoints, service, seconds=120, max_requests=200_000, concurrency=concurrency,
        stop=stopping,
    )))  # fmt: skip
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        thread.join(timeout=30)


def started_service(
    cluster: Cluster,
    namespace: str,
    name: str,
    prometheus: LocalPrometheus,
    spec: dict[str, Any] | None = None,
    **autoscaling: Any,
) -> None:
    """Apply the service (top-level `spec` parts replaced) and wait until it serves (the first
    pod of a fresh cluster is slow)."""
    service = scaled_service(name, prometheus, **autoscaling)
    service["spec"].update(spec or {})
    apply(cluster, namespace, service)
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


def test_queue_over_its_target_scales_up_while_p99_meets_the_slo(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    prometheus = start_prometheus()
    # Batches of at most 2 rows for 32 clients: most requests wait in the queue behind the
    # batch computing, a few milliseconds each, far under a 10 s SLO.
    started_service(
        cluster, namespace, "queued", prometheus,
        spec={"runtime": {**mlp_service("queued")["spec"]["runtime"],
                          "batching": {"maxBatchSize": 2, "maxQueueDelayMicroseconds": 100_000}}},
        slo={"p99LatencyMilliseconds": 10_000}, queueDepthPerReplica=1,
        # one replica per step, under maxReplicas: the reason stays the trigger's
        scaleUp={"stabilizationSeconds": 0, "maxStepReplicas": 1, "maxStepPercent": 1},
    )  # fmt: skip
    with load(cluster, namespace, "queued", concurrency=32):
        scaled = wait_for(
            lambda: events(cluster, namespace, "queued", "ScaledUp"),
            timeout=90, description="a scale-up under load",
        )  # fmt: skip
        status = autoscaling_status(cluster, namespace, "queued")
    message = scaled[0]["message"]
    assert message.startswith("1 -> 2 (QueueAboveTarget): "), message
    assert replicas(cluster, namespace, "queued") == 2
    # The p99 stayed under its target: the queue alone scaled.
    assert status["observed"]["p99LatencyMilliseconds"] < 10_000, status
    queued = re.search(r"queue/replica ([0-9.]+) \(target 1\)", message)
    assert queued is not None and float(queued.group(1)) > 1, message
    print(f"\nqueue-depth scale-up: {message}")


def test_the_warm_up_gates_requests_are_never_load(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    """`make demo` once went 1 -> 2 ("13.9 req/s on 0 ready") before any client had sent a
    request: the gate's requests reached the metrics the autoscaler reads."""
    prometheus = start_prometheus()
    # An SLO of 2 ms and a queue target of 1: 400 warm-up requests, 8 at a time, on a shared
    # CPU breach both if read as load.
    warmup = {**mlp_service("warm")["spec"]["warmup"], "requests": 400, "concurrency": 8}
    started_service(
        cluster, namespace, "warm", prometheus, spec={"warmup": warmup},
        maxReplicas=2, queueDepthPerReplica=1,
    )  # fmt: skip
    # The gate passed: its requests are in the 15 s rate window for its length at least.
    observed: list[dict[str, Any]] = []
    until = time.monotonic() + 25
    while time.monotonic() < until:
        status = autoscaling_status(cluster, namespace, "warm")
        if status.get("metricsAvailable"):
            observed.append(status["observed"])
        assert replicas(cluster, namespace, "warm") == 1, status
        time.sleep(1)
    assert observed, "no status with metrics in 25 s"
    assert all(o["requestsPerSecond"] == 0 for o in observed), observed
    assert all("p99LatencyMilliseconds" not in o for o in observed), observed
    assert events(cluster, namespace, "warm", "ScaledUp") == []
    # Prometheus has the gate's requests, counted apart.
    warm = f'namespace="{namespace}",inferenceservice="warm"'
    assert query(prometheus, f"sum(kiln_warmup_requests_total{{{warm}}})") == 400
    assert not query(prometheus, f"sum(kiln_requests_total{{{warm}}})")


def test_hand_scaling_ends_where_the_docs_say(
    cluster: Cluster, namespace: str, models_claim: str, operator: Any, start_prometheus: Any
) -> None:
    """docs/autoscaling.md, "Who writes replicas": `kubectl scale kis` sets the floor, which the
    next evaluation applies; `kubectl scale deployment` is taken as the current count and
    corrected by the autoscaler's rules (an idle service: down to the floor once healthy for
    the hold window)."""
    prometheus = start_prometheus()
    started_service(cluster, namespace, "hand", prometheus, slo={"p99LatencyMilliseconds": 60_000})
    wait_for(
        lambda: autoscaling_status(cluster, namespace, "hand").get("metricsAvailable"),
        timeout=60, description="the autoscaler reading metrics",
    )  # fmt: skip

    cluster.kubectl("scale", "inferenceservice/hand", "--replicas=2", "-n", namespace)
    body = cluster.get_json("inferenceservice", "hand", "-n", namespace)
    assert body["spec"]["autoscaling"]["minReplicas"] == 2  # the scale subresource's path
    raised = wait_for(
        lambda: events(cluster, namespace, "hand", "ScaledUp"),
        timeout=30, description="the floor applied",
    )  # fmt: skip
    assert raised[0]["message"].startswith("1 -> 2 (MinReplicas): "), raised[0]["message"]
    assert replicas(cluster, namespace, "hand") == 2

    cluster.kubectl("scale", "deployment/hand", "--replicas=3", "-n", namespace)
    scaled_by_hand = time.monotonic()
    lowered = wait_for(
        lambda: events(cluster, namespace, "hand", "ScaledDown"),
        timeout=HOLD_SECONDS + 40, description="the count set by hand corrected",
    )  # fmt: skip
    message = lowered[0]["message"]
    # one bounded step down (LoadDecreased), or a larger one that the floor stopped at 2
    assert re.match(r"3 -> 2 \((LoadDecreased|MinReplicas)\): ", message), message
    assert "set to 3 outside the autoscaler (it had left them at 2)" in message, message
    wait_for(
        lambda: replicas(cluster, namespace, "hand") == 2,
        timeout=10, description="the Deployment back at the floor",
    )  # fmt: skip
    print(f"\nhand scale corrected after {time.monotonic() - scaled_by_hand:.0f} s: {message}")


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
        """The status once the autoscaler reads the service's metrics: idle (the warm-up
        gate's requests are not load)."""
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
    # (Before the warm-up gate's requests were counted apart, they left the windows in steps
    # the status followed, a write every 10 s; 20 s of quiet is kept as the margin.)
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

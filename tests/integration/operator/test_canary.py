"""spec.rollout.canary on the real control plane: kwok's pods, a real Prometheus, the operator.

The pods run no container, so the two versions' metrics come from one loopback server that
renders what a stable and a canary runtime export (the series labels the scrape config gives,
`kiln_track="canary"` on the canary's), with the latency each test chooses. The operator does
everything else for real: the canary Deployment beside the stable one, status.rollout, the
judgement from Prometheus, the replicas of both, promotion or rollback, events, kstatus.
The real node's tests (tests/e2e/test_canary.py) send real traffic through the Service.
"""

import functools
import json
import math
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster import prometheus
from kiln_localcluster.processes import stop
from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import apply, condition, get, gpu_service

pytestmark = pytest.mark.integration

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, math.inf)
STABLE_RATE = 30.0
CANARY_RATE = 10.0
STEP_SECONDS = 10


class TwoVersions:
    """/metrics of one service's stable and canary versions: counters growing at a steady
    rate, every request of a version in one latency bucket, optionally some failing."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.services: dict[str, tuple[float, float]] = {}
        """Per service: the canary's latency and its failing share."""
        self.started = time.monotonic()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def render(self) -> str:
        elapsed = time.monotonic() - self.started
        lines = []
        for service, (canary_latency, canary_failing) in self.services.items():
            versions = (
                ("", STABLE_RATE, 0.004, 0.0),
                (',kiln_track="canary"', CANARY_RATE, canary_latency, canary_failing),
            )
            for track, rate, latency, failing in versions:
                labels = (
                    f'namespace="{self.namespace}",inferenceservice="{service}",'
                    f'pod="{service}{"-canary" if track else ""}-0",model="{service}",'
                    f'protocol="http"{track}'
                )
                answered = math.floor(rate * elapsed)
                failed = math.floor(answered * failing)
                ok = answered - failed
                for bound in LATENCY_BUCKETS:
                    le = "+Inf" if math.isinf(bound) else repr(bound)
                    count = ok if bound >= latency else 0
                    lines.append(
                        f'kiln_request_duration_seconds_bucket{{{labels},code="ok",le="{le}"}} '
                        f"{count}"
                    )
                lines.append(f'kiln_requests_total{{{labels},code="ok"}} {ok}')
                lines.append(f'kiln_requests_total{{{labels},code="internal"}} {failed}')
                lines.append(f"kiln_queue_depth{{{labels}}} 0")
        return "\n".join(lines) + "\n"


@pytest.fixture
def two_versions(
    namespace: str, tmp_path: Path
) -> Iterator[tuple[TwoVersions, prometheus.LocalPrometheus]]:
    if (missing := prometheus.available()) is not None:
        pytest.fail(f"{missing}: run `make system-deps`")
    server = TwoVersions(namespace)
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{server.port}"], "labels": {}}]))
    local = prometheus.start_prometheus(targets, tmp_path / "prometheus")
    try:
        yield server, local
    finally:
        stop(local.process)
        server.close()


def canary_service(name: str, url: str, version: str = "1") -> dict[str, Any]:
    """The service; another `version` is another pod template (an annotation of its pods)."""
    return gpu_service(
        name,
        slo={"p99LatencyMilliseconds": 100},
        pod={"annotations": {"example.com/version": version}},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 4,
            "prometheusUrl": url,
            "evaluationIntervalSeconds": 5,
            "metricsWindowSeconds": 15,
            "staleAfterSeconds": 15,
        },
        rollout={"canary": {"steps": [25, 50], "stepSeconds": STEP_SECONDS, "minRequests": 20}},
    )


def rollout(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = get(cluster, namespace, "inferenceservice", name) or {}
    found: dict[str, Any] = (body.get("status") or {}).get("rollout") or {}
    return found


def template(cluster: Cluster, namespace: str, name: str) -> Any:
    deployment = get(cluster, namespace, "deployment", name) or {}
    return (deployment.get("spec") or {}).get("template")


def replicas(cluster: Cluster, namespace: str, name: str) -> int | None:
    deployment = get(cluster, namespace, "deployment", name)
    return None if deployment is None else int(deployment["spec"].get("replicas", 1))


def reasons(cluster: Cluster, namespace: str, name: str) -> list[str]:
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    ordered = sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [event["reason"] for event in ordered]


def started(cluster: Cluster, namespace: str, name: str, url: str) -> Any:
    """The service applied and available; the stable Deployment's template."""
    apply(cluster, namespace, canary_service(name, url))
    wait_for(
        lambda: (
            (condition(get(cluster, namespace, "inferenceservice", name), "Ready") or {}).get(
                "status"
            )
            == "True"
        ),
        timeout=90,
        interval=1.0,
        description=f"{name} Ready",
    )
    return template(cluster, namespace, name)


def rolled_back(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    found = rollout(cluster, namespace, name)
    return found if found.get("phase") == "RolledBack" else None


def canary_gone(cluster: Cluster, namespace: str, name: str) -> bool:
    return get(cluster, namespace, "deployment", f"{name}-canary") is None


def autoscaler_p99(cluster: Cluster, namespace: str, name: str) -> float | None:
    body = get(cluster, namespace, "inferenceservice", name) or {}
    observed = ((body.get("status") or {}).get("autoscaling") or {}).get("observed") or {}
    value = observed.get("p99LatencyMilliseconds")
    return None if value is None else float(value)


def kstatus(cluster: Cluster, namespace: str, name: str, kind: str) -> tuple[str, str]:
    found = condition(get(cluster, namespace, "inferenceservice", name), kind) or {}
    return found.get("status", ""), found.get("reason", "")


@pytest.mark.usefixtures("operator")
def test_a_good_canary_is_promoted_step_by_step_and_a_deleted_canary_comes_back(
    cluster: Cluster, namespace: str, two_versions: tuple[TwoVersions, Any]
) -> None:
    server, local = two_versions
    server.services["good"] = (0.004, 0.0)
    stable_template = started(cluster, namespace, "good", local.url)
    apply(cluster, namespace, canary_service("good", local.url, version="2"))  # a new version

    canary = wait_for(
        lambda: get(cluster, namespace, "deployment", "good-canary"),
        timeout=30,
        interval=1.0,
        description="the canary Deployment",
    )
    assert canary["metadata"]["labels"]["serving.kiln.dev/track"] == "canary"
    wait_for(
        lambda: rollout(cluster, namespace, "good").get("stableReplicas") == 3,
        timeout=30,
        interval=1.0,
        description="the stable Deployment sized for the 25 % step",
    )
    status = rollout(cluster, namespace, "good")
    assert (status["phase"], status["step"], status["sharePercent"]) == ("Progressing", 0, 25)
    assert status["canaryReplicas"] == 1
    assert template(cluster, namespace, "good") == stable_template  # the stable version serves
    assert kstatus(cluster, namespace, "good", "Reconciling") == ("True", "CanaryProgressing")
    wait_for(
        lambda: (
            (replicas(cluster, namespace, "good"), replicas(cluster, namespace, "good-canary"))
            == (3, 1)
        ),
        timeout=30,
        interval=1.0,
        description="both Deployments scaled by the autoscaler for the step",
    )

    # A deleted canary Deployment is re-created, and its step's window restarts.
    cluster.kubectl("delete", "deployment", "good-canary", "-n", namespace, "--wait=false")
    wait_for(
        lambda: (
            (get(cluster, namespace, "deployment", "good-canary") or {})
            .get("metadata", {})
            .get("uid")
            not in (None, canary["metadata"]["uid"])
        ),
        timeout=30,
        interval=1.0,
        description="the canary Deployment re-created",
    )

    def passed(step: int) -> dict[str, Any] | None:
        found = rollout(cluster, namespace, "good")
        verdict = found.get("lastVerdict") or {}
        if found.get("phase") in ("Promoting", "Promoted") or found.get("step", 0) > step:
            return found
        assert verdict.get("result") != "Fail", found
        return None

    first = wait_for(lambda: passed(0), timeout=60, description="step 1 passed")
    verdict = first["lastVerdict"]
    assert verdict["reason"] == "CanaryStepPassed" and verdict["result"] == "Pass"
    assert abs(verdict["measuredSharePercent"] - 25.0) < 2.0  # the series' own 10 of 40 req/s
    assert verdict["canaryP99Milliseconds"] <= 5.0 and verdict["canaryErrorRatio"] == 0
    done = wait_for(
        lambda: rollout(cluster, namespace, "good").get("phase") == "Promoted",
        timeout=90,
        interval=1.0,
        description="the canary promoted",
    )
    assert done
    wait_for(
        lambda: get(cluster, namespace, "deployment", "good-canary") is None,
        timeout=30,
        interval=1.0,
        description="the canary Deployment removed",
    )
    assert template(cluster, namespace, "good") != stable_template  # the stable one rolled
    seen = reasons(cluster, namespace, "good")
    assert seen.count("CanaryStarted") == 1, seen
    assert seen.count("CanaryStepPassed") == 2, seen
    assert "CanaryPromoted" in seen and "CanaryRolledBack" not in seen, seen
    wait_for(
        lambda: kstatus(cluster, namespace, "good", "Reconciling") == ("False", "Converged"),
        timeout=30,
        interval=1.0,
        description="converged after the promotion",
    )


@pytest.mark.usefixtures("operator")
def test_a_slow_canary_is_rolled_back_within_its_first_window_and_stalls_until_the_spec_changes(
    cluster: Cluster, namespace: str, two_versions: tuple[TwoVersions, Any]
) -> None:
    server, local = two_versions
    server.services["slow"] = (0.04, 0.0)  # 40 ms against a stable 4 ms
    server.services["failing"] = (0.004, 0.2)  # a fifth of its requests fail
    templates = {name: started(cluster, namespace, name, local.url) for name in server.services}
    for name in server.services:
        apply(cluster, namespace, canary_service(name, local.url, version="2"))
    for name, reason in (("slow", "CanarySlowerThanStable"), ("failing", "CanaryErrors")):
        began = time.monotonic()
        status = wait_for(
            functools.partial(rolled_back, cluster, namespace, name),
            timeout=60,
            interval=1.0,
            description=f"{name}: rolled back",
        )
        verdict = status["lastVerdict"]
        assert verdict["reason"] == reason, verdict
        assert status["step"] == 0 and verdict["windowSeconds"] <= STEP_SECONDS + 5
        if name == "slow":
            assert verdict["canaryP99Milliseconds"] > 25
            assert verdict["stableP99Milliseconds"] <= 5
        else:
            assert verdict["canaryErrorRatio"] > 0.1
        assert time.monotonic() - began < 60
        # The window starts when both Deployments are at the step's sizes and ready; errors are
        # judged even before it (then from the step's start).
        began = status.get("windowStartedAt") or status["stepStartedAt"]
        judged = datetime.fromisoformat(verdict["at"]) - datetime.fromisoformat(began)
        # By the end of the first window: errors at once, slower than stable at the window's
        # end (at the first autoscaler pass after it, every 5 s).
        assert judged.total_seconds() <= STEP_SECONDS + 5, (judged, status)
        wait_for(
            functools.partial(canary_gone, cluster, namespace, name),
            timeout=30,
            interval=1.0,
            description=f"{name}: the canary Deployment removed",
        )
        assert template(cluster, namespace, name) == templates[name]
        assert kstatus(cluster, namespace, name, "Stalled") == ("True", "CanaryRolledBack")
        assert kstatus(cluster, namespace, name, "Ready")[0] == "True"
        assert "CanaryRolledBack" in reasons(cluster, namespace, name)
    # The autoscaler reads the stable version's series only: the canary's 40 ms (its series
    # are still scraped here) never raise the p99 it scales on.
    observed = wait_for(
        functools.partial(autoscaler_p99, cluster, namespace, "slow"),
        timeout=30,
        interval=1.0,
        description="the autoscaler's p99",
    )
    assert observed <= 5.0, observed
    # Stalled until the spec changes: the same spec stays rolled back...
    time.sleep(6)
    assert rollout(cluster, namespace, "slow")["phase"] == "RolledBack"
    assert get(cluster, namespace, "deployment", "slow-canary") is None
    # ... and going back to the stable version ends it.
    apply(cluster, namespace, canary_service("slow", local.url))
    wait_for(
        lambda: kstatus(cluster, namespace, "slow", "Stalled")[0] == "False",
        timeout=30,
        interval=1.0,
        description="no longer stalled once the spec is the stable version again",
    )

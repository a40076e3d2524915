"""The autoscaler's pass with spec.rollout.canary: it judges the canary, writes status.rollout
under its own field manager, and is the one writer of both Deployments' replicas (the stable
one sized for the step's share)."""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from kiln_operator.api.validation import parse_spec
from kiln_operator.autoscaling.prometheus import Snapshot
from kiln_operator.autoscaling.signals import ServiceSignals
from kiln_operator.builders import Owner, build_deployment
from kiln_operator.builders.canary import build_canary_deployment, revision_of
from kiln_operator.k8s.autoscaler import ROLLOUT_FIELD_MANAGER, Autoscaler
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.rollout.machine import CanaryMetrics, TrackSignals
from tests.unit.operator.conftest import load_sample

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
OWNER = Owner(name="mlp", namespace="ns", uid="isvc-uid")
URL = "http://prometheus.test"
CANARY = {"serving.kiln.dev/track": "canary"}


class RecordingKube:
    def __init__(self) -> None:
        self.statuses: list[tuple[str, dict[str, Any]]] = []
        self.scales: dict[str, int] = {}
        self.annotated: list[str] = []

    async def apply_status(
        self, resource: Any, namespace: str, name: str, status: dict[str, Any], manager: str
    ) -> dict[str, Any]:
        self.statuses.append((manager, status))
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "9"}}

    async def merge_patch(
        self, resource: Any, namespace: str, name: str, patch: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        if "spec" in patch:
            self.scales[name] = patch["spec"]["replicas"]
        elif resource.plural == "pods":
            self.annotated.append(name)
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "9"}}


class FixedSource:
    """Prometheus as one window read: the stable version idle and fast, the canary as given."""

    def __init__(self, canary: TrackSignals) -> None:
        self.canary_signals = canary
        self.windows: list[int] = []

    async def snapshot(self, window_seconds: int, max_age_seconds: float) -> Snapshot:
        signals = ServiceSignals(
            freshest=T0.timestamp(), p99_seconds=0.004, requests_per_second=0.0, queue_depth=0.0
        )
        return Snapshot(time.monotonic(), services={("ns", "mlp"): signals})

    async def canary(self, namespace: str, name: str, window_seconds: int) -> CanaryMetrics:
        self.windows.append(window_seconds)
        return CanaryMetrics(window_seconds, self.canary_signals, TrackSignals(900, 0, 0.004))

    def load_by_pod(self, namespace: str, service: str, window_seconds: int) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def spec(version: str) -> dict[str, Any]:
    body: dict[str, Any] = load_sample("minimal")["spec"]
    body["autoscaling"] = {"minReplicas": 1, "maxReplicas": 6}  # the operator's Prometheus
    body["rollout"] = {"canary": {"steps": [25, 50], "stepSeconds": 60}}
    body["pod"] = {"annotations": {"example.com/version": version}}
    return body


def ready(deployment: dict[str, Any], replicas: int, uid: str) -> dict[str, Any]:
    deployment["metadata"] |= {"uid": uid, "generation": 1}
    deployment["spec"]["replicas"] = replicas
    deployment["status"] = {
        "observedGeneration": 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }
    return deployment


def autoscaler_on_step_one(
    canary: TrackSignals,
    *,
    measuring: bool = True,
    stable_ready: int = 3,
    seen: bool = True,
    pod_statuses: dict[str, dict[str, Any]] | None = None,
) -> tuple[Autoscaler, RecordingKube, str]:
    """Step 1 (25 %) with 3 stable replicas and 1 canary; `measuring`: its window started 61 s
    ago (else it has not started); `stable_ready`: the stable pods ready of 3; `seen`: the
    Deployment controller has seen the stable Deployment's last change; `pod_statuses`: a pod's
    status by name (mlp-a, mlp-b, mlp-c stable; mlp-canary-x the canary's)."""
    old, new = parse_spec("mlp", spec("1")), parse_spec("mlp", spec("2"))
    stable = ready(build_deployment(old, OWNER, 3), 3, "stable-uid")  # type: ignore[arg-type]
    stable["status"]["readyReplicas"] = stable_ready
    if not seen:
        stable["metadata"]["generation"] = 2  # its replicas just changed: the count is old
    desired = build_deployment(new, OWNER)  # type: ignore[arg-type]
    revision = revision_of(desired)
    cache = ObjectCache()
    cache.store(
        "inferenceservices",
        {
            "apiVersion": "serving.kiln.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "mlp", "namespace": "ns", "uid": "isvc-uid", "generation": 2},
            "spec": spec("2"),
            "status": {
                "rollout": {
                    "phase": "Progressing",
                    "revision": revision,
                    "step": 0,
                    "steps": 2,
                    "sharePercent": 25,
                    "stepStartedAt": (T0 - timedelta(seconds=70)).isoformat(),
                    **(
                        {"windowStartedAt": (T0 - timedelta(seconds=61)).isoformat()}
                        if measuring
                        else {}
                    ),
                    "canaryReplicas": 1,
                    "stableReplicas": 3,
                }
            },
        },
    )
    cache.store("deployments", stable)
    cache.store("deployments", ready(build_canary_deployment(desired, OWNER, 1), 1, "canary-uid"))
    for pod, track in (("mlp-a", {}), ("mlp-b", {}), ("mlp-c", {}), ("mlp-canary-x", CANARY)):
        labels = {"serving.kiln.dev/inferenceservice": "mlp", **track}
        cache.store(
            "pods",
            {
                "metadata": {"name": pod, "namespace": "ns", "labels": labels},
                "status": (pod_statuses or {}).get(pod, {}),
            },
        )
    kube = RecordingKube()
    autoscaler = Autoscaler(kube, cache, URL)  # type: ignore[arg-type]
    autoscaler.sources[URL] = FixedSource(canary)  # type: ignore[assignment]
    return autoscaler, kube, revision


async def test_a_passed_step_moves_to_the_next_share_and_sizes_both_deployments() -> None:
    autoscaler, kube, revision = autoscaler_on_step_one(TrackSignals(300, 0, 0.004))
    evaluation = await autoscaler.evaluate("ns", "mlp", T0)
    assert evaluation is not None and evaluation.rollout_changed
    assert [e.reason for e in evaluation.rollout_events] == ["CanaryStepPassed"]
    (written,) = [s for m, s in kube.statuses if m == ROLLOUT_FIELD_MANAGER]
    rollout = written["rollout"]
    assert (rollout["revision"], rollout["step"], rollout["sharePercent"]) == (revision, 1, 50)
    assert rollout["lastVerdict"]["measuredSharePercent"] == 25.0
    # The demand holds 3 replicas (the scale-down's stabilization); at 50 % that is 2 and 2,
    # both written by the autoscaler, the stable count with the canary's share in its message.
    assert (rollout["stableReplicas"], rollout["canaryReplicas"]) == (2, 2)
    assert kube.scales == {"mlp": 2, "mlp-canary": 2}
    assert "2 stable replicas keep the canary's share (the demand asks 3)" in (
        evaluation.decision.message
    )
    # Before the stable scale-down, its own pods are marked (never a canary pod).
    assert sorted(kube.annotated) == ["mlp-a", "mlp-b", "mlp-c"]
    assert not any("rollout" in s for m, s in kube.statuses if m != ROLLOUT_FIELD_MANAGER)


async def test_a_slow_canary_is_rolled_back_and_its_latency_never_scales_the_stable_one() -> None:
    autoscaler, kube, _ = autoscaler_on_step_one(TrackSignals(300, 0, 0.045))
    evaluation = await autoscaler.evaluate("ns", "mlp", T0)
    assert evaluation is not None and evaluation.rollout_changed
    assert [(e.type, e.reason) for e in evaluation.rollout_events] == [
        ("Warning", "CanaryRolledBack")
    ]
    (written,) = [s for m, s in kube.statuses if m == ROLLOUT_FIELD_MANAGER]
    assert written["rollout"]["phase"] == "RolledBack"
    assert written["rollout"]["lastVerdict"]["reason"] == "CanarySlowerThanStable"
    assert kube.scales == {}  # the reconcile loop deletes the canary; the stable one holds
    assert evaluation.decision.desired_replicas == 3  # never up for the canary's 45 ms


async def test_the_steps_window_starts_when_both_deployments_are_at_its_sizes_and_ready() -> None:
    """The pass gives the machine both Deployments' replicas and ready pods and the step's sizes
    at its demand (3 and 1 at 25 %): one stable pod not ready, or a ready count the Deployment
    controller has not brought up to date, holds the window; all ready start it."""
    for short, seen, said in ((2, True, "stable 2 ready of 3"), (3, False, "stable 0 ready of 3")):
        autoscaler, kube, _ = autoscaler_on_step_one(
            TrackSignals(300, 0, 0.004), measuring=False, stable_ready=short, seen=seen
        )
        evaluation = await autoscaler.evaluate("ns", "mlp", T0)
        assert evaluation is not None and evaluation.rollout_changed
        (written,) = [s for m, s in kube.statuses if m == ROLLOUT_FIELD_MANAGER]
        assert "windowStartedAt" not in written["rollout"]
        assert written["rollout"]["lastVerdict"]["reason"] == "CanaryScaling"
        assert f"{said} (wanted 3)" in written["rollout"]["lastVerdict"]["message"]
    autoscaler, kube, _ = autoscaler_on_step_one(TrackSignals(300, 0, 0.004), measuring=False)
    evaluation = await autoscaler.evaluate("ns", "mlp", T0)
    assert evaluation is not None and evaluation.rollout_events == ()
    (written,) = [s for m, s in kube.statuses if m == ROLLOUT_FIELD_MANAGER]
    assert written["rollout"]["windowStartedAt"] == T0.isoformat().replace("+00:00", "Z")
    assert written["rollout"]["lastVerdict"]["reason"] == "CanaryMeasuring"


GATE_FAILED = {
    "conditions": [
        {
            "type": "serving.kiln.dev/warmed-up",
            "status": "False",
            "reason": "P99OverBound",
            "message": "warm-up p99 1900.00 ms (p50 700.00 ms) over 25 requests exceeds 1000 ms",
        }
    ]
}


async def test_a_canary_pod_that_failed_its_warm_up_gate_rolls_the_canary_back() -> None:
    """The pass hands the machine the gate's verdict on a canary pod (a stable pod's failed gate
    is not the canary's)."""
    fast = TrackSignals(300, 0, 0.004)
    autoscaler, kube, _ = autoscaler_on_step_one(fast, pod_statuses={"mlp-a": GATE_FAILED})
    evaluation = await autoscaler.evaluate("ns", "mlp", T0)
    assert evaluation is not None
    assert [e.reason for e in evaluation.rollout_events] == ["CanaryStepPassed"]

    autoscaler, kube, _ = autoscaler_on_step_one(fast, pod_statuses={"mlp-canary-x": GATE_FAILED})
    evaluation = await autoscaler.evaluate("ns", "mlp", T0)
    assert evaluation is not None and evaluation.rollout_changed
    assert [(e.type, e.reason) for e in evaluation.rollout_events] == [
        ("Warning", "CanaryRolledBack")
    ]
    (written,) = [s for m, s in kube.statuses if m == ROLLOUT_FIELD_MANAGER]
    verdict = written["rollout"]["lastVerdict"]
    assert (written["rollout"]["phase"], verdict["reason"]) == ("RolledBack", "CanaryWarmupFailed")
    assert verdict["message"] == (
        "a canary pod failed its warm-up gate: warm-up of pod mlp-canary-x failed "
        "(P99OverBound): warm-up p99 1900.00 ms (p50 700.00 ms) over 25 requests exceeds 1000 ms"
    )

"""The warm-up gate's metrics: a warmed pod's cold start, and its model fetch once per pod; and
its verdict handing the activator's held requests to the pod."""

from typing import Any, cast

from prometheus_client import REGISTRY

from kiln_operator import constants
from kiln_operator.handlers.warmup_gate import _release_held, observe_warm_pod
from kiln_operator.k8s.activator import Activators
from kiln_operator.k8s.cache import ObjectCache
from tests.unit.warmup.test_podstate import GATE
from tests.unit.warmup.test_podstate import pod as gated_pod

FETCHED = "model fetched: 268435456 bytes in 3.250 s from s3://models/m/"


def warm_pod(namespace: str, uid: str, fetch_message: str | None) -> dict[str, Any]:
    warm = gated_pod((GATE, "True", "WarmedUp"))
    warm["metadata"].update(namespace=namespace, uid=uid)
    if fetch_message is not None:
        terminated = {"exitCode": 0, "reason": "Completed", "message": fetch_message}
        warm["status"]["initContainerStatuses"] = [
            {"name": constants.FETCH_CONTAINER, "state": {"terminated": terminated}}
        ]
    return warm


def sample(name: str, namespace: str) -> float | None:
    labels = {"namespace": namespace, "inferenceservice": "svc"}
    return REGISTRY.get_sample_value(name, labels)


def test_a_warm_pods_download_is_observed_once_beside_its_cold_start() -> None:
    seen: set[str] = set()
    warm = warm_pod("metrics-once", "uid-1", FETCHED)
    observe_warm_pod(warm, "svc", seen)
    observe_warm_pod(warm, "svc", seen)  # its runtime container restarted and warmed again
    assert sample("kiln_operator_pod_cold_start_seconds_count", "metrics-once") == 2
    assert sample("kiln_operator_model_download_seconds_count", "metrics-once") == 1
    assert sample("kiln_operator_model_download_seconds_sum", "metrics-once") == 3.25
    assert sample("kiln_operator_model_download_bytes_sum", "metrics-once") == 268435456
    observe_warm_pod(warm_pod("metrics-once", "uid-2", FETCHED), "svc", seen)
    assert sample("kiln_operator_model_download_bytes_count", "metrics-once") == 2


def test_a_pod_without_a_fetch_observes_no_download() -> None:
    observe_warm_pod(warm_pod("metrics-none", "uid-3", None), "svc", set())
    assert sample("kiln_operator_pod_cold_start_seconds_count", "metrics-none") == 1
    assert sample("kiln_operator_model_download_seconds_count", "metrics-none") is None


def test_a_cache_hit_is_observed_as_zero_bytes() -> None:
    restored = "model fetched: 0 bytes in 0.800 s from s3://models/m/"
    observe_warm_pod(warm_pod("metrics-cached", "uid-4", restored), "svc", set())
    labels = {"namespace": "metrics-cached", "inferenceservice": "svc", "le": "0.0"}
    assert REGISTRY.get_sample_value("kiln_operator_model_download_bytes_bucket", labels) == 1


class RecordingActivators:
    """Records what the gate reports (kiln_operator.k8s.activator.Activators' report)."""

    def __init__(self) -> None:
        self.reports: list[tuple[tuple[str, str], list[str], list[str]]] = []

    async def report(self, key: tuple[str, str], http: list[str], grpc: list[str]) -> None:
        self.reports.append((key, http, grpc))


async def test_at_its_verdict_a_pod_takes_the_held_requests_and_the_cache_keeps_it() -> None:
    def runtime_pod(name: str, ip: str, gate: str) -> dict[str, Any]:
        body = gated_pod((GATE, gate, "WarmedUp" if gate == "True" else "WarmingUp"))
        body["metadata"].update(name=name, namespace="models", uid=f"uid-{name}",
                                labels={constants.LABEL_INFERENCESERVICE: "mlp"})  # fmt: skip
        body["status"].update(podIP=ip, phase="Running")
        body["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})
        return body

    cache = ObjectCache()
    cache.store("pods", {**runtime_pod("mlp-a", "10.2.0.5", "False")})
    cache.store("pods", runtime_pod("mlp-b", "10.2.0.6", "False"))
    decided = runtime_pod("mlp-a", "10.2.0.5", "True")  # the verdict's patch, before its event
    decided["metadata"]["resourceVersion"] = "9"
    activators = RecordingActivators()
    await _release_held(cast(Activators, activators), cache, decided, "models", "mlp")
    assert activators.reports == [(("models", "mlp"), ["10.2.0.5:8000"], ["10.2.0.5:8001"])]
    cached = cache.get("pods", "models", "mlp-a")
    assert cached is not None and cached["metadata"]["resourceVersion"] == "9"

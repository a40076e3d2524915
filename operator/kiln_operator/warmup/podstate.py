"""Reading and writing the warm-up gate's state on pods. Pure: pods in, decisions and patches out.

Why it exists: the gate is level-based — whether a pod still needs warming, what the pod
condition must say, and what the InferenceService's status summarises about warm-up are all
derived from the pods themselves, so an operator restart loses nothing and repeats nothing.
"""

import datetime
from dataclasses import dataclass
from typing import Any

from kiln_operator import constants
from kiln_operator.status.download import model_download
from kiln_operator.warmup.plan import REASON_GATE_DISABLED, REASON_WARMING, percentile

Pod = dict[str, Any]


def _condition(pod: Pod, kind: str) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def gate_condition(pod: Pod) -> dict[str, Any] | None:
    """The pod's warmed-up condition, if it has one yet."""
    return _condition(pod, constants.CONDITION_WARMED_UP)


def is_gated(pod: Pod) -> bool:
    """True when the pod's readiness waits for Kiln's warmed-up condition."""
    gates = pod.get("spec", {}).get("readinessGates") or []
    return any(g.get("conditionType") == constants.CONDITION_WARMED_UP for g in gates)


def serving_pods(pods: list[Pod]) -> list[Pod]:
    """Pods that may take traffic, in name order: with an address, not being deleted, and
    either past their warm-up gate with their containers ready (a gated pod), or Ready (one
    without a gate). A gated pod serves from the gate's verdict on, before its Ready: the kubelet
    computes Ready from its own copy of the pod, refreshed only at its next sync of the pod (1 to
    2 s later on the real node), and Ready adds nothing the verdict did not check. Where Kiln's
    activator releases held requests, and what a service at minReplicas 0 lists as its
    endpoints."""

    def serves(pod: Pod) -> bool:
        address = (pod.get("status") or {}).get("podIP")
        deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
        if not address or deleting:
            return False
        if not is_gated(pod):
            return (_condition(pod, "Ready") or {}).get("status") == "True"
        containers = (_condition(pod, "ContainersReady") or {}).get("status") == "True"
        warm = (gate_condition(pod) or {}).get("status") == "True"
        return containers and warm and not verdict_outlived_its_container(pod)

    return sorted((pod for pod in pods if serves(pod)), key=lambda pod: pod["metadata"]["name"])


def ready_addresses(pods: list[Pod]) -> tuple[list[str], list[str]]:
    """`ip:port` of the HTTP and gRPC ports of every serving pod (`serving_pods`)."""
    ips = sorted(str(pod["status"]["podIP"]) for pod in serving_pods(pods))
    hosts = [f"[{ip}]" if ":" in ip else ip for ip in ips]
    return (
        [f"{host}:{constants.HTTP_PORT}" for host in hosts],
        [f"{host}:{constants.GRPC_PORT}" for host in hosts],
    )


def needs_warmup(pod: Pod) -> bool:
    """A gated, running pod whose container is ready and whose gate is not yet decided.

    A gate left at WarmingUp (an operator stopped mid-attempt) is taken up again; a final
    verdict (True, or False with a failure reason) stays until the pod is replaced.
    """
    if not is_gated(pod) or pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status", {})
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    containers_ready = _condition(pod, "ContainersReady")
    if not containers_ready or containers_ready.get("status") != "True":
        return False
    gate = gate_condition(pod)
    return gate is None or gate.get("reason") == REASON_WARMING


def verdict_outlived_its_container(pod: Pod) -> bool:
    """True when the gate's verdict predates the runtime container that runs now.

    A container the kubelet restarted (a crash, an OOM kill, a failed liveness probe) lost what
    warm-up built — compiled graphs, allocator pools, caches — so the verdict given to its
    predecessor must not let it take traffic: the gate has to be decided again.
    """
    gate = gate_condition(pod)
    if (
        gate is None
        or gate.get("reason") in (REASON_WARMING, REASON_GATE_DISABLED)
        or not gate.get("lastTransitionTime")
        or pod["metadata"].get("deletionTimestamp")
    ):
        return False
    decided = _timestamp(gate["lastTransitionTime"])
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") != constants.RUNTIME_CONTAINER:
            continue
        ended = (status.get("state") or {}).get("terminated", {}).get("finishedAt")
        if not status.get("restartCount"):
            # The first container exited and the kubelet has not restarted it yet: the gate
            # closes now, seconds before the restarted container's readiness probe can pass.
            if ended and _timestamp(ended) > decided:
                return True
            continue
        moments = [
            (status.get("state") or {}).get("running", {}).get("startedAt"),
            ended,
            (status.get("lastState") or {}).get("terminated", {}).get("finishedAt"),
        ]
        if any(m and _timestamp(m) > decided for m in moments):
            return True
    return False


def condition_patch(
    passed: bool, reason: str, message: str, now: datetime.datetime
) -> dict[str, Any]:
    """A strategic-merge patch of pods/status setting the gate condition.

    Strategic merge merges `conditions` by `type`, so the kubelet's conditions stay; a JSON merge
    patch would replace the whole list.
    """
    return {
        "status": {
            "conditions": [
                {
                    "type": constants.CONDITION_WARMED_UP,
                    "status": "True" if passed else "False",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now.astimezone(datetime.UTC).strftime(
                        "%Y-%m-%dT%H:%M:%SZ"
                    ),
                }
            ]
        }
    }


def _timestamp(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def cold_start_seconds(pod: Pod) -> float | None:
    """Pod creation to warmed-up, or None while the pod is not warmed up."""
    gate = gate_condition(pod)
    if gate is None or gate.get("status") != "True" or not gate.get("lastTransitionTime"):
        return None
    created = _timestamp(pod["metadata"]["creationTimestamp"])
    return (_timestamp(gate["lastTransitionTime"]) - created).total_seconds()


@dataclass(frozen=True)
class WarmupSummary:
    """What the InferenceService's status says about its pods' warm-up."""

    warm_replicas: int
    failed_replicas: int
    failure_message: str | None
    last_cold_start_seconds: float | None
    cold_start_p50_seconds: float | None
    cold_start_p90_seconds: float | None
    last_download_seconds: float | None = None
    last_download_bytes: int | None = None


def summary_status(summary: WarmupSummary) -> dict[str, Any]:
    """`status.warmup` of the InferenceService (camelCase; unknown values left out)."""
    fields = {
        "warmReplicas": summary.warm_replicas,
        "failedReplicas": summary.failed_replicas,
        "failureMessage": summary.failure_message,
        "lastColdStartSeconds": summary.last_cold_start_seconds,
        "coldStartP50Seconds": summary.cold_start_p50_seconds,
        "coldStartP90Seconds": summary.cold_start_p90_seconds,
        "lastDownloadSeconds": summary.last_download_seconds,
        "lastDownloadBytes": summary.last_download_bytes,
    }
    return {key: value for key, value in fields.items() if value is not None}


def summarize(pods: list[Pod]) -> WarmupSummary:
    """Warm and failed pods, and cold-start times of the warm ones (latest, p50, p90)."""
    live = [p for p in pods if is_gated(p) and not p["metadata"].get("deletionTimestamp")]
    warmed = [(p, s) for p in live if (s := cold_start_seconds(p)) is not None]
    failed = [
        gate
        for p in live
        if (gate := gate_condition(p)) is not None
        and gate.get("status") == "False"
        and gate.get("reason") != REASON_WARMING
    ]
    starts = sorted(seconds for _, seconds in warmed)
    latest = max(warmed, key=lambda item: _warmed_at(item[0]), default=None)
    download = model_download(latest[0]) if latest else None
    return WarmupSummary(
        warm_replicas=len(warmed),
        failed_replicas=len(failed),
        failure_message=f"{failed[0]['reason']}: {failed[0].get('message', '')}"
        if failed
        else None,
        last_cold_start_seconds=latest[1] if latest else None,
        cold_start_p50_seconds=percentile(starts, 50) if starts else None,
        cold_start_p90_seconds=percentile(starts, 90) if starts else None,
        last_download_seconds=download.seconds if download else None,
        last_download_bytes=download.bytes if download else None,
    )


def _warmed_at(pod: Pod) -> datetime.datetime:
    gate = gate_condition(pod)
    assert gate is not None  # only called for warmed pods
    return _timestamp(gate["lastTransitionTime"])

"""first_cause: why the pods of an InferenceService do not serve, from what the operator watches;
placement_failure: why pods it asks for cannot exist at all (created, then scheduled).

Why it exists: "0 of 1 updated pods are available" tells nobody what to do. Kubernetes already
knows the cause — the scheduler's reason on the pod, the ReplicaSet's failure to create pods
(a quota) copied onto the Deployment, the kubelet's container states, the warm-up gate's
verdict — and the operator already watches the Deployment and the pods. This reads them (no
request of its own) and names the first cause, in the order a person should fix them. The
narrower placement failure (a refused create, an unschedulable pod) is what more replicas
cannot fix: the status says so in its own condition, and the autoscaler stops adding replicas
while it lasts. Pure: the objects are parameters.
"""

from dataclasses import dataclass
from typing import Any

from kiln_operator import constants
from kiln_operator.warmup.plan import REASON_WARMING

IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
"""Container waiting reasons of the kubelet that mean the image cannot be had."""
CONFIG_ERROR_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
"""Container waiting reasons meaning the container cannot be created as specified."""
FAILED_CREATE = "FailedCreate"
"""The ReplicaSet's ReplicaFailure reason when it cannot create a pod (FailedDelete when it cannot
delete one)."""
SCHEDULER_UNSCHEDULABLE = "Unschedulable"
"""The scheduler's PodScheduled reason when no node fits the pod (v1.PodReasonUnschedulable)."""
MAX_CAUSE = 400
"""Characters kept of a message Kubernetes wrote (a termination message can be long)."""


@dataclass(frozen=True)
class Cause:
    """Why pods do not serve: a reason constant, and a message naming the pod and the cause."""

    reason: str
    message: str
    failure: bool
    """True when the pods will not serve without a change (of the spec, the cluster, a quota);
    False while they are merely on their way (starting, warming up)."""


def _trim(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_CAUSE else text[: MAX_CAUSE - 1] + "…"


def _condition(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind), None)


def _crashed(container: dict[str, Any]) -> dict[str, Any] | None:
    """The terminated state of a container that exited with an error and has not been ready
    since, else None. The whole cycle of a crash loop counts: waiting in back-off, just exited
    (before the kubelet's back-off starts), and running its retry until it turns ready. So Ready
    keeps one reason, carrying the last exit's termination message, through the cycle (a
    runtime that cannot load its model would otherwise read as RuntimeNotReady, "loading the
    model", for the seconds of each retry)."""
    if container.get("ready"):
        return None
    state = container.get("state") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    if "waiting" in state:
        waiting = state.get("waiting") or {}
        return last if waiting.get("reason") == "CrashLoopBackOff" else None
    if "terminated" in state:
        terminated = state.get("terminated") or {}
        return terminated if int(terminated.get("exitCode") or 0) != 0 else None
    if "running" in state and int(last.get("exitCode") or 0) != 0:
        return last
    return None


def _failed_gate(pod: dict[str, Any]) -> str | None:
    """What the warm-up gate said of a pod it failed (its verdict, final until the pod is
    replaced), else None."""
    gate = _condition((pod.get("status") or {}).get("conditions"), constants.CONDITION_WARMED_UP)
    if not gate or gate.get("status") != "False" or gate.get("reason") == REASON_WARMING:
        return None
    return (
        f"warm-up of pod {pod['metadata']['name']} failed ({gate.get('reason')}): "
        f"{_trim(gate.get('message', ''))}"
    )


def failed_warmup(pods: list[dict[str, Any]]) -> str | None:
    """The verdict of one pod among `pods` (the first by name) that failed its warm-up gate and
    is not being deleted, else None."""
    failed = sorted(
        (pod["metadata"]["name"], said)
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp") and (said := _failed_gate(pod))
    )
    return failed[0][1] if failed else None


def _pod_cause(pod: dict[str, Any]) -> Cause | None:
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    conditions = status.get("conditions")
    scheduled = _condition(conditions, "PodScheduled")
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason"):
        return Cause(
            constants.REASON_UNSCHEDULABLE,
            f"pod {name} cannot be scheduled: {_trim(scheduled.get('message', ''))}",
            failure=True,
        )
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in IMAGE_PULL_REASONS:
            return Cause(
                constants.REASON_IMAGE_PULL_FAILED,
                f"pod {name} cannot pull image {container.get('image', '')} ({reason}): "
                f"{_trim(waiting.get('message', ''))}",
                failure=True,
            )
        if reason in CONFIG_ERROR_REASONS:
            return Cause(
                constants.REASON_CONTAINER_CANNOT_START,
                f"pod {name}: container {container.get('name')} cannot start ({reason}): "
                f"{_trim(waiting.get('message', ''))}",
                failure=True,
            )
        crashed = _crashed(container)
        if crashed is not None:
            said = _trim(crashed.get("message", "")) or "no termination message"
            return Cause(
                constants.REASON_CRASH_LOOP,
                f"pod {name}: container {container.get('name')} keeps crashing "
                f"({container.get('restartCount', 0)} restarts; last exit code "
                f"{crashed.get('exitCode', '?')}, {crashed.get('reason', 'unknown reason')}): "
                f"{said}",
                failure=True,
            )
    failed = _failed_gate(pod)
    if failed is not None:
        return Cause(constants.REASON_WARMUP_FAILED, failed, failure=True)
    gate = _condition(conditions, constants.CONDITION_WARMED_UP)
    runtime = next(
        (
            c
            for c in status.get("containerStatuses") or []
            if c.get("name") == constants.RUNTIME_CONTAINER
        ),
        None,
    )
    if (
        runtime is not None
        and "running" in (runtime.get("state") or {})
        and not runtime.get("ready")
    ):
        return Cause(
            constants.REASON_RUNTIME_NOT_READY,
            f"pod {name}: the runtime is not ready yet (loading the model, warming up its "
            "batch sizes)",
            failure=False,
        )
    if gate and gate.get("status") == "False":
        return Cause(
            constants.REASON_WARMING_UP,
            f"pod {name} is warming up: {_trim(gate.get('message', ''))}",
            failure=False,
        )
    return None


def _is_ready(pod: dict[str, Any]) -> bool:
    ready = _condition((pod.get("status") or {}).get("conditions"), "Ready")
    return ready is not None and ready.get("status") == "True"


def _refused(deployment: dict[str, Any] | None) -> Cause | None:
    """The ReplicaSet's failure to create pods, as the Deployment controller copies it onto the
    Deployment (ReplicaFailure True, reason FailedCreate: a ResourceQuota, a LimitRange, an
    admission webhook), else None."""
    if deployment is None:
        return None
    failure = _condition((deployment.get("status") or {}).get("conditions"), "ReplicaFailure")
    if not failure or failure.get("status") != "True":
        return None
    if failure.get("reason", FAILED_CREATE) != FAILED_CREATE:
        return None  # FailedDelete: a scale-down the API server refused, not a missing pod
    return Cause(
        constants.REASON_PODS_REFUSED,
        f"pods cannot be created ({FAILED_CREATE}): {_trim(failure.get('message', ''))}",
        failure=True,
    )


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's PodScheduled condition if the scheduler found no node for it (reason
    Unschedulable; a pod waiting on its scheduling gates is not refused), else None."""
    if pod["metadata"].get("deletionTimestamp"):
        return None
    scheduled = _condition((pod.get("status") or {}).get("conditions"), "PodScheduled")
    if scheduled and (scheduled.get("status"), scheduled.get("reason")) == (
        "False",
        SCHEDULER_UNSCHEDULABLE,
    ):
        return scheduled
    return None


def placement_failure(
    deployment: dict[str, Any] | None, pods: list[dict[str, Any]]
) -> Cause | None:
    """Why pods the Deployment asks for cannot run at all, whatever their spec's fate: the
    ReplicaSet cannot create them (PodsRefused), or the scheduler finds no node for one
    (Unschedulable: too few GPUs, no node with the GPU product, taints). None when every pod
    asked for was created and scheduled. More replicas would only add more of the same, so
    the autoscaler holds while this says something."""
    refused = _refused(deployment)
    if refused is not None:
        return refused
    stuck = sorted(
        ((pod["metadata"]["name"], found) for pod in pods if (found := _unschedulable(pod))),
        key=lambda named: str(named[0]),
    )
    if not stuck:
        return None
    name, scheduled = stuck[0]
    who = f"pod {name}" if len(stuck) == 1 else f"pod {name} and {len(stuck) - 1} more"
    return Cause(
        constants.REASON_UNSCHEDULABLE,
        f"{who} cannot be scheduled: {_trim(scheduled.get('message', ''))}",
        failure=True,
    )


def first_cause(deployment: dict[str, Any] | None, pods: list[dict[str, Any]]) -> Cause | None:
    """The first reason why pods of the current spec do not serve; None if none is known.

    Pods refused at creation (a ResourceQuota: the Deployment's ReplicaFailure condition) come
    first, then failures of existing pods (unschedulable, image, crash loop, warm-up), then the
    pods still on their way. Pods of the current template are judged before older ones.
    """
    refused = _refused(deployment)
    if refused is not None:
        return refused
    waiting = [p for p in pods if not _is_ready(p) and not p["metadata"].get("deletionTimestamp")]
    # Newest first: in a rollout, the new template's pods are the ones that matter.
    waiting.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
    causes = [cause for pod in waiting if (cause := _pod_cause(pod)) is not None]
    return next((c for c in causes if c.failure), causes[0] if causes else None)

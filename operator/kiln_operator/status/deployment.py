"""rollout_state: read a live Deployment the way `kubectl rollout status` does.

Why it exists: "Ready is False while a rollout is in progress" needs a precise definition of
in progress, and of rollout as opposed to a scale (the autoscaler adding a pod of the current
template is not a rollout); it is this one, tested against hand-written Deployment statuses.
"""

from dataclasses import dataclass
from typing import Any

from kiln_operator import constants


@dataclass(frozen=True)
class RolloutState:
    """What the InferenceService's status needs to know about its Deployment."""

    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    is_available: bool
    """The Deployment's own Available condition (with maxUnavailable 0 it is False while a
    scale-up's new pods warm up, although the older pods serve)."""
    observed: bool
    """The Deployment controller has seen the Deployment's current generation."""
    in_progress: bool
    """Anything is still moving: a new spec, pods being added, old pods leaving."""
    rolling: bool
    """Pods of an older pod template still exist (or the controller has not seen the spec yet):
    a rollout, as opposed to a scale of the current template."""
    deadline_exceeded: bool
    detail: str


def rollout_state(deployment: dict[str, Any]) -> RolloutState:
    """The rollout state of a live Deployment (with its status)."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    replicas = int(status.get("replicas") or 0)
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    generation = int((deployment.get("metadata") or {}).get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0) >= generation
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    available_condition = conditions.get("Available", {})
    progressing_condition = conditions.get("Progressing", {})
    deadline_exceeded = (
        progressing_condition.get("reason") == constants.REASON_PROGRESS_DEADLINE_EXCEEDED
    )
    if not observed:
        in_progress, detail = True, "the Deployment controller has not seen the new spec yet"
    elif updated < desired:
        in_progress, detail = True, f"{updated} of {desired} pods run the current spec"
    elif replicas > updated:
        in_progress, detail = True, f"{replicas - updated} pods of the previous spec remain"
    elif available < updated:
        in_progress, detail = True, f"{available} of {updated} updated pods are available"
    else:
        in_progress, detail = False, f"{available} of {desired} pods available"
    return RolloutState(
        desired=desired,
        replicas=replicas,
        ready=ready,
        updated=updated,
        available=available,
        is_available=available_condition.get("status") == "True" and desired > 0,
        observed=observed,
        in_progress=in_progress,
        rolling=not observed or replicas > updated,
        deadline_exceeded=deadline_exceeded,
        detail=detail,
    )

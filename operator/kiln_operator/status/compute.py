"""compute_status: the InferenceService's status from what was observed, and what to announce.

Why it exists: the reconcile loop must write status only when it changed and emit an event
only on a transition; deciding both is pure and belongs in one tested function.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.status.causes import Cause, first_cause, placement_failure
from kiln_operator.status.conditions import ConditionDict, find_condition, set_condition
from kiln_operator.status.deployment import rollout_state

OWNED_CONDITION_TYPES = (
    constants.CONDITION_SPEC_VALID,
    constants.CONDITION_DEPLOYMENT_AVAILABLE,
    constants.CONDITION_PROGRESSING,
    constants.CONDITION_REPLICA_FLOOR_MET,
    constants.CONDITION_REPLICAS_FEASIBLE,
    constants.CONDITION_READY,
    constants.CONDITION_STALLED,
    constants.CONDITION_RECONCILING,
)
"""Condition types the reconcile loop writes; others in the list belong to other writers."""

STALLED_REASONS = frozenset(
    {
        constants.REASON_INVALID_SPEC,
        constants.REASON_POLICY_VIOLATION,
        constants.REASON_PROFILE_NOT_FOUND,
        constants.REASON_PROFILE_INVALID,
        constants.REASON_CHILD_REJECTED,
        constants.REASON_ROLLOUT_STALLED,
        constants.REASON_PROGRESS_DEADLINE_EXCEEDED,
        constants.REASON_WARMUP_FAILED,
    }
)
"""Ready reasons that waiting does not resolve, so Stalled is True: the spec must change, the API
server refused a child (a policy, a quota: the same request gets the same answer), new pods
cannot serve while older ones do, the Deployment's progress deadline passed, or a pod of the
current spec failed its warm-up (the gate leaves it unready until it is replaced). Not
ChildConflict (a re-created service waits for the garbage collector to remove the old children)
nor ChildApplyFailed (a server error that may pass)."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes event to emit on the InferenceService."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


@dataclass(frozen=True)
class StatusUpdate:
    """What changed in status (None: nothing), the events to emit, and the status to apply."""

    patch: dict[str, Any] | None
    events: list[Event] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)
    """Every status field the reconcile loop owns, with only its own conditions: the body of a
    server-side apply, which merges conditions by type and so never touches the conditions
    other writers (the autoscaler) own."""


@dataclass(frozen=True)
class ChildProblem:
    """A child the reconcile did not write: its name is held by another object
    (REASON_CHILD_CONFLICT), the API server refused it (REASON_CHILD_REJECTED), or reading or
    writing it failed in a way that may pass (REASON_CHILD_APPLY_FAILED)."""

    reason: str
    message: str


CHILD_PROBLEM_REASONS = (
    constants.REASON_CHILD_CONFLICT,
    constants.REASON_CHILD_REJECTED,
    constants.REASON_CHILD_APPLY_FAILED,
)


@dataclass(frozen=True)
class ReconcileObservation:
    """What one reconcile saw of the InferenceService and its children: everything its status
    is computed from. (The autoscaler's is `autoscaling.policy.MetricsObservation`.)"""

    generation: int
    spec_error: str | None
    """None when the spec can run, else the message naming the field, policy or profile."""
    deployment: dict[str, Any] | None
    """The live Deployment (with status), or None when it does not exist."""
    selector: str
    url: str
    grpc_address: str
    child_problems: tuple[ChildProblem, ...] = ()
    """Children not written this reconcile; Ready says so until a later reconcile writes them."""
    pods: tuple[dict[str, Any], ...] = ()
    """The service's pods as the operator's watch last saw them: where causes are read from."""
    min_replicas: int | None = None
    """spec.autoscaling.minReplicas of the valid spec; None while the spec is invalid."""
    download_failure: str | None = None
    """A pod's fetch init container's failure (status.download), else None."""
    spec_error_reason: str = constants.REASON_INVALID_SPEC
    """Why the spec cannot run: InvalidSpec, PolicyViolation, ProfileNotFound, ProfileInvalid."""
    profiles: tuple[dict[str, Any], ...] = ()
    """status.profiles: the profiles the spec was resolved against."""
    cold_start_seconds: float | None = None
    """The last cold start the warm-up gate measured (status.warmup), for Ready's message at
    zero; None when unknown."""
    canary_phase: str | None = None
    """status.rollout.phase of the spec's revision while a canary concerns it (Progressing,
    Promoting, RolledBack), else None."""
    canary_message: str = ""
    """What Reconciling or Stalled says of the canary."""


def _conditions(
    observation: ReconcileObservation, previous: list[ConditionDict], now: datetime
) -> list[ConditionDict]:
    generation = observation.generation

    def put(
        conditions: list[ConditionDict], kind: str, status: bool, reason: str, message: str
    ) -> list[ConditionDict]:
        return set_condition(
            conditions,
            condition_type=kind,
            status="True" if status else "False",
            reason=reason,
            message=message,
            observed_generation=generation,
            now=now,
        )

    conditions = list(previous)
    deadline_exceeded = False
    floor: tuple[bool, str, str] | None = None
    if observation.spec_error is None:
        conditions = put(
            conditions, constants.CONDITION_SPEC_VALID, True, constants.REASON_VALID, ""
        )
    else:
        conditions = put(
            conditions,
            constants.CONDITION_SPEC_VALID,
            False,
            observation.spec_error_reason,
            observation.spec_error,
        )

    if observation.deployment is None:
        missing = "the runtime Deployment does not exist"
        conditions = put(
            conditions,
            constants.CONDITION_DEPLOYMENT_AVAILABLE,
            False,
            constants.REASON_DEPLOYMENT_MISSING,
            missing,
        )
        conditions = put(
            conditions,
            constants.CONDITION_PROGRESSING,
            True,
            constants.REASON_DEPLOYMENT_MISSING,
            missing,
        )
        ready = (False, constants.REASON_DEPLOYMENT_MISSING, missing)
    else:
        state = rollout_state(observation.deployment)
        if state.is_available:
            conditions = put(
                conditions,
                constants.CONDITION_DEPLOYMENT_AVAILABLE,
                True,
                constants.REASON_AVAILABLE,
                state.detail,
            )
        else:
            conditions = put(
                conditions,
                constants.CONDITION_DEPLOYMENT_AVAILABLE,
                False,
                constants.REASON_MINIMUM_REPLICAS_UNAVAILABLE,
                f"{state.available} of {state.desired} pods available",
            )
        deadline_exceeded = state.deadline_exceeded
        if state.deadline_exceeded:
            conditions = put(
                conditions,
                constants.CONDITION_PROGRESSING,
                False,
                constants.REASON_PROGRESS_DEADLINE_EXCEEDED,
                state.detail,
            )
        elif state.in_progress:
            conditions = put(
                conditions,
                constants.CONDITION_PROGRESSING,
                True,
                constants.REASON_ROLLOUT_IN_PROGRESS,
                state.detail,
            )
        else:
            conditions = put(
                conditions,
                constants.CONDITION_PROGRESSING,
                False,
                constants.REASON_ROLLOUT_COMPLETE,
                state.detail,
            )

        cause = first_cause(observation.deployment, list(observation.pods))
        if observation.min_replicas is not None:
            floor = _floor(state.available, observation.min_replicas, cause)
            conditions = put(conditions, constants.CONDITION_REPLICA_FLOOR_MET, *floor)
        placement = placement_failure(observation.deployment, list(observation.pods))
        conditions = put(conditions, constants.CONDITION_REPLICAS_FEASIBLE, *_feasible(placement))
        judged = find_condition(previous, constants.CONDITION_READY)
        if state.desired == 0 and observation.min_replicas == 0:
            ready = (True, constants.REASON_SCALED_TO_ZERO, _asleep(observation))
        elif state.desired == 0:
            ready = (False, constants.REASON_SCALED_TO_ZERO, "the Deployment has 0 replicas")
        elif state.deadline_exceeded:
            ready = (
                False,
                constants.REASON_PROGRESS_DEADLINE_EXCEEDED,
                _with_cause(state.detail, cause),
            )
        elif (
            not state.observed
            and judged is not None
            and judged.get("observedGeneration") == generation
        ):
            # The spec did not change since Ready was last judged, so the Deployment changed
            # only in replicas (the autoscaler): no news until its controller reports.
            ready = (
                judged.get("status") == "True",
                str(judged.get("reason")),
                str(judged.get("message", "")),
            )
        elif state.rolling:
            previous_spec = state.replicas - state.updated
            if cause is not None and cause.failure and state.available > 0:
                ready = (
                    False,
                    constants.REASON_ROLLOUT_STALLED,
                    f"the rollout is stalled: {cause.message}; "
                    f"{min(previous_spec, state.available)} pods of the previous spec keep serving",
                )
            else:
                ready = (
                    False,
                    constants.REASON_ROLLOUT_IN_PROGRESS,
                    _with_cause(state.detail, cause),
                )
        elif (
            (state.available == 0 or state.ready == 0)
            and observation.min_replicas == 0
            and (cause is None or not cause.failure)
        ):
            # Woken from zero: the activator holds the requests until the first pod passes its
            # warm-up gate, so the service answers (late) meanwhile: Ready stays True.
            ready = (True, constants.REASON_WAKING, _with_cause(f"waking: {state.detail}", cause))
        elif state.available == 0 or state.ready == 0:
            if cause is not None:
                ready = (False, cause.reason, _with_cause(state.detail, cause))
            else:
                ready = (False, constants.REASON_MINIMUM_REPLICAS_UNAVAILABLE, state.detail)
        elif floor is not None and not floor[0] and placement is not None:
            # Pods of the current spec serve, fewer than the floor, and no more can come.
            message = (
                f"{state.available} of {state.desired} pods available, fewer than minReplicas "
                f"{observation.min_replicas}"
            )
            ready = (True, constants.REASON_AVAILABLE, _with_cause(message, placement))
        else:
            # Pods of the current spec serve; a scale-up's new pods may still be warming up.
            ready = (True, constants.REASON_AVAILABLE, state.detail)

    if observation.download_failure is not None and not ready[0]:
        ready = (False, constants.REASON_MODEL_DOWNLOAD_FAILED, observation.download_failure)
    if observation.child_problems:
        first = observation.child_problems[0]
        # one failure can surface twice (a fresh read, then a re-read): say it once
        message = "; ".join(
            dict.fromkeys(problem.message for problem in observation.child_problems)
        )
        ready = (False, first.reason, message)
    if observation.spec_error is not None:
        ready = (False, observation.spec_error_reason, observation.spec_error)
    conditions = put(conditions, constants.CONDITION_READY, *ready)
    stalled, reconciling = _kstatus(ready, floor, deadline_exceeded)
    if observation.spec_error is None and not stalled[0]:
        stalled, reconciling = _canary_kstatus(
            observation.canary_phase, observation.canary_message, stalled, reconciling
        )
    conditions = put(conditions, constants.CONDITION_STALLED, *stalled)
    return put(conditions, constants.CONDITION_RECONCILING, *reconciling)


def _kstatus(
    ready: tuple[bool, str, str], floor: tuple[bool, str, str] | None, deadline_exceeded: bool
) -> tuple[tuple[bool, str, str], tuple[bool, str, str]]:
    """Stalled and Reconciling, the conditions kstatus (Flux, `kubectl wait`) reads before Ready.

    Both follow from Ready (and ReplicaFloorMet), so they change only when those do: they add
    no status write of their own. They are never both True, as kstatus takes whichever comes
    first. A passed progress deadline is Stalled whatever Ready's reason: a model download
    failure or a child's server error can hide it in Ready, not make it pass.
    """
    ready_status, reason, message = ready
    if not ready_status and (reason in STALLED_REASONS or deadline_exceeded):
        return (True, reason, message), (False, constants.REASON_STALLED, "")
    not_stalled = (False, constants.REASON_NOT_STALLED, "")
    if not ready_status:
        return not_stalled, (True, reason, message)
    if ready_status and floor is not None and not floor[0]:
        return not_stalled, (True, floor[1], floor[2])
    return not_stalled, (False, constants.REASON_CONVERGED, "")


def _asleep(observation: ReconcileObservation) -> str:
    """Ready's message at zero: what the first request costs."""
    cold = observation.cold_start_seconds
    lead = "" if cold is None else f", cold start about {cold:.0f} s"
    return (
        "0 replicas (minReplicas 0, idle); the first request wakes one and waits for it "
        f"to pass its warm-up gate{lead}"
    )


def _canary_kstatus(
    phase: str | None,
    message: str,
    stalled: tuple[bool, str, str],
    reconciling: tuple[bool, str, str],
) -> tuple[tuple[bool, str, str], tuple[bool, str, str]]:
    """A canary under way is work in progress (Reconciling) even while the stable version is
    Ready; a rolled-back one needs a person (Stalled) until the spec changes."""
    if phase == "RolledBack":
        return (True, constants.REASON_CANARY_ROLLED_BACK, message), (
            False,
            constants.REASON_STALLED,
            "",
        )
    if phase == "Progressing":
        return stalled, (True, constants.REASON_CANARY_PROGRESSING, message)
    if phase == "Promoting":
        return stalled, (True, constants.REASON_CANARY_PROMOTING, message)
    return stalled, reconciling


def _with_cause(detail: str, cause: Cause | None) -> str:
    return detail if cause is None else f"{detail}: {cause.message}"


def _floor(available: int, floor: int, cause: Cause | None) -> tuple[bool, str, str]:
    """ReplicaFloorMet: whether minReplicas pods are available, and if not, why."""
    if available >= floor:
        return True, constants.REASON_FLOOR_MET, f"{available} pods available, minReplicas {floor}"
    return (
        False,
        constants.REASON_FLOOR_NOT_MET,
        _with_cause(f"{available} of minReplicas {floor} pods available", cause),
    )


def _feasible(placement: Cause | None) -> tuple[bool, str, str]:
    """ReplicasFeasible: whether every pod asked for was created and scheduled, and if not, why
    (Kubernetes' own message)."""
    if placement is None:
        return (
            True,
            constants.REASON_ALL_PODS_PLACED,
            "every pod asked for is created and scheduled",
        )
    return False, placement.reason, placement.message


def _placement_events(previous: list[ConditionDict], current: list[ConditionDict]) -> list[Event]:
    """A Warning when pods stop being placeable, a Normal event when they are again: the
    autoscaler's hold begins and ends with them."""
    old = find_condition(previous, constants.CONDITION_REPLICAS_FEASIBLE)
    new = find_condition(current, constants.CONDITION_REPLICAS_FEASIBLE)
    if new is None or (old is not None and old.get("status") == new["status"]):
        return []
    if new["status"] == "False":
        return [Event("Warning", new["reason"], new["message"])]
    if old is None:
        return []
    return [Event("Normal", new["reason"], new["message"])]


def _events(previous: list[ConditionDict], current: list[ConditionDict]) -> list[Event]:
    events: list[Event] = []
    old_valid = find_condition(previous, constants.CONDITION_SPEC_VALID)
    new_valid = find_condition(current, constants.CONDITION_SPEC_VALID)
    if (
        new_valid is not None
        and new_valid["status"] == "False"
        and (
            old_valid is None
            or (old_valid.get("status"), old_valid.get("message"))
            != ("False", new_valid["message"])
        )
    ):
        events.append(Event("Warning", new_valid["reason"], new_valid["message"]))
    old_ready = find_condition(previous, constants.CONDITION_READY)
    new_ready = find_condition(current, constants.CONDITION_READY)
    if (
        new_ready is not None
        and new_ready["reason"] in CHILD_PROBLEM_REASONS
        and (old_ready is None or old_ready.get("message") != new_ready["message"])
    ):
        events.append(Event("Warning", new_ready["reason"], new_ready["message"]))
        return events
    if (
        new_ready is not None
        and new_ready["reason"] == constants.REASON_MODEL_DOWNLOAD_FAILED
        and (old_ready is None or old_ready.get("message") != new_ready["message"])
        and (old_ready is None or old_ready.get("status") == new_ready["status"])
    ):  # no Ready transition announces it: say it once per message
        events.append(
            Event("Warning", constants.REASON_MODEL_DOWNLOAD_FAILED, new_ready["message"])
        )
    if new_ready is not None and (
        old_ready is None or old_ready.get("status") != new_ready["status"]
    ):
        if new_ready["status"] == "True":
            events.append(Event("Normal", constants.EVENT_READY, new_ready["message"]))
        elif old_ready is not None:
            events.append(
                Event(
                    "Warning",
                    constants.EVENT_NOT_READY,
                    f"{new_ready['reason']}: {new_ready['message']}",
                )
            )
    return events


def compute_status(
    previous: dict[str, Any], observation: ReconcileObservation, now: datetime
) -> StatusUpdate:
    """The status patch (only keys whose value changed) and the events of this transition."""
    previous_conditions: list[ConditionDict] = list(previous.get("conditions") or [])
    conditions = _conditions(observation, previous_conditions, now)
    deployment_status = (observation.deployment or {}).get("status") or {}
    desired: dict[str, Any] = {
        "observedGeneration": observation.generation,
        "conditions": conditions,
        "replicas": int(deployment_status.get("replicas") or 0),
        "readyReplicas": int(deployment_status.get("readyReplicas") or 0),
        "updatedReplicas": int(deployment_status.get("updatedReplicas") or 0),
        "availableReplicas": int(deployment_status.get("availableReplicas") or 0),
        "selector": observation.selector,
        "url": observation.url,
        "grpcAddress": observation.grpc_address,
    }
    if observation.profiles or previous.get("profiles"):
        desired["profiles"] = list(observation.profiles) or None
    patch = {key: value for key, value in desired.items() if previous.get(key) != value}
    applied = {  # a field left out of a server-side apply is removed (status.profiles)
        **{key: value for key, value in desired.items() if value is not None},
        "conditions": [c for c in conditions if c["type"] in OWNED_CONDITION_TYPES],
    }
    events = _events(previous_conditions, conditions)
    events += _placement_events(previous_conditions, conditions)
    return StatusUpdate(patch=patch or None, events=events, applied=applied)

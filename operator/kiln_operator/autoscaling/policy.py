"""`decide`: how many replicas a service needs now, and why.

Why it exists: this is Kiln's scaling policy, one pure function called by the operator's
timer (with metrics read from Prometheus), by the unit tests (with explicit `now`) and by the
simulator (with simulated metrics). It never reads the clock and does no I/O. Its inputs are
in inputs.py, the sizing of steps 2 to 4 in sizing.py; here are the floor, the ceiling, the
placement hold and the pre-warm window's bookkeeping.

The policy, in order (docs/autoscaling.md explains it with the PromQL behind each input):

1. The floor is `minReplicas`, raised by a pre-warm window that is open or within its lead
   time (measured cold start + margin, or the schedule's own lead) and by the learned
   pre-warm's forecast over the same lead (`learned.py`); the highest wins; floors are capped
   at `maxReplicas`.
2. Metrics missing, stale, NaN or Prometheus down: the declared policy (`Hold`,
   `ScheduleFloor`, `Fixed`) applies and replicas never go down.
3. Unhealthy (p99 above the SLO or queue depth per replica above its target): scale up, sized
   by Little's law from the arrival rate (answered + queue growth), its excess over the ready
   replicas and the backlog to drain, divided by the per-replica capacity at the target
   utilization; at least one replica, at most one rate-limited step. While earlier new
   replicas warm, nothing is stacked on them: only the arrivals alone may raise the count.
4. Healthy: size for the target utilization (20-30 % headroom) with a +-10 % hysteresis band;
   add replicas if the headroom is gone (only with a measured capacity); remove replicas only
   after both signals have been healthy for the hold window, one bounded step per period.
5. `minReplicas: 0` (zero.py): the floor is 1 until the service was idle (no request counted,
   none held by the activator) for `scaleToZero.idleSeconds`, then 0 and the service goes to
   zero at once; at zero, requests the activator holds wake it (sized by the held requests).
6. Pods that cannot be placed (the ReplicaSet cannot create them: a quota, a LimitRange, an
   admission refusal; or the scheduler finds no node for one): replicas are never raised above
   the current count, whatever the steps above wanted, until they can be placed again; lowering
   them stays allowed.
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingStatus,
    CapacityStatus,
    LearnedStatus,
    ObservedMetrics,
    PrewarmSpec,
    WindowStatus,
)
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec, metrics_problem
from kiln_operator.autoscaling.learned import learned_status
from kiln_operator.autoscaling.schedule import Window, governing_window, require_utc, windows_at
from kiln_operator.autoscaling.sizing import Proposal, blind_proposal, sighted_proposal
from kiln_operator.autoscaling.state import ScalerState, WindowState
from kiln_operator.autoscaling.zero import zero_floor


@dataclass(frozen=True)
class Decision:
    """The replica count to set, the reason, an explanation, and the state to store."""

    desired_replicas: int
    reason: str
    message: str
    state: ScalerState
    metrics_available: bool
    window: WindowState | None
    learned: LearnedStatus | None = None

    def status(self, observed: MetricsObservation) -> AutoscalingStatus:
        """The `status.autoscaling` object for this decision."""
        p99 = observed.p99_latency_seconds
        if not observed.requests_per_second:
            p99 = None  # no traffic: there is no latency to show, not a latency of 0
        capacity = self.state.capacity_per_replica
        return AutoscalingStatus(
            desired_replicas=self.desired_replicas,
            reason=self.reason,
            message=self.message[:1024],
            metrics_available=self.metrics_available,
            observed=ObservedMetrics(
                p99_latency_milliseconds=_finite_or_none(None if p99 is None else p99 * 1000.0),
                queue_depth_per_replica=_finite_or_none(observed.queue_depth_per_replica),
                requests_per_second=_finite_or_none(observed.requests_per_second),
                ready_replicas=observed.ready_replicas,
                observed_at=observed.observed_at,
            ),
            active_window=None
            if self.window is None
            else WindowStatus(
                name=self.window.name,
                opens_at=self.window.opens_at,
                closes_at=self.window.closes_at,
                floor_replicas=self.window.floor,
                raised_at=self.window.raised_at,
                floor_warm_at_open=self.window.floor_warm_at_open,
            ),
            last_scale_time=self.state.last_scale_at,
            capacity=None
            if capacity is None or not math.isfinite(capacity)
            else CapacityStatus(
                requests_per_second_per_replica=round(capacity, 2),
                measured=self.state.capacity_measured,
            ),
            learned=self.learned,
        )


def decide(
    current: int,
    observed: MetricsObservation,
    spec: ScalingSpec,
    state: ScalerState,
    now: datetime,
) -> Decision:
    """The replicas the service should run at `now` (timezone-aware), with the reason."""
    require_utc(now)
    if current < 0:
        raise ValueError(f"current replicas must be >= 0, got {current}")
    scaling = spec.autoscaling
    cold_start = _cold_start(observed, spec.prewarm, state)
    default_lead = timedelta(seconds=cold_start + spec.prewarm.lead_time_margin_seconds)
    window = governing_window(windows_at(spec.prewarm, now, default_lead, scaling.max_replicas))

    problem = metrics_problem(observed, scaling, now)
    at_zero = scaling.min_replicas == 0 and current == 0 and observed.ready_replicas == 0
    if at_zero and problem is not None and observed.metrics_error is None:
        # No pod, no series: Prometheus has nothing to count at zero (the activator's held
        # requests are the demand), so absent metrics are no reason to be blind.
        problem = None
    zero = None
    if scaling.min_replicas == 0:
        zero = zero_floor(
            current, observed, scaling, state.idle_since, blind=problem is not None, now=now
        )
    base_floor = scaling.min_replicas if zero is None else zero.floor
    base_reason = reasons.MIN_REPLICAS if zero is None else zero.reason
    floor = min(max(base_floor, window.floor if window else 0), scaling.max_replicas)
    floor_reason = (
        reasons.PREWARM_WINDOW if window is not None and window.floor > base_floor else base_reason
    )

    if problem is not None:
        proposal = blind_proposal(current, spec, state, problem)
        if scaling.when_metrics_missing.policy != "ScheduleFloor":
            # Hold and Fixed ignore pre-warm windows while blind; minReplicas still holds.
            floor, floor_reason = base_floor, base_reason
    elif at_zero:
        proposal = Proposal(0, reasons.IDLE, "0 replicas: no pod to measure", state)
    else:
        proposal = sighted_proposal(current, observed, spec, state, now=now, cold_start=cold_start)

    learned = None
    if spec.prewarm.learned is not None:
        learned = learned_status(
            observed.learned,
            now,
            default_lead,
            capacity_per_replica=proposal.state.capacity_per_replica,
            target_utilization_percent=scaling.target_utilization_percent,
            max_replicas=scaling.max_replicas,
        )
        ignored = problem is not None and scaling.when_metrics_missing.policy != "ScheduleFloor"
        if not ignored and learned.floor_replicas > floor:
            floor, floor_reason = learned.floor_replicas, reasons.PREWARM_LEARNED

    desired, reason, message = proposal.replicas, proposal.reason, proposal.message
    if zero is not None and zero.asleep and floor == 0 and problem is None:
        # Idle for the whole window with nothing held: no pod is needed, whatever the pacing.
        desired, reason = 0, reasons.IDLE
        message = f"{message}; scaled to zero{zero.note}" if current else f"{message}; at zero"
    elif desired < floor:
        desired, reason = floor, floor_reason
        note = _window_note(window)
        if floor_reason == reasons.PREWARM_LEARNED and learned is not None:
            note = f" ({learned.message})"
        elif zero is not None and floor_reason == zero.reason:
            note = zero.note
        message = f"{message}; raised to the floor {floor}" + note
    elif zero is not None and zero.note:
        message = f"{message}{zero.note}"
    if desired > scaling.max_replicas:
        desired, reason = scaling.max_replicas, reasons.MAX_REPLICAS
        message = f"{message}; capped at maxReplicas {scaling.max_replicas}"
    if desired > current and observed.placement_failure is not None:
        message = f"held at {current}, wanted {desired}: {observed.placement_failure} ({message})"
        desired, reason = current, reasons.SCALE_UP_BLOCKED

    new_state = proposal.state
    if desired != current:
        direction = "up" if desired > current else "down"
        new_state = new_state.model_copy(
            update={
                "last_scale_at": now,
                "last_scale_direction": direction,
                "last_scale_up_at": now if direction == "up" else new_state.last_scale_up_at,
            }
        )
    window_state = _track_window(state.window, window, desired, observed.ready_replicas, now)
    new_state = new_state.model_copy(
        update={
            "window": window_state,
            "idle_since": None if zero is None else zero.idle_since,
            "cold_start_seconds": _measured(observed.cold_start_seconds)
            or state.cold_start_seconds,
        }
    )
    return Decision(
        desired_replicas=desired,
        reason=reason,
        message=message,
        state=new_state,
        metrics_available=problem is None,
        window=window_state,
        learned=learned,
    )


def _cold_start(observed: MetricsObservation, prewarm: PrewarmSpec, state: ScalerState) -> float:
    """The measured cold start; at zero (no pod to measure) the last one measured; else the
    assumed one."""
    measured = _measured(observed.cold_start_seconds) or _measured(state.cold_start_seconds)
    if measured is not None:
        return measured
    return float(prewarm.assumed_cold_start_seconds)


def _measured(seconds: float | None) -> float | None:
    if seconds is not None and math.isfinite(seconds) and seconds > 0:
        return seconds
    return None


def _track_window(
    previous: WindowState | None,
    window: Window | None,
    desired: int,
    ready: int,
    now: datetime,
) -> WindowState | None:
    """Carry the governing window's bookkeeping: when the floor was raised, warm at open."""
    if window is None:
        return None
    same = (
        previous is not None
        and previous.name == window.name
        and previous.opens_at == window.opens_at
    )
    tracked = (
        previous
        if same and previous is not None
        else WindowState(
            name=window.name,
            opens_at=window.opens_at,
            closes_at=window.closes_at,
            floor=window.floor,
        )
    )
    if tracked.raised_at is None and desired >= window.floor:
        tracked = tracked.model_copy(update={"raised_at": now})
    if tracked.floor_warm_at_open is None and window.is_open(now):
        tracked = tracked.model_copy(update={"floor_warm_at_open": ready >= window.floor})
    return tracked


def _window_note(window: Window | None) -> str:
    if window is None:
        return ""
    return f" (window {window.name} opens {window.opens_at.isoformat()})"


def _finite_or_none(value: float | None) -> float | None:
    """The value for status: None unless finite, rounded to two decimal places so the
    status (and `kubectl get`) is readable and does not change with measurement noise."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, 2)

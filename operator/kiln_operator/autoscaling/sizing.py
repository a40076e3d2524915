"""How many replicas the metrics ask for: sized by Little's law when unhealthy, for the target
utilization when healthy, never down while blind.

Why it exists: this is the arithmetic of steps 2 to 4 of the policy (docs/autoscaling.md):
`decide` (policy.py) takes its proposal and applies the floor, the ceiling and the placement
hold. Pure: `now` is a parameter.
"""

import math
from dataclasses import dataclass
from datetime import datetime

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.capacity import CapacityFit
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.state import ScalerState

HEADROOM_TOLERANCE = 0.1
"""The hysteresis band around the target utilization: healthy replicas are added only above
target x 1.1 (82.5 % for 75 %) and removed only while the smaller count stays below
target x 0.9 (67.5 %), so rate noise around the target cannot flap the count."""


@dataclass(frozen=True)
class Proposal:
    """What the metrics alone ask for, before the floor, the ceiling and the placement hold."""

    replicas: int
    reason: str
    message: str
    state: ScalerState


def blind_proposal(current: int, spec: ScalingSpec, state: ScalerState, problem: str) -> Proposal:
    """Metrics cannot be trusted: follow the declared policy, never scale down."""
    missing = spec.autoscaling.when_metrics_missing
    replicas = current
    if missing.policy == "Fixed" and missing.replicas is not None:
        replicas = max(current, missing.replicas)
    # Health must be re-established from fresh metrics before any later scale-down.
    blind_state = state.model_copy(
        update={
            "healthy_since": None,
            "unhealthy_since": None,
            "last_queue_total": None,
            "last_observed_at": None,
        }
    )
    message = f"{problem}; policy {missing.policy}: no scale-down"
    return Proposal(replicas, reasons.METRICS_UNAVAILABLE, message, blind_state)


def sighted_proposal(
    current: int,
    observed: MetricsObservation,
    spec: ScalingSpec,
    state: ScalerState,
    *,
    now: datetime,
    cold_start: float,
) -> Proposal:
    scaling = spec.autoscaling
    ready = observed.ready_replicas
    rate = observed.requests_per_second or 0.0
    queue_per_replica = observed.queue_depth_per_replica or 0.0
    p99 = observed.p99_latency_seconds
    p99_seconds = p99 if p99 is not None and math.isfinite(p99) else 0.0
    utilization = scaling.target_utilization_percent / 100.0
    latency_ratio = p99_seconds * 1000.0 / spec.slo.p99_latency_milliseconds
    queue_ratio = queue_per_replica / scaling.queue_depth_per_replica
    saturated = queue_ratio >= 1.0

    fit = state.capacity_fit
    if observed.batches is not None:
        fit = (fit or CapacityFit()).add(observed.batches)
    estimate = None if fit is None else fit.estimate(spec.max_batch_size)
    capacity: float | None
    if estimate is not None:
        capacity, measured = estimate.requests_per_second, estimate.fitted
    else:
        capacity, measured = _update_capacity(state, rate, ready, saturated)
    queue_total = queue_per_replica * ready
    growth = _queue_growth(state, queue_total, observed, now)
    demand = rate + growth  # arrivals: answered requests plus the queue's growth
    latency = (
        f"p99 {p99_seconds * 1000:.0f}ms (target {spec.slo.p99_latency_milliseconds:.0f}ms)"
        if rate > 0
        else "no traffic"
    )
    signals = (
        f"{latency}, queue/replica {queue_per_replica:.1f} "
        f"(target {scaling.queue_depth_per_replica:g}), {rate:.1f} req/s on {ready} ready"
    )
    base = state.model_copy(
        update={
            "capacity_per_replica": capacity,
            "capacity_measured": measured,
            "capacity_fit": fit,
            "last_queue_total": queue_total,
            "last_observed_at": observed.observed_at,
        }
    )
    pending = max(0, current - ready)

    if latency_ratio > 1.0 or queue_ratio > 1.0:
        unhealthy = base.model_copy(
            update={"healthy_since": None, "unhealthy_since": state.unhealthy_since or now}
        )
        reason = (
            reasons.QUEUE_ABOVE_TARGET
            if queue_ratio >= latency_ratio
            else reasons.LATENCY_ABOVE_TARGET
        )
        breached_for = (now - (state.unhealthy_since or now)).total_seconds()
        if breached_for < scaling.scale_up.stabilization_seconds:
            return Proposal(
                current,
                reasons.SCALE_UP_STABILIZING,
                f"{signals}; breached for {breached_for:.0f}s of "
                f"{scaling.scale_up.stabilization_seconds}s",
                unhealthy,
            )
        limit = _step_up_limit(current, scaling)
        if capacity is not None and capacity > 0:
            # Little's law: serve the arrivals, plus drain the backlog that will have piled up
            # by the time new replicas are ready (today's queue and the excess over what the
            # ready replicas serve, for one cold start) within about one more cold start.
            excess = max(0.0, demand - ready * capacity)
            window = max(cold_start, float(scaling.evaluation_interval_seconds))
            drain_rate = queue_total / window + excess
            wanted = math.ceil((demand + drain_rate) / (capacity * utilization))
            arrivals_need = min(math.ceil((demand + excess) / (capacity * utilization)), limit)
        else:
            wanted = math.ceil(max(ready, 1) * max(latency_ratio, queue_ratio) / utilization)
            arrivals_need = None
        wanted = min(max(wanted, current + 1), limit)
        return _scale_up(
            current,
            wanted,
            arrivals_need=arrivals_need,
            pending=pending,
            reason=reason,
            explanation=signals,
            state=unhealthy,
            now=now,
            cold_start=cold_start,
        )

    healthy = base.model_copy(
        update={"unhealthy_since": None, "healthy_since": state.healthy_since or now}
    )
    if capacity is None or capacity <= 0:
        if demand > 0:
            return Proposal(current, reasons.STEADY, f"{signals}; capacity not yet known", healthy)
        # No demand needs no replica whatever the capacity: a service that never had traffic
        # (no capacity measured) still comes down to its floor from a count set by hand or a
        # pre-warm window, by the same hold window and steps.
        needed, sizing = 0, f"{signals}; none needed without demand"
    else:
        needed = math.ceil(demand / (capacity * utilization))
        sizing = f"{signals}; need {needed} at {scaling.target_utilization_percent}% utilization"
        if demand > current * capacity * utilization * (1.0 + HEADROOM_TOLERANCE) and measured:
            wanted = min(needed, _step_up_limit(current, scaling))
            return _scale_up(
                current,
                wanted,
                arrivals_need=wanted,
                pending=pending,
                reason=reasons.HEADROOM_LOW,
                explanation=sizing,
                state=healthy,
                now=now,
                cold_start=cold_start,
            )
        # Down-sizing keeps the same band on the other side: the smaller count must run at no
        # more than the target minus the tolerance, so a step down is never undone by noise.
        needed = math.ceil(demand / (capacity * utilization * (1.0 - HEADROOM_TOLERANCE)))
    if needed >= current:
        return Proposal(current, reasons.STEADY, sizing, healthy)

    healthy_for = (now - (state.healthy_since or now)).total_seconds()
    hold = scaling.scale_down.stabilization_seconds
    if healthy_for < hold:
        return Proposal(
            current,
            reasons.SCALE_DOWN_HELD,
            f"{sizing}; healthy for {healthy_for:.0f}s of the {hold}s hold window",
            healthy,
        )
    if state.last_scale_at is not None:
        since_scale = (now - state.last_scale_at).total_seconds()
        if since_scale < scaling.scale_down.period_seconds:
            return Proposal(
                current,
                reasons.SCALE_DOWN_PACED,
                f"{sizing}; last step {since_scale:.0f}s ago "
                f"(period {scaling.scale_down.period_seconds}s)",
                healthy,
            )
    step = max(
        scaling.scale_down.max_step_replicas,
        current * scaling.scale_down.max_step_percent // 100,
    )
    desired = max(needed, current - step)
    return Proposal(desired, reasons.LOAD_DECREASED, f"{sizing}; step to {desired}", healthy)


def _scale_up(
    current: int,
    wanted: int,
    *,
    arrivals_need: int | None,
    pending: int,
    reason: str,
    explanation: str,
    state: ScalerState,
    now: datetime,
    cold_start: float,
) -> Proposal:
    """Scale up to `wanted`, unless replicas added earlier are still warming.

    The pending-replica guard: while earlier new replicas warm, the queue and latency still
    describe the old replica set, so nothing is stacked on them — no term for today's queue,
    no extra replica. Only if the measured arrivals alone (`arrivals_need`: the absolute
    Little's-law size from the arrival rate and its excess over the ready replicas, which
    already counts the warming ones) need more than exist may the count rise to it: a spike
    that is still growing is not a stale signal.
    """
    if pending > 0 and state.last_scale_up_at is not None:
        # Pods that have not become ready within two cold starts are failing, not warming:
        # they no longer block further scale-ups.
        warming_for = (now - state.last_scale_up_at).total_seconds()
        if warming_for < 2.0 * cold_start:
            if arrivals_need is not None and arrivals_need > current:
                return Proposal(
                    arrivals_need,
                    reason,
                    f"{explanation}; {pending} replica(s) warming, but the arrival rate alone "
                    f"needs {arrivals_need}",
                    state,
                )
            return Proposal(
                current,
                reasons.SCALE_UP_PENDING,
                f"{explanation}; {pending} replica(s) still warming, want {wanted}",
                state,
            )
    return Proposal(wanted, reason, f"{explanation}; scale to {wanted}", state)


def _step_up_limit(current: int, scaling: AutoscalingSpec) -> int:
    step = max(
        scaling.scale_up.max_step_replicas,
        math.ceil(current * scaling.scale_up.max_step_percent / 100),
    )
    return current + step


def _update_capacity(
    state: ScalerState, rate: float, ready: int, saturated: bool
) -> tuple[float | None, bool]:
    """Per-replica capacity: measured when saturated, else the best lower bound seen."""
    if ready <= 0 or rate <= 0:
        return state.capacity_per_replica, state.capacity_measured
    per_replica = rate / ready
    if saturated:
        return per_replica, True
    if state.capacity_per_replica is None or per_replica > state.capacity_per_replica:
        return per_replica, state.capacity_measured and state.capacity_per_replica is not None
    return state.capacity_per_replica, state.capacity_measured


def _queue_growth(
    state: ScalerState, queue_total: float, observed: MetricsObservation, now: datetime
) -> float:
    """Requests per second the queue grew by since the last evaluation (0 if it shrank)."""
    if state.last_queue_total is None or state.last_observed_at is None:
        return 0.0
    then = state.last_observed_at
    seen = observed.observed_at or now
    elapsed = (seen - then).total_seconds()
    if elapsed <= 0:
        return 0.0
    return max(0.0, (queue_total - state.last_queue_total) / elapsed)

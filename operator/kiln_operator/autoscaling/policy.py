"""`decide`: how many replicas a service needs now, and why.

Why it exists: this is Kiln's scaling policy, one pure function called by the operator's
timer (with metrics read from Prometheus), by the unit tests (with explicit `now`) and by the
simulator (with simulated metrics). It never reads the clock and does no I/O.

The policy, in order (docs/autoscaling.md explains it with the PromQL behind each input):

1. The floor is `minReplicas`, raised by a pre-warm window that is open or within its lead
   time (measured cold start + margin, or the schedule's own lead); floors are capped at
   `maxReplicas`.
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
5. Pods that cannot be placed (the ReplicaSet cannot create them: a quota, a LimitRange, an
   admission refusal; or the scheduler finds no node for one): replicas are never raised above
   the current count, whatever the steps above wanted, until they can be placed again; lowering
   them stays allowed.
"""

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingSpec,
    AutoscalingStatus,
    CapacityStatus,
    ObservedMetrics,
    PrewarmSpec,
    SloSpec,
    WindowStatus,
)
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.capacity import BatchWindow, CapacityFit
from kiln_operator.autoscaling.schedule import Window, governing_window, require_utc, windows_at
from kiln_operator.autoscaling.state import ScalerState, WindowState

HEADROOM_TOLERANCE = 0.1
"""The hysteresis band around the target utilization: healthy replicas are added only above
target x 1.1 (82.5 % for 75 %) and removed only while the smaller count stays below
target x 0.9 (67.5 %), so rate noise around the target cannot flap the count."""


@dataclass(frozen=True)
class ScalingSpec:
    """The parts of an InferenceService spec the policy reads."""

    slo: SloSpec
    autoscaling: AutoscalingSpec = field(default_factory=AutoscalingSpec)
    prewarm: PrewarmSpec = field(default_factory=PrewarmSpec)
    max_batch_size: int = 32
    """`spec.runtime.batching.maxBatchSize`: where the capacity is read off the batch-time fit."""


@dataclass(frozen=True)
class MetricsObservation:
    """What Prometheus and the cluster showed at one evaluation of the autoscaler.

    A metric is None when its query returned nothing; `metrics_error` carries why Prometheus
    could not be read at all. A NaN p99 with a zero request rate means "no traffic", not
    "missing": `histogram_quantile` over an empty window is NaN.
    """

    ready_replicas: int
    observed_at: datetime | None = None
    p99_latency_seconds: float | None = None
    queue_depth_per_replica: float | None = None
    requests_per_second: float | None = None
    cold_start_seconds: float | None = None
    """The warm-up gate's measured pod-creation-to-ready time, if known."""
    batches: BatchWindow | None = None
    """The service's batch rows, batch count, compute time and successful requests over the
    metrics window: the capacity estimate's input (`autoscaling.capacity`)."""
    metrics_error: str | None = None
    placement_failure: str | None = None
    """Why pods already asked for cannot be created or scheduled, in Kubernetes' words (the
    Deployment's ReplicaFailure, the scheduler's message); None when every one was placed.
    While set, more replicas would only add more pods that cannot run: no scale-up."""


@dataclass(frozen=True)
class Decision:
    """The replica count to set, the reason, an explanation, and the state to store."""

    desired_replicas: int
    reason: str
    message: str
    state: ScalerState
    metrics_available: bool
    window: WindowState | None

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
    cold_start = _cold_start(observed, spec.prewarm)
    default_lead = timedelta(seconds=cold_start + spec.prewarm.lead_time_margin_seconds)
    window = governing_window(windows_at(spec.prewarm, now, default_lead, scaling.max_replicas))
    floor = max(scaling.min_replicas, window.floor if window else 0)
    floor = min(floor, scaling.max_replicas)
    floor_reason = (
        reasons.PREWARM_WINDOW
        if window is not None and window.floor > scaling.min_replicas
        else reasons.MIN_REPLICAS
    )

    problem = metrics_problem(observed, scaling, now)
    if problem is not None:
        proposal = _blind_proposal(current, spec, state, problem)
        if scaling.when_metrics_missing.policy != "ScheduleFloor":
            # Hold and Fixed ignore pre-warm windows while blind; minReplicas still holds.
            floor, floor_reason = scaling.min_replicas, reasons.MIN_REPLICAS
    else:
        proposal = _sighted_proposal(current, observed, spec, state, now=now, cold_start=cold_start)

    desired, reason, message = proposal.replicas, proposal.reason, proposal.message
    if desired < floor:
        desired, reason = floor, floor_reason
        message = f"{message}; raised to the floor {floor}" + _window_note(window)
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
    new_state = new_state.model_copy(update={"window": window_state})
    return Decision(
        desired_replicas=desired,
        reason=reason,
        message=message,
        state=new_state,
        metrics_available=problem is None,
        window=window_state,
    )


@dataclass(frozen=True)
class _Proposal:
    replicas: int
    reason: str
    message: str
    state: ScalerState


def metrics_problem(
    observed: MetricsObservation, scaling: AutoscalingSpec, now: datetime
) -> str | None:
    """Why the observation cannot be trusted, or None when it can."""
    if observed.metrics_error is not None:
        return f"metrics unreadable: {observed.metrics_error}"
    if observed.observed_at is None:
        return "metrics have no timestamp"
    age = (now - observed.observed_at).total_seconds()
    if age > scaling.stale_after_seconds:
        return f"metrics are stale: {age:.0f}s old (limit {scaling.stale_after_seconds}s)"
    rate = observed.requests_per_second
    if rate is None or not math.isfinite(rate) or rate < 0:
        return f"request rate is missing or invalid ({rate})"
    if observed.ready_replicas > 0:
        queue = observed.queue_depth_per_replica
        if queue is None or not math.isfinite(queue) or queue < 0:
            return f"queue depth is missing or invalid ({queue})"
    p99 = observed.p99_latency_seconds
    if rate > 0 and (p99 is None or not math.isfinite(p99)):
        return f"p99 latency is missing or NaN ({p99}) while requests flow"
    return None


def _blind_proposal(current: int, spec: ScalingSpec, state: ScalerState, problem: str) -> _Proposal:
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
    return _Proposal(replicas, reasons.METRICS_UNAVAILABLE, message, blind_state)


def _sighted_proposal(
    current: int,
    observed: MetricsObservation,
    spec: ScalingSpec,
    state: ScalerState,
    *,
    now: datetime,
    cold_start: float,
) -> _Proposal:
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
            return _Proposal(
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
        return _Proposal(current, reasons.STEADY, f"{signals}; capacity not yet known", healthy)
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
    # Down-sizing keeps the same band on the other side: the smaller count must run at no more
    # than the target minus the tolerance, so a step down is never undone by noise.
    needed = math.ceil(demand / (capacity * utilization * (1.0 - HEADROOM_TOLERANCE)))
    if needed >= current:
        return _Proposal(current, reasons.STEADY, sizing, healthy)

    healthy_for = (now - (state.healthy_since or now)).total_seconds()
    hold = scaling.scale_down.stabilization_seconds
    if healthy_for < hold:
        return _Proposal(
            current,
            reasons.SCALE_DOWN_HELD,
            f"{sizing}; healthy for {healthy_for:.0f}s of the {hold}s hold window",
            healthy,
        )
    if state.last_scale_at is not None:
        since_scale = (now - state.last_scale_at).total_seconds()
        if since_scale < scaling.scale_down.period_seconds:
            return _Proposal(
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
    return _Proposal(desired, reasons.LOAD_DECREASED, f"{sizing}; step to {desired}", healthy)


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
) -> _Proposal:
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
                return _Proposal(
                    arrivals_need,
                    reason,
                    f"{explanation}; {pending} replica(s) warming, but the arrival rate alone "
                    f"needs {arrivals_need}",
                    state,
                )
            return _Proposal(
                current,
                reasons.SCALE_UP_PENDING,
                f"{explanation}; {pending} replica(s) still warming, want {wanted}",
                state,
            )
    return _Proposal(wanted, reason, f"{explanation}; scale to {wanted}", state)


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


def _cold_start(observed: MetricsObservation, prewarm: PrewarmSpec) -> float:
    measured = observed.cold_start_seconds
    if measured is not None and math.isfinite(measured) and measured >= 0:
        return measured
    return float(prewarm.assumed_cold_start_seconds)


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

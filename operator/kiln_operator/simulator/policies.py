"""The autoscalers under test: Kiln's real `decide`, HPA, KEDA, Knative KPA, static, oracles.

Why it exists: a comparison is only fair if each baseline is configured as its users would
run it, with its documented defaults. Kiln's policy is the operator's own `decide`, imported
and fed what the operator's Prometheus adapter would read. Each class says which knob the
benchmark sweeps (`knob`).
"""

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
from numpy.typing import NDArray

from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingSpec,
    LearnedPrewarmSpec,
    PrewarmSpec,
    ScaleToZeroSpec,
    SloSpec,
)
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.learned import LearnedFit
from kiln_operator.autoscaling.policy import decide
from kiln_operator.autoscaling.schedule import starts_between
from kiln_operator.autoscaling.state import ScalerState
from kiln_operator.simulator.engine import Snapshot
from kiln_operator.simulator.prometheus import PrometheusDown

EPOCH = datetime(2026, 11, 23, tzinfo=UTC)
"""The simulated day starts at midnight UTC on a Monday."""


@dataclass(frozen=True)
class Schedule:
    """A pre-warm window as the user declares it, for the policies that take schedules."""

    name: str
    cron: str
    duration_minutes: int
    floor: int


def _at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


class KilnPolicy:
    """Kiln's `decide`, every `evaluationIntervalSeconds`, on Prometheus-shaped inputs: the same
    signals the operator reads, the batch counters for its capacity estimate included.

    With `learned` (spec.prewarm.learned) and `history` (the fit the operator's history cache
    would hold at a simulated second), the learned pre-warm runs too.

    Knob: `targetUtilizationPercent`.
    """

    name = "kiln"
    reads_prometheus = True

    def __init__(
        self,
        slo_seconds: float,
        min_replicas: int,
        max_replicas: int,
        schedules: list[Schedule],
        *,
        cold_start_seconds: float,
        max_batch_size: int,
        target_utilization_percent: int = 75,
        learned: LearnedPrewarmSpec | None = None,
        history: Callable[[float], LearnedFit | None] | None = None,
        idle_seconds: int = 900,
    ) -> None:
        autoscaling = AutoscalingSpec(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_utilization_percent=target_utilization_percent,
            scale_to_zero=ScaleToZeroSpec(idle_seconds=idle_seconds),
        )
        prewarm = PrewarmSpec.model_validate(
            {
                "schedules": [
                    {
                        "name": schedule.name,
                        "cron": schedule.cron,
                        "timeZone": "UTC",
                        "durationMinutes": schedule.duration_minutes,
                        "minReplicas": schedule.floor,
                    }
                    for schedule in schedules
                ],
            }
        ).model_copy(update={"learned": learned})
        self.history = history
        self.spec = ScalingSpec(
            slo=SloSpec(p99_latency_milliseconds=slo_seconds * 1000.0),
            autoscaling=autoscaling,
            prewarm=prewarm,
            max_batch_size=max_batch_size,
        )
        self.interval_seconds = autoscaling.evaluation_interval_seconds
        self.window = float(autoscaling.metrics_window_seconds)
        self.cold_start_seconds = cold_start_seconds
        self.state = ScalerState()
        self.reasons: dict[str, int] = {}

    def desired(self, snapshot: Snapshot) -> int:
        """One evaluation of the operator's timer."""
        view, now = snapshot.prometheus, snapshot.now
        learned = self.history(now) if self.history is not None else None
        try:
            observation = MetricsObservation(
                ready_replicas=snapshot.ready,
                observed_at=_at(view.sample_time(now)),
                p99_latency_seconds=view.p99(now, self.window),
                queue_depth_per_replica=view.queue_per_replica(now),
                requests_per_second=view.request_rate(now, self.window),
                cold_start_seconds=self.cold_start_seconds,
                batches=view.batch_window(now, self.window),
                learned=learned,
                held_requests=self._held(snapshot),
            )
        except PrometheusDown as error:
            observation = MetricsObservation(
                ready_replicas=snapshot.ready,
                metrics_error=str(error),
                cold_start_seconds=self.cold_start_seconds,
                learned=learned,
                held_requests=self._held(snapshot),
            )
        decision = decide(snapshot.current, observation, self.spec, self.state, _at(now))
        self.state = decision.state
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        return decision.desired_replicas

    def _held(self, snapshot: Snapshot) -> int | None:
        """What the activator reports: at minReplicas 0, the requests waiting while no pod is
        ready (the activator holds them); None (no activator) otherwise."""
        if self.spec.autoscaling.min_replicas > 0:
            return None
        return snapshot.waiting if snapshot.ready == 0 else 0


@dataclass
class _HpaCore:
    """The HPA v2 controller's arithmetic with its defaults (sync every 15 s).

    Tolerance 0.1; scale-up at most max(100 %, 4 pods) per 15 s with no stabilization;
    scale-down to the highest recommendation of the last 300 s.
    """

    tolerance: float = 0.1
    down_stabilization_seconds: float = 300.0
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)

    def stabilize(self, now: float, current: int, proposal: int) -> int:
        self.recommendations.append((now, proposal))
        while self.recommendations[0][0] < now - self.down_stabilization_seconds:
            self.recommendations.popleft()
        if proposal < current:
            proposal = min(current, max(rec for _, rec in self.recommendations))
        return min(proposal, max(2 * current, current + 4))

    def proposal(self, current: int, ratio: float) -> int:
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        return math.ceil(ratio * current)


class HpaPolicy:
    """Kubernetes HPA v2 on GPU utilization (busy fraction, averaged over 1 min).

    Unready pods count as 0 % when scaling up, as the HPA does. Metrics unavailable: no change.
    Knob: target utilization.
    """

    name = "hpa"
    interval_seconds = 15
    reads_prometheus = True

    def __init__(self, target_utilization: float = 0.7) -> None:
        self.target = target_utilization
        self.core = _HpaCore()

    def desired(self, snapshot: Snapshot) -> int:
        """One HPA sync."""
        try:
            utilization = snapshot.prometheus.utilization(snapshot.now, 60.0)
        except PrometheusDown:
            return snapshot.current
        if snapshot.ready == 0:
            return snapshot.current
        usage = utilization * snapshot.ready
        ratio = utilization / self.target
        if ratio > 1.0:
            ratio = usage / (self.target * snapshot.current)
        else:
            ratio = ratio * snapshot.ready / snapshot.current
        proposal = self.core.proposal(snapshot.current, ratio)
        return self.core.stabilize(snapshot.now, snapshot.current, proposal)


class KedaPolicy:
    """KEDA: a cron trigger for the declared window plus a Prometheus request-rate trigger.

    The ScaledObject's HPA takes the max of the triggers (AverageValue: rate / threshold per
    replica) with the HPA defaults above; the cron trigger starts at the window's opening (KEDA
    has no notion of cold start). Prometheus down: the failing trigger cannot lower replicas.
    Knob: the per-replica request-rate threshold.
    """

    name = "keda"
    interval_seconds = 15
    reads_prometheus = True

    def __init__(self, threshold_rps: float, schedules: list[Schedule], horizon: float) -> None:
        self.threshold = threshold_rps
        self.core = _HpaCore()
        self.windows: list[tuple[float, float, int]] = []
        for schedule in schedules:
            parsed = PrewarmSpec.model_validate(
                {
                    "schedules": [
                        {
                            "name": schedule.name,
                            "cron": schedule.cron,
                            "durationMinutes": schedule.duration_minutes,
                            "minReplicas": schedule.floor,
                        }
                    ]
                }
            ).schedules[0]
            for opening in starts_between(parsed, EPOCH, _at(horizon)):
                start = (opening - EPOCH).total_seconds()
                self.windows.append((start, start + schedule.duration_minutes * 60, schedule.floor))

    def desired(self, snapshot: Snapshot) -> int:
        """One HPA sync over the two triggers."""
        now = snapshot.now
        cron = max((floor for start, end, floor in self.windows if start <= now < end), default=0)
        try:
            rate = snapshot.prometheus.request_rate(now, 60.0)
        except PrometheusDown:
            return max(cron, snapshot.current)
        ratio = rate / (self.threshold * max(snapshot.current, 1))
        proposal = max(self.core.proposal(snapshot.current, ratio), cron)
        return self.core.stabilize(now, snapshot.current, proposal)


class KnativePolicy:
    """Knative KPA: concurrency from the queue-proxies every second, 60 s stable and 6 s panic
    windows, panic when the panic window wants 200 % of ready pods, scale-up rate 1000x,
    scale-down rate 2x per 2 s tick, target utilization 70 %. Not fed by Prometheus, so a
    Prometheus outage does not touch it. Knob: target concurrency per pod.
    """

    name = "knative"
    interval_seconds = 2
    reads_prometheus = False

    def __init__(self, target_concurrency: float = 8.0) -> None:
        self.target = target_concurrency * 0.7
        self.panic_since: float | None = None
        self.panic_peak = 0

    def desired(self, snapshot: Snapshot) -> int:
        """One KPA tick."""
        history = snapshot.concurrency
        if not history:
            return snapshot.current
        stable = float(np.mean(history[-60:]))
        panic = float(np.mean(history[-6:]))
        ready = max(1, snapshot.ready)
        low, high = math.floor(ready / 2.0), math.ceil(1000.0 * ready)
        want_stable = min(high, max(low, math.ceil(stable / self.target)))
        want_panic = min(high, max(low, math.ceil(panic / self.target)))
        now = snapshot.now
        if want_panic / ready >= 2.0:
            if self.panic_since is None:
                self.panic_peak = snapshot.current
            self.panic_since = now
        elif self.panic_since is not None and now - self.panic_since >= 60.0:
            self.panic_since = None
        if self.panic_since is not None:
            self.panic_peak = max(self.panic_peak, want_panic)
            return self.panic_peak
        return want_stable


class StaticPolicy:
    """Provisioned for the peak, all day. Knob: the replica count."""

    name = "static"
    interval_seconds = 60
    reads_prometheus = False

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def desired(self, snapshot: Snapshot) -> int:
        """Always the same."""
        return self.replicas


class ForesightOracle:
    """Perfect foresight of the true rate: sized at a utilization for the max rate over the
    next `lookahead` seconds, so pods started now are ready when needed. With a real cold
    start the lookahead includes it (billed while warming); with zero cold start it does not.
    Knob: utilization.
    """

    interval_seconds = 15
    reads_prometheus = False

    def __init__(
        self,
        name: str,
        rate: NDArray[np.float64],
        capacity_per_replica: float,
        lookahead_seconds: float,
        utilization: float = 0.8,
    ) -> None:
        self.name = name
        # The max over each lookahead window, computed once with a sliding maximum.
        span = int(lookahead_seconds) + self.interval_seconds
        padded = np.concatenate([rate, np.full(span, rate[-1])])
        windows = np.lib.stride_tricks.sliding_window_view(padded, span + 1)
        self.plan = np.ceil(windows.max(axis=1)[: rate.size] / (capacity_per_replica * utilization))

    def desired(self, snapshot: Snapshot) -> int:
        """What the future needs."""
        return int(self.plan[min(int(snapshot.now), self.plan.size - 1)])

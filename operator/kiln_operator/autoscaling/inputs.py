"""What the scaling policy decides from: the spec's parts it reads and one observation of the
metrics, and whether that observation can be trusted.

Why it exists: the operator (from Prometheus), the simulator (from its model) and the tests
build these two values; `decide` (policy.py) and the sizing (sizing.py) read them. Pure data.
"""

import math
from dataclasses import dataclass, field
from datetime import datetime

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec, PrewarmSpec, SloSpec
from kiln_operator.autoscaling.capacity import BatchWindow
from kiln_operator.autoscaling.learned import LearnedFit


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
    held_requests: int | None = None
    """Requests Kiln's activator holds for the service now (it is at zero, or waking); None
    when no activator was read. Prometheus never counts them: no pod has seen them yet."""
    learned: LearnedFit | None = None
    """The learned pre-warm's latest fit of the request-rate history (spec.prewarm.learned
    only); None until the history was read."""


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

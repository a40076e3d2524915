"""The reasons a scaling decision gives, as named constants.

Why it exists: the reason is written to `status.autoscaling.reason`, to events and to the
simulator's traces; one table keeps the vocabulary stable and documented.
"""

from typing import Final

LATENCY_ABOVE_TARGET: Final = "LatencyAboveTarget"
"""p99 latency exceeded the SLO: replicas were added, sized from rate and backlog."""

QUEUE_ABOVE_TARGET: Final = "QueueAboveTarget"
"""Queue depth per ready replica exceeded its target: replicas were added."""

HEADROOM_LOW: Final = "HeadroomLow"
"""The SLO is met but utilization of the measured capacity exceeds the target: replicas were
added to restore headroom before latency suffers."""

SCALE_UP_PENDING: Final = "ScaleUpPending"
"""More replicas are wanted but earlier new replicas are still warming: no stacking."""

SCALE_UP_BLOCKED: Final = "ScaleUpBlocked"
"""More replicas are wanted, but pods already asked for cannot be created (a ResourceQuota, a
LimitRange, an admission webhook) or scheduled (no node has the GPUs or the GPU product): the
replicas stay at the current count until they can be placed; the message has Kubernetes' cause."""

SCALE_UP_STABILIZING: Final = "ScaleUpStabilizing"
"""The SLO is breached but not yet for the scale-up stabilization window."""

LOAD_DECREASED: Final = "LoadDecreased"
"""Both signals were healthy for the hold window: replicas were removed by a bounded step."""

SCALE_DOWN_HELD: Final = "ScaleDownHeld"
"""Fewer replicas would do, but the signals have not been healthy for the hold window yet."""

SCALE_DOWN_PACED: Final = "ScaleDownPaced"
"""Fewer replicas would do, but the last scaling step was too recent."""

STEADY: Final = "Steady"
"""The current replicas meet the SLO with the target headroom."""

PREWARM_WINDOW: Final = "PrewarmWindow"
"""A scheduled window (open or within its lead time) sets the replica floor."""

MIN_REPLICAS: Final = "MinReplicas"
"""The decision was raised to `minReplicas`."""

MAX_REPLICAS: Final = "MaxReplicas"
"""The decision was capped at `maxReplicas`."""

METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
"""Metrics are missing, stale, NaN or Prometheus is unreachable: the declared policy applies
and replicas are never lowered."""

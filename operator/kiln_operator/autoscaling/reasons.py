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

PREWARM_LEARNED: Final = "PrewarmLearned"
"""The learned pre-warm's forecast (spec.prewarm.learned) sets the replica floor: a rise is
forecast within the lead time, or the forecast traffic needs more than the other floors."""

IDLE: Final = "Idle"
"""minReplicas 0: no request was counted or held for `scaleToZero.idleSeconds`, so the service
went to zero (or stays there)."""

WAKE_ON_REQUEST: Final = "WakeOnRequest"
"""minReplicas 0: the activator holds requests for the service at zero: replicas were raised
from zero, one per `queueDepthPerReplica` held requests (at least one)."""

MIN_REPLICAS: Final = "MinReplicas"
"""The decision was raised to `minReplicas`."""

MAX_REPLICAS: Final = "MaxReplicas"
"""The decision was capped at `maxReplicas`."""

METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
"""Metrics are missing, stale, NaN or Prometheus is unreachable: the declared policy applies
and replicas are never lowered."""

# The learned pre-warm's reasons (status.autoscaling.learned.reason).

LEARNED_FORECAST: Final = "LearnedForecast"
"""The history fits: the forecast sets a floor (possibly 0) and names the next rise."""

LEARNED_HISTORY_PENDING: Final = "LearnedHistoryPending"
"""The request-rate history has not been read yet: the history queries are spread over the
cycles (a bounded number per cycle), so a new service waits its turn."""

LEARNED_HISTORY_UNREADABLE: Final = "LearnedHistoryUnreadable"
"""Prometheus did not answer the history's range query (down, a timeout, an error); retried
after the refresh interval's tenth."""

LEARNED_HISTORY_SHORT: Final = "LearnedHistoryShort"
"""Fewer days with request-rate history than `minHistoryDays`: off until there are enough."""

LEARNED_NO_TRAFFIC: Final = "LearnedNoTraffic"
"""The history holds no traffic: nothing to forecast."""

LEARNED_POOR_FIT: Final = "LearnedPoorFit"
"""The daily and weekly shape missed the history's last days by more than `maxErrorPercent`."""

LEARNED_NO_CAPACITY: Final = "LearnedNoCapacity"
"""No per-replica capacity measured yet, so a forecast rate cannot be turned into replicas."""

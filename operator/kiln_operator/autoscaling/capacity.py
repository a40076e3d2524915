"""Per-replica capacity, measured from the runtime's batch metrics.

Why it exists: sizing by Little's law and the headroom scale-up need to know how many requests
one replica serves when it is saturated, and production has no oracle for it. The runtime
exports, per pod, the rows of every batch (`kiln_batch_size`) and its compute time
(`kiln_compute_duration_seconds`); over a metrics window their rates give the mean batch size
and the mean compute time per batch of the service. Batch time is affine in the batch size
(`t(b) = t0 + c*b`: a fixed cost per batch, a cost per row), and the mean of an affine function
is the function of the mean, so every window is one exact point on that line. The autoscaler
keeps an exponentially weighted least-squares fit over its evaluations (a few numbers in its
state) and reads the capacity off the line at the configured maximum batch size:
`maxBatchSize / t(maxBatchSize)` rows per second, divided by the rows per request.

Until the batch sizes seen have spread enough to fit a slope, the estimate is the rows per
compute-second at the batches seen, which is a lower bound (a fuller batch amortizes `t0`).
Pure: no clock, no I/O.
"""

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

DECAY = 0.995
"""Weight kept by the older points at each new one: about 200 evaluations of memory (50 min at
15 s), long enough for the diurnal swing of the load to spread the batch sizes, short enough
to follow a new model version within the hour. Noise averages out over the points."""
MIN_ROWS_SPREAD = 0.2
"""The standard deviation of the mean batch sizes seen (rows) needed to trust a slope."""


@dataclass(frozen=True)
class BatchWindow:
    """One metrics window of a service's batches, summed over its pods (per-second rates)."""

    rows_per_second: float
    batches_per_second: float
    compute_seconds_per_second: float
    ok_per_second: float

    @property
    def usable(self) -> bool:
        """Whether the window saw computed batches (no traffic tells nothing about capacity)."""
        values = (
            self.rows_per_second,
            self.batches_per_second,
            self.compute_seconds_per_second,
            self.ok_per_second,
        )
        return all(math.isfinite(v) for v in values) and min(values) > 0


class CapacityFit(BaseModel):
    """Weighted sums of (mean batch rows b, mean batch seconds t) points, and rows per request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: float = 0.0
    rows: float = 0.0
    seconds: float = 0.0
    rows_squared: float = 0.0
    rows_seconds: float = 0.0
    rows_per_request: float = 1.0

    def add(self, window: BatchWindow) -> "CapacityFit":
        """The fit with this window's point added (older points decayed); unchanged if the
        window is not usable."""
        if not window.usable:
            return self
        b = window.rows_per_second / window.batches_per_second
        t = window.compute_seconds_per_second / window.batches_per_second
        per_request = window.rows_per_second / window.ok_per_second
        keep = DECAY if self.weight > 0 else 0.0
        weight = self.weight * keep + 1.0
        return CapacityFit(
            weight=weight,
            rows=self.rows * keep + b,
            seconds=self.seconds * keep + t,
            rows_squared=self.rows_squared * keep + b * b,
            rows_seconds=self.rows_seconds * keep + b * t,
            rows_per_request=(self.rows_per_request * self.weight * keep + per_request) / weight,
        )

    def estimate(self, max_batch_rows: int) -> "CapacityEstimate | None":
        """Requests per second one replica serves at full batches; None before any batch."""
        if self.weight <= 0 or self.rows <= 0 or self.seconds <= 0:
            return None
        mean_b, mean_t = self.rows / self.weight, self.seconds / self.weight
        variance = max(0.0, self.rows_squared / self.weight - mean_b * mean_b)
        rows = float(max_batch_rows)
        if variance < MIN_ROWS_SPREAD**2:
            # One batch size only: rows per compute-second there, a lower bound unless the
            # batches were already full.
            full = mean_b >= rows - 0.5
            return CapacityEstimate(mean_b / mean_t / self.rows_per_request, fitted=full)
        slope = max(0.0, (self.rows_seconds / self.weight - mean_b * mean_t) / variance)
        intercept = mean_t - slope * mean_b
        if intercept < 0:  # noise: no fixed cost per batch, time proportional to rows
            intercept, slope = 0.0, mean_t / mean_b
        full_batch_seconds = intercept + slope * rows
        if full_batch_seconds <= 0:
            return None
        return CapacityEstimate(rows / full_batch_seconds / self.rows_per_request, fitted=True)


@dataclass(frozen=True)
class CapacityEstimate:
    """Requests per second per replica, and whether it is read off a fitted line (or observed
    at full batches) rather than a lower bound."""

    requests_per_second: float
    fitted: bool

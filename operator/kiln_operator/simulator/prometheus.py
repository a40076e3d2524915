"""What Prometheus would show: scrapes every 15 s, `rate()` and `histogram_quantile()` windows.

Why it exists: an autoscaler never sees the truth, only scraped counters. Policies read the
simulated service through this view, so they suffer the same lag (the newest sample is up to
one scrape old), the same window smoothing and the same histogram bucket error as in a
cluster. An outage makes every query fail.
"""

import bisect
import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kiln_operator.autoscaling.capacity import BatchWindow
from kiln_operator.simulator.model import LATENCY_BUCKETS


class PrometheusDown(RuntimeError):
    """The query failed: Prometheus is unreachable."""


@dataclass(frozen=True)
class BatchCounters:
    """Cumulative counters of the batches that finished: `kiln_batch_size_sum` and `_count`,
    `kiln_compute_duration_seconds_sum` and `kiln_requests_total{code="ok"}`."""

    rows: int = 0
    batches: int = 0
    compute_seconds: float = 0.0
    ok: int = 0


@dataclass
class Scrapes:
    """Scraped samples of the service-wide sums, one row per scrape."""

    interval: float
    times: list[float] = field(default_factory=list)
    buckets: list[NDArray[np.int64]] = field(default_factory=list)
    """Cumulative `le` bucket counts of kiln_request_duration_seconds (last one is +Inf)."""
    requests: list[int] = field(default_factory=list)
    """Cumulative kiln_requests_total (all codes)."""
    queue: list[int] = field(default_factory=list)
    """kiln_queue_depth summed over pods."""
    busy_seconds: list[float] = field(default_factory=list)
    """Cumulative seconds replicas spent computing batches (a GPU-utilization counter)."""
    ready: list[int] = field(default_factory=list)
    batches: list["BatchCounters"] = field(default_factory=list)
    """The runtime's batch counters (summed over pods), as the operator's capacity reads them."""

    def record(  # noqa: PLR0917 (one value per scraped series)
        self,
        now: float,
        buckets: NDArray[np.int64],
        requests: int,
        queue: int,
        busy_seconds: float,
        ready: int,
        batches: "BatchCounters",
    ) -> None:
        """Store one scrape."""
        self.batches.append(batches)
        self.times.append(now)
        self.buckets.append(buckets.copy())
        self.requests.append(requests)
        self.queue.append(queue)
        self.busy_seconds.append(busy_seconds)
        self.ready.append(ready)


@dataclass
class PrometheusView:
    """PromQL-like queries over the scrapes as of a moment."""

    scrapes: Scrapes
    outage: tuple[float, float] | None = None

    def _latest(self, now: float) -> int:
        if self.outage is not None and self.outage[0] <= now < self.outage[1]:
            raise PrometheusDown("connection refused")
        index = bisect.bisect_right(self.scrapes.times, now) - 1
        if index < 0:
            raise PrometheusDown("no samples yet")
        return index

    def _window(self, now: float, window: float) -> tuple[int, int, float]:
        last = self._latest(now)
        span = max(1, round(window / self.scrapes.interval))
        first = max(0, last - span)
        elapsed = self.scrapes.times[last] - self.scrapes.times[first]
        return first, last, elapsed

    def sample_time(self, now: float) -> float:
        """When the newest visible scrape was taken."""
        return self.scrapes.times[self._latest(now)]

    def request_rate(self, now: float, window: float) -> float:
        """sum(rate(kiln_requests_total[window]))."""
        first, last, elapsed = self._window(now, window)
        if elapsed <= 0:
            return 0.0
        return (self.scrapes.requests[last] - self.scrapes.requests[first]) / elapsed

    def p99(self, now: float, window: float) -> float:
        """histogram_quantile(0.99, sum by (le) (rate(..._bucket[window]))); NaN if empty."""
        first, last, _ = self._window(now, window)
        counts = self.scrapes.buckets[last] - self.scrapes.buckets[first]
        return histogram_quantile(0.99, counts)

    def queue_per_replica(self, now: float) -> float:
        """sum(kiln_queue_depth) / ready replicas, at the newest scrape."""
        last = self._latest(now)
        ready = self.scrapes.ready[last]
        return self.scrapes.queue[last] / ready if ready else float(self.scrapes.queue[last])

    def batch_window(self, now: float, window: float) -> BatchWindow | None:
        """The rates of the batch counters over the window, as the operator's grouped query
        returns them; None before two scrapes."""
        first, last, elapsed = self._window(now, window)
        if elapsed <= 0:
            return None
        old, new = self.scrapes.batches[first], self.scrapes.batches[last]
        return BatchWindow(
            rows_per_second=(new.rows - old.rows) / elapsed,
            batches_per_second=(new.batches - old.batches) / elapsed,
            compute_seconds_per_second=(new.compute_seconds - old.compute_seconds) / elapsed,
            ok_per_second=(new.ok - old.ok) / elapsed,
        )

    def utilization(self, now: float, window: float) -> float:
        """Average busy fraction of the ready replicas over the window (GPU utilization)."""
        first, last, elapsed = self._window(now, window)
        ready = np.mean(self.scrapes.ready[first : last + 1]) if last >= first else 0.0
        if elapsed <= 0 or ready <= 0:
            return 0.0
        busy = self.scrapes.busy_seconds[last] - self.scrapes.busy_seconds[first]
        return min(1.0, float(busy / (elapsed * ready)))


def histogram_quantile(quantile: float, counts: NDArray[np.int64]) -> float:
    """Prometheus's quantile estimate from cumulative `le` bucket counts (+Inf last).

    Linear interpolation inside the bucket holding the rank; a rank in the +Inf bucket returns
    the highest finite bound; no observations return NaN.
    """
    total = int(counts[-1])
    if total <= 0:
        return math.nan
    rank = quantile * total
    index = int(np.searchsorted(counts, rank, side="left"))
    if index >= len(LATENCY_BUCKETS):
        return LATENCY_BUCKETS[-1]
    upper = LATENCY_BUCKETS[index]
    lower = LATENCY_BUCKETS[index - 1] if index > 0 else 0.0
    below = int(counts[index - 1]) if index > 0 else 0
    inside = int(counts[index]) - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside

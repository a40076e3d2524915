"""How long the batcher waits before dispatching, and what it learns from traffic. Pure.

The wait adapts to load. At low load (batches of one request) it dispatches at once, so a lone
request never pays the queue delay. At high load it waits for the batch size that load has
been producing, estimated from the arrival rate, and never longer than the configured cap.

The cap counts from the later of the oldest request's arrival and the moment the model became
free: requests that queued behind a running batch have waited for the model, not for company,
and giving the clients answered by that batch a moment to send again keeps closed-loop
clients in one batch instead of splitting them into two that alternate (12 + 4 instead of 16).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

SMOOTHING = 0.2  # weight of the newest gap in the inter-arrival average
BATCH_MEMORY = 0.9  # per batch, how much of the largest recent batch size is remembered


@dataclass(frozen=True)
class TrafficStats:
    """What the wait policy knows about recent traffic."""

    typical_batch_rows: float = 1.0  # the largest recent batch, decaying batch by batch
    mean_interarrival_seconds: float = math.inf
    last_arrival: float | None = None


def observe_arrival(stats: TrafficStats, now: float) -> TrafficStats:
    if stats.last_arrival is None:
        return TrafficStats(stats.typical_batch_rows, stats.mean_interarrival_seconds, now)
    gap = max(0.0, now - stats.last_arrival)
    mean = (
        gap
        if math.isinf(stats.mean_interarrival_seconds)
        else (1 - SMOOTHING) * stats.mean_interarrival_seconds + SMOOTHING * gap
    )
    return TrafficStats(stats.typical_batch_rows, mean, now)


def observe_batch(stats: TrafficStats, rows: int) -> TrafficStats:
    typical = max(float(rows), stats.typical_batch_rows * BATCH_MEMORY)
    return TrafficStats(typical, stats.mean_interarrival_seconds, stats.last_arrival)


def batch_wait_seconds(
    *,
    queued_rows: int,
    max_batch_rows: int,
    stats: TrafficStats,
    max_delay_seconds: float,
    window_start: float,
    now: float,
) -> float:
    """Seconds to keep collecting before dispatching what is queued (0 means now).

    ``window_start`` is the later of the oldest queued request's arrival and the moment the
    model became free.
    """
    budget = max_delay_seconds - (now - window_start)
    if budget <= 0 or queued_rows >= max_batch_rows:
        return 0.0
    target = min(max_batch_rows, math.floor(stats.typical_batch_rows))
    if queued_rows >= target:
        return 0.0
    expected_fill = (target - queued_rows) * stats.mean_interarrival_seconds
    return min(budget, expected_fill)


def inline_rows(timings: Mapping[int, float], limit_seconds: float, max_batch_rows: int) -> int:
    """The most rows a batch may hold and still be computed inline (on the event loop).

    ``timings`` maps batch sizes to their measured compute time. A batch's time between two
    measured sizes is interpolated linearly (compute grows about linearly with the rows); a
    batch is inline if that estimate is under ``limit_seconds``. If every measured size is
    under the limit, every batch is inline (as before per-batch decisions: the largest
    warm-up size stands for the model); if none is, no batch is.
    """
    points = sorted(timings.items())
    if not points or points[0][1] >= limit_seconds:
        return 0
    for (rows0, time0), (rows1, time1) in itertools.pairwise(points):
        if time1 >= limit_seconds:  # the limit is crossed between these two sizes
            share = (limit_seconds - time0) / (time1 - time0) if time1 > time0 else 0.0
            return min(max_batch_rows, rows0 + math.floor(share * (rows1 - rows0)))
    return max_batch_rows

"""How long the batcher waits before dispatching, and what it learns from traffic. Pure.

The wait adapts to load. At low load (batches of one request) it dispatches at once, so a lone
request never pays the queue delay. At high load it waits for the batch size that load has
been producing, estimated from the arrival rate, and never longer than the configured cap.

The cap counts from the later of the oldest request's arrival and the moment the model became
free: requests that queued behind a running batch have waited for the model, not for company,
and giving the clients answered by that batch a moment to send again keeps closed-loop
clients in one batch instead of splitting them into two that alternate (12 + 4 instead of 16).

Waiting for the whole batch pays only while the server is busy reading the requests that fill
it. When the clients leave the server idle (tritonclient spends about 0.1 ms of its own CPU per
request, more than the runtime does; its asyncio flavour answers a batch's replies in a burst
after a pause), the server waits for the clients, then the clients wait while the whole batch
computes: they work in turn. So when the server's idle time per batch is more than twice
what one more batch costs (the part of a batch's compute time that does not grow with its
rows), batches aim at half the rows and hold no more: one half computes while the clients
answer and send the other. Halves stay while the idle time per whole batch is still above
that cost once: halving is what shrinks the idle time, and without that margin the batcher
would swing between the two. Clients that keep the server busy (h2load, wrk: the gaps between
arrivals are the server's own reading), and models whose fixed cost per batch is large, keep
whole batches.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping
from typing import Final

SMOOTHING = 0.2  # weight of the newest gap in the inter-arrival average
IDLE_WINDOW = 8  # batches whose idle time per row is remembered; the median of them counts
BATCH_MEMORY = 0.9  # per batch, how much of the largest recent batch size is remembered
# A batch expected to compute faster than this runs on the event loop: a thread hop would cost
# a large share of its latency, and blocking the loop this briefly delays no one noticeably.
INLINE_BELOW_SECONDS = 0.001
# The same when the model's compute leaves the loop no CPU (see inline_limit_seconds): the
# longest the loop stops reading for a batch, which requests then wait for anyway.
SHARED_CPU_INLINE_BELOW_SECONDS = 0.004


# TrafficStats and BatchPlan are plain classes with their own ``__init__``, not NamedTuples:
# mypyc compiles these to C, while a NamedTuple's constructor and ``_replace`` run as
# interpreted Python, and the batcher renews the stats with every request.


class TrafficStats:
    """What the wait policy knows about recent traffic (immutable: renewed per request)."""

    def __init__(
        self,
        typical_batch_rows: float = 1.0,
        mean_interarrival_seconds: float = math.inf,
        *,
        last_arrival: float | None = None,
        idle_seconds_per_row: float = 0.0,
        recent_idle_per_row: tuple[float, ...] = (),
        last_dispatch: float | None = None,
        last_busy_seconds: float = 0.0,
        halves: bool = False,
    ) -> None:
        # the most rows recently waiting at a dispatch, decaying
        self.typical_batch_rows: Final = typical_batch_rows
        self.mean_interarrival_seconds: Final = mean_interarrival_seconds
        self.last_arrival: Final = last_arrival
        self.idle_seconds_per_row: Final = idle_seconds_per_row  # median of recent_idle_per_row
        # per batch: the server's idle time before it, per row
        self.recent_idle_per_row: Final = recent_idle_per_row
        self.last_dispatch: Final = last_dispatch
        # the server's busy time (see observe_dispatch) at the last dispatch
        self.last_busy_seconds: Final = last_busy_seconds
        self.halves: Final = halves  # the last batch was planned as half the typical rows


class BatchPlan:
    """The rows the next batch waits for, the most it takes, and whether these are halves."""

    def __init__(self, target_rows: int, max_rows: int, halves: bool = False) -> None:
        self.target_rows: Final = target_rows
        self.max_rows: Final = max_rows
        self.halves: Final = halves

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchPlan) and (self.target_rows, self.max_rows, self.halves) == (
            other.target_rows,
            other.max_rows,
            other.halves,
        )

    def __hash__(self) -> int:
        return hash((self.target_rows, self.max_rows, self.halves))

    def __repr__(self) -> str:
        return f"BatchPlan({self.target_rows}, {self.max_rows}, halves={self.halves})"


def observe_arrival(stats: TrafficStats, now: float) -> TrafficStats:
    if stats.last_arrival is None:
        mean = stats.mean_interarrival_seconds
    else:
        gap = max(0.0, now - stats.last_arrival)
        mean = (
            gap
            if math.isinf(stats.mean_interarrival_seconds)
            else (1 - SMOOTHING) * stats.mean_interarrival_seconds + SMOOTHING * gap
        )
    return TrafficStats(
        stats.typical_batch_rows,
        mean,
        last_arrival=now,
        idle_seconds_per_row=stats.idle_seconds_per_row,
        recent_idle_per_row=stats.recent_idle_per_row,
        last_dispatch=stats.last_dispatch,
        last_busy_seconds=stats.last_busy_seconds,
        halves=stats.halves,
    )


def observe_dispatch(
    stats: TrafficStats,
    *,
    now: float,
    busy_seconds: float,
    rows: int,
    waiting_rows: int,
    plan: BatchPlan,
) -> TrafficStats:
    """Learn from a batch of ``rows`` dispatched when ``waiting_rows`` rows were queued.

    ``busy_seconds`` is a running total of the server's busy time: the CPU time of the thread
    that reads requests (the event loop, inline batches included) plus the time the model
    spent computing elsewhere. The part of the time since the last dispatch that it did not
    grow by is idle time, counted per row dispatched. The median of the last few batches
    counts, so one pause (the host, a client's garbage collection) changes nothing.
    """
    typical = max(float(waiting_rows), stats.typical_batch_rows * BATCH_MEMORY)
    recent = stats.recent_idle_per_row
    if stats.last_dispatch is not None and rows > 0:
        elapsed = now - stats.last_dispatch
        idle = max(0.0, elapsed - (busy_seconds - stats.last_busy_seconds)) / rows
        recent = (*recent[1 - IDLE_WINDOW :], idle)
    return TrafficStats(
        typical_batch_rows=typical,
        mean_interarrival_seconds=stats.mean_interarrival_seconds,
        last_arrival=stats.last_arrival,
        idle_seconds_per_row=statistics.median(recent) if recent else 0.0,
        recent_idle_per_row=recent,
        last_dispatch=now,
        last_busy_seconds=busy_seconds,
        halves=plan.halves,
    )


def batch_plan(
    stats: TrafficStats, max_batch_rows: int, batch_overhead_seconds: float
) -> BatchPlan:
    """Whole batches of the typical size, or halves while the server idles, per whole batch,
    more than twice what one more batch costs (``batch_overhead_seconds``, see
    ``batch_overhead``), and, once in halves, more than once."""
    typical = max(1, min(max_batch_rows, math.floor(stats.typical_batch_rows)))
    margin = 1 if stats.halves else 2
    if typical > 1 and typical * stats.idle_seconds_per_row > margin * batch_overhead_seconds:
        half = math.ceil(typical / 2)
        return BatchPlan(half, half, halves=True)
    return BatchPlan(typical, max_batch_rows)


def batch_wait_seconds(
    *,
    queued_rows: int,
    target_rows: int,
    stats: TrafficStats,
    max_delay_seconds: float,
    window_start: float,
    now: float,
) -> float:
    """Seconds to keep collecting before dispatching what is queued (0 means now).

    ``target_rows`` is the plan's (``batch_plan``); ``window_start`` is the later of the oldest
    queued request's arrival and the moment the model became free.
    """
    budget = max_delay_seconds - (now - window_start)
    if budget <= 0 or queued_rows >= target_rows:
        return 0.0
    return min(budget, (target_rows - queued_rows) * stats.mean_interarrival_seconds)


def batch_overhead(timings: Mapping[int, float]) -> float:
    """The part of a batch's compute time that does not grow with its rows, in seconds.

    ``timings`` maps batch sizes to their measured compute time. The line through the two
    smallest sizes, taken back to zero rows, within [0, the smallest size's time]; with one
    size, all of its time (the cautious side: it makes splitting a batch look costly); with
    none, infinity (never split).
    """
    points = sorted(timings.items())
    if not points:
        return math.inf
    (rows0, time0), *rest = points
    if not rest:
        return time0
    rows1, time1 = rest[0]
    per_row = (time1 - time0) / (rows1 - rows0)
    return min(time0, max(0.0, time0 - rows0 * per_row))


def inline_limit_seconds(
    *, computes_on_cpu: bool, compute_threads: int | None, cpus: int | None
) -> float:
    """How long a batch may be expected to compute and still run inline, on the event loop.

    A thread for the model pays when it computes while the loop reads: on a GPU, or on CPUs
    its compute threads leave free. A model that computes on the CPU with a thread for each of
    the server's CPUs (the default: as many as the process may run on) leaves the loop none,
    and then the thread buys no overlap, only the hand-off and the two threads taking turns on
    the same CPUs: on one CPU the fp32 MLP's batches of 8 rows took twice their compute time
    in the thread. Such a model computes inline every batch expected under
    ``SHARED_CPU_INLINE_BELOW_SECONDS``, the longest the loop may stop reading; any other
    (either count unknown included) every batch under ``INLINE_BELOW_SECONDS``, where a
    hand-off would be a large share of the batch's time.
    """
    leaves_loop_no_cpu = (
        computes_on_cpu and compute_threads is not None and cpus is not None
        and compute_threads >= cpus
    )  # fmt: skip
    return SHARED_CPU_INLINE_BELOW_SECONDS if leaves_loop_no_cpu else INLINE_BELOW_SECONDS


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

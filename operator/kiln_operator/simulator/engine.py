"""The discrete-event core: requests, batching replicas, pods that start cold, a policy loop.

Why it exists: it is the simulated cluster every policy is scored on, identical for all.
Requests wait in one FIFO queue (the Service spreads load over ready replicas); an idle
replica opens a batch when a request is waiting and closes it when it is full or the oldest
request has waited the batch delay; a batch of b takes `t0 + c*b`. A request that waited the
queue timeout is rejected. Pods are billed from creation, serve once ready, and drain their
current batch when removed. The events are batch starts; the policy and the scrapes run on a
clock that jumps from one control moment to the next (every second for Knative).

Deterministic: the arrivals and the pod failures come from generators seeded by the caller.
"""

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from kiln_operator.simulator.model import LATENCY_BUCKETS, ClusterModel, ServiceModel
from kiln_operator.simulator.prometheus import BatchCounters, PrometheusView, Scrapes

_DRAIN_SECONDS = 120
"""After the trace ends, replicas keep serving this long; what is left is rejected."""


@dataclass(frozen=True)
class Snapshot:
    """What a policy may look at when it decides."""

    now: float
    current: int
    """Pods that exist (warming or ready): the Deployment's replicas."""
    ready: int
    prometheus: PrometheusView
    concurrency: Sequence[float]
    """Per-second in-system requests (queued + in flight), as Knative's queue-proxy reports."""
    waiting: int = 0
    """Requests arrived and not yet in a batch: with no ready pod, those Kiln's activator holds."""


class Policy(Protocol):
    """An autoscaler under test."""

    name: str
    interval_seconds: int
    reads_prometheus: bool
    """False for policies with their own signal; the scrapes are then skipped (speed)."""

    def desired(self, snapshot: Snapshot) -> int:
        """The replica count the policy wants now."""
        ...


@dataclass(eq=False)
class _Pod:
    created: float
    ready_at: float
    removed: float | None = None
    free_at: float = 0.0
    batch_start: float = 0.0
    batch_size: int = 0
    draining: bool = False


@dataclass
class RunResult:
    """Everything measured in one run, for `results.score`."""

    arrivals: NDArray[np.float64]
    latency: NDArray[np.float64]
    """Seconds from arrival to response; +inf for rejected requests."""
    ready: NDArray[np.int64]
    """Ready replicas at each second."""
    existing: NDArray[np.int64]
    """Billed pods at each second."""
    decisions: list[tuple[float, int]]
    """(time, replicas) each time the policy changed the count."""
    replica_seconds: float
    horizon: float
    cold_starts: list[float] = field(default_factory=list)


class Simulation:
    """One policy on one trace."""

    def __init__(
        self,
        arrivals: NDArray[np.float64],
        horizon: float,
        service: ServiceModel,
        cluster: ClusterModel,
        *,
        pod_rng: np.random.Generator,
        outage: tuple[float, float] | None = None,
        initial_replicas: int = 1,
    ) -> None:
        self.arrivals = arrivals
        self.horizon = horizon
        self.service = service
        self.cluster = cluster
        self.pod_rng = pod_rng
        self.arrival_list: list[float] = arrivals.tolist()
        # Per batch, in start order: finish (or rejection) time, first and end request index,
        # whether its requests were rejected. Parallel lists: the hot loop only appends.
        self.batch_finish: list[float] = []
        self.batch_first: list[int] = []
        self.batch_end: list[int] = []
        self.batch_rejected: list[bool] = []
        self.scanned = 0
        self.unfinished = _Batches.empty()
        """Batches seen by a scrape that had not finished yet."""
        self.head = 0
        self.pods: list[_Pod] = []
        self.removed: list[_Pod] = []
        self.starting: list[_Pod] = []
        self.idle: list[tuple[float, int, _Pod]] = []
        self.sequence = 0
        self.busy_seconds = 0.0
        self.bucket_counts = np.zeros(len(LATENCY_BUCKETS) + 1, dtype=np.int64)
        self.answered = 0
        self.batch_counters = BatchCounters()
        self.scrapes = Scrapes(interval=cluster.scrape_interval_seconds)
        self.view = PrometheusView(self.scrapes, outage)
        self.concurrency: list[float] = []
        self.decisions: list[tuple[float, int]] = []
        self.cold_starts: list[float] = []
        for _ in range(initial_replicas):
            pod = _Pod(created=-cluster.cold_start_seconds, ready_at=0.0)
            self.pods.append(pod)
            self._push_ready(pod, 0.0)

    # ---------------------------------------------------------------- the run
    def run(self, policy: Policy, track_concurrency: bool = False) -> RunResult:
        """Play the whole trace with `policy` deciding; return what happened."""
        seconds = int(self.horizon)
        scrape_every = int(self.cluster.scrape_interval_seconds)
        reads_prometheus = policy.reads_prometheus
        # Nothing but batches happens between two control moments, so the clock jumps from one
        # to the next (every second only when Knative's per-second concurrency is sampled).
        step = policy.interval_seconds
        if reads_prometheus:
            step = math.gcd(step, scrape_every)
        if track_concurrency:
            step = 1
        for second in range(0, seconds, step):
            now = float(second)
            if reads_prometheus and second % scrape_every == 0:
                self._scrape(now)
            if track_concurrency:
                self.concurrency.append(self._in_system(now))
            if second % policy.interval_seconds == 0:
                snapshot = Snapshot(
                    now=now,
                    current=len(self.pods),
                    ready=self._ready_at(now),
                    prometheus=self.view,
                    concurrency=self.concurrency,
                    waiting=bisect.bisect_right(self.arrival_list, now, self.head) - self.head,
                )
                wanted = min(self.cluster.max_replicas, policy.desired(snapshot))
                wanted = max(self.cluster.min_replicas, wanted)
                if wanted != len(self.pods):
                    self._scale(now, wanted)
                    self.decisions.append((now, wanted))
            self._start_pods(now + step)
            self._serve(now + step)
        end = self.horizon + _DRAIN_SECONDS
        second = seconds
        while self.head < self.arrivals.size and second < end:
            self._start_pods(second + 1.0)
            self._serve(second + 1.0)
            second += 1
        latency = np.full(self.arrivals.size, math.inf)
        if self.batch_end:
            served = self.batch_end[-1]
            latency[:served] = self._latencies(self._batches(0, len(self.batch_end)))
        replica_seconds = sum(
            min(pod.removed if pod.removed is not None else self.horizon, self.horizon)
            - max(pod.created, 0.0)
            for pod in self.pods + self.removed
        )
        ready_series, existing_series = self._series(seconds)
        return RunResult(
            arrivals=self.arrivals,
            latency=latency,
            ready=ready_series,
            existing=existing_series,
            decisions=self.decisions,
            replica_seconds=replica_seconds,
            horizon=self.horizon,
            cold_starts=self.cold_starts,
        )

    def _series(self, seconds: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Ready and billed pods at each second, from every pod's lifetime."""
        ready = np.zeros(seconds + 1, dtype=np.int64)
        existing = np.zeros(seconds + 1, dtype=np.int64)
        for pod in self.pods + self.removed:
            gone = pod.removed if pod.removed is not None else float(seconds)
            for series, since in ((ready, pod.ready_at), (existing, pod.created)):
                first = min(max(0, math.ceil(since)), seconds)
                last = min(max(0, math.ceil(gone)), seconds)
                if first < last:
                    series[first] += 1
                    series[last] -= 1
        return np.cumsum(ready)[:seconds], np.cumsum(existing)[:seconds]

    # ---------------------------------------------------------------- pods
    def _ready_at(self, now: float) -> int:
        """Pods that are ready (and not being removed) at `now`."""
        return sum(1 for pod in self.pods if pod.ready_at <= now)

    def _push_ready(self, pod: _Pod, at: float) -> None:
        pod.free_at = at
        self.sequence += 1
        heapq.heappush(self.idle, (at, self.sequence, pod))

    def _start_pods(self, until: float) -> None:
        still: list[_Pod] = []
        for pod in self.starting:
            if pod.removed is not None:
                continue
            if pod.ready_at < until:
                self._push_ready(pod, pod.ready_at)
            else:
                still.append(pod)
        self.starting = still

    def _scale(self, now: float, wanted: int) -> None:
        cold = self.cluster.cold_start_seconds
        while len(self.pods) < wanted:
            ready_at = now + cold
            if self.pod_rng.random() < self.cluster.load_failure_probability:
                ready_at += self.cluster.restart_backoff_seconds + cold
            pod = _Pod(created=now, ready_at=ready_at)
            self.cold_starts.append(ready_at - now)
            self.pods.append(pod)
            self.starting.append(pod)
        if len(self.pods) > wanted:
            # Like a ReplicaSet: pods that are not ready go first (newest first), then the
            # idlest ready ones (pod-deletion-cost from in-flight counts).
            order = sorted(
                self.pods,
                key=lambda pod: (pod.ready_at <= now, pod.free_at > now, -pod.created),
            )
            for pod in order[: len(self.pods) - wanted]:
                self.pods.remove(pod)
                self.removed.append(pod)
                if pod in self.starting:
                    self.starting.remove(pod)
                if pod.free_at > now and pod.ready_at <= now:
                    pod.draining = True
                    pod.removed = pod.free_at
                else:
                    pod.removed = now

    # ---------------------------------------------------------------- serving
    def _serve(self, until: float) -> None:
        """Start every batch that starts before `until`.

        The hot loop: plain floats and `bisect` on a list, batches recorded as index ranges
        (requests are served in arrival order, so a batch is a contiguous range).
        """
        arrivals = self.arrival_list
        total = len(arrivals)
        size = self.service.max_batch_size
        delay = self.service.max_batch_delay_seconds
        timeout = self.service.queue_timeout_seconds
        overhead, per_item = self.service.batch_overhead_seconds, self.service.per_item_seconds
        idle = self.idle
        head = self.head
        while idle and idle[0][0] < until:
            free_at, _, pod = idle[0]
            if pod.removed is not None and (not pod.draining or pod.removed <= free_at):
                heapq.heappop(idle)
                continue
            if head >= total:
                break
            first = arrivals[head]
            full_at = arrivals[head + size - 1] if head + size - 1 < total else math.inf
            start = max(free_at, min(first + delay, full_at))
            if start >= until:
                break
            if start - first > timeout:
                expired = bisect.bisect_left(arrivals, start - timeout, head)
                self._record_batch(start, head, expired, True)
                head = expired
                continue
            end = min(head + size, bisect.bisect_right(arrivals, start, head))
            finish = start + overhead + per_item * (end - head)
            self._record_batch(finish, head, end, False)
            self.busy_seconds += finish - start
            pod.batch_start, pod.batch_size, pod.free_at = start, end - head, finish
            head = end
            self.sequence += 1
            heapq.heapreplace(idle, (finish, self.sequence, pod))
        self.head = head

    def _record_batch(self, finish: float, first: int, end: int, rejected: bool) -> None:
        self.batch_finish.append(finish)
        self.batch_first.append(first)
        self.batch_end.append(end)
        self.batch_rejected.append(rejected)

    def _in_system(self, now: float) -> float:
        queued = bisect.bisect_right(self.arrival_list, now) - self.head
        in_flight = sum(pod.batch_size for pod in self.pods if pod.batch_start <= now < pod.free_at)
        return float(max(queued, 0) + in_flight)

    # ---------------------------------------------------------------- metrics
    def _scrape(self, now: float) -> None:
        new = self._batches(self.scanned, len(self.batch_finish))
        self.scanned = len(self.batch_finish)
        candidates = self.unfinished.concat(new)
        done = candidates.finish <= now
        self.unfinished = candidates.select(~done)
        finished = candidates.select(done)
        if finished.finish.size:
            observed = self._latencies(finished)
            # Rejected requests count as observed beyond every bucket.
            observed[np.isinf(observed)] = LATENCY_BUCKETS[-1] * 2
            slots = np.searchsorted(LATENCY_BUCKETS, observed, side="left")
            self.bucket_counts += np.bincount(slots, minlength=len(LATENCY_BUCKETS) + 1)
            self.answered += observed.size
            self._count_batches(finished)
        cumulative = np.cumsum(self.bucket_counts)
        queued = max(0, bisect.bisect_right(self.arrival_list, now) - self.head)
        self.scrapes.record(
            now,
            cumulative,
            self.answered,
            queued,
            self.busy_seconds,
            self._ready_at(now),
            self.batch_counters,
        )

    def _count_batches(self, finished: "_Batches") -> None:
        """The runtime's batch counters, observed as it observes them: when a batch finishes."""
        served = ~finished.rejected
        sizes = (finished.end - finished.first)[served]
        if not sizes.size:
            return
        seconds = self.service.batch_overhead_seconds * sizes.size + (
            self.service.per_item_seconds * float(sizes.sum())
        )
        counters = self.batch_counters
        self.batch_counters = BatchCounters(
            rows=counters.rows + int(sizes.sum()),
            batches=counters.batches + int(sizes.size),
            compute_seconds=counters.compute_seconds + seconds,
            ok=counters.ok + int(sizes.sum()),
        )

    def _batches(self, lo: int, hi: int) -> "_Batches":
        return _Batches(
            finish=np.asarray(self.batch_finish[lo:hi], dtype=np.float64),
            first=np.asarray(self.batch_first[lo:hi], dtype=np.int64),
            end=np.asarray(self.batch_end[lo:hi], dtype=np.int64),
            rejected=np.asarray(self.batch_rejected[lo:hi], dtype=bool),
        )

    def _latencies(self, batches: "_Batches") -> NDArray[np.float64]:
        """Latency of every request of the given batches, in their order; +inf if rejected."""
        sizes = batches.end - batches.first
        firsts = np.repeat(batches.first, sizes)
        offsets = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        latency = np.repeat(np.where(batches.rejected, math.inf, batches.finish), sizes)
        result: NDArray[np.float64] = latency - self.arrivals[firsts + offsets]
        return result


@dataclass(frozen=True)
class _Batches:
    """A set of batches as arrays (for the vectorized scrape)."""

    finish: NDArray[np.float64]
    first: NDArray[np.int64]
    end: NDArray[np.int64]
    rejected: NDArray[np.bool_]

    @classmethod
    def empty(cls) -> "_Batches":
        return cls(
            np.zeros(0, dtype=np.float64),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=bool),
        )

    def concat(self, other: "_Batches") -> "_Batches":
        return _Batches(
            np.concatenate([self.finish, other.finish]),
            np.concatenate([self.first, other.first]),
            np.concatenate([self.end, other.end]),
            np.concatenate([self.rejected, other.rejected]),
        )

    def select(self, mask: NDArray[np.bool_]) -> "_Batches":
        return _Batches(self.finish[mask], self.first[mask], self.end[mask], self.rejected[mask])

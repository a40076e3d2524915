"""The simulated world's constants: how a replica serves, how pods start, how Prometheus sees.

Why it exists: every number the simulation depends on is here, named and documented, so a
reader can check that no policy was favoured and change one knob for a what-if.
"""

from dataclasses import dataclass

# The runtime's `kiln_request_duration_seconds` buckets at and above 50 ms (the contract in
# runtime_image/kiln_runtime/metrics.py); finer buckets change nothing at these latencies.
LATENCY_BUCKETS: tuple[float, ...] = (0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class ServiceModel:
    """One replica: dynamic batching with a wait cap, batch time `t0 + c*b`.

    The defaults describe a generative model on one GPU whose batch of 8 takes 1.8 s; they are
    slower than the runtime benchmark's toy model so that a day of traffic stays a few hundred
    thousand requests per run (the control time scales — scrape, windows, cold start — are the
    real ones).
    """

    batch_overhead_seconds: float = 0.6
    per_item_seconds: float = 0.15
    max_batch_size: int = 8
    max_batch_delay_seconds: float = 0.05
    queue_timeout_seconds: float = 30.0
    """The bounded queue: a request that waited this long is rejected (an SLO miss)."""
    slo_p99_seconds: float = 5.0

    def batch_seconds(self, size: int) -> float:
        """Service time of one batch."""
        return self.batch_overhead_seconds + self.per_item_seconds * size

    @property
    def capacity_per_replica(self) -> float:
        """Requests per second one replica serves with full batches."""
        return self.max_batch_size / self.batch_seconds(self.max_batch_size)


@dataclass(frozen=True)
class ClusterModel:
    """Pods and the metrics pipeline."""

    cold_start_seconds: float = 120.0
    """Pod creation to ready: scheduling, image, model load, warm-up. GPU billed from creation."""
    load_failure_probability: float = 0.0
    """Chance that a starting pod fails to load its model and restarts (another cold start)."""
    restart_backoff_seconds: float = 10.0
    scrape_interval_seconds: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 40

"""The discrete-event engine: batching, the bounded queue, billing, cold starts, determinism."""

import numpy as np
import pytest

from kiln_operator.simulator.engine import RunResult, Simulation, Snapshot
from kiln_operator.simulator.model import ClusterModel, ServiceModel

SERVICE = ServiceModel(
    batch_overhead_seconds=0.5,
    per_item_seconds=0.1,
    max_batch_size=4,
    max_batch_delay_seconds=0.05,
    queue_timeout_seconds=5.0,
    slo_p99_seconds=2.0,
)


class Fixed:
    """Wants a fixed count from a given second on."""

    name = "fixed"
    interval_seconds = 1
    reads_prometheus = True

    def __init__(self, replicas: int, from_second: float = 0.0, before: int = 1) -> None:
        self.replicas, self.from_second, self.before = replicas, from_second, before
        self.seen: list[Snapshot] = []

    def desired(self, snapshot: Snapshot) -> int:
        self.seen.append(snapshot)
        return self.replicas if snapshot.now >= self.from_second else self.before


def simulate(
    arrivals: list[float], horizon: float, policy: Fixed, cluster: ClusterModel | None = None
) -> RunResult:
    simulation = Simulation(
        np.array(arrivals),
        horizon,
        SERVICE,
        cluster or ClusterModel(cold_start_seconds=30.0),
        pod_rng=np.random.default_rng(0),
    )
    return simulation.run(policy)


def test_a_lone_request_waits_the_batch_delay_then_one_batch() -> None:
    run = simulate([1.0], 10.0, Fixed(1))
    assert run.latency[0] == pytest.approx(0.05 + 0.5 + 0.1)


def test_a_full_batch_closes_without_waiting() -> None:
    run = simulate([1.0, 1.01, 1.02, 1.03], 10.0, Fixed(1))
    expected = 1.03 + 0.5 + 0.4 - np.array([1.0, 1.01, 1.02, 1.03])
    np.testing.assert_allclose(run.latency, expected)


def test_overload_queues_then_rejects_after_the_timeout() -> None:
    burst = [1.0 + i * 0.01 for i in range(100)]  # 100 requests; one replica serves ~4.4/s
    run = simulate(burst, 60.0, Fixed(1))
    latency = run.latency
    assert np.isinf(latency).sum() > 50
    assert np.all(latency[np.isfinite(latency)] <= SERVICE.queue_timeout_seconds + 1.0)
    done = np.array(burst) + latency
    # In arrival order, back to back: batch 2 ends one batch time after batch 1.
    np.testing.assert_allclose(done[:4], 1.03 + 0.9)
    np.testing.assert_allclose(done[4:8], 1.03 + 0.9 + 0.9)


def test_pods_are_billed_from_creation_and_serve_after_the_cold_start() -> None:
    policy = Fixed(3, from_second=10.0)
    run = simulate([], 100.0, policy)
    # One pod all along, two more from second 10: billed 100 + 2 x 90 seconds.
    assert run.replica_seconds == pytest.approx(100 + 2 * 90)
    ready = run.ready
    assert ready[30] == 1 and ready[40] == 3
    assert run.decisions == [(10.0, 3)]


def test_load_failures_restart_the_cold_start() -> None:
    cluster = ClusterModel(cold_start_seconds=30.0, load_failure_probability=1.0)
    run = simulate([], 200.0, Fixed(2, from_second=10.0), cluster)
    assert run.ready[10 + 30 + 5] == 1
    assert run.ready[10 + 30 + 10 + 30 + 1] == 2
    assert run.cold_starts == [70.0]


def test_policies_see_prometheus_scrapes_not_the_truth() -> None:
    arrivals = list(np.arange(0.0, 60.0, 0.5))
    policy = Fixed(1)
    simulate(arrivals, 60.0, policy)
    at_40 = next(s for s in policy.seen if s.now == 40.0)
    assert at_40.prometheus.sample_time(40.0) == 30.0
    assert at_40.prometheus.request_rate(40.0, 30.0) == pytest.approx(2.0, rel=0.1)


def test_same_inputs_same_result() -> None:
    arrivals = np.sort(np.random.default_rng(3).uniform(0, 300, 900)).tolist()
    first = simulate(arrivals, 300.0, Fixed(2, from_second=60.0))
    second = simulate(arrivals, 300.0, Fixed(2, from_second=60.0))
    np.testing.assert_array_equal(first.latency, second.latency)

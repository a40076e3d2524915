"""The baselines behave as documented, and Kiln's adapter drives the real `decide`."""

import math

import numpy as np
import pytest

from kiln_operator.autoscaling import reasons
from kiln_operator.simulator.engine import Simulation, Snapshot
from kiln_operator.simulator.model import LATENCY_BUCKETS, ClusterModel, ServiceModel
from kiln_operator.simulator.policies import (
    ForesightOracle,
    HpaPolicy,
    KedaPolicy,
    KilnPolicy,
    KnativePolicy,
    Schedule,
)
from kiln_operator.simulator.prometheus import BatchCounters, PrometheusView, Scrapes
from kiln_operator.simulator.traffic import poisson_arrivals


def view(
    *,
    busy_per_scrape: float = 0.0,
    requests_per_scrape: int = 0,
    queue: int = 0,
    ready: int = 4,
    fast: bool = True,
    outage: tuple[float, float] | None = None,
) -> PrometheusView:
    store = Scrapes(interval=15.0)
    slot = 3 if fast else len(LATENCY_BUCKETS)  # 0.1 s, or beyond every bucket
    for step in range(41):
        per_bucket = np.zeros(len(LATENCY_BUCKETS) + 1, dtype=np.int64)
        per_bucket[slot] = requests_per_scrape * step
        store.record(
            15.0 * step,
            np.cumsum(per_bucket),
            requests=requests_per_scrape * step,
            queue=queue,
            busy_seconds=busy_per_scrape * step,
            ready=ready,
            batches=BatchCounters(
                rows=requests_per_scrape * step,
                batches=requests_per_scrape * step // 8,
                compute_seconds=busy_per_scrape * step,
                ok=requests_per_scrape * step,
            ),
        )
    return PrometheusView(store, outage)


def snap(now: float, prometheus: PrometheusView, current: int = 4, ready: int = 4) -> Snapshot:
    return Snapshot(now=now, current=current, ready=ready, prometheus=prometheus, concurrency=[])


def test_hpa_holds_within_tolerance_and_scales_up_by_ratio() -> None:
    hpa = HpaPolicy(target_utilization=0.5)
    # 4 pods 54 % busy: ratio 1.08 is within the 0.1 tolerance.
    assert hpa.desired(snap(600, view(busy_per_scrape=0.54 * 15 * 4))) == 4
    # 4 pods 100 % busy at a 50 % target: 8.
    assert hpa.desired(snap(600, view(busy_per_scrape=15 * 4))) == 8


def test_hpa_scale_down_waits_for_the_five_minute_stabilization() -> None:
    hpa = HpaPolicy(target_utilization=0.5)
    busy = view(busy_per_scrape=0.5 * 15 * 8, ready=8)
    idle = view(busy_per_scrape=0.1 * 15 * 8, ready=8)
    assert hpa.desired(snap(300, busy, current=8, ready=8)) == 8
    assert hpa.desired(snap(315, idle, current=8, ready=8)) == 8
    assert hpa.desired(snap(600, idle, current=8, ready=8)) == 8
    assert hpa.desired(snap(601, idle, current=8, ready=8)) == 2


def test_hpa_holds_when_prometheus_is_down() -> None:
    down = view(busy_per_scrape=0.0, outage=(0.0, 1e9))
    assert HpaPolicy().desired(snap(600, down, current=6)) == 6


def test_keda_takes_the_max_of_cron_and_rate_and_never_lowers_blind() -> None:
    schedule = Schedule("business", "0 9 * * 1-5", 60, floor=9)
    keda = KedaPolicy(threshold_rps=1.0, schedules=[schedule], horizon=86_400)
    nine = 9 * 3600.0
    quiet = view(requests_per_scrape=15)  # 1 req/s in total
    assert keda.desired(snap(nine - 15, quiet, current=1, ready=1)) == 1
    # The cron trigger asks for 9, but KEDA's HPA adds at most max(100 %, 4 pods) per sync.
    assert keda.desired(snap(nine, quiet, current=1, ready=1)) == 5
    assert keda.desired(snap(nine + 15, quiet, current=5, ready=1)) == 9
    down = view(outage=(0.0, 1e9))
    assert KedaPolicy(1.0, [], 86_400).desired(snap(nine, down, current=5)) == 5


def test_knative_panics_on_a_burst_and_does_not_scale_down_in_panic() -> None:
    kpa = KnativePolicy(target_concurrency=10.0)  # 7 per pod at 70 %
    calm = Snapshot(0, 2, 2, view(), concurrency=[14.0] * 60)
    assert kpa.desired(calm) == 2
    burst = Snapshot(2, 2, 2, view(), concurrency=[14.0] * 54 + [70.0] * 6)
    assert kpa.desired(burst) == 10
    later = Snapshot(30, 10, 10, view(), concurrency=[14.0] * 60)
    assert kpa.desired(later) == 10  # still in panic: no scale-down
    settled = Snapshot(70, 10, 10, view(), concurrency=[14.0] * 60)
    assert kpa.desired(settled) == 5  # panic over; at most halves per tick


def test_oracle_sees_the_future_through_its_lookahead() -> None:
    rate = np.zeros(1000)
    rate[500:] = 30.0
    oracle = ForesightOracle(
        "oracle", rate, capacity_per_replica=10.0, lookahead_seconds=100, utilization=0.75
    )
    assert oracle.desired(snap(300, view())) == 0
    assert oracle.desired(snap(400, view())) == math.ceil(30 / 7.5)


def kiln() -> KilnPolicy:
    return KilnPolicy(
        5.0,
        1,
        20,
        [],
        cold_start_seconds=120.0,
        max_batch_size=8,
    )


def test_kiln_adapter_feeds_decide_and_records_reasons() -> None:
    policy = kiln()
    slow = view(requests_per_scrape=15 * 20, fast=False, queue=40)
    wanted = policy.desired(snap(600, slow))
    assert wanted > 4
    assert policy.reasons == {reasons.LATENCY_ABOVE_TARGET: 1}


def test_kiln_adapter_never_scales_down_while_prometheus_is_down() -> None:
    policy = kiln()
    down = view(outage=(0.0, 1e9))
    for step in range(40):
        assert policy.desired(snap(15.0 * step, down, current=8, ready=8)) == 8
    assert policy.reasons == {reasons.METRICS_UNAVAILABLE: 40}


def test_kiln_fits_the_capacity_from_the_scraped_batches_it_is_not_given() -> None:
    service = ServiceModel()
    # Two hours whose load climbs from 2 to 12 req/s: batch sizes spread, the line is fitted.
    rate = np.linspace(2.0, 12.0, 7200)
    arrivals = poisson_arrivals(rate, np.random.default_rng(7))
    policy = kiln()
    simulation = Simulation(
        arrivals, 7200.0, service, ClusterModel(), pod_rng=np.random.default_rng(8)
    )
    simulation.run(policy)
    assert policy.state.capacity_measured
    assert policy.state.capacity_per_replica == pytest.approx(
        service.capacity_per_replica, rel=0.02
    )

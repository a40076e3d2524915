"""The benchmark matrix: scenarios x seeds x policies (at their defaults), plus knob sweeps.

Why it exists: the comparison must be reproducible from one seed list. A `Case` is one
scenario and seed with the policies to run on the same arrivals; `run_case` is a pure
function of it (safe to fan out over processes); rows come back sortable, so the result does
not depend on which process finished first.
"""

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kiln_operator.simulator.engine import Policy, RunResult, Simulation
from kiln_operator.simulator.model import ClusterModel, ServiceModel
from kiln_operator.simulator.policies import (
    ForesightOracle,
    HpaPolicy,
    KedaPolicy,
    KilnPolicy,
    KnativePolicy,
    Schedule,
    StaticPolicy,
)
from kiln_operator.simulator.results import Score, score
from kiln_operator.simulator.traffic import Scenario, poisson_arrivals

POLICIES = ("kiln", "hpa", "keda", "knative", "static", "oracle-instant", "oracle-cold")
"""Every simulated policy; `capacity-bound` is computed, not simulated."""

DEFAULT_KNOBS: dict[str, float] = {
    "kiln": 75,  # targetUtilizationPercent
    "hpa": 0.7,  # target GPU utilization
    "keda": 0.7,  # request-rate threshold as a share of one replica's capacity
    "knative": 8,  # target concurrency per pod (x 70 % utilization)
    "static": 0.75,  # utilization at the expected peak
    "oracle-instant": 0.75,  # utilization the oracle sizes for
    "oracle-cold": 0.75,
}
SWEEPS: dict[str, tuple[float, ...]] = {
    "kiln": (60, 70, 75, 80, 90),
    "hpa": (0.5, 0.6, 0.7, 0.8, 0.9),
    "keda": (0.5, 0.6, 0.7, 0.8, 0.9),
    "knative": (4, 6, 8, 10, 12),
    "static": (0.6, 0.75, 0.9, 1.0),
    "oracle-cold": (0.65, 0.75, 0.85, 0.95),
}
KNOB_NAMES = {
    "kiln": "targetUtilizationPercent",
    "hpa": "target GPU utilization",
    "keda": "rps threshold / replica capacity",
    "knative": "target concurrency per pod",
    "static": "utilization at expected peak",
    "oracle-instant": "utilization",
    "oracle-cold": "utilization",
}


@dataclass(frozen=True)
class Case:
    """One scenario and seed, and the (policy, knob) pairs to run on its arrivals."""

    scenario: Scenario
    scenario_index: int
    seed: int
    runs: tuple[tuple[str, float], ...]
    service: ServiceModel = field(default_factory=ServiceModel)
    cluster: ClusterModel = field(default_factory=ClusterModel)
    keep_timeline: bool = False


@dataclass(frozen=True)
class Row:
    """The score of one policy at one knob on one case."""

    scenario: str
    seed: int
    policy: str
    knob: float
    score: Score
    timeline: tuple[NDArray[np.int64], NDArray[np.float64]] | None = None
    """Per minute: ready replicas and p99 latency of arrivals (only when asked for)."""


def window_floor(scenario: Scenario, service: ServiceModel, utilization: float = 0.75) -> int:
    """The pre-warm floor a user would declare: the expected peak at the target utilization."""
    if scenario.peak is None:
        return 0
    # What the user expects of a whole day, whatever part of it is simulated.
    nominal = Scenario(scenario.name, scenario.title, 24.0, scenario.mean_rate)
    base = nominal.rate_curve(np.random.default_rng(0))
    opens = int(scenario.peak.opens_hour * 3600)
    expected = float(base[opens : opens + scenario.peak.duration_minutes * 60].max())
    expected += scenario.peak.extra_rate
    return math.ceil(expected / (service.capacity_per_replica * utilization))


def schedules_of(scenario: Scenario, service: ServiceModel) -> list[Schedule]:
    """The pre-warm schedules the user declared for this scenario."""
    if scenario.peak is None:
        return []
    return [
        Schedule(
            "business",
            scenario.peak.cron,
            scenario.peak.duration_minutes,
            window_floor(scenario, service),
        )
    ]


def build_policy(
    name: str, knob: float, case: Case, rate: NDArray[np.float64]
) -> tuple[Policy, ClusterModel]:
    """The policy `name` at `knob`, and the cluster it runs on."""
    service, cluster, scenario = case.service, case.cluster, case.scenario
    capacity = service.capacity_per_replica
    schedules = schedules_of(scenario, service)
    cold = cluster.cold_start_seconds
    if name == "kiln":
        kiln = KilnPolicy(
            service.slo_p99_seconds,
            cluster.min_replicas,
            cluster.max_replicas,
            schedules,
            cold_start_seconds=cold,
            max_batch_size=service.max_batch_size,
            target_utilization_percent=int(knob),
        )
        return kiln, cluster
    if name == "hpa":
        return HpaPolicy(knob), cluster
    if name == "keda":
        return KedaPolicy(knob * capacity, schedules, scenario.hours * 3600), cluster
    if name == "knative":
        return KnativePolicy(knob), cluster
    if name == "static":
        # Provisioned for the peak the user expects (the scheduled one included).
        floor = max(window_floor(scenario, service, knob), 1)
        nominal_peak = Scenario("", "", scenario.hours, scenario.mean_rate).rate_curve(
            np.random.default_rng(0)
        )
        replicas = max(floor, math.ceil(nominal_peak.max() / (capacity * knob)))
        return StaticPolicy(replicas), cluster
    if name == "oracle-instant":
        instant = ClusterModel(
            cold_start_seconds=0.0,
            scrape_interval_seconds=cluster.scrape_interval_seconds,
            min_replicas=cluster.min_replicas,
            max_replicas=cluster.max_replicas,
        )
        return ForesightOracle(name, rate, capacity, 60.0, knob), instant
    if name == "oracle-cold":
        return ForesightOracle(name, rate, capacity, cold + 60.0, knob), cluster
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


def run_case(case: Case) -> list[Row]:
    """Every run of one case, on the same arrivals and the same pod-failure draws."""
    scenario = case.scenario
    cluster = ClusterModel(
        cold_start_seconds=case.cluster.cold_start_seconds,
        load_failure_probability=scenario.load_failure_probability,
        restart_backoff_seconds=case.cluster.restart_backoff_seconds,
        scrape_interval_seconds=case.cluster.scrape_interval_seconds,
        min_replicas=case.cluster.min_replicas,
        max_replicas=case.cluster.max_replicas,
    )
    case = Case(
        scenario, case.scenario_index, case.seed, case.runs, case.service, cluster,
        case.keep_timeline,
    )  # fmt: skip
    traffic_rng = np.random.default_rng([case.seed, case.scenario_index])
    rate = scenario.rate_curve(traffic_rng)
    arrivals = poisson_arrivals(rate, traffic_rng)
    schedules = schedules_of(scenario, case.service)
    window = (
        (scenario.peak.opens_hour * 3600, schedules[0].floor)
        if scenario.peak is not None and schedules
        else None
    )
    rows = []
    for name, knob in case.runs:
        policy, run_cluster = build_policy(name, knob, case, rate)
        simulation = Simulation(
            arrivals,
            scenario.hours * 3600,
            case.service,
            run_cluster,
            pod_rng=np.random.default_rng([case.seed, case.scenario_index, 1]),
            outage=scenario.outage_seconds(),
            initial_replicas=max(1, math.ceil(rate[0] / case.service.capacity_per_replica / 0.75)),
        )
        run = simulation.run(policy, track_concurrency=isinstance(policy, KnativePolicy))
        rows.append(
            Row(
                scenario.name,
                case.seed,
                name,
                knob,
                score(run, case.service.slo_p99_seconds, window, scenario.outage_seconds()),
                timeline(run, case.service.slo_p99_seconds) if case.keep_timeline else None,
            )
        )
    return rows


def capacity_bound_hours(scenario: Scenario, seed: int, index: int, service: ServiceModel) -> float:
    """Replica-hours of the capacity lower bound: every request served at 100 % utilization."""
    rate = scenario.rate_curve(np.random.default_rng([seed, index]))
    return float(rate.sum() / service.capacity_per_replica / 3600.0)


def timeline(run: RunResult, slo_seconds: float) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Per minute: ready replicas at the minute's start, and the p99 latency of its arrivals."""
    minutes = int(run.horizon // 60)
    ready = run.ready[::60][:minutes]
    order = (run.arrivals // 60).astype(np.int64)
    p99 = np.full(minutes, np.nan)
    bounds = np.searchsorted(order, np.arange(minutes + 1))
    capped = np.minimum(run.latency, 4 * slo_seconds)
    for minute in range(minutes):
        chunk = capped[bounds[minute] : bounds[minute + 1]]
        if chunk.size:
            p99[minute] = np.quantile(chunk, 0.99)
    return ready, p99

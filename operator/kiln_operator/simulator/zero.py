"""Scale to zero in the simulator: Kiln at `minReplicas: 0` against one always-on replica and
Kiln at `minReplicas: 1`, on the same arrivals, in replica-hours and SLO attainment.

Why it exists: zero trades a cold start on the first request of a quiet spell for the replica
that would otherwise idle; this is the measured size of both sides, on a sparse day (the day
zero is for) and on the benchmark's busy days (where it should change nothing). Requests that
arrive while no pod is ready wait in the queue, as Kiln's activator holds them, up to the hold
deadline (`HOLD_SECONDS`); `decide` sees them as held requests. Pure: seeded, no clock, no I/O.
"""

from dataclasses import dataclass

import numpy as np

from kiln_operator.simulator.engine import Policy, Simulation
from kiln_operator.simulator.model import ClusterModel, ServiceModel
from kiln_operator.simulator.policies import KilnPolicy, Schedule, StaticPolicy
from kiln_operator.simulator.results import score
from kiln_operator.simulator.traffic import Scenario, poisson_arrivals

ZERO_POLICIES = ("always-on-1", "kiln-min-1", "kiln-min-0", "kiln-min-0-prewarm")
"""The compared policies: one replica all day, Kiln with a floor of 1, Kiln at minReplicas 0,
and Kiln at minReplicas 0 with a pre-warm schedule per known session (sparse days only)."""

IDLE_SECONDS = 900
"""`scaleToZero.idleSeconds` of the simulated service (the API's default)."""

HOLD_SECONDS = 300.0
"""The activator's hold deadline in the simulation: long enough for a 120 s cold start plus
the autoscaler's pass; a request held longer is refused (a miss)."""


@dataclass(frozen=True)
class ZeroRow:
    """One policy on one seed of one scenario."""

    scenario: str
    seed: int
    policy: str
    replica_hours: float
    attainment: float
    rejects: int
    requests: int
    wakes: int
    """Times the replicas went from 0 to more."""


def run_zero_case(scenario: Scenario, index: int, seed: int) -> list[ZeroRow]:
    """The three policies on the same arrivals of `scenario` (seeded by `seed`, `index`)."""
    service = ServiceModel(queue_timeout_seconds=HOLD_SECONDS)
    cluster = ClusterModel(min_replicas=0)
    rng = np.random.default_rng([seed, index])
    rate = scenario.rate_curve(rng)
    arrivals = poisson_arrivals(rate, rng)
    rows = []
    for name in ZERO_POLICIES:
        policy: Policy
        if name == "kiln-min-0-prewarm" and not scenario.sessions:
            continue
        if name == "always-on-1":
            policy = StaticPolicy(1)
        else:
            policy = KilnPolicy(
                service.slo_p99_seconds,
                0 if name.startswith("kiln-min-0") else 1,
                cluster.max_replicas,
                _session_schedules(scenario) if name == "kiln-min-0-prewarm" else [],
                cold_start_seconds=cluster.cold_start_seconds,
                max_batch_size=service.max_batch_size,
                idle_seconds=IDLE_SECONDS,
            )
        simulation = Simulation(
            arrivals,
            scenario.hours * 3600,
            service,
            cluster,
            pod_rng=np.random.default_rng([seed, index, 1]),
            initial_replicas=1,
        )
        run = simulation.run(policy)
        scored = score(run, service.slo_p99_seconds)
        wakes = sum(
            1
            for (_, before), (_, after) in zip(
                [(0.0, 1), *run.decisions], run.decisions, strict=False
            )
            if before == 0 and after > 0
        )
        rows.append(
            ZeroRow(
                scenario.name,
                seed,
                name,
                scored.replica_hours,
                scored.attainment,
                scored.rejects,
                int(arrivals.size),
                wakes,
            )
        )
    return rows


def _session_schedules(scenario: Scenario) -> list[Schedule]:
    """A daily pre-warm window (floor 1) per session of a sparse day."""
    return [
        Schedule(
            f"session-{number}",
            f"{round((hour % 1) * 60)} {int(hour)} * * *",
            int(scenario.session_minutes),
            1,
        )
        for number, hour in enumerate(scenario.sessions)
    ]


def render_zero(rows: list[ZeroRow]) -> str:
    """A Markdown table: per scenario and policy, the means over the seeds."""
    lines = [
        "| day | policy | replica-hours | vs always-on | SLO attainment | refused | wakes |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    scenarios = list(dict.fromkeys(row.scenario for row in rows))
    for scenario in scenarios:
        of_day = [row for row in rows if row.scenario == scenario]
        base = _mean([row.replica_hours for row in of_day if row.policy == "always-on-1"])
        for policy in ZERO_POLICIES:
            chosen = [row for row in of_day if row.policy == policy]
            if not chosen:
                continue
            hours = _mean([row.replica_hours for row in chosen])
            attainment = _mean([row.attainment for row in chosen])
            rejects = sum(row.rejects for row in chosen)
            requests = sum(row.requests for row in chosen)
            wakes = _mean([float(row.wakes) for row in chosen])
            lines.append(
                f"| {scenario} | {policy} | {hours:.1f} | {hours / base - 1:+.0%} | "
                f"{attainment:.2%} | {rejects} of {requests} | {wakes:.1f} |"
            )
    return "\n".join(lines) + "\n"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


SECTION_BEGIN = "<!-- simulated-zero:begin (python -m kiln_operator.simulator bench-zero) -->"
SECTION_END = "<!-- simulated-zero:end -->"


def with_zero_section(page: str, section: str) -> str:
    """`page` with its simulated section replaced by `section` (appended if absent)."""
    block = f"{SECTION_BEGIN}\n{section}\n{SECTION_END}\n"
    if SECTION_BEGIN in page and SECTION_END in page:
        head, rest = page.split(SECTION_BEGIN, 1)
        return head + block + rest.split(SECTION_END, 1)[1].lstrip("\n")
    return page.rstrip("\n") + "\n\n" + block

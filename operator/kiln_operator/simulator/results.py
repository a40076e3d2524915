"""Scores of one run: SLO attainment, violation minutes, replica-hours, flapping, rejects, lead.

Why it exists: the benchmark's verdict must be computed the same way for every policy, from
what happened to requests and pods, never from what a policy believed.
"""

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kiln_operator.simulator.engine import RunResult


@dataclass(frozen=True)
class Score:
    """One policy on one seed of one scenario."""

    attainment: float
    """Share of requests answered within the p99 target (rejects are misses)."""
    violation_minutes: int
    """Minutes (by arrival) whose requests' p99 exceeded the target."""
    replica_hours: float
    flaps_per_hour: float
    """Changes of scaling direction per hour."""
    rejects: int
    prewarm_lead_seconds: float | None
    """How long before the window opened the floor was ready (negative: late)."""
    scale_down_during_outage: bool


def score(
    run: RunResult,
    slo_seconds: float,
    window: tuple[float, int] | None = None,
    outage: tuple[float, float] | None = None,
) -> Score:
    """Score a run; `window` is (opening second, floor) of the announced pre-warm window."""
    met = run.latency <= slo_seconds
    minutes = (run.arrivals // 60).astype(np.int64)
    total = np.bincount(minutes)
    missed = np.bincount(minutes, weights=~met)
    # p99 above the target <=> more than 1 % of the minute's requests above it.
    violations = int(np.sum((total > 0) & (missed > 0.01 * total)))
    return Score(
        attainment=float(met.mean()) if met.size else 1.0,
        violation_minutes=violations,
        replica_hours=run.replica_seconds / 3600.0,
        flaps_per_hour=_direction_changes(run.decisions) / (run.horizon / 3600.0),
        rejects=int(np.isinf(run.latency).sum()),
        prewarm_lead_seconds=None if window is None else prewarm_lead(run.ready, *window),
        scale_down_during_outage=_scaled_down_during(run.decisions, run.existing, outage),
    )


def _direction_changes(decisions: list[tuple[float, int]]) -> int:
    changes, last_direction, last = 0, 0, None
    for _, replicas in decisions:
        if last is not None and replicas != last:
            direction = 1 if replicas > last else -1
            if last_direction and direction != last_direction:
                changes += 1
            last_direction = direction
        last = replicas
    return changes


def prewarm_lead(ready: NDArray[np.int64], opening: float, floor: int) -> float:
    """Seconds the floor was continuously ready before `opening` (negative: how late)."""
    at = int(opening)
    if at >= ready.size:
        return 0.0
    if ready[at] >= floor:
        below = np.nonzero(ready[: at + 1] < floor)[0]
        return float(at - (below[-1] + 1)) if below.size else float(at)
    above = np.nonzero(ready[at:] >= floor)[0]
    return -float(above[0]) if above.size else -float(ready.size - at)


def _scaled_down_during(
    decisions: list[tuple[float, int]],
    existing: NDArray[np.int64],
    outage: tuple[float, float] | None,
) -> bool:
    """Whether any decision taken during the outage lowered the replica count."""
    if outage is None:
        return False
    last = int(existing[0]) if existing.size else 0
    for when, replicas in decisions:
        if outage[0] <= when < outage[1] and replicas < last:
            return True
        last = replicas
    return False

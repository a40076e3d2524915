"""Scores: attainment, violation minutes, flapping, pre-warm lead, outage scale-downs."""

import numpy as np
import pytest

from kiln_operator.simulator.engine import RunResult
from kiln_operator.simulator.results import prewarm_lead, score


def run(latency: list[float], decisions: list[tuple[float, int]] | None = None) -> RunResult:
    arrivals = np.arange(len(latency), dtype=np.float64)  # one request per second
    return RunResult(
        arrivals=arrivals,
        latency=np.array(latency),
        ready=np.ones(len(latency), dtype=np.int64),
        existing=np.full(len(latency), 3, dtype=np.int64),
        decisions=decisions or [],
        replica_seconds=7200.0,
        horizon=3600.0,
    )


def test_attainment_counts_rejects_as_misses_and_minutes_by_p99() -> None:
    latency = [0.1] * 180
    latency[5] = np.inf  # minute 0: 1 of 60 over the target: p99 violated (> 1 %)
    latency[70] = 9.0  # minute 1: likewise
    scored = score(run(latency), slo_seconds=1.0)
    assert scored.attainment == pytest.approx(178 / 180)
    assert scored.violation_minutes == 2
    assert scored.rejects == 1
    assert scored.replica_hours == pytest.approx(2.0)


def test_flapping_counts_direction_changes_per_hour() -> None:
    decisions = [(0.0, 2), (60.0, 3), (120.0, 4), (180.0, 3), (240.0, 4), (300.0, 5)]
    assert score(run([0.1] * 10, decisions), 1.0).flaps_per_hour == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("ready", "expected"),
    [
        ([1, 1, 3, 3, 3, 3], 3.0),  # warm 3 s before opening at second 5
        ([1, 1, 1, 1, 1, 1, 1, 3], -2.0),  # 2 s late
        ([3, 3, 3, 3, 3, 3], 5.0),
    ],
)
def test_prewarm_lead(ready: list[int], expected: float) -> None:
    assert prewarm_lead(np.array(ready), opening=5, floor=3) == expected


def test_scale_down_during_outage_is_detected() -> None:
    decisions = [(100.0, 2)]
    assert score(run([0.1] * 10, decisions), 1.0, outage=(50.0, 150.0)).scale_down_during_outage
    assert not score(
        run([0.1] * 10, decisions), 1.0, outage=(150.0, 250.0)
    ).scale_down_during_outage

"""Traffic scenarios: the diurnal ratio, the scheduled peak's variants, seeded arrivals."""

import numpy as np
import pytest

from kiln_operator.simulator.traffic import (
    Scenario,
    ScheduledPeak,
    Spike,
    poisson_arrivals,
    standard_scenarios,
)


def curve(scenario: Scenario, seed: int = 0) -> np.ndarray:
    return scenario.rate_curve(np.random.default_rng(seed))


def test_diurnal_is_five_to_one_with_the_trough_at_two_and_peak_at_fourteen() -> None:
    rate = curve(Scenario("d", "d", mean_rate=6.0))
    assert rate.max() / rate.min() == pytest.approx(5.0, rel=1e-3)
    assert int(rate.argmin()) // 3600 == 2
    assert int(rate.argmax()) // 3600 == 14


@pytest.mark.parametrize(
    ("peak", "busy_second", "quiet_second"),
    [
        (ScheduledPeak(extra_rate=10.0), 9 * 3600 + 120, 9 * 3600 - 300),
        (
            ScheduledPeak(extra_rate=10.0, arrival_offset_minutes=-10),
            9 * 3600 - 300,
            11 * 3600 - 300,
        ),
    ],
)
def test_scheduled_peak_adds_its_rate_when_it_really_arrives(
    peak: ScheduledPeak, busy_second: int, quiet_second: int
) -> None:
    base = curve(Scenario("d", "d"))
    with_peak = curve(Scenario("p", "p", peak=peak))
    assert with_peak[busy_second] - base[busy_second] == pytest.approx(10.0)
    assert with_peak[quiet_second] == pytest.approx(base[quiet_second])


def test_cancelled_peak_adds_nothing() -> None:
    cancelled = Scenario("c", "c", peak=ScheduledPeak(extra_rate=10.0, cancelled=True))
    np.testing.assert_allclose(curve(cancelled), curve(Scenario("d", "d")))


def test_spike_multiplies_for_its_minutes_at_a_seeded_time() -> None:
    spiky = Scenario("s", "s", spike=Spike(factor=3.0, minutes=15))
    ratio = curve(spiky, seed=4) / curve(Scenario("d", "d"))
    assert np.sum(np.isclose(ratio, 3.0)) == 15 * 60
    np.testing.assert_allclose(curve(spiky, seed=4), curve(spiky, seed=4))
    assert not np.allclose(curve(spiky, seed=4), curve(spiky, seed=5))


def test_arrivals_are_seeded_sorted_and_poisson() -> None:
    rate = np.full(3600, 5.0)
    first = poisson_arrivals(rate, np.random.default_rng(7))
    again = poisson_arrivals(rate, np.random.default_rng(7))
    np.testing.assert_array_equal(first, again)
    assert np.all(np.diff(first) >= 0)
    assert first.size == pytest.approx(18_000, rel=0.03)


def test_standard_scenarios_cover_the_issue() -> None:
    names = {scenario.name for scenario in standard_scenarios()}
    assert names == {
        "peak-on-time",
        "peak-early",
        "peak-cancelled",
        "spike-3x",
        "spike-5x",
        "prometheus-outage",
        "load-failures",
    }

"""The learned pre-warm's simulated days: the history holds the shape the day's story says,
the fit the simulated operator holds follows it, and the report section replaces itself."""

from datetime import timedelta

import numpy as np

from kiln_operator.api.v1alpha1.autoscaling import LearnedPrewarmSpec
from kiln_operator.autoscaling import reasons
from kiln_operator.simulator.learned import (
    SECTION_BEGIN,
    SECTION_END,
    SimulatedHistory,
    history_samples,
    learned_days,
    with_section,
)
from kiln_operator.simulator.policies import EPOCH

DAYS = {day.scenario.name: day for day in learned_days()}


def test_the_moved_peak_is_in_the_history_and_the_fit_forecasts_it() -> None:
    day = DAYS["peak-moved"]
    samples = history_samples(day, np.random.default_rng(0))
    assert len(samples) == 14 * 288
    arrivals = np.sort(np.random.default_rng(1).uniform(0, 3600, 20_000))
    fitted = SimulatedHistory(samples, arrivals, LearnedPrewarmSpec())(60.0)
    assert fitted is not None and fitted.reason == reasons.LEARNED_FORECAST
    assert fitted.profile is not None
    at_eight = fitted.profile.rate_at(EPOCH + timedelta(hours=8, minutes=30))
    at_seven = fitted.profile.rate_at(EPOCH + timedelta(hours=7, minutes=30))
    assert at_eight > 2 * at_seven


def test_the_section_is_replaced_not_appended_twice() -> None:
    page = with_section("# Page\n\nbody\n", "first")
    assert page.count(SECTION_BEGIN) == 1 and "first" in page
    again = with_section(page + "\nafter\n", "second")
    assert again.count(SECTION_BEGIN) == again.count(SECTION_END) == 1
    assert "second" in again and "first" not in again and again.endswith("after\n")

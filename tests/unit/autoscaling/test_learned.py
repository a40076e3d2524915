"""The learned pre-warm's fit and forecast (`autoscaling.learned`), each with an explicit `now`:
the shape is learned, moved peaks and holidays are handled, and it stays off, saying why, on
too little history, no traffic or a poor fit."""

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from kiln_operator.api.v1alpha1.autoscaling import LearnedPrewarmSpec, LearnedStatus
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.learned import STEP_SECONDS, LearnedFit, Sample, fit, learned_status

MONDAY = datetime(2026, 11, 23, tzinfo=UTC)
SPEC = LearnedPrewarmSpec()


def history(
    days: int = 14,
    *,
    end: datetime = MONDAY,
    base: float = 10.0,
    peak: float = 100.0,
    peak_hour: float = 9.0,
    moved: tuple[int, float] | None = None,
    holidays: tuple[int, ...] = (),
    seed: int = 0,
) -> list[Sample]:
    """`days` days before `end`: `base` req/s, plus `peak` on weekdays from `peak_hour` for two
    hours (from `moved[1]` for the last `moved[0]` days), Poisson noise per 5 minutes."""
    rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    for ago in range(days, 0, -1):
        start = end - timedelta(days=ago)
        hour = moved[1] if moved is not None and ago <= moved[0] else peak_hour
        for slot in range(86_400 // STEP_SECONDS):
            at = start + timedelta(seconds=slot * STEP_SECONDS)
            rate = base
            in_peak = hour <= slot * STEP_SECONDS / 3600 < hour + 2
            if start.weekday() < 5 and ago not in holidays and in_peak:
                rate += peak
            count = rng.poisson(rate * STEP_SECONDS)
            samples.append((at.timestamp() + STEP_SECONDS, count / STEP_SECONDS))
    return samples


def rate_at(result: LearnedFit, instant: datetime) -> float:
    assert result.profile is not None, result.message
    return result.profile.rate_at(instant)


def test_learns_the_weekday_peak_and_the_quiet_weekend() -> None:
    result = fit(history(), MONDAY, SPEC)
    assert result.reason == reasons.LEARNED_FORECAST
    assert result.profile is not None and result.profile.error < 0.1
    assert rate_at(result, MONDAY + timedelta(hours=9, minutes=30)) == pytest.approx(110, rel=0.1)
    assert rate_at(result, MONDAY + timedelta(hours=8)) == pytest.approx(10, rel=0.2)
    saturday = MONDAY + timedelta(days=5, hours=9, minutes=30)
    assert saturday - result.profile.start >= timedelta(days=3)  # beyond the forecast
    assert math.isnan(rate_at(result, saturday))


def test_a_peak_moved_a_week_ago_is_forecast_where_it_now_comes() -> None:
    result = fit(history(moved=(7, 8.0)), MONDAY, SPEC)
    assert rate_at(result, MONDAY + timedelta(hours=8, minutes=15)) > 80


def test_a_holiday_last_monday_does_not_drop_this_mondays_peak() -> None:
    result = fit(history(holidays=(7,)), MONDAY, SPEC)
    assert rate_at(result, MONDAY + timedelta(hours=9, minutes=30)) > 80


def test_growth_is_followed_by_the_level() -> None:
    older = history(days=14, end=MONDAY - timedelta(days=1))
    last_day = [(at, rate * 1.5) for at, rate in history(days=1, seed=1)]
    result = fit(older + last_day, MONDAY, SPEC)
    assert result.profile is not None
    assert result.profile.level == pytest.approx(1.5, rel=0.1)


def test_too_little_history_stays_off_and_says_how_much() -> None:
    result = fit(history(days=5), MONDAY, SPEC)
    assert result.profile is None
    assert result.reason == reasons.LEARNED_HISTORY_SHORT
    assert "5 of the last 14 days" in result.message
    assert "7 needed" in result.message


def test_no_traffic_stays_off() -> None:
    silent = [(at, 0.0) for at, _ in history()]
    result = fit(silent, MONDAY, SPEC)
    assert (result.profile, result.reason) == (None, reasons.LEARNED_NO_TRAFFIC)


def test_a_history_without_a_shape_is_a_poor_fit() -> None:
    rng = np.random.default_rng(3)
    bursts = [(at, float(rng.choice([1.0, 400.0], p=[0.9, 0.1]))) for at, _ in history()]
    result = fit(bursts, MONDAY, SPEC)
    assert result.profile is None
    assert result.reason == reasons.LEARNED_POOR_FIT
    assert "maxErrorPercent 40" in result.message


def test_fit_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        fit([], datetime(2026, 11, 23), SPEC)


FITTED = fit(history(), MONDAY, SPEC)
LEAD = timedelta(minutes=5)


def status_at(
    instant: datetime, capacity_per_replica: float | None = 25.0, max_replicas: int = 100
) -> LearnedStatus:
    return learned_status(
        FITTED, instant, LEAD, capacity_per_replica=capacity_per_replica,
        target_utilization_percent=80, max_replicas=max_replicas,
    )  # fmt: skip


def test_the_floor_rises_a_lead_before_the_forecast_rise_and_not_earlier() -> None:
    early = status_at(MONDAY + timedelta(hours=8, minutes=40))
    assert early.active and early.floor_replicas == 0  # no rise within the lead
    assert early.next_rise_at == MONDAY + timedelta(hours=9)
    assert early.raise_from == MONDAY + timedelta(hours=8, minutes=55)
    peak = max(rate_at(FITTED, MONDAY + timedelta(hours=9, minutes=m)) for m in range(0, 10, 5))
    floor = math.ceil(peak / 20.0)  # 25 req/s per replica at 80 %
    assert floor == 6
    assert "Mondays 09:00 UTC rise to" in early.message
    assert f"floor {floor} from 08:55" in early.message
    ahead = status_at(MONDAY + timedelta(hours=8, minutes=56))
    assert ahead.floor_replicas == floor
    assert "rising: floor 6" in ahead.message
    # Once the traffic has come, the reactive policy sizes for it: no floor held all peak long.
    assert status_at(MONDAY + timedelta(hours=9, minutes=30)).floor_replicas == 0


def test_the_floor_is_capped_at_max_replicas() -> None:
    capped = status_at(MONDAY + timedelta(hours=8, minutes=56), max_replicas=4)
    assert capped.floor_replicas == 4


def test_without_capacity_or_fit_it_is_off_and_says_why() -> None:
    no_capacity = status_at(MONDAY + timedelta(hours=9), capacity_per_replica=None)
    assert not no_capacity.active
    assert no_capacity.reason == reasons.LEARNED_NO_CAPACITY
    pending = learned_status(
        None, MONDAY, LEAD, capacity_per_replica=1.0, target_utilization_percent=75,
        max_replicas=4,
    )  # fmt: skip
    assert (pending.active, pending.reason) == (False, reasons.LEARNED_HISTORY_PENDING)
    short = fit(history(days=3), MONDAY, SPEC)
    off = learned_status(
        short, MONDAY, LEAD, capacity_per_replica=1.0, target_utilization_percent=75,
        max_replicas=4,
    )  # fmt: skip
    assert (off.active, off.reason, off.floor_replicas) == (
        False, reasons.LEARNED_HISTORY_SHORT, 0,
    )  # fmt: skip
    assert "3 of the last 14 days" in off.message


def test_min_history_days_cannot_exceed_history_days() -> None:
    with pytest.raises(ValueError, match="minHistoryDays"):
        LearnedPrewarmSpec(history_days=7, min_history_days=8)

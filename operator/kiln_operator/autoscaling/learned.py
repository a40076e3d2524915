"""Learned pre-warm: the daily and weekly shape of a service's traffic, fitted from its
request-rate history, and the replica floor its forecast implies a lead time ahead.

Why it exists: a cron pre-warm needs someone who knows when the peaks come, and peaks move.
This module learns them instead. `fit` turns the history Prometheus returned (the service's
request rate every `STEP_SECONDS`) into a forecast of the coming days; `learned_status` reads
that forecast at `now`, over the lead window (measured cold start + margin), and says the floor
it implies and why. Both are pure: samples, `now` and the spec are parameters.

The method, chosen with the simulator (docs/benchmarks/autoscaling.md, "Learned pre-warm"):
a seasonal profile with a robust level. For a 5-minute slot of a coming day, two seasonal
estimates are taken from the history's same slot:

- weekly: the median over the past days of the same weekday (what a Monday looks like);
- recent: the median over the last `RECENT_DAYS` days of the same kind (weekday or weekend),
  which follows a peak that moved within days (a time-zone change, new office hours);

and the forecast is the higher of the two (a floor is raised for either, since a missing
replica costs the SLO and an extra one only its hours), times a level: the median ratio of the
last day's traffic to its own forecast, bounded to [0.5, 2] (growth or decline, robust to a
spike). Medians make one holiday or one spike in the history change nothing.

The fit is checked before it is used: each of the history's last `BACKTEST_DAYS` complete days
is forecast from the days before it, and the absolute error over the traffic must stay within
`maxErrorPercent`; too few days with data, no traffic, or a poor fit leave it off, with why.
"""

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

import numpy as np
from numpy.typing import NDArray

from kiln_operator.api.v1alpha1.autoscaling import LearnedPrewarmSpec, LearnedStatus
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.schedule import require_utc

STEP_SECONDS = 300
"""The history's resolution: one request rate per 5 minutes (`rate(...[5m])` at a 5 m step)."""
SLOTS_PER_DAY = 86_400 // STEP_SECONDS
RECENT_DAYS = 3
"""Days of the same kind the recent estimate takes the median of."""
BACKTEST_DAYS = 7
"""Complete days at the history's end the fit is checked on."""
FORECAST_DAYS = 3
"""Days forecast from one fit (today, tomorrow, the day after): a fit refreshed hourly always
covers the next day and the lead."""
LEVEL_BOUNDS = (0.5, 2.0)
MIN_DAY_COVERAGE = 0.5
"""A day counts towards the history when at least half its slots have a rate."""
NO_TRAFFIC_RPS = 0.001
"""Below this mean rate the history holds no traffic to learn from."""
RISE_HORIZON = timedelta(days=1)
"""How far ahead the status looks for the next rise."""
RISE_RATIO = 1.2
"""A rise: the forecast over the lead window reaches this multiple of the rate now (and needs
more replicas). The diurnal swing (5:1 over 12 hours) moves a 5-minute step by a few percent."""

Sample = tuple[float, float]
"""(Unix time, requests per second over the `STEP_SECONDS` before it)."""


@dataclass(frozen=True, eq=False)
class LearnedProfile:
    """The forecast rate of every slot of `FORECAST_DAYS` days from `start` (midnight UTC)."""

    start: datetime
    rates: "array[float]"
    """Requests per second per slot, level applied; NaN where the history had nothing. An array
    of doubles: 6.9 KB a service (a tuple of float objects takes 28 KB, 28 MB at 1,000)."""
    error: float
    """The backtest's absolute error over the traffic (0.12 = 12 %)."""
    level: float

    def rate_at(self, instant: datetime) -> float:
        """The forecast rate of the slot holding `instant`; NaN outside the forecast."""
        index = math.floor((instant - self.start).total_seconds() / STEP_SECONDS)
        if 0 <= index < len(self.rates):
            return self.rates[index]
        return math.nan


@dataclass(frozen=True)
class LearnedFit:
    """One fit of one service's history: a profile, or the reason it is off."""

    fitted_at: datetime
    profile: LearnedProfile | None
    reason: str
    message: str


def unreadable(now: datetime, error: str) -> LearnedFit:
    """The fit when the history could not be read."""
    return LearnedFit(now, None, reasons.LEARNED_HISTORY_UNREADABLE, error[:400])


def _matrix(samples: Sequence[Sample], first_day: datetime, days: int) -> NDArray[np.float64]:
    """Days x slots of rates (NaN: no sample). A sample at t is the rate over the step before
    t, so it fills the slot starting at t - STEP_SECONDS."""
    grid = np.full((days, SLOTS_PER_DAY), np.nan)
    origin = first_day.timestamp()
    for at, rate in samples:
        if not math.isfinite(rate) or rate < 0:
            continue
        index = math.floor((at - STEP_SECONDS - origin) / STEP_SECONDS)
        if 0 <= index < days * SLOTS_PER_DAY:
            grid[index // SLOTS_PER_DAY, index % SLOTS_PER_DAY] = rate
    return grid


def _nanmedian(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per slot, the median of the rows' finite values; NaN where none (no warnings)."""
    if rows.shape[0] == 0:
        return np.full(SLOTS_PER_DAY, np.nan)
    counts = np.isfinite(rows).sum(axis=0)
    median = np.full(SLOTS_PER_DAY, np.nan)
    some = counts > 0
    if some.any():
        # sort NaN to the end, then average the middle one or two finite values per slot
        ordered = np.sort(np.where(np.isfinite(rows), rows, np.inf), axis=0)[:, some]
        n = counts[some]
        low = ordered[(n - 1) // 2, np.arange(n.size)]
        high = ordered[n // 2, np.arange(n.size)]
        median[some] = (low + high) / 2.0
    return median


def _seasonal(grid: NDArray[np.float64], weekdays: list[int], target: int) -> NDArray[np.float64]:
    """The forecast of day `target` (a row index, possibly past the grid) from rows before it."""
    before = min(target, grid.shape[0])
    weekday = weekdays[target]
    same_day = [row for row in range(before) if weekdays[row] == weekday]
    weekly = _nanmedian(grid[same_day])
    weekend = weekday >= 5
    same_kind = [row for row in range(before) if (weekdays[row] >= 5) == weekend]
    recent = _nanmedian(grid[same_kind[-RECENT_DAYS:]])
    both = np.vstack([weekly, recent])
    finite = np.isfinite(both).any(axis=0)
    out = np.full(SLOTS_PER_DAY, np.nan)
    out[finite] = np.nanmax(both[:, finite], axis=0)
    return out


def fit(samples: Sequence[Sample], now: datetime, spec: LearnedPrewarmSpec) -> LearnedFit:
    """Fit the history (`samples` up to `now`) and forecast the next `FORECAST_DAYS` days."""
    require_utc(now)
    today = datetime.combine(now.astimezone(UTC).date(), time(), UTC)
    first_day = today - timedelta(days=spec.history_days)
    days = spec.history_days + 1  # the past days and today so far
    grid = _matrix(samples, first_day, days)
    weekdays = [(first_day + timedelta(days=row)).weekday() for row in range(days + FORECAST_DAYS)]
    covered = np.isfinite(grid).sum(axis=1) >= MIN_DAY_COVERAGE * SLOTS_PER_DAY
    with_data = int(covered[:-1].sum())
    if with_data < spec.min_history_days:
        return LearnedFit(
            now,
            None,
            reasons.LEARNED_HISTORY_SHORT,
            f"{with_data} of the last {spec.history_days} days have request-rate history "
            f"(kiln_requests_total); {spec.min_history_days} needed (minHistoryDays)",
        )
    finite = grid[np.isfinite(grid)]
    if finite.size == 0 or float(finite.mean()) < NO_TRAFFIC_RPS:
        return LearnedFit(
            now,
            None,
            reasons.LEARNED_NO_TRAFFIC,
            f"no traffic in the last {spec.history_days} days to learn from",
        )

    # The backtest: the last complete days with data, each forecast from the days before it.
    checked = [row for row in range(days - 1) if covered[row]][-BACKTEST_DAYS:]
    error_sum = traffic_sum = 0.0
    ratios: list[NDArray[np.float64]] = []
    for row in checked:
        forecast = _seasonal(grid, weekdays, row)
        usable = np.isfinite(forecast) & np.isfinite(grid[row])
        error_sum += float(np.abs(grid[row][usable] - forecast[usable]).sum())
        traffic_sum += float(grid[row][usable].sum())
    # The level: the last day's traffic (the latest 24 h of slots) over its own forecast.
    for row in (days - 2, days - 1):
        forecast = _seasonal(grid, weekdays, row)
        usable = np.isfinite(forecast) & np.isfinite(grid[row]) & (forecast > NO_TRAFFIC_RPS)
        ratios.append(grid[row][usable] / forecast[usable])
    latest = np.concatenate(ratios)[-SLOTS_PER_DAY:]
    level = float(np.median(latest)) if latest.size else 1.0
    level = min(max(level, LEVEL_BOUNDS[0]), LEVEL_BOUNDS[1])
    error = error_sum / traffic_sum if traffic_sum > 0 else math.inf
    if not checked or error * 100.0 > spec.max_error_percent:
        shown = "no day to check" if not checked else f"{error * 100.0:.0f} %"
        return LearnedFit(
            now,
            None,
            reasons.LEARNED_POOR_FIT,
            f"the daily and weekly shape does not fit the history: forecasting each of the last "
            f"{len(checked)} days from the days before it missed by {shown} of the traffic "
            f"(maxErrorPercent {spec.max_error_percent})",
        )
    rates = np.concatenate(
        [_seasonal(grid, weekdays, days - 1 + ahead) for ahead in range(FORECAST_DAYS)]
    )
    profile = LearnedProfile(
        start=today,
        rates=array("d", (float(rate) * level for rate in rates)),
        error=error,
        level=level,
    )
    return LearnedFit(
        now,
        profile,
        reasons.LEARNED_FORECAST,
        f"fitted on {with_data} days: backtest error {error * 100.0:.0f} %, level {level:.2f}",
    )


def _slot_start(instant: datetime) -> datetime:
    seconds = instant.timestamp()
    return datetime.fromtimestamp(seconds - seconds % STEP_SECONDS, UTC)


def _peak(profile: LearnedProfile, start: datetime, end: datetime) -> float:
    """The highest forecast rate of the slots meeting [start, end]; NaN if none is known."""
    found = math.nan
    slot = _slot_start(start)
    while slot <= end:
        rate = profile.rate_at(slot)
        if math.isfinite(rate) and not rate <= found:
            found = rate
        slot += timedelta(seconds=STEP_SECONDS)
    return found


def _replicas(rate: float, per_replica: float, max_replicas: int) -> int:
    if not math.isfinite(rate) or rate <= 0:
        return 0
    return min(math.ceil(rate / per_replica - 1e-9), max_replicas)


def _rate(rate: float) -> str:
    """A request rate for the message: three significant digits, whole numbers from 1,000."""
    return f"{rate:.0f}" if rate >= 1000 else f"{rate:.3g}"


def _clock(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%H:%M")


def _rise(
    profile: LearnedProfile, at: datetime, lead: timedelta, per_replica: float, max_replicas: int
) -> tuple[float, float]:
    """The forecast rate at `at` and the highest over [at, at + lead] if that is a rise (needs
    more replicas and is `RISE_RATIO` times the rate at `at`), else NaN."""
    now_rate = profile.rate_at(at)
    peak = _peak(profile, at, at + lead)
    if not math.isfinite(peak):
        return now_rate, math.nan
    base = now_rate if math.isfinite(now_rate) else 0.0
    more = _replicas(peak, per_replica, max_replicas) > _replicas(base, per_replica, max_replicas)
    if more and peak >= RISE_RATIO * base:
        return now_rate, peak
    return now_rate, math.nan


def learned_status(
    learned_fit: LearnedFit | None,
    now: datetime,
    lead: timedelta,
    *,
    capacity_per_replica: float | None,
    target_utilization_percent: int,
    max_replicas: int,
) -> LearnedStatus:
    """The floor the forecast implies at `now`, capped at `maxReplicas`: while a rise is
    forecast within the lead window [now, now + lead] (or began within the last lead), the
    replicas for the rise's rate (the
    reactive policy sizes for the traffic once it has come; a floor held all day would charge
    every error of the forecast, and the capacity while it is only a lower bound, to the
    replica-hours); 0 otherwise. And the next forecast rise within a day; or why it is off."""
    require_utc(now)
    if learned_fit is None:
        return LearnedStatus(
            active=False,
            reason=reasons.LEARNED_HISTORY_PENDING,
            message="the request-rate history has not been read yet",
        )
    profile = learned_fit.profile
    if profile is None:
        return LearnedStatus(
            active=False,
            reason=learned_fit.reason,
            message=learned_fit.message,
            fitted_at=learned_fit.fitted_at,
        )
    if capacity_per_replica is None or not capacity_per_replica > 0:
        return LearnedStatus(
            active=False,
            reason=reasons.LEARNED_NO_CAPACITY,
            message="no per-replica capacity measured yet to turn the forecast into replicas",
            fitted_at=learned_fit.fitted_at,
        )
    per_replica = capacity_per_replica * target_utilization_percent / 100.0
    rate_now, rising = _rise(profile, now, lead, per_replica, max_replicas)
    # A rise that began within the last lead keeps its floor: the metrics that size the
    # reactive policy lag the traffic by their window.
    _, began = _rise(profile, now - lead, lead, per_replica, max_replicas)
    if not rising >= began:  # NaN-aware max: a NaN compares False
        rising = began if math.isfinite(began) else rising
    floor = _replicas(rising, per_replica, max_replicas)
    rise_at, rise_rate = None, None
    slot = _slot_start(now + lead) + timedelta(seconds=STEP_SECONDS)
    while slot < now + RISE_HORIZON:
        _, peak = _rise(profile, slot - lead, lead, per_replica, max_replicas)
        if math.isfinite(peak):
            rise_at, rise_rate = slot, peak
            break
        slot += timedelta(seconds=STEP_SECONDS)
    shown = f"{_rate(rate_now)} req/s" if math.isfinite(rate_now) else "unknown"
    if floor:
        message = f"rising: floor {floor} for {_rate(rising)} req/s (now {shown})"
    else:
        message = f"no rise within the lead (forecast now {shown})"
    raise_from = None
    if rise_at is not None and rise_rate is not None:
        raise_from = rise_at - lead
        rise_floor = _replicas(rise_rate, per_replica, max_replicas)
        message = (
            f"{rise_at.strftime('%A')}s {_clock(rise_at)} UTC rise to {_rate(rise_rate)} req/s; "
            f"floor {rise_floor} from {_clock(raise_from)}; {message}"
        )
    return LearnedStatus(
        active=True,
        reason=reasons.LEARNED_FORECAST,
        message=f"learned: {message}"[:512],
        floor_replicas=floor,
        next_rise_at=rise_at,
        next_rise_requests_per_second=None if rise_rate is None else round(rise_rate, 2),
        raise_from=raise_from,
        fitted_at=learned_fit.fitted_at,
    )

"""Pre-warm windows: when a cron schedule in an IANA time zone opens, in UTC.

Why it exists: scheduled pre-warming must raise replicas a lead time before a window opens,
and it must be right on daylight-saving days. Cron expressions are evaluated in the zone's
wall-clock time and each wall-clock start is then placed on the UTC timeline:

- a start in a spring-forward gap (02:30 in Europe/Berlin on the last Sunday of March) opens
  at the same elapsed time after the gap began, i.e. 03:30 local: the window still happens that
  day, a little later by the wall clock, never skipped;
- a start in the repeated autumn hour (02:30 on the last Sunday of October) opens once, at its
  first occurrence (02:30 summer time): pre-warming early is the safe side.

Pure: `now` and every instant are parameters (timezone-aware), nothing reads the clock.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from croniter import croniter

from kiln_operator.api.v1alpha1.autoscaling import PrewarmSchedule, PrewarmSpec

# The widest UTC-offset change at a DST transition is two hours; this margin covers it when a
# UTC instant is mapped to wall-clock time and back.
_OFFSET_MARGIN = timedelta(hours=3)
# A bound on the cron matches looked at per day: a five-field cron matches at most 1,440 times
# a day, plus the margins on either side.
_MAX_STARTS_SCANNED = 2000


@dataclass(frozen=True)
class Window:
    """One occurrence of a pre-warm schedule on the UTC timeline."""

    name: str
    opens_at: datetime
    closes_at: datetime
    floor: int
    lead: timedelta

    @property
    def raise_at(self) -> datetime:
        """When replicas must start rising so the floor is warm at `opens_at`."""
        return self.opens_at - self.lead

    def is_open(self, now: datetime) -> bool:
        """True between opening (inclusive) and closing (exclusive)."""
        return self.opens_at <= now < self.closes_at


def require_utc(instant: datetime, name: str = "now") -> None:
    """Refuse naive datetimes: every instant in the policy is timezone-aware."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got naive {instant!r}")


def wall_clock_to_utc(naive_local: datetime, zone: ZoneInfo) -> datetime:
    """Place a wall-clock time of `zone` on the UTC timeline with the rules above.

    With `fold=0`, zoneinfo maps a time in a gap with the offset before the gap (so 02:30 in
    a one-hour spring-forward gap lands at 03:30 after it) and a repeated time to its first
    occurrence.
    """
    return naive_local.replace(tzinfo=zone, fold=0).astimezone(UTC)


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _naive_local(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def starts_between(schedule: PrewarmSchedule, start: datetime, end: datetime) -> list[datetime]:
    """Every UTC opening of `schedule` in [start, end), sorted, without duplicates."""
    require_utc(start, "start")
    require_utc(end, "end")
    found: list[datetime] = []
    day = start.astimezone(UTC).date()
    while day <= end.astimezone(UTC).date():
        found.extend(
            opening
            for opening in _starts_on_utc_day(schedule.cron, schedule.time_zone, day)
            if start <= opening < end
        )
        day += timedelta(days=1)
    return found


def latest_start(schedule: PrewarmSchedule, at: datetime, not_before: datetime) -> datetime | None:
    """The latest UTC opening of `schedule` in [not_before, at], or None."""
    require_utc(at)
    require_utc(not_before, "not_before")
    day = at.astimezone(UTC).date()
    while day >= not_before.astimezone(UTC).date():
        openings = [
            opening
            for opening in _starts_on_utc_day(schedule.cron, schedule.time_zone, day)
            if not_before <= opening <= at
        ]
        if openings:
            return openings[-1]
        day -= timedelta(days=1)
    return None


@lru_cache(maxsize=4096)
def _starts_on_utc_day(cron: str, time_zone: str, day: date) -> tuple[datetime, ...]:
    """The sorted UTC openings falling on one UTC day (memoized: the same day is asked for
    at every evaluation)."""
    zone = _zone(time_zone)
    start = datetime.combine(day, time(), UTC)
    end = start + timedelta(days=1)
    first = _naive_local(start - _OFFSET_MARGIN, zone)
    last = _naive_local(end + _OFFSET_MARGIN, zone)
    found: set[datetime] = set()
    matches = croniter(cron, first)
    for _ in range(_MAX_STARTS_SCANNED):
        naive = matches.get_next(datetime)
        if naive > last:
            break
        opening = wall_clock_to_utc(naive, zone)
        if start <= opening < end:
            found.add(opening)
    return tuple(sorted(found))


def windows_at(
    prewarm: PrewarmSpec, now: datetime, default_lead: timedelta, max_replicas: int
) -> list[Window]:
    """The windows that are open at `now` or will open within their lead time.

    `default_lead` is the lead for schedules without `leadTimeSeconds` (the measured cold
    start plus the margin); floors are capped at `max_replicas`.
    """
    require_utc(now)
    relevant: list[Window] = []
    for schedule in prewarm.schedules:
        lead = (
            timedelta(seconds=schedule.lead_time_seconds)
            if schedule.lead_time_seconds is not None
            else default_lead
        )
        duration = timedelta(minutes=schedule.duration_minutes)
        # The occurrence that matters is the latest one opening no later than now + lead:
        # occurrences share a duration, so if that one has closed, every earlier one has too.
        opening = latest_start(schedule, now + lead, not_before=now - duration)
        if opening is not None and opening + duration > now:
            relevant.append(
                Window(
                    name=schedule.name,
                    opens_at=opening,
                    closes_at=opening + duration,
                    floor=min(schedule.min_replicas, max_replicas),
                    lead=lead,
                )
            )
    return relevant


def governing_window(windows: list[Window]) -> Window | None:
    """The window that sets the floor: highest floor, then earliest opening, then name."""
    if not windows:
        return None
    return min(windows, key=lambda window: (-window.floor, window.opens_at, window.name))

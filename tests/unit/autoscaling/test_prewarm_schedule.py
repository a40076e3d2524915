"""Pre-warm windows on the UTC timeline, including both daylight-saving transitions."""

from datetime import UTC, datetime, timedelta

import pytest

from kiln_operator.api.v1alpha1.autoscaling import PrewarmSchedule, PrewarmSpec
from kiln_operator.autoscaling.schedule import (
    Window,
    governing_window,
    latest_start,
    starts_between,
    wall_clock_to_utc,
    windows_at,
)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def schedule(cron: str, zone: str = "Europe/Berlin", **extra: int) -> PrewarmSchedule:
    fields: dict[str, object] = {
        "name": "w",
        "cron": cron,
        "timeZone": zone,
        "durationMinutes": 60,
        "minReplicas": 4,
    }
    fields.update(extra)
    return PrewarmSchedule.model_validate(fields)


@pytest.mark.parametrize(
    ("cron", "zone", "start", "end", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 28, 0),
            utc(2026, 3, 31, 0),
            # 28th: CET 02:30 = 01:30Z; 29th: 02:30 does not exist, opens 03:30 CEST = 01:30Z;
            # 30th: CEST 02:30 = 00:30Z.
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)],
            id="spring-forward-gap-opens-after-the-gap",
        ),
        pytest.param(
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 0),
            utc(2026, 10, 27, 0),
            # 25th: 02:30 happens twice (CEST then CET); the window opens once, at the first.
            [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
            id="autumn-repeated-hour-opens-once-at-first-occurrence",
        ),
        pytest.param(
            "0 9 * * 1-5",
            "America/New_York",
            utc(2026, 3, 6, 0),
            utc(2026, 3, 11, 0),
            # Fri 6th EST 09:00 = 14:00Z; Mon 9th EDT (DST began Sun 8th) 09:00 = 13:00Z.
            [utc(2026, 3, 6, 14), utc(2026, 3, 9, 13), utc(2026, 3, 10, 13)],
            id="business-hours-follow-the-wall-clock-across-dst",
        ),
        pytest.param(
            "0 9 * * *",
            "UTC",
            utc(2026, 1, 1, 9),
            utc(2026, 1, 2, 9),
            [utc(2026, 1, 1, 9)],
            id="interval-is-half-open",
        ),
    ],
)
def test_starts_between(
    cron: str, zone: str, start: datetime, end: datetime, expected: list[datetime]
) -> None:
    assert starts_between(schedule(cron, zone), start, end) == expected


def test_wall_clock_to_utc_maps_gap_forward_and_repeat_to_first() -> None:
    berlin = PrewarmSchedule.model_validate(
        {"name": "w", "cron": "0 0 * * *", "timeZone": "Europe/Berlin"}
        | {"durationMinutes": 1, "minReplicas": 1}
    )
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(berlin.time_zone)
    assert wall_clock_to_utc(datetime(2026, 3, 29, 2, 30), zone) == utc(2026, 3, 29, 1, 30)
    assert wall_clock_to_utc(datetime(2026, 10, 25, 2, 30), zone) == utc(2026, 10, 25, 0, 30)


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (utc(2026, 3, 29, 1, 29), utc(2026, 3, 28, 1, 30)),
        (utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 1, 30)),
        (utc(2026, 10, 25, 1, 45), utc(2026, 10, 25, 0, 30)),
        (utc(2026, 10, 25, 0, 29), utc(2026, 10, 24, 0, 30)),
    ],
)
def test_latest_start_across_transitions(at: datetime, expected: datetime) -> None:
    assert latest_start(schedule("30 2 * * *"), at, at - timedelta(days=2)) == expected


def test_latest_start_looks_no_further_back_than_asked() -> None:
    weekdays = schedule("0 9 * * 1-5", "UTC")
    monday_morning = utc(2026, 11, 23, 8)
    assert latest_start(weekdays, monday_morning, monday_morning - timedelta(days=3)) == utc(
        2026, 11, 20, 9
    )
    assert latest_start(weekdays, monday_morning, monday_morning - timedelta(days=2)) is None


def test_latest_start_refuses_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        latest_start(schedule("30 2 * * *"), datetime(2026, 1, 1), utc(2025, 12, 31))


def prewarm(*schedules: dict[str, object]) -> PrewarmSpec:
    return PrewarmSpec.model_validate({"schedules": list(schedules)})


BUSINESS = {
    "name": "business",
    "cron": "0 9 * * 1-5",
    "timeZone": "Europe/Berlin",
    "durationMinutes": 480,
    "minReplicas": 6,
}
LAUNCH = {
    "name": "launch",
    "cron": "0 12 * * 1-5",
    "timeZone": "Europe/Berlin",
    "durationMinutes": 60,
    "minReplicas": 9,
    "leadTimeSeconds": 900,
}
LEAD = timedelta(minutes=6)


@pytest.mark.parametrize(
    ("now", "names"),
    [
        (utc(2026, 11, 23, 7, 53), []),  # 08:53 Berlin: 7 min before, lead is 6
        (utc(2026, 11, 23, 7, 54), ["business"]),  # exactly lead time before opening
        (utc(2026, 11, 23, 10, 45), ["business", "launch"]),  # launch within its own 15 min lead
        (utc(2026, 11, 23, 11, 30), ["business", "launch"]),  # overlapping, both open
        (utc(2026, 11, 23, 15, 59), ["business"]),
        (utc(2026, 11, 23, 16, 0), []),  # closes (exclusive) at 17:00 Berlin
        (utc(2026, 11, 22, 10, 0), []),  # Sunday
    ],
)
def test_windows_at(now: datetime, names: list[str]) -> None:
    found = windows_at(prewarm(BUSINESS, LAUNCH), now, LEAD, max_replicas=100)
    assert sorted(window.name for window in found) == names


def test_overlapping_windows_take_the_highest_floor() -> None:
    found = windows_at(prewarm(BUSINESS, LAUNCH), utc(2026, 11, 23, 11, 30), LEAD, 100)
    chosen = governing_window(found)
    assert chosen is not None
    assert (chosen.name, chosen.floor) == ("launch", 9)


def test_floors_are_capped_at_max_replicas() -> None:
    found = windows_at(prewarm(LAUNCH), utc(2026, 11, 23, 11, 0), LEAD, max_replicas=5)
    assert [window.floor for window in found] == [5]


def test_window_raise_at_and_open() -> None:
    window = Window("w", utc(2026, 1, 1, 9), utc(2026, 1, 1, 10), 3, timedelta(minutes=5))
    assert window.raise_at == utc(2026, 1, 1, 8, 55)
    assert not window.is_open(utc(2026, 1, 1, 8, 59))
    assert window.is_open(utc(2026, 1, 1, 9))
    assert not window.is_open(utc(2026, 1, 1, 10))
    assert governing_window([]) is None

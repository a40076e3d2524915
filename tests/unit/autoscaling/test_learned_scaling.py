"""The learned pre-warm inside the autoscaler: `decide` takes the higher of the learned and the
cron floors, blind Hold ignores it, the status is written and announced only when its floor or
state changes, and the history reads stay within their query budget at 1,000 services."""

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingSpec,
    AutoscalingStatus,
    LearnedPrewarmSpec,
    LearnedStatus,
    PrewarmSpec,
    SloSpec,
)
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.history import (
    QUERY_GAP_SECONDS,
    REFRESH_SECONDS,
    RETRY_SECONDS,
    SERVICES_PER_QUERY,
    Fitted,
    history_query,
    next_batch,
)
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.learned import LearnedFit, fit, unreadable
from kiln_operator.autoscaling.policy import decide
from kiln_operator.autoscaling.quiet import status_needs_write
from kiln_operator.autoscaling.signals import ServiceKey
from kiln_operator.autoscaling.state import ScalerState
from kiln_operator.k8s.autoscaler import learned_change
from tests.unit.autoscaling.test_learned import MONDAY, history

FITTED = fit(history(), MONDAY, LearnedPrewarmSpec())
# 25 req/s per replica at 80 %: 20; the peak (about 110 req/s) needs 6.
STATE = ScalerState(capacity_per_replica=25.0, capacity_measured=True)


def scaling(*, cron_floor: int | None = None, policy: str = "Hold") -> ScalingSpec:
    schedules = (
        []
        if cron_floor is None
        else [{"name": "business", "cron": "0 9 * * 1-5", "durationMinutes": 120,
               "minReplicas": cron_floor}]
    )  # fmt: skip
    return ScalingSpec(
        slo=SloSpec(p99_latency_milliseconds=500),
        autoscaling=AutoscalingSpec(
            min_replicas=1,
            max_replicas=10,
            target_utilization_percent=80,
            when_metrics_missing={"policy": policy},
        ),
        prewarm=PrewarmSpec.model_validate(
            {
                "assumedColdStartSeconds": 240,
                "leadTimeMarginSeconds": 60,
                "schedules": schedules,
                "learned": {},
            }
        ),
    )


def quiet_traffic(at: datetime, learned: LearnedFit | None = FITTED) -> MetricsObservation:
    return MetricsObservation(
        ready_replicas=1, observed_at=at, p99_latency_seconds=0.05, queue_depth_per_replica=0.0,
        requests_per_second=10.0, learned=learned,
    )  # fmt: skip


def test_the_learned_floor_raises_replicas_a_lead_before_the_rise() -> None:
    before = MONDAY + timedelta(hours=8, minutes=50)
    decision = decide(1, quiet_traffic(before), scaling(), STATE, before)
    assert decision.desired_replicas == 1
    assert decision.learned is not None and decision.learned.next_rise_at is not None
    ahead = MONDAY + timedelta(hours=8, minutes=56)  # the rise at 09:00 less the 5-minute lead
    decision = decide(1, quiet_traffic(ahead), scaling(), STATE, ahead)
    assert (decision.desired_replicas, decision.reason) == (6, reasons.PREWARM_LEARNED)
    assert "raised to the floor 6 (learned:" in decision.message
    status = decision.status(quiet_traffic(ahead))
    assert status.learned is not None and status.learned.floor_replicas == 6


def test_the_higher_of_the_cron_and_the_learned_floor_wins() -> None:
    ahead = MONDAY + timedelta(hours=8, minutes=56)
    high_cron = decide(1, quiet_traffic(ahead), scaling(cron_floor=9), STATE, ahead)
    assert (high_cron.desired_replicas, high_cron.reason) == (9, reasons.PREWARM_WINDOW)
    low_cron = decide(1, quiet_traffic(ahead), scaling(cron_floor=3), STATE, ahead)
    assert (low_cron.desired_replicas, low_cron.reason) == (6, reasons.PREWARM_LEARNED)


def test_off_it_raises_nothing_and_blind_hold_ignores_it() -> None:
    ahead = MONDAY + timedelta(hours=8, minutes=56)
    short = fit(history(days=3), MONDAY, LearnedPrewarmSpec())
    off = decide(1, quiet_traffic(ahead, short), scaling(), STATE, ahead)
    assert off.desired_replicas == 1
    assert off.learned is not None and off.learned.reason == reasons.LEARNED_HISTORY_SHORT
    blind = MetricsObservation(ready_replicas=1, metrics_error="down", learned=FITTED)
    assert decide(1, blind, scaling(policy="Hold"), STATE, ahead).desired_replicas == 1
    assert decide(1, blind, scaling(policy="ScheduleFloor"), STATE, ahead).desired_replicas == 6


def learned(floor: int, *, active: bool = True, reason: str = reasons.LEARNED_FORECAST,
            rate: float = 110.0) -> AutoscalingStatus:  # fmt: skip
    return AutoscalingStatus(
        desired_replicas=1, reason="Steady", updated_at=MONDAY,
        learned=LearnedStatus(
            active=active, reason=reason, floor_replicas=floor,
            next_rise_requests_per_second=rate, message=f"learned: floor {floor}",
        ),
    )  # fmt: skip


def test_status_and_events_follow_the_floor_not_the_forecast_numbers() -> None:
    assert not status_needs_write(learned(1), learned(1, rate=118.0))
    assert status_needs_write(learned(1), learned(6))
    assert status_needs_write(learned(1), learned(0, active=False, reason="LearnedPoorFit"))
    written = learned(1).model_dump(by_alias=True, mode="json")
    assert learned_change(written, learned(1, rate=118.0)) is None
    assert learned_change(written, learned(6)) == "learned floor 1 -> 6: learned: floor 6"
    off = learned_change(written, learned(0, active=False, reason=reasons.LEARNED_POOR_FIT))
    assert off is not None and off.startswith("learned pre-warm off (LearnedPoorFit)")
    assert learned_change(None, AutoscalingStatus(desired_replicas=1, reason="Steady")) is None


def test_history_queries_stay_within_the_budget_at_1000_services() -> None:
    """One range query per endpoint per cycle at most (the autoscaler's budget is 10 queries
    per cycle, its instant queries take 2), and every one of 1,000 services read within the
    hour, then refreshed hourly; the bound computed from the budget logic, not a re-run of the
    operator benchmark."""
    spec = LearnedPrewarmSpec()
    wanted: dict[ServiceKey, LearnedPrewarmSpec] = {
        ("shop", f"svc-{i:04d}"): spec for i in range(1000)
    }
    fitted: dict[ServiceKey, Fitted] = {}
    last_query = float("-inf")
    queries: list[float] = []
    clock = 0.0
    while clock < 2 * REFRESH_SECONDS:  # every 1 s, as 1,000 services' passes would ask
        batch = next_batch(wanted, fitted, clock, last_query)
        if batch:
            last_query = clock
            queries.append(clock)
            assert len(batch) <= SERVICES_PER_QUERY
            for key in batch:
                fitted[key] = Fitted(clock, FITTED)
        clock += 1.0
    per_cycle = max(sum(1 for q in queries if start <= q < start + 15) for start in queries)
    assert per_cycle == 1
    assert min(b - a for a, b in itertools.pairwise(queries)) >= QUERY_GAP_SECONDS
    first_round = [q for q in queries if q < REFRESH_SECONDS]
    assert len(first_round) == 1000 // SERVICES_PER_QUERY  # 40 queries: 10 minutes of cycles
    assert first_round[-1] < 15 * 60
    assert len(queries) == 2 * 1000 // SERVICES_PER_QUERY  # refreshed once an hour, no more


def test_a_failed_read_is_retried_sooner_than_a_refresh() -> None:
    key = ("shop", "a")
    wanted = {key: LearnedPrewarmSpec()}
    failed = {key: Fitted(0.0, unreadable(MONDAY, "down"))}
    assert next_batch(wanted, failed, RETRY_SECONDS - 1, 0.0) == []
    assert next_batch(wanted, failed, RETRY_SECONDS, 0.0) == [key]
    good = {key: Fitted(0.0, FITTED)}
    assert next_batch(wanted, good, RETRY_SECONDS, 0.0) == []


def test_history_query_selects_the_batch_and_groups_by_service() -> None:
    query = history_query([("a", "x"), ("b", "y")])
    assert 'namespace=~"a|b"' in query and 'inferenceservice=~"x|y"' in query
    assert query.startswith("sum by (namespace, inferenceservice) (rate(kiln_requests_total")
    assert query.endswith("[300s]))")


def test_at_1000_services_a_refresh_after_a_day_still_forecasts_the_next_day() -> None:
    later = MONDAY + timedelta(hours=23, minutes=59)
    assert FITTED.profile is not None
    assert FITTED.profile.rate_at(later + timedelta(days=1)) > 0
    assert FITTED.profile.start == datetime(2026, 11, 23, tzinfo=UTC)


def test_every_learned_reason_has_a_troubleshooting_row() -> None:
    page = (Path(__file__).parents[3] / "docs" / "troubleshooting.md").read_text()
    names = [
        value
        for name, value in vars(reasons).items()
        if (name.startswith("LEARNED_") or name == "PREWARM_LEARNED")
        and value != reasons.LEARNED_FORECAST  # on: nothing to troubleshoot
    ]
    assert len(names) == 7
    missing = [name for name in names if f": {name}` |" not in page]
    assert missing == []

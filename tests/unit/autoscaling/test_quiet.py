"""When the autoscaler writes: a steady service is quiet, a change a reader acts on is not."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingStatus,
    CapacityStatus,
    ObservedMetrics,
)
from kiln_operator.autoscaling.quiet import (
    has_something_to_say,
    state_needs_write,
    status_needs_write,
)
from kiln_operator.autoscaling.state import ScalerState

WRITTEN_AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
LATER = WRITTEN_AT + timedelta(seconds=15)


def status(**changes: Any) -> AutoscalingStatus:
    observed = {
        "p99_latency_milliseconds": 40.0,
        "queue_depth_per_replica": 2.0,
        "requests_per_second": 100.0,
        "ready_replicas": 4,
        "observed_at": WRITTEN_AT,
    } | changes.pop("observed", {})
    base: dict[str, Any] = {
        "desired_replicas": 4,
        "reason": "Steady",
        "message": "p99 40ms (target 100ms), 100.0 req/s on 4 ready",
        "observed": ObservedMetrics(**observed),
        "capacity": CapacityStatus(requests_per_second_per_replica=40.0, measured=True),
        "updated_at": WRITTEN_AT,
    }
    return AutoscalingStatus(**(base | changes))


def test_a_steady_service_rewrites_nothing() -> None:
    written = status()
    noisy = status(
        message="p99 44ms (target 100ms), 104.0 req/s on 4 ready",
        observed={
            "p99_latency_milliseconds": 44.0,
            "requests_per_second": 104.0,
            "queue_depth_per_replica": 2.4,
            "observed_at": LATER,
        },
        capacity=CapacityStatus(requests_per_second_per_replica=41.0, measured=True),
    )
    assert not status_needs_write(written, noisy)


@pytest.mark.parametrize(
    "change",
    [
        {"desired_replicas": 5},
        {"reason": "HeadroomLow"},
        {"metrics_available": False},
        {"last_scale_time": LATER},
        {"observed": {"ready_replicas": 5}},
        {"observed": {"p99_latency_milliseconds": 49.0}},  # +22.5 %: outside the 20 % band
        {"observed": {"requests_per_second": 111.0}},  # +11 %
        {"observed": {"queue_depth_per_replica": 3.1}},  # +1.1 requests and +55 %
        {"observed": {"requests_per_second": 0.0, "p99_latency_milliseconds": None}},
        {"capacity": CapacityStatus(requests_per_second_per_replica=45.0, measured=True)},
        {"capacity": CapacityStatus(requests_per_second_per_replica=40.0, measured=False)},
        {"capacity": None},
    ],
    ids=lambda change: ",".join(f"{k}" for k in change),
)
def test_a_change_a_reader_acts_on_is_written_at_once(change: dict[str, Any]) -> None:
    assert status_needs_write(status(), status(**change))


def test_small_values_need_an_absolute_move_too() -> None:
    idle = status(observed={"queue_depth_per_replica": 0.1, "p99_latency_milliseconds": 0.4})
    moved = status(observed={"queue_depth_per_replica": 0.9, "p99_latency_milliseconds": 1.2})
    assert not status_needs_write(idle, moved)  # +800 % of nearly nothing


def test_a_status_never_written_or_from_an_older_operator_is_written() -> None:
    assert status_needs_write(None, status())
    assert status_needs_write(status(updated_at=None), status())


def test_state_is_written_when_a_restart_would_decide_otherwise() -> None:
    written = ScalerState(healthy_since=WRITTEN_AT, capacity_per_replica=40.0)
    seen_again = written.model_copy(
        update={"last_queue_total": 7.0, "last_observed_at": LATER, "capacity_per_replica": 42.0}
    )
    assert not state_needs_write(written, seen_again)
    assert state_needs_write(written, written.model_copy(update={"healthy_since": None}))
    assert state_needs_write(written, written.model_copy(update={"last_scale_at": LATER}))
    assert state_needs_write(written, written.model_copy(update={"capacity_per_replica": 45.0}))


def test_a_new_service_is_spoken_of_from_its_first_ready_replica_metrics_or_scaling() -> None:
    blind_and_unready = status(metrics_available=False, observed={"ready_replicas": 0})
    assert not has_something_to_say(False, blind_and_unready, scales=False)
    assert has_something_to_say(False, blind_and_unready, scales=True)
    assert has_something_to_say(False, status(metrics_available=False), scales=False)  # 4 ready
    reading = status(observed={"ready_replicas": 0})  # metrics read, no replica ready yet
    assert has_something_to_say(False, reading, scales=False)
    # once written on, it is always kept current
    assert has_something_to_say(True, blind_and_unready, scales=False)

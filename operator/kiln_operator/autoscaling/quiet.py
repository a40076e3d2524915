"""When the autoscaler writes: only on a change a reader would act on.

Why it exists: every evaluation produces a fresh status (new metric values, a new timestamp)
and a fresh state (the queue seen, the capacity fit). Writing each would cost two API writes
per service per interval, each echoed to every watcher. These pure functions say whether the
new status or state differs from the written one in a way that matters:

- status: desired replicas, reason, metrics availability, the pre-warm window, the learned
  pre-warm's floor, state or next rise, the last scale time, the ready replicas or the
  capacity's kind changed; traffic started or stopped; or a metric left its band around the
  written value (`BANDS`). There is no heartbeat: at 1,000 steady services even one write
  per service per hour would be 17 writes a minute; the operator's own metrics
  (`kiln_operator_autoscaler_evaluations_total`) say whether it evaluates;
- a new service: nothing until its first ready replica, metrics or change of replicas;
- state: anything `decide` needs after a restart changed (cooldowns, health since, the
  window, whether capacity is measured), or the capacity left its band. The queue last seen
  and the fit's sums are kept in memory between evaluations and written only with those.

Pure: no clock, no I/O.
"""

import math
from dataclasses import dataclass

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingStatus
from kiln_operator.autoscaling.state import ScalerState


@dataclass(frozen=True)
class Band:
    """A value moved if it changed by more than `relative` of the written value, and by more
    than `absolute` (so values near zero do not flap on noise)."""

    relative: float
    absolute: float

    def moved(self, written: float | None, new: float | None) -> bool:
        if written is None or new is None:
            return written is not new
        if not (math.isfinite(written) and math.isfinite(new)):
            return written != new
        return abs(new - written) > max(self.absolute, self.relative * abs(written))


BANDS = {
    "p99_latency_milliseconds": Band(relative=0.2, absolute=1.0),
    "queue_depth_per_replica": Band(relative=0.25, absolute=1.0),
    "requests_per_second": Band(relative=0.1, absolute=0.5),
}
"""Per observed metric: 20 % for p99 (the SLO is judged on it), 25 % for the queue, 10 % for
the request rate (what sizing follows)."""
CAPACITY_BAND = Band(relative=0.1, absolute=0.01)
"""The per-replica capacity: 10 % moves the sizing by about one replica in ten."""


def has_something_to_say(written: bool, new: AutoscalingStatus, scales: bool) -> bool:
    """Whether the autoscaler speaks on a service at all: always once it has `written`
    status.autoscaling on it (what it said never goes stale); before that, from the service's
    first ready replica, its first metrics or its first change of replicas (`scales`). A new
    service with none of them has nothing to report or explain (the reconcile loop's Ready
    condition says why no pod serves), and a write each would only add to a thousand new
    services' creation."""
    return written or scales or new.metrics_available or new.observed.ready_replicas > 0


def status_needs_write(written: AutoscalingStatus | None, new: AutoscalingStatus) -> bool:
    """Whether `new` should replace the written status."""
    if written is None or written.updated_at is None:
        return True
    keys = ("desired_replicas", "reason", "metrics_available", "active_window", "last_scale_time")
    if any(getattr(written, key) != getattr(new, key) for key in keys):
        return True
    old, fresh = written.observed, new.observed
    if old.ready_replicas != fresh.ready_replicas:
        return True
    if bool(old.requests_per_second) != bool(fresh.requests_per_second):
        return True  # traffic started or stopped
    if any(BANDS[key].moved(getattr(old, key), getattr(fresh, key)) for key in BANDS):
        return True
    if _learned_key(written) != _learned_key(new):
        return True
    if (written.capacity is None) != (new.capacity is None):
        return True
    if written.capacity is not None and new.capacity is not None:
        if written.capacity.measured != new.capacity.measured:
            return True
        return CAPACITY_BAND.moved(
            written.capacity.requests_per_second_per_replica,
            new.capacity.requests_per_second_per_replica,
        )
    return False


def _learned_key(status: AutoscalingStatus) -> tuple[object, ...] | None:
    """What of the learned pre-warm's status a reader acts on: on or off and why, the floor and
    the next rise (not the forecast's numbers, which move with every 5-minute step)."""
    learned = status.learned
    if learned is None:
        return None
    return (learned.active, learned.reason, learned.floor_replicas, learned.next_rise_at)


_VOLATILE = {"last_queue_total", "last_observed_at", "capacity_fit", "capacity_per_replica"}
"""State fields that change at every evaluation; kept in memory, written with the others."""


def state_needs_write(written: ScalerState, new: ScalerState) -> bool:
    """Whether `new` should replace the written state (status.autoscalerState)."""
    if new.model_dump(exclude=_VOLATILE) != written.model_dump(exclude=_VOLATILE):
        return True
    return CAPACITY_BAND.moved(written.capacity_per_replica, new.capacity_per_replica)

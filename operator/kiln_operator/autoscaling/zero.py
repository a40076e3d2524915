"""Scale to zero: when a service at `minReplicas: 0` may lose its last replica, and how many
replicas wake it.

Why it exists: going to zero and coming back are the two decisions of `decide` (policy.py) that
read more than Prometheus: requests Kiln's activator holds for a service at zero never reach a
pod, so Prometheus cannot count them. This module keeps those rules apart and pure (`now` is a
parameter):

- The last replica goes only after `scaleToZero.idleSeconds` in which Prometheus counted no
  request and the activator held none; never while the activator holds one; never while the
  metrics cannot be trusted (blind, replicas never go down).
- At zero the service stays there while nothing is held; requests held by the activator wake it
  with as many replicas as the held requests fill at `queueDepthPerReplica` (at least one, at
  most `maxReplicas`). Pre-warm windows raise the floor from zero as from any count (policy.py).
"""

import math
from dataclasses import dataclass
from datetime import datetime

from kiln_operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.inputs import MetricsObservation


@dataclass(frozen=True)
class ZeroFloor:
    """The replica floor scale-to-zero sets, why, and the idle clock to store."""

    floor: int
    reason: str
    note: str
    idle_since: datetime | None
    asleep: bool
    """True when the floor lets the service be at zero now (idle long enough, nothing held)."""


def zero_floor(
    current: int,
    observed: MetricsObservation,
    scaling: AutoscalingSpec,
    idle_since: datetime | None,
    *,
    blind: bool,
    now: datetime,
) -> ZeroFloor:
    """The floor for a service with `minReplicas: 0` (callers check that first)."""
    held = max(0, observed.held_requests or 0)
    rate = observed.requests_per_second or 0.0
    idle_seconds = scaling.scale_to_zero.idle_seconds
    if held > 0:
        idle_since = None
    elif blind:
        # Health must be re-established from fresh metrics; at zero nothing is lost waiting.
        idle_since = idle_since if current == 0 else None
    elif rate > 0:
        idle_since = None
    elif idle_since is None:
        idle_since = now

    if current == 0 and held > 0:
        wake = min(max(1, math.ceil(held / scaling.queue_depth_per_replica)), scaling.max_replicas)
        return ZeroFloor(
            wake,
            reasons.WAKE_ON_REQUEST,
            f"; the activator holds {held} request(s): waking {wake} replica(s)",
            idle_since,
            asleep=False,
        )
    if current == 0 and not blind:
        return ZeroFloor(0, reasons.IDLE, "", idle_since, asleep=True)
    idle_for = 0.0 if idle_since is None else (now - idle_since).total_seconds()
    if not blind and held == 0 and idle_since is not None and idle_for >= idle_seconds:
        return ZeroFloor(
            0,
            reasons.IDLE,
            f"; no request for {idle_for:.0f}s (scaleToZero.idleSeconds {idle_seconds})",
            idle_since,
            asleep=True,
        )
    waiting = (
        f"idle for {idle_for:.0f}s of scaleToZero.idleSeconds {idle_seconds}"
        if idle_since is not None
        else f"to zero after {idle_seconds}s without a request"
    )
    if held > 0:
        waiting = f"the activator holds {held} request(s)"
    return ZeroFloor(
        0 if current == 0 else 1, reasons.MIN_REPLICAS, f" ({waiting})", idle_since, asleep=False
    )

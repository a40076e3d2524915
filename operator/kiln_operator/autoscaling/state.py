"""The autoscaler's memory, kept on the InferenceService as an annotation.

Why it exists: cooldowns, the hold window, the capacity estimate and pre-warm bookkeeping must
survive an operator restart, so a restarted operator decides exactly as the old one would have
(the dask-kubernetes lesson). The state is a small JSON document; parsing it is strict and a
damaged annotation gives a clear error instead of a silent reset.
"""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kiln_operator.autoscaling.capacity import CapacityFit

STATE_ANNOTATION = "serving.kiln.dev/autoscaler-state"
"""The annotation key holding `ScalerState` as JSON."""


class InvalidScalerState(ValueError):
    """The state annotation exists but is not a valid `ScalerState`."""


class WindowState(BaseModel):
    """Bookkeeping for the pre-warm window currently governing the floor."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    opens_at: datetime
    closes_at: datetime
    floor: int
    raised_at: datetime | None = None
    floor_warm_at_open: bool | None = None


class ScalerState(BaseModel):
    """Everything `decide` remembers between two evaluations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    last_scale_at: datetime | None = None
    last_scale_direction: Literal["up", "down"] | None = None
    last_scale_up_at: datetime | None = None
    healthy_since: datetime | None = None
    unhealthy_since: datetime | None = None
    capacity_per_replica: float | None = None
    """Requests per second one ready replica serves at saturation (or the best lower bound)."""
    capacity_measured: bool = False
    """True once the capacity was read off the batch-time fit (or observed at saturation)
    rather than only bounded below."""
    capacity_fit: CapacityFit | None = None
    """The batch-time fit the capacity is read from (`autoscaling.capacity`)."""
    last_queue_total: float | None = None
    last_observed_at: datetime | None = None
    window: WindowState | None = None
    idle_since: datetime | None = None
    """With minReplicas 0: since when no request was counted or held (the idle window's start)."""
    cold_start_seconds: float | None = None
    """The last cold start the warm-up gate measured: at zero no pod is left to measure, and a
    pre-warm window still wakes the service ahead by it."""

    def to_annotation(self) -> str:
        """The JSON stored under `STATE_ANNOTATION`."""
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_annotation(cls, text: str | None) -> "ScalerState":
        """Parse the annotation; a missing one is a fresh state, a damaged one an error."""
        if text is None or not text.strip():
            return cls()
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            raise InvalidScalerState(
                f"annotation {STATE_ANNOTATION} is not a valid autoscaler state: {error}"
            ) from error

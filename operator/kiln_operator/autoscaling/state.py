"""The autoscaler's memory, kept on the InferenceService in `status.autoscalerState`.

Why it exists: cooldowns, the hold window, the capacity estimate and pre-warm bookkeeping must
survive an operator restart, so a restarted operator decides exactly as the old one would have
(the dask-kubernetes lesson). The state is a small JSON document; parsing it is strict and a
damaged one gives a clear error instead of a silent reset.

It lives in status, so that the operator writes nothing of a user's object but its status (an
upgrade of Kiln, a restart, a scale: the object's metadata stays as its owner left it). Earlier
versions kept it in the annotation `STATE_ANNOTATION`; `written_state_text` still reads that
one while status holds none (the first passes after an upgrade), and it is never written again.
"""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kiln_operator.autoscaling.capacity import CapacityFit

STATE_FIELD = "autoscalerState"
"""The status field holding `ScalerState` as JSON."""
STATE_ANNOTATION = "serving.kiln.dev/autoscaler-state"
"""Where versions before `STATE_FIELD` kept it: read, never written."""


class InvalidScalerState(ValueError):
    """The written state exists but is not a valid `ScalerState`."""


def written_state_text(body: dict[str, Any]) -> str | None:
    """The state as written on the object: `status.autoscalerState`, else (written by a version
    before it) the annotation; None when neither holds one."""
    text = (body.get("status") or {}).get(STATE_FIELD)
    if text:
        return str(text)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    legacy = annotations.get(STATE_ANNOTATION)
    return str(legacy) if legacy else None


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

    def to_text(self) -> str:
        """The JSON stored in `STATE_FIELD` (as it was in `STATE_ANNOTATION`)."""
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_text(cls, text: str | None) -> "ScalerState":
        """Parse the written state; a missing one is a fresh state, a damaged one an error."""
        if text is None or not text.strip():
            return cls()
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            raise InvalidScalerState(
                f"status.{STATE_FIELD} (or the annotation {STATE_ANNOTATION}) is not a valid"
                f" autoscaler state: {error}"
            ) from error

"""spec.rollout and status.rollout: a new version tried on a share of traffic before all of it.

Why it exists: the warm-up gate proves a new pod is fast on synthetic requests, not that the new
version is as good as the old one on real traffic. With `rollout.canary` set, a change of the pod
template runs beside the stable version in a second Deployment, gets each step's share of the
Service's traffic for a window, and is judged on its own p99 and error ratio against the SLO and
against the stable version's in the same window (`rollout.machine`): promoted step by step, or
rolled back at once. docs/rollout.md tells the whole story.
"""

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator

from kiln_operator.api.v1alpha1.base import ApiModel


class CanarySpec(ApiModel):
    """The canary strategy: the steps of traffic a new version gets and how it is judged."""

    steps: Annotated[
        list[Annotated[int, Field(ge=1, le=99)]],
        Field(min_length=1, max_length=10, default_factory=lambda: [10, 50]),
    ]
    """Percentages of the Service's traffic the canary receives, one step after the other,
    strictly ascending; after the last step passes the new version replaces the stable one. The
    split is by ready replicas behind the one Service, so a share is rounded to whole replicas
    (status.rollout.lastVerdict.measuredSharePercent says what the canary really got)."""
    step_seconds: Annotated[int, Field(ge=10, le=86_400)] = 300
    """How long each step lasts: the window the canary is judged over before the next step."""
    max_error_ratio: Annotated[float, Field(ge=0, le=1)] = 0.01
    """The canary is rolled back when more than this fraction of its requests fail (codes
    internal, deadline, overloaded: docs/metrics.md) in the window."""
    max_p99_ratio: Annotated[float, Field(ge=1, le=100)] = 1.5
    """The canary is rolled back when its p99 exceeds the stable version's p99 in the same
    window times this ratio plus p99SlackMilliseconds (and whenever it exceeds spec.slo)."""
    p99_slack_milliseconds: Annotated[float, Field(ge=0, le=60_000)] = 10.0
    """Added to the stable p99 times maxP99Ratio before comparing: a histogram's buckets and a
    few slow requests make two fast versions' p99s differ by milliseconds."""
    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] = 50
    """Canary requests a window needs before the canary is judged; with fewer, the step is
    extended (no verdict without evidence)."""
    progress_deadline_seconds: Annotated[int, Field(ge=60, le=86_400)] = 600
    """How long the canary may have no ready pod of the new version (pods crashing, an image
    that cannot be pulled, no node) before it is rolled back; a canary pod that fails its
    warm-up gate rolls it back at once."""

    @field_validator("steps")
    @classmethod
    def _ascending(cls, steps: list[int]) -> list[int]:
        if steps != sorted(set(steps)):
            raise ValueError("steps must be strictly ascending percentages without repeats")
        return steps


class RolloutSpec(ApiModel):
    """How a change of the pod template (model, runtime, resources…) reaches the pods."""

    canary: CanarySpec | None = None
    """Opt in to a canary: a changed version runs beside the stable one on a growing share of
    traffic and is promoted or rolled back by its measured p99 and errors. Empty: the Deployment
    rolls every pod to the new version as each new pod passes its warm-up gate."""


RolloutPhase = Literal["Progressing", "Promoting", "Promoted", "RolledBack", "Abandoned"]


class RolloutVerdict(ApiModel):
    """One judgement of the canary, with the numbers it was made on."""

    result: Literal["Pass", "Hold", "Fail"]
    """Pass: the step passed (next step or promotion); Hold: not enough evidence yet or no ready
    canary; Fail: rolled back."""
    reason: Annotated[str, Field(max_length=64)]
    """A CamelCase reason (docs/troubleshooting.md has a row for each)."""
    message: Annotated[str, Field(max_length=1024)]
    """The verdict in words, with its numbers."""
    at: datetime
    """When it was made."""
    window_seconds: Annotated[int | None, Field(ge=0)] = None
    """The window the numbers were measured over."""
    canary_p99_milliseconds: Annotated[float | None, Field(ge=0)] = None
    """The canary's p99 in the window."""
    stable_p99_milliseconds: Annotated[float | None, Field(ge=0)] = None
    """The stable version's p99 in the same window."""
    canary_error_ratio: Annotated[float | None, Field(ge=0, le=1)] = None
    """The fraction of the canary's requests that failed in the window."""
    canary_requests: Annotated[int | None, Field(ge=0)] = None
    """The canary's requests in the window."""
    measured_share_percent: Annotated[float | None, Field(ge=0, le=100)] = None
    """The canary's share of the service's requests in the window."""


class RolloutStatus(ApiModel):
    """The canary's progress; written by the autoscaler's pass, which judges it."""

    phase: RolloutPhase
    """Progressing (a step runs), Promoting (every step passed: the stable Deployment rolls to the
    new version), Promoted, RolledBack (the canary is removed; the stable version serves until
    the spec changes) or Abandoned (the spec went back to the stable version mid-canary)."""
    revision: Annotated[str, Field(max_length=64)]
    """The pod template's revision the canary runs (a hash of it)."""
    step: Annotated[int, Field(ge=0)] = 0
    """The step under way (0-based), or the last one reached."""
    steps: Annotated[int, Field(ge=1)] = 1
    """How many steps the strategy has."""
    share_percent: Annotated[int, Field(ge=0, le=100)] = 0
    """The declared share of the step under way."""
    step_started_at: datetime
    """When the step began (the canary was started, or the previous step passed)."""
    window_started_at: datetime | None = None
    """When the step's measurement window began: the first pass that found both Deployments at
    the step's sizes and every pod of them ready. Empty until then, and again while no canary
    pod is ready (the window restarts when the step's replicas are ready again)."""
    canary_replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas the autoscaler gave the canary Deployment."""
    stable_replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas the autoscaler gave the stable Deployment."""
    last_verdict: RolloutVerdict | None = None
    """The last judgement, with its numbers."""

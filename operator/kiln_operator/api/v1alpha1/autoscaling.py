"""The SLO, autoscaling and pre-warm parts of the InferenceService API.

Why it exists: these four models are the contract between a model owner and Kiln's
autoscaler (`kiln_operator.autoscaling.policy.decide`). Schema-level bounds live in the field
definitions so the generated CRD rejects bad values at `kubectl apply`; checks that span fields
(min <= max, a cron expression that parses, a time zone that exists) are validators, which the
operator turns into `Ready=False, reason=InvalidSpec`.

It must never import the clock or anything that does I/O: the API is pure data.
"""

from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import Field, field_validator, model_validator

from kiln_operator.api.dotsegments import URL_RULE, has_dot_segment
from kiln_operator.api.v1alpha1.base import ApiModel

__all__ = [
    "AutoscalingSpec",
    "AutoscalingStatus",
    "CapacityStatus",
    "LearnedPrewarmSpec",
    "LearnedStatus",
    "PrewarmSpec",
    "ScaleToZeroSpec",
    "SloSpec",
]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class SloSpec(ApiModel):
    """The latency objective the autoscaler keeps: a tail, not an average."""

    p99_latency_milliseconds: Annotated[float, Field(gt=0, le=600_000)]
    """End-to-end p99 latency target in milliseconds (queueing + batching + compute), measured
    by the runtime's `kiln_request_duration_seconds` histogram. The autoscaler adds replicas when
    the observed p99 exceeds it."""


class ScaleUpSpec(ApiModel):
    """How fast replicas may be added."""

    stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """How long the SLO must be breached before a scale-up; 0 reacts on the first breach."""

    max_step_replicas: Annotated[int, Field(ge=1, le=1000)] = 10
    """At most this many replicas are added in one step (or `maxStepPercent`, whichever is
    larger). Steps are sized from the measured demand; the limit only guards against a wild
    estimate."""

    max_step_percent: Annotated[int, Field(ge=1, le=10_000)] = 500
    """At most this percentage of the current replicas is added in one step (or
    `maxStepReplicas`, whichever is larger)."""


class ScaleDownSpec(ApiModel):
    """How cautiously replicas are removed."""

    stabilization_seconds: Annotated[int, Field(ge=0, le=86_400)] = 300
    """The hold window: both signals (p99 and queue depth) must have been healthy this long
    before any scale-down."""

    max_step_replicas: Annotated[int, Field(ge=1, le=1000)] = 1
    """At most this many replicas are removed in one step (or `maxStepPercent`, whichever is
    larger)."""

    max_step_percent: Annotated[int, Field(ge=1, le=100)] = 10
    """At most this percentage of the current replicas is removed in one step (or
    `maxStepReplicas`, whichever is larger)."""

    period_seconds: Annotated[int, Field(ge=0, le=3600)] = 60
    """The minimum time between two scale-down steps, and between a scale-up and the next
    scale-down."""


MetricsMissingPolicy = Literal["Hold", "ScheduleFloor", "Fixed"]


class MetricsMissingSpec(ApiModel):
    """What the autoscaler does when metrics are missing, stale, NaN or Prometheus is down.

    Whatever the policy, replicas are never lowered while the autoscaler is blind."""

    policy: MetricsMissingPolicy = "ScheduleFloor"
    """`Hold` keeps the current replicas; `ScheduleFloor` keeps them and still raises them to
    the pre-warm floor of a scheduled window; `Fixed` raises them to `replicas`."""

    replicas: Annotated[int | None, Field(ge=1, le=10_000)] = None
    """The replica count for the `Fixed` policy (required there, refused otherwise)."""

    @model_validator(mode="after")
    def _replicas_only_with_fixed(self) -> "MetricsMissingSpec":
        if self.policy == "Fixed" and self.replicas is None:
            raise ValueError("replicas is required when policy is Fixed")
        if self.policy != "Fixed" and self.replicas is not None:
            raise ValueError(f"replicas is only used by policy Fixed, not {self.policy}")
        return self


class ScaleToZeroSpec(ApiModel):
    """When a service with `minReplicas: 0` goes to zero replicas (docs/scale-to-zero.md)."""

    idle_seconds: Annotated[int, Field(ge=30, le=604_800)] = 900
    """How long the service must have answered no request, and Kiln's activator held none for
    it, before its last replica is removed. Read only with `minReplicas: 0`; a platform's
    policy may set the shortest allowed (`minScaleToZeroIdleSeconds`)."""


class AutoscalingSpec(ApiModel):
    """Replica bounds and the targets the autoscaler holds the service to."""

    min_replicas: Annotated[int, Field(ge=0, le=10_000)] = 1
    """The fewest replicas the service ever runs. 0 lets it scale to zero after
    `scaleToZero.idleSeconds` without a request: Kiln's activator then holds the first
    requests until a pod has passed its warm-up gate (a platform's policy may forbid it)."""

    max_replicas: Annotated[int, Field(ge=1, le=10_000)] = 10
    """The most replicas the service ever runs (pre-warm floors must not exceed it)."""

    queue_depth_per_replica: Annotated[float, Field(gt=0, le=100_000)] = 16.0
    """Target number of requests waiting in the batching queue per ready replica; above it the
    autoscaler adds replicas. A busy replica normally has about one batch waiting, so about
    twice the maximum batch size is a good value."""

    target_utilization_percent: Annotated[int, Field(ge=30, le=95)] = 75
    """Replicas are sized so each runs at this share of its measured capacity; the rest
    (25 % by default) is headroom for bursts and for the time a new replica takes to warm."""

    scale_up: ScaleUpSpec = ScaleUpSpec()
    """Rate limits and stabilization for adding replicas."""

    scale_down: ScaleDownSpec = ScaleDownSpec()
    """Hold window, rate limits and pacing for removing replicas."""

    when_metrics_missing: MetricsMissingSpec = MetricsMissingSpec()
    """Behaviour while metrics are missing, stale or Prometheus is unreachable."""

    stale_after_seconds: Annotated[int, Field(ge=15, le=3600)] = 90
    """Metrics older than this count as missing."""

    prometheus_url: Annotated[str | None, Field(pattern=r"^https?://[^\s]+$")] = None
    """Prometheus base URL for this service; defaults to the operator's configuration. Its path
    may not hold a `.` or `..` segment nor a percent-encoded dot (`%2e`)."""

    evaluation_interval_seconds: Annotated[int, Field(ge=5, le=600)] = 15
    """How often the autoscaler reads metrics and decides."""

    metrics_window_seconds: Annotated[int, Field(ge=15, le=3600)] = 60
    """The range of the PromQL `rate()` and `histogram_quantile()` windows."""

    scale_to_zero: ScaleToZeroSpec = ScaleToZeroSpec()
    """With `minReplicas: 0`: how long the service must be idle before it goes to zero."""

    @field_validator("prometheus_url")
    @classmethod
    def _no_dot_segments(cls, url: str | None) -> str | None:
        if url is not None and has_dot_segment(urlsplit(url).path):
            raise ValueError(f"{url!r}: {URL_RULE}")
        return url

    @model_validator(mode="after")
    def _min_not_above_max(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must not exceed "
                f"maxReplicas ({self.max_replicas})"
            )
        fixed = self.when_metrics_missing.replicas
        if fixed is not None and not self.min_replicas <= fixed <= self.max_replicas:
            raise ValueError(
                f"whenMetricsMissing.replicas ({fixed}) must lie within "
                f"[minReplicas, maxReplicas] = [{self.min_replicas}, {self.max_replicas}]"
            )
        if self.metrics_window_seconds < self.evaluation_interval_seconds:
            raise ValueError(
                "metricsWindowSeconds must be at least evaluationIntervalSeconds "
                f"({self.metrics_window_seconds} < {self.evaluation_interval_seconds})"
            )
        return self


class PrewarmSchedule(ApiModel):
    """A recurring window of known traffic, for which replicas are warmed ahead of time."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    """A name for the window, shown in status and events."""

    cron: Annotated[str, Field(min_length=9, max_length=200)]
    """When the window opens: a five-field cron expression in wall-clock time of `timeZone`
    (e.g. `0 9 * * 1-5`). A start that falls in a daylight-saving gap opens at the same
    elapsed time after the gap (02:30 becomes 03:30); a start in a repeated hour opens once,
    at its first occurrence."""

    time_zone: Annotated[str, Field(min_length=1, max_length=64)] = "UTC"
    """IANA time zone of the cron expression (e.g. `Europe/Berlin`)."""

    duration_minutes: Annotated[int, Field(ge=1, le=10_080)]
    """How long the window stays open."""

    min_replicas: Annotated[int, Field(ge=1, le=10_000)]
    """The replica floor while the window is open; above `maxReplicas` the spec is refused."""

    lead_time_seconds: Annotated[int | None, Field(ge=0, le=86_400)] = None
    """How long before the window opens the floor is raised. By default, the measured
    cold-start time of the service plus `leadTimeMarginSeconds`."""

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError(
                f"cron must have five fields (minute hour day month weekday): {value!r}"
            )
        if not croniter.is_valid(value):
            raise ValueError(f"cron does not parse: {value!r}")
        return value

    @field_validator("time_zone")
    @classmethod
    def _time_zone_exists(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as error:
            raise ValueError(f"unknown IANA time zone: {value!r}") from error
        return value


class LearnedPrewarmSpec(ApiModel):
    """Pre-warming learned from the service's own request-rate history in Prometheus: the
    daily and weekly shape of its traffic, forecast a lead time ahead, raises the replica floor
    before a forecast rise (docs/autoscaling.md, "Learned pre-warm")."""

    history_days: Annotated[int, Field(ge=7, le=28)] = 14
    """Days of `kiln_requests_total` history read (every 5 minutes) to fit the shape."""

    min_history_days: Annotated[int, Field(ge=2, le=28)] = 7
    """Days with traffic data the history must hold before the forecast is used; with fewer
    the learned floor stays off and the status says why."""

    max_error_percent: Annotated[int, Field(ge=1, le=100)] = 40
    """The fit is checked by forecasting each of the history's last days from the days before
    it: above this error (absolute error over traffic, in percent) the learned floor stays off."""

    @model_validator(mode="after")
    def _enough_days(self) -> "LearnedPrewarmSpec":
        if self.min_history_days > self.history_days:
            raise ValueError(
                f"minHistoryDays ({self.min_history_days}) must be <= historyDays "
                f"({self.history_days})"
            )
        return self


class PrewarmSpec(ApiModel):
    """Scheduled pre-warming: replica floors raised ahead of known bursts."""

    schedules: Annotated[list[PrewarmSchedule], Field(max_length=32, default_factory=list)]
    """The recurring windows; overlapping windows take the highest floor."""

    lead_time_margin_seconds: Annotated[int, Field(ge=0, le=3600)] = 60
    """Added to the measured cold-start time to get each window's default lead time."""

    assumed_cold_start_seconds: Annotated[int, Field(ge=0, le=7200)] = 300
    """The cold-start time assumed until the warm-up gate has measured one."""

    learned: LearnedPrewarmSpec | None = None
    """Opt-in: also raise the floor ahead of rises forecast from the request-rate history (no
    cron to write). Schedules still apply; the higher floor wins."""

    @field_validator("schedules")
    @classmethod
    def _names_unique(cls, value: list[PrewarmSchedule]) -> list[PrewarmSchedule]:
        names = [schedule.name for schedule in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"schedule names must be unique, repeated: {duplicates}")
        return value


class ObservedMetrics(ApiModel):
    """The metrics a decision was made on, as Prometheus returned them."""

    p99_latency_milliseconds: float | None = None
    """Observed p99 end-to-end latency; absent when unknown or when there was no traffic."""

    queue_depth_per_replica: float | None = None
    """Requests waiting per ready replica."""

    requests_per_second: float | None = None
    """Requests answered per second over the metrics window."""

    ready_replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas that passed the warm-up gate."""

    observed_at: datetime | None = None
    """When Prometheus evaluated the queries."""


class WindowStatus(ApiModel):
    """A pre-warm window the autoscaler is acting on (in its lead time or open)."""

    name: str
    """The schedule's name."""

    opens_at: datetime
    """When the window opens (UTC)."""

    closes_at: datetime
    """When the window closes (UTC)."""

    floor_replicas: Annotated[int, Field(ge=0)]
    """The replica floor applied for it."""

    raised_at: datetime | None = None
    """When the autoscaler first raised replicas to the floor for this window."""

    floor_warm_at_open: bool | None = None
    """Whether the floor's replicas were all ready when the window opened; unknown until then."""


class LearnedStatus(ApiModel):
    """What the learned pre-warm forecast and the floor it implies, or why it is off."""

    active: bool
    """True while the forecast is used; false with `reason` saying why it is off."""

    reason: Annotated[str, Field(max_length=64)]
    """A CamelCase reason (see docs/autoscaling.md)."""

    message: Annotated[str, Field(max_length=512)] = ""
    """The forecast and the floor, or why it is off, for humans."""

    floor_replicas: Annotated[int, Field(ge=0)] = 0
    """The replica floor the forecast implies now (0 while off)."""

    next_rise_at: datetime | None = None
    """When the next forecast rise begins (UTC), within the next day."""

    next_rise_requests_per_second: Annotated[float | None, Field(ge=0)] = None
    """The request rate forecast for that rise."""

    raise_from: datetime | None = None
    """When the floor for that rise is raised: the rise less the lead (cold start + margin)."""

    fitted_at: datetime | None = None
    """When the history was last read and fitted."""


class CapacityStatus(ApiModel):
    """What one replica serves at full batches, as the autoscaler measured it."""

    requests_per_second_per_replica: Annotated[float, Field(ge=0)]
    """Requests per second one ready replica serves with full batches: read off a line fitted
    to the runtime's mean batch size and mean compute time per batch over the metrics windows
    (`kiln_batch_size`, `kiln_compute_duration_seconds`) at `runtime.batching.maxBatchSize`."""

    measured: bool = False
    """True when read off the fitted line (or seen at full batches); false while it is only a
    lower bound (every batch seen had the same size, or no batch metrics yet)."""


class AutoscalingStatus(ApiModel):
    """What the autoscaler decided last, and why."""

    desired_replicas: Annotated[int, Field(ge=0)]
    """The replica count the autoscaler wants."""

    reason: Annotated[str, Field(max_length=64)]
    """A CamelCase reason for the decision (see docs/autoscaling.md)."""

    message: Annotated[str, Field(max_length=1024)] = ""
    """The decision, explained for humans."""

    metrics_available: bool = True
    """False while metrics are missing, stale or Prometheus is unreachable."""

    observed: ObservedMetrics = ObservedMetrics()
    """The metrics the decision was made on."""

    active_window: WindowStatus | None = None
    """The pre-warm window currently in its lead time or open, if any."""

    last_scale_time: datetime | None = None
    """When the autoscaler last changed the replica count."""

    capacity: CapacityStatus | None = None
    """Per-replica capacity the decision was sized with; absent until traffic was seen."""

    learned: LearnedStatus | None = None
    """The learned pre-warm's forecast and floor (only with spec.prewarm.learned)."""

    updated_at: datetime | None = None
    """When the autoscaler last wrote this status. It writes only when something a reader would
    act on changed (desired replicas, reason, a condition, a metric outside its band: see
    docs/autoscaling.md), so a steady service's status keeps the values of its last change."""

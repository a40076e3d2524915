"""The canary's state machine: start, hold, next step, promote, roll back; and its replicas.

Why it exists: whether a new version gets more traffic or is removed is the one decision of a
canary, and it must be the same after an operator restart, testable without a cluster, and
explained with its numbers. `advance` is pure (`now` is a parameter): it takes the last
`RolloutStatus` (the status is the state, so a restarted operator continues the step it was on),
what the autoscaler's pass observed (both Deployments, the canary's and the stable version's
signals in one window) and returns the next status and the events of the transition.
`split_replicas` sizes both Deployments for a step's share of the one Service's endpoints.
"""

import math
from dataclasses import dataclass, field
from datetime import datetime

from kiln_operator import constants
from kiln_operator.api.v1alpha1.rollout import CanarySpec, RolloutStatus, RolloutVerdict

WINDOW_FLOOR_SECONDS = 15
"""The shortest window signals are read over: a few scrapes, so a rate has two samples."""


@dataclass(frozen=True)
class TrackSignals:
    """One version's requests in the window, the failed ones among them, and its p99."""

    requests: float
    errors: float
    p99_seconds: float | None


@dataclass(frozen=True)
class CanaryMetrics:
    """Both versions' signals over the same window, or why they could not be read."""

    window_seconds: int
    canary: TrackSignals | None = None
    stable: TrackSignals | None = None
    error: str | None = None


@dataclass(frozen=True)
class RolloutObservation:
    """What one autoscaler pass saw of the rollout."""

    target_revision: str
    """The revision of the pod template the spec asks for."""
    stable_matches: bool
    """The stable Deployment already runs the spec's template (nothing to canary)."""
    canary_ready: int
    """Ready pods of the canary Deployment running target_revision (0 while it runs another or
    is rolling, or is absent)."""
    stable_rolled_out: bool
    """The stable Deployment's rollout is complete (ends Promoting)."""
    metrics: CanaryMetrics | None = None
    """Read only while a step runs."""
    canary_replicas: int = 0
    """The canary Deployment's replicas (its spec; 0 when it is absent)."""
    stable_replicas: int = 0
    """The stable Deployment's replicas (its spec)."""
    stable_ready: int = 0
    """Ready pods of the stable Deployment."""
    step_replicas: tuple[int, int] | None = None
    """(stable, canary) replicas the step's share asks for at this pass's demand
    (`split_replicas`); None when no step runs."""
    canary_warmup_failed: str | None = None
    """Why a canary pod of target_revision failed its warm-up gate on every attempt (the
    gate's reason and message), else None."""
    canary_cause: str | None = None
    """The first cause the canary's pods show for not serving (status.causes), if any: said
    when the progress deadline rolls the canary back."""


def replicas_ready(observed: RolloutObservation) -> bool:
    """Both Deployments at the step's sizes and every pod of them ready: from here the Service
    splits its traffic in the step's proportion, so the step's window may start. Before, the
    window would hold the previous step's share (a full run measured 39.3 % for a declared
    50 %: the 50 % step's second canary pod was still warming up in its window)."""
    sizes = observed.step_replicas
    if sizes is None:
        return False
    stable, canary = sizes
    seen = (
        observed.stable_replicas,
        observed.stable_ready,
        observed.canary_replicas,
        observed.canary_ready,
    )
    return seen == (stable, stable, canary, canary)


@dataclass(frozen=True)
class RolloutEvent:
    """An event to post on the InferenceService."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class RolloutStep:
    """The status after this pass (None: no rollout ever started) and what to announce."""

    status: RolloutStatus | None
    events: list[RolloutEvent] = field(default_factory=list)


def metrics_window(spec: CanarySpec, status: RolloutStatus | None, now: datetime) -> int:
    """The window to read the signals over: since the step's window began (before it has, since
    the step began: errors and an SLO breach are judged meanwhile), at least
    WINDOW_FLOOR_SECONDS, at most the step's length."""
    if status is None:
        return WINDOW_FLOOR_SECONDS
    began = status.window_started_at or status.step_started_at
    elapsed = int((now - began).total_seconds())
    return max(WINDOW_FLOOR_SECONDS, min(spec.step_seconds, elapsed))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} ms"


def _verdict(
    result: str, reason: str, message: str, now: datetime, metrics: CanaryMetrics | None = None
) -> RolloutVerdict:
    numbers: dict[str, float | int | None] = {}
    if metrics is not None and metrics.canary is not None:
        canary, stable = metrics.canary, metrics.stable
        total = canary.requests + (stable.requests if stable is not None else 0.0)
        numbers = {
            "window_seconds": metrics.window_seconds,
            "canary_p99_milliseconds": _ms(canary.p99_seconds),
            "stable_p99_milliseconds": _ms(stable.p99_seconds) if stable is not None else None,
            "canary_error_ratio": round(canary.errors / canary.requests, 6)
            if canary.requests > 0
            else None,
            "canary_requests": round(canary.requests),
            "measured_share_percent": round(100.0 * canary.requests / total, 2)
            if total > 0
            else None,
        }
    return RolloutVerdict.model_validate(
        {"result": result, "reason": reason, "message": message[:1024], "at": now, **numbers}
    )


def judge(
    spec: CanarySpec,
    slo_p99_milliseconds: float,
    metrics: CanaryMetrics,
    *,
    window_complete: bool = True,
) -> tuple[str, str] | None:
    """A failure's (reason, message) if the canary is worse, None if it is not (or there is not
    enough evidence: fewer than minRequests canary requests).

    Errors and a breach of the SLO count at once. The comparison with the stable version's p99
    waits for the step's whole window (`window_complete`): right after a step began, a canary pod
    the new share just added serves its first real requests, and two tails estimated from a few
    seconds of them differ by noise, not by version (the real node's test once rolled a good
    canary back on 32 ms against 31.5 ms five seconds into a step)."""
    canary = metrics.canary
    if canary is None or canary.requests < spec.min_requests:
        return None
    ratio = canary.errors / canary.requests
    if ratio > spec.max_error_ratio:
        return (
            constants.REASON_CANARY_ERRORS,
            f"{ratio:.2%} of the canary's {canary.requests:.0f} requests failed in "
            f"{metrics.window_seconds} s, above maxErrorRatio {spec.max_error_ratio:.2%}",
        )
    p99 = _ms(canary.p99_seconds)
    if p99 is not None and p99 > slo_p99_milliseconds:
        return (
            constants.REASON_CANARY_SLO_BREACHED,
            f"canary p99 {p99:.1f} ms over {metrics.window_seconds} s exceeds the SLO's "
            f"{slo_p99_milliseconds:g} ms",
        )
    stable_p99 = _ms(metrics.stable.p99_seconds) if metrics.stable is not None else None
    if window_complete and p99 is not None and stable_p99 is not None:
        limit = stable_p99 * spec.max_p99_ratio + spec.p99_slack_milliseconds
        if p99 > limit:
            return (
                constants.REASON_CANARY_SLOWER,
                f"canary p99 {p99:.1f} ms exceeds the stable version's {stable_p99:.1f} ms "
                f"x {spec.max_p99_ratio:g} + {spec.p99_slack_milliseconds:g} ms = {limit:.1f} ms "
                f"over the same {metrics.window_seconds} s",
            )
    return None


def _start(
    spec: CanarySpec, revision: str, previous: RolloutStatus | None, now: datetime
) -> RolloutStep:
    status = RolloutStatus(
        phase="Progressing",
        revision=revision,
        step=0,
        steps=len(spec.steps),
        share_percent=spec.steps[0],
        step_started_at=now,
        last_verdict=None,
    )
    replaced = ""
    if previous is not None and previous.phase == "Progressing":
        replaced = f" (the spec changed mid-canary: the canary of {previous.revision} ends)"
    message = (
        f"revision {revision}: step 1 of {len(spec.steps)}, {spec.steps[0]} % of traffic for "
        f"{spec.step_seconds} s{replaced}"
    )
    return RolloutStep(status, [RolloutEvent("Normal", constants.EVENT_CANARY_STARTED, message)])


def _hold(
    status: RolloutStatus, verdict: RolloutVerdict, *, end_window: bool = False
) -> RolloutStep:
    """Keep the step; write only when the hold's reason changes (a pass that finds the same hold
    writes nothing). `end_window`: the step's window is over; a new one starts when the step's
    replicas are ready again."""
    last = status.last_verdict
    if last is not None and (last.result, last.reason) == (verdict.result, verdict.reason):
        return RolloutStep(status)
    update: dict[str, object] = {"last_verdict": verdict}
    if end_window:
        update["window_started_at"] = None
    return RolloutStep(status.model_copy(update=update))


def _roll_back(
    current: RolloutStatus,
    reason: str,
    message: str,
    now: datetime,
    metrics: CanaryMetrics | None = None,
) -> RolloutStep:
    """The canary judged worse or unable to serve: RolledBack, with the verdict and an event."""
    verdict = _verdict("Fail", reason, message, now, metrics)
    rolled_back = current.model_copy(
        update={"phase": "RolledBack", "last_verdict": verdict, "canary_replicas": 0}
    )
    said = f"revision {current.revision} at step {current.step + 1}: {message}"
    return RolloutStep(
        rolled_back, [RolloutEvent("Warning", constants.EVENT_CANARY_ROLLED_BACK, said)]
    )


def not_ready_since(status: RolloutStatus, now: datetime) -> datetime:
    """Since when the canary has had no ready pod: the CanaryNotReady hold's time (a hold is
    written only when its reason changes, so it is when the pods were first seen unready), else
    `now` (this pass is the first to see none)."""
    last = status.last_verdict
    if last is not None and last.reason == constants.REASON_CANARY_NOT_READY:
        return last.at
    return now


def _sizes(observed: RolloutObservation) -> str:
    wanted = observed.step_replicas
    stable, canary = wanted if wanted is not None else ("?", "?")
    return (
        f"stable {observed.stable_ready} ready of {observed.stable_replicas} (wanted {stable}), "
        f"canary {observed.canary_ready} ready of {observed.canary_replicas} (wanted {canary})"
    )


def advance(
    spec: CanarySpec,
    slo_p99_milliseconds: float,
    previous: RolloutStatus | None,
    observed: RolloutObservation,
    now: datetime,
) -> RolloutStep:
    """The rollout's next state and the events of this transition."""
    current = (
        previous if previous is not None and previous.revision == observed.target_revision else None
    )
    if observed.stable_matches:
        if current is not None and current.phase == "Promoting" and observed.stable_rolled_out:
            message = f"revision {current.revision} runs on every stable pod; the canary is removed"
            done = current.model_copy(update={"phase": "Promoted", "canary_replicas": 0})
            return RolloutStep(
                done, [RolloutEvent("Normal", constants.EVENT_CANARY_PROMOTED, message)]
            )
        if current is None and previous is not None and previous.phase == "Progressing":
            message = (
                f"the spec is back to the stable version: the canary of {previous.revision} ends"
            )
            abandoned = previous.model_copy(update={"phase": "Abandoned", "canary_replicas": 0})
            return RolloutStep(
                abandoned, [RolloutEvent("Normal", constants.EVENT_CANARY_ABANDONED, message)]
            )
        return RolloutStep(previous)
    if current is None:
        return _start(spec, observed.target_revision, previous, now)
    if current.phase in ("Promoted", "Abandoned"):
        # The spec left this revision and came back to it: a new canary, judged afresh.
        return _start(spec, observed.target_revision, None, now)
    if current.phase != "Progressing":
        return RolloutStep(current)  # Promoting waits for the stable rollout; RolledBack stays
    if observed.canary_warmup_failed is not None:
        return _roll_back(
            current,
            constants.REASON_CANARY_WARMUP_FAILED,
            f"a canary pod failed its warm-up gate: {observed.canary_warmup_failed}",
            now,
        )
    if observed.canary_ready == 0:
        unready = (now - not_ready_since(current, now)).total_seconds()
        if unready >= spec.progress_deadline_seconds:
            cause = observed.canary_cause or "the pods showed no cause"
            return _roll_back(
                current,
                constants.REASON_CANARY_PROGRESS_DEADLINE,
                f"no canary pod was ready for {unready:.0f} s (progressDeadlineSeconds "
                f"{spec.progress_deadline_seconds}): {cause}",
                now,
            )
        verdict = _verdict(
            "Hold",
            constants.REASON_CANARY_NOT_READY,
            f"no ready canary pod runs revision {current.revision} yet: step {current.step + 1}'s "
            "window starts when the step's replicas are ready (rolled back after "
            f"{spec.progress_deadline_seconds} s without one)",
            now,
        )
        return _hold(current, verdict, end_window=True)
    metrics = observed.metrics
    if metrics is None or metrics.error is not None:
        why = "no metrics read" if metrics is None else metrics.error
        verdict = _verdict(
            "Hold",
            constants.REASON_CANARY_METRICS_UNAVAILABLE,
            f"the canary is not judged: {why}",
            now,
        )
        return _hold(current, verdict)
    began = current.window_started_at
    complete = began is not None and (now - began).total_seconds() >= spec.step_seconds
    failure = judge(spec, slo_p99_milliseconds, metrics, window_complete=complete)
    if failure is not None:
        return _roll_back(current, *failure, now, metrics)
    if began is None:
        if replicas_ready(observed):
            verdict = _verdict(
                "Hold",
                constants.REASON_CANARY_MEASURING,
                f"step {current.step + 1}'s replicas are ready ({_sizes(observed)}): its "
                f"{spec.step_seconds} s window starts",
                now,
            )
            started = current.model_copy(update={"window_started_at": now, "last_verdict": verdict})
            return RolloutStep(started)
        verdict = _verdict(
            "Hold",
            constants.REASON_CANARY_SCALING,
            f"step {current.step + 1} waits for its replicas ({_sizes(observed)}): its window "
            "starts when both Deployments are at the step's sizes and ready",
            now,
        )
        return _hold(current, verdict)
    if not complete:
        return RolloutStep(current)
    canary = metrics.canary
    requests = 0.0 if canary is None else canary.requests
    if requests < spec.min_requests:
        verdict = _verdict(
            "Hold",
            constants.REASON_CANARY_TOO_FEW_REQUESTS,
            f"{requests:.0f} canary requests in {metrics.window_seconds} s, fewer than "
            f"minRequests {spec.min_requests}: step {current.step + 1} goes on",
            now,
            metrics,
        )
        return _hold(current, verdict)
    verdict = _verdict(
        "Pass",
        constants.REASON_CANARY_STEP_PASSED,
        f"step {current.step + 1} of {len(spec.steps)} ({current.share_percent} %) passed",
        now,
        metrics,
    )
    shares = f"declared {current.share_percent} %, measured {verdict.measured_share_percent} %"
    numbers = (
        f"canary p99 {_fmt(verdict.canary_p99_milliseconds)}, stable p99 "
        f"{_fmt(verdict.stable_p99_milliseconds)}, errors {verdict.canary_error_ratio}, {shares}"
    )
    following = current.step + 1
    if following < len(spec.steps):
        advanced = current.model_copy(
            update={
                "step": following,
                "steps": len(spec.steps),
                "share_percent": spec.steps[following],
                "step_started_at": now,
                "window_started_at": None,
                "last_verdict": verdict,
            }
        )
        message = (
            f"revision {current.revision}: step {current.step + 1} passed ({numbers}); "
            f"step {following + 1} sends {spec.steps[following]} %"
        )
        return RolloutStep(
            advanced, [RolloutEvent("Normal", constants.EVENT_CANARY_STEP_PASSED, message)]
        )
    promoting = current.model_copy(update={"phase": "Promoting", "last_verdict": verdict})
    message = (
        f"revision {current.revision}: the last step passed ({numbers}); the stable Deployment "
        "rolls to it"
    )
    return RolloutStep(
        promoting, [RolloutEvent("Normal", constants.EVENT_CANARY_STEP_PASSED, message)]
    )


SHARE_ROUNDING_POINTS = 5.0
"""How far, in percentage points, whole replicas may put the canary's share of the ready
replicas from the declared one before the canary gets another replica."""


def split_replicas(demand: int, share_percent: int, max_replicas: int) -> tuple[int, int]:
    """(stable, canary) replicas for a step: the canary gets its share of the ready replicas
    behind the Service (whole replicas, at least one), the stable version at least what the
    autoscaler's `demand` leaves and at most maxReplicas.

    The canary's count starts at its share of the demand and grows while the stable count the
    demand leaves puts the share more than SHARE_ROUNDING_POINTS from the declared one: a demand
    of 5 at 50 % is 3 and 3, not 3 and 2 (40 %), and a 40 % step of one replica of demand is 3
    and 2, not 2 and 1 (33 %). A demand raised for an earlier step's share and still held by the
    scale-down's stabilization thus costs replicas, never the share."""
    share = min(max(share_percent, 1), 99)

    def stable_for(canary: int) -> int:
        return max(demand - canary, math.floor(canary * (100 - share) / share + 0.5), 1)

    canary = max(1, round(demand * share / 100))
    while (
        abs(100.0 * canary / (canary + stable_for(canary)) - share) > SHARE_ROUNDING_POINTS
        and canary < demand + 100
    ):
        canary += 1
    return min(stable_for(canary), max(max_replicas, 1)), canary

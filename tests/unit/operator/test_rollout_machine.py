"""The canary's state machine (rollout.machine): every transition, with `now` given."""

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from kiln_operator import constants
from kiln_operator.api.v1alpha1.rollout import CanarySpec, RolloutStatus
from kiln_operator.rollout.machine import (
    CanaryMetrics,
    RolloutObservation,
    TrackSignals,
    advance,
    judge,
    metrics_window,
    split_replicas,
)
from kiln_operator.rollout.signals import canary_query, parse

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
SPEC = CanarySpec(steps=[10, 50], step_seconds=60, min_requests=50)
SLO_MS = 100.0


def signals(requests: float = 500, errors: float = 0, p99_ms: float | None = 5.0) -> TrackSignals:
    return TrackSignals(requests, errors, None if p99_ms is None else p99_ms / 1000)


def metrics(
    canary: TrackSignals | None = None, stable: TrackSignals | None = None, window: int = 60
) -> CanaryMetrics:
    return CanaryMetrics(
        window,
        canary if canary is not None else signals(),
        stable if stable is not None else signals(4500),
    )


def observe(
    *,
    revision: str = "rev-b",
    stable_matches: bool = False,
    ready: int = 1,
    rolled_out: bool = True,
    seen: CanaryMetrics | None = None,
    stable: tuple[int, int] = (9, 9),
    canary_replicas: int = 1,
    wanted: tuple[int, int] | None = (9, 1),
) -> RolloutObservation:
    """What a pass saw; by default both Deployments at the step's sizes, every pod ready
    (`stable`: the stable Deployment's replicas and ready pods; `wanted`: the step's sizes)."""
    return RolloutObservation(
        revision,
        stable_matches,
        ready,
        rolled_out,
        seen,
        canary_replicas=canary_replicas,
        stable_replicas=stable[0],
        stable_ready=stable[1],
        step_replicas=wanted,
    )


def started(at: datetime = T0) -> RolloutStatus:
    """Step 1 running, its window started at `at` (its replicas were ready)."""
    step = advance(SPEC, SLO_MS, None, observe(ready=0), at)
    assert step.status is not None
    measuring = advance(SPEC, SLO_MS, step.status, observe(seen=metrics(few())), at)
    assert measuring.status is not None and measuring.status.window_started_at == at
    return measuring.status


def few() -> TrackSignals:
    """Fewer canary requests than minRequests: no verdict on them."""
    return signals(requests=10)


def test_a_new_revision_starts_a_canary_at_the_first_step() -> None:
    step = advance(SPEC, SLO_MS, None, observe(ready=0), T0)
    assert step.status is not None
    assert (step.status.phase, step.status.step, step.status.share_percent) == (
        "Progressing",
        0,
        10,
    )
    assert step.status.revision == "rev-b" and step.status.step_started_at == T0
    assert step.status.window_started_at is None  # no ready canary pod yet
    assert [e.reason for e in step.events] == [constants.EVENT_CANARY_STARTED]
    assert "step 1 of 2, 10 % of traffic" in step.events[0].message


def test_nothing_to_canary_when_the_stable_version_runs_the_spec() -> None:
    assert advance(SPEC, SLO_MS, None, observe(stable_matches=True), T0).status is None


def test_a_good_canary_passes_each_step_then_promotes_then_is_promoted() -> None:
    status = started()
    halfway = advance(SPEC, SLO_MS, status, observe(seen=metrics()), T0 + timedelta(seconds=30))
    assert halfway.status == status and halfway.events == []  # no verdict mid-window: no write
    first = advance(SPEC, SLO_MS, status, observe(seen=metrics()), T0 + timedelta(seconds=60))
    assert first.status is not None and first.status.phase == "Progressing"
    assert (first.status.step, first.status.share_percent) == (1, 50)
    assert first.status.step_started_at == T0 + timedelta(seconds=60)
    assert first.status.window_started_at is None  # until step 2's replicas are ready
    verdict = first.status.last_verdict
    assert verdict is not None and verdict.result == "Pass"
    assert verdict.reason == constants.REASON_CANARY_STEP_PASSED
    assert verdict.measured_share_percent == 10.0 and verdict.canary_requests == 500
    assert verdict.canary_p99_milliseconds == 5.0 and verdict.canary_error_ratio == 0.0
    assert [e.reason for e in first.events] == [constants.EVENT_CANARY_STEP_PASSED]
    assert "declared 10 %, measured 10.0 %" in first.events[0].message
    second = advance(
        SPEC, SLO_MS, first.status, observe(seen=metrics()), T0 + timedelta(seconds=65)
    )
    assert second.status is not None
    assert second.status.window_started_at == T0 + timedelta(seconds=65)
    last = advance(
        SPEC, SLO_MS, second.status, observe(seen=metrics()), T0 + timedelta(seconds=125)
    )
    assert last.status is not None and last.status.phase == "Promoting"
    rolling = observe(stable_matches=True, rolled_out=False)
    waiting = advance(SPEC, SLO_MS, last.status, rolling, T0 + timedelta(seconds=125))
    assert waiting.status == last.status and waiting.events == []
    done = advance(
        SPEC, SLO_MS, last.status, observe(stable_matches=True), T0 + timedelta(seconds=130)
    )
    assert done.status is not None and done.status.phase == "Promoted"
    assert [e.reason for e in done.events] == [constants.EVENT_CANARY_PROMOTED]
    again = advance(SPEC, SLO_MS, done.status, observe(stable_matches=True), T0)
    assert again.status == done.status and again.events == []


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def on_step_two() -> RolloutStatus:
    """Step 1 passed at 60 s: step 2 (50 %) asks for 2 stable and 2 canary replicas."""
    passed = advance(SPEC, SLO_MS, started(), observe(seen=metrics()), at(60))
    assert passed.status is not None and passed.status.step == 1
    assert passed.status.window_started_at is None
    return passed.status


STEP_TWO = (2, 2)


def test_a_steps_window_starts_when_both_deployments_are_at_its_sizes_and_ready() -> None:
    """The share measured over a window is the step's only once the Service splits in the
    step's proportion: a second canary pod still warming up (or a stable pod the step removes
    still there) would count the previous step's share in it."""
    status = on_step_two()
    warming = observe(seen=metrics(), stable=(2, 2), canary_replicas=2, ready=1, wanted=STEP_TWO)
    scaling = advance(SPEC, SLO_MS, status, warming, at(65))
    assert scaling.status is not None and scaling.events == []
    assert scaling.status.window_started_at is None
    verdict = scaling.status.last_verdict
    assert verdict is not None and (verdict.result, verdict.reason) == (
        "Hold",
        constants.REASON_CANARY_SCALING,
    )
    assert "stable 2 ready of 2 (wanted 2), canary 1 ready of 2 (wanted 2)" in verdict.message
    # Still scaling, another way (the stable Deployment not yet down to 2): the same hold, no
    # write; the window has not started however long it lasts.
    unscaled = observe(seen=metrics(), stable=(3, 3), canary_replicas=2, ready=2, wanted=STEP_TWO)
    assert advance(SPEC, SLO_MS, scaling.status, unscaled, at(130)).status == scaling.status
    # One pod short of the stable side's size: not ready either.
    short = observe(seen=metrics(), stable=(2, 1), canary_replicas=2, ready=2, wanted=STEP_TWO)
    assert advance(SPEC, SLO_MS, scaling.status, short, at(131)).status == scaling.status
    ready = observe(seen=metrics(), stable=(2, 2), canary_replicas=2, ready=2, wanted=STEP_TWO)
    measuring = advance(SPEC, SLO_MS, scaling.status, ready, at(135))
    assert measuring.status is not None and measuring.status.window_started_at == at(135)
    assert measuring.status.step_started_at == at(60)
    verdict = measuring.status.last_verdict
    assert verdict is not None and verdict.reason == constants.REASON_CANARY_MEASURING
    assert metrics_window(SPEC, measuring.status, at(140)) == 15
    assert metrics_window(SPEC, measuring.status, at(180)) == 45
    # The step is judged a whole window after its replicas were ready, not after it began.
    assert advance(SPEC, SLO_MS, measuring.status, ready, at(194)).status == measuring.status
    done = advance(SPEC, SLO_MS, measuring.status, ready, at(195))
    assert done.status is not None and done.status.phase == "Promoting"


def test_without_the_steps_sizes_its_window_never_starts() -> None:
    nothing = observe(seen=metrics(), wanted=None)
    step = advance(SPEC, SLO_MS, on_step_two(), nothing, at(65))
    assert step.status is not None and step.status.window_started_at is None


def test_errors_and_an_slo_breach_are_judged_before_the_window_starts() -> None:
    """A worse canary is not kept while the step's replicas scale: its own errors and its p99
    against the SLO say nothing about the share. Only the comparison with the stable version
    waits for a whole window."""
    for canary, reason in (
        (signals(errors=30), constants.REASON_CANARY_ERRORS),
        (signals(p99_ms=150), constants.REASON_CANARY_SLO_BREACHED),
    ):
        seen = metrics(canary, window=15)
        scaling = observe(seen=seen, canary_replicas=2, ready=1, wanted=STEP_TWO)
        step = advance(SPEC, SLO_MS, on_step_two(), scaling, at(65))
        assert step.status is not None and step.status.phase == "RolledBack"
        assert step.status.last_verdict is not None
        assert step.status.last_verdict.reason == reason
    slower = metrics(signals(p99_ms=40), signals(4500, p99_ms=5), window=15)
    scaling = observe(seen=slower, canary_replicas=2, ready=1, wanted=STEP_TWO)
    held = advance(SPEC, SLO_MS, on_step_two(), scaling, at(65))
    assert held.status is not None and held.status.phase == "Progressing"


@pytest.mark.parametrize(
    ("canary", "stable", "reason", "at"),
    [
        (signals(errors=30), signals(4500), constants.REASON_CANARY_ERRORS, 20),
        (
            signals(p99_ms=150),
            signals(4500, p99_ms=140),
            constants.REASON_CANARY_SLO_BREACHED,
            20,
        ),
        (signals(p99_ms=40), signals(4500, p99_ms=5), constants.REASON_CANARY_SLOWER, 60),
    ],
    ids=["errors: at once", "the SLO: at once", "slower than stable: at the window's end"],
)
def test_a_worse_canary_is_rolled_back(
    canary: TrackSignals, stable: TrackSignals, reason: str, at: int
) -> None:
    status = started()
    seen = metrics(canary, stable, window=20)
    if at > 20:  # mid-window, slower than the stable version is not yet a verdict
        early = advance(SPEC, SLO_MS, status, observe(seen=seen), T0 + timedelta(seconds=20))
        assert early.status == status and early.events == []
    step = advance(SPEC, SLO_MS, status, observe(seen=seen), T0 + timedelta(seconds=at))
    assert step.status is not None and step.status.phase == "RolledBack"
    verdict = step.status.last_verdict
    assert verdict is not None and (verdict.result, verdict.reason) == ("Fail", reason)
    assert verdict.window_seconds == 20 and verdict.canary_requests == 500
    assert [(e.type, e.reason) for e in step.events] == [
        ("Warning", constants.EVENT_CANARY_ROLLED_BACK)
    ]
    assert step.status.canary_replicas == 0
    # Rolled back stays rolled back for that revision, whatever the next metrics say.
    later = advance(SPEC, SLO_MS, step.status, observe(seen=metrics()), T0 + timedelta(hours=1))
    assert later.status == step.status and later.events == []


def test_the_slower_verdict_has_both_p99s_and_the_limit() -> None:
    seen = metrics(signals(p99_ms=40), signals(4500, p99_ms=5), window=30)
    failure = judge(SPEC, SLO_MS, seen)
    assert failure is not None
    assert failure[1] == (
        "canary p99 40.0 ms exceeds the stable version's 5.0 ms x 1.5 + 10 ms = 17.5 ms "
        "over the same 30 s"
    )


def test_a_canary_within_the_ratio_and_slack_is_not_judged_worse() -> None:
    assert judge(SPEC, SLO_MS, metrics(signals(p99_ms=17), signals(4500, p99_ms=5))) is None


def test_too_few_canary_requests_judge_nothing_and_extend_the_step() -> None:
    status = started()
    few = metrics(signals(requests=10, errors=10, p99_ms=900))
    mid = advance(SPEC, SLO_MS, status, observe(seen=few), T0 + timedelta(seconds=30))
    assert mid.status == status  # 100 % errors on 10 requests: no evidence, no verdict
    end = advance(SPEC, SLO_MS, status, observe(seen=few), T0 + timedelta(seconds=61))
    assert end.status is not None and end.status.phase == "Progressing" and end.status.step == 0
    verdict = end.status.last_verdict
    assert verdict is not None and verdict.reason == constants.REASON_CANARY_TOO_FEW_REQUESTS
    same = advance(SPEC, SLO_MS, end.status, observe(seen=few), T0 + timedelta(seconds=70))
    assert same.status == end.status  # the same hold writes nothing


def test_metrics_unavailable_hold_without_a_verdict() -> None:
    status = started()
    down = CanaryMetrics(60, error="Prometheus at http://p unreadable: refused")
    step = advance(SPEC, SLO_MS, status, observe(seen=down), T0 + timedelta(seconds=90))
    assert step.status is not None and step.status.phase == "Progressing"
    verdict = step.status.last_verdict
    assert verdict is not None and verdict.reason == constants.REASON_CANARY_METRICS_UNAVAILABLE
    assert step.status.step == 0 and step.status.step_started_at == T0
    back = advance(SPEC, SLO_MS, step.status, observe(seen=metrics()), T0 + timedelta(seconds=95))
    assert back.status is not None and back.status.step == 1


def test_a_deleted_canary_deployment_restarts_the_step_when_its_pod_is_ready_again() -> None:
    status = started()
    gone = advance(SPEC, SLO_MS, status, observe(ready=0), T0 + timedelta(seconds=40))
    assert gone.status is not None and gone.status.phase == "Progressing"
    verdict = gone.status.last_verdict
    assert verdict is not None and verdict.reason == constants.REASON_CANARY_NOT_READY
    assert gone.status.window_started_at is None and gone.status.step_started_at == T0
    still = advance(SPEC, SLO_MS, gone.status, observe(ready=0), T0 + timedelta(seconds=50))
    assert still.status == gone.status  # no write per pass while it stays away
    ready_at = T0 + timedelta(seconds=70)
    back = advance(SPEC, SLO_MS, gone.status, observe(seen=metrics()), ready_at)
    assert back.status is not None and back.status.window_started_at == ready_at
    assert back.status.last_verdict is not None
    assert back.status.last_verdict.reason == constants.REASON_CANARY_MEASURING
    full = advance(
        SPEC, SLO_MS, back.status, observe(seen=metrics()), ready_at + timedelta(seconds=60)
    )
    assert full.status is not None and full.status.step == 1
    short = advance(
        SPEC, SLO_MS, back.status, observe(seen=metrics()), ready_at + timedelta(seconds=59)
    )
    assert short.status == back.status  # a full window from the pod's return, not before


GATE_FAILED = "warm-up of pod svc-canary-1 failed (P99OverBound): warm-up p99 1900 ms exceeds 1000"


@pytest.mark.parametrize(
    ("ready", "canary_replicas"),
    [(0, 1), (1, 2)],
    ids=["its only pod", "its second pod, while the step scales"],
)
def test_a_canary_pod_that_fails_its_warm_up_gate_rolls_the_canary_back_at_once(
    ready: int, canary_replicas: int
) -> None:
    status = started()
    seen = observe(ready=ready, canary_replicas=canary_replicas, seen=metrics(few()))
    failed = dataclasses.replace(seen, canary_warmup_failed=GATE_FAILED)
    step = advance(SPEC, SLO_MS, status, failed, T0 + timedelta(seconds=5))
    assert step.status is not None and step.status.phase == "RolledBack"
    verdict = step.status.last_verdict
    assert verdict is not None
    assert (verdict.result, verdict.reason) == ("Fail", constants.REASON_CANARY_WARMUP_FAILED)
    assert verdict.message == f"a canary pod failed its warm-up gate: {GATE_FAILED}"
    assert step.status.canary_replicas == 0
    assert [(e.type, e.reason) for e in step.events] == [
        ("Warning", constants.EVENT_CANARY_ROLLED_BACK)
    ]
    assert step.events[0].message.startswith("revision rev-b at step 1: a canary pod failed")


def not_ready(canary_cause: str | None = None) -> RolloutObservation:
    return dataclasses.replace(observe(ready=0), canary_cause=canary_cause)


def test_a_canary_without_a_ready_pod_for_its_progress_deadline_is_rolled_back_with_the_cause() -> (
    None
):
    status = advance(SPEC, SLO_MS, None, not_ready(), T0).status
    assert status is not None
    deadline = SPEC.progress_deadline_seconds
    crash = "CrashLoop: pod svc-canary-1: container runtime keeps crashing (4 restarts)"
    held = advance(SPEC, SLO_MS, status, not_ready(canary_cause=crash), T0 + timedelta(seconds=5))
    assert held.status is not None and held.status.phase == "Progressing"
    verdict = held.status.last_verdict
    assert verdict is not None and verdict.reason == constants.REASON_CANARY_NOT_READY
    assert f"rolled back after {deadline} s without one" in verdict.message
    almost = T0 + timedelta(seconds=5 + deadline - 1)
    same = advance(SPEC, SLO_MS, held.status, not_ready(canary_cause=crash), almost)
    assert same.status == held.status and same.events == []  # no write while it holds
    over = T0 + timedelta(seconds=5 + deadline)
    step = advance(SPEC, SLO_MS, held.status, not_ready(canary_cause=crash), over)
    assert step.status is not None and step.status.phase == "RolledBack"
    verdict = step.status.last_verdict
    assert verdict is not None
    assert (verdict.result, verdict.reason) == ("Fail", constants.REASON_CANARY_PROGRESS_DEADLINE)
    assert verdict.message == (
        f"no canary pod was ready for {deadline} s (progressDeadlineSeconds {deadline}): {crash}"
    )
    quiet = advance(SPEC, SLO_MS, held.status, not_ready(), over)
    assert quiet.status is not None and quiet.status.last_verdict is not None
    assert quiet.status.last_verdict.message.endswith(": the pods showed no cause")


def test_the_progress_deadline_counts_from_when_the_canary_last_lost_its_ready_pods() -> None:
    """A canary that had a ready pod for most of the deadline and then lost it is not rolled
    back on the first pass that sees none."""
    status = started()
    deadline = SPEC.progress_deadline_seconds
    lost_at = T0 + timedelta(seconds=deadline + 30)
    lost = advance(SPEC, SLO_MS, status, not_ready(), lost_at)
    assert lost.status is not None and lost.status.phase == "Progressing"
    assert lost.status.last_verdict is not None
    assert lost.status.last_verdict.at == lost_at
    seen = observe(seen=metrics(few()))
    back = advance(SPEC, SLO_MS, lost.status, seen, lost_at + timedelta(seconds=1))
    assert back.status is not None and back.status.last_verdict is not None
    assert back.status.last_verdict.reason == constants.REASON_CANARY_MEASURING
    again_at = lost_at + timedelta(seconds=deadline)
    again = advance(SPEC, SLO_MS, back.status, not_ready(), again_at)
    assert again.status is not None and again.status.phase == "Progressing"
    assert again.status.last_verdict is not None and again.status.last_verdict.at == again_at


def test_an_operator_restart_mid_step_continues_the_step_from_status() -> None:
    """The status is the state: a new process, given the written status, continues the same
    step from the same start (the window is not restarted)."""
    status = started()
    written = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    reread = RolloutStatus.model_validate(written)
    assert reread == status
    after = advance(SPEC, SLO_MS, reread, observe(seen=metrics()), T0 + timedelta(seconds=61))
    assert after.status is not None and after.status.step == 1


def test_a_spec_change_mid_canary_starts_the_new_revision_at_step_one() -> None:
    status = started()
    moved = advance(SPEC, SLO_MS, status, observe(seen=metrics()), T0 + timedelta(seconds=60))
    assert moved.status is not None and moved.status.step == 1
    changed = advance(
        SPEC, SLO_MS, moved.status, observe(revision="rev-c", ready=0), T0 + timedelta(seconds=70)
    )
    assert changed.status is not None and changed.status.revision == "rev-c"
    assert (changed.status.phase, changed.status.step) == ("Progressing", 0)
    assert "the canary of rev-b ends" in changed.events[0].message


def test_a_spec_back_to_the_stable_version_abandons_the_canary() -> None:
    status = started()
    back = observe(revision="rev-a", stable_matches=True)
    step = advance(SPEC, SLO_MS, status, back, T0 + timedelta(seconds=10))
    assert step.status is not None and step.status.phase == "Abandoned"
    assert step.status.revision == "rev-b"
    assert [e.reason for e in step.events] == [constants.EVENT_CANARY_ABANDONED]
    quiet = advance(SPEC, SLO_MS, step.status, back, T0 + timedelta(seconds=20))
    assert quiet.status == step.status and quiet.events == []
    # ... and coming back to rev-b later is a new canary, judged afresh.
    again = advance(SPEC, SLO_MS, step.status, observe(), T0 + timedelta(seconds=30))
    assert again.status is not None and (again.status.phase, again.status.step) == (
        "Progressing",
        0,
    )


def test_a_promoted_revision_that_comes_back_is_a_new_canary() -> None:
    promoted = started().model_copy(update={"phase": "Promoted"})
    step = advance(SPEC, SLO_MS, promoted, observe(), T0 + timedelta(hours=1))
    assert step.status is not None and step.status.phase == "Progressing"
    assert step.status.step_started_at == T0 + timedelta(hours=1)


def test_the_window_grows_with_the_step_between_its_floor_and_the_step() -> None:
    step = advance(SPEC, SLO_MS, None, observe(ready=0), T0)
    assert step.status is not None
    # Before the step's window starts, the errors and the SLO are read since the step began.
    assert metrics_window(SPEC, step.status, T0 + timedelta(seconds=40)) == 40
    status = started(T0 + timedelta(seconds=30))
    assert metrics_window(SPEC, status, T0 + timedelta(seconds=40)) == 15
    status = started()
    assert metrics_window(SPEC, status, T0 + timedelta(seconds=3)) == 15
    assert metrics_window(SPEC, status, T0 + timedelta(seconds=40)) == 40
    assert metrics_window(SPEC, status, T0 + timedelta(seconds=400)) == 60


@pytest.mark.parametrize(
    ("demand", "share", "maximum", "expected"),
    [
        (1, 50, 10, (1, 1)),
        (1, 25, 10, (3, 1)),
        (1, 10, 10, (9, 1)),
        (4, 50, 10, (2, 2)),
        (10, 10, 20, (9, 1)),
        (20, 10, 30, (18, 2)),
        (1, 10, 5, (5, 1)),  # maxReplicas caps the stable side: the share is then larger
        # A demand the stable side alone would leave off the share: the canary grows with it.
        (5, 50, 10, (3, 3)),  # not 3 and 2 (40 %)
        (9, 50, 10, (5, 5)),  # not 5 and 4 (44 %)
        (1, 40, 10, (3, 2)),  # not 2 and 1 (33 %)
        # Within SHARE_ROUNDING_POINTS: no replica more.
        (5, 25, 10, (4, 1)),  # 20 %
        (11, 10, 20, (10, 1)),  # 9.1 %
        # A stable demand held from the 25 % step (3) at 50 %: 2 and 2, the share kept.
        (3, 50, 10, (2, 2)),
    ],
)
def test_replicas_are_split_for_the_share(
    demand: int, share: int, maximum: int, expected: tuple[int, int]
) -> None:
    assert split_replicas(demand, share, maximum) == expected


def test_the_query_reads_both_tracks_and_parse_tells_them_apart() -> None:
    query = canary_query("ns", "svc", 30)
    assert 'namespace="ns",inferenceservice="svc"' in query
    assert "sum by (kiln_track)" in query and "[30s]" in query
    result = [
        {"metric": {"kiln_signal": "requests", "kiln_track": "canary"}, "value": [0, "100"]},
        {"metric": {"kiln_signal": "errors", "kiln_track": "canary"}, "value": [0, "3"]},
        {"metric": {"kiln_signal": "p99", "kiln_track": "canary"}, "value": [0, "0.02"]},
        {"metric": {"kiln_signal": "requests"}, "value": [0, "900"]},
        {"metric": {"kiln_signal": "p99"}, "value": [0, "NaN"]},
    ]
    seen = parse(result, 30)
    assert seen.canary == TrackSignals(100.0, 3.0, 0.02)
    assert seen.stable == TrackSignals(900.0, 0.0, None)
    assert parse([], 30).canary is None

"""The autoscaler's kopf handler: one loop per InferenceService, evaluating at its own interval.

A daemon (not a timer) because each service sets its own `evaluationIntervalSeconds`. Each pass
is one `k8s.autoscaler.Autoscaler.evaluate`; a change of replicas is announced as an event with
the decision's reason and explanation. Errors are logged and the loop goes on: a failed pass
changes nothing, and the next pass decides from the cluster as it then is. Two metrics on the
operator's own /metrics (`KILN_OPERATOR_METRICS_PORT`) show that every service is evaluated,
and how late: the status itself is written only on a change.
"""

import datetime
import time
from typing import Any

import kopf
from prometheus_client import Counter, Histogram

from kiln_operator import constants
from kiln_operator.handlers.inferenceservice import PROMETHEUS_URL
from kiln_operator.k8s.autoscaler import Autoscaler
from kiln_operator.k8s.client import ApiError
from kiln_operator.k8s.events import post_event

RETRY_SECONDS = 15.0

EVALUATIONS = Counter(
    "kiln_operator_autoscaler_evaluations_total",
    "Autoscaler passes by outcome: decided, skipped (nothing to scale yet), failed.",
    ["outcome"],
)
EVALUATION_LAG = Histogram(
    "kiln_operator_autoscaler_evaluation_lag_seconds",
    "How much later than its evaluationIntervalSeconds a service's pass started after its "
    "previous one (the previous pass's own duration included).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

EVENT_SCALED_UP = "ScaledUp"
EVENT_SCALED_DOWN = "ScaledDown"
EVENT_INVALID_STATE = "InvalidAutoscalerState"


SHARED = "autoscaler"


@kopf.on.startup()
async def autoscaler_startup(memo: kopf.Memo, **_: Any) -> None:
    """A slot in the operator-wide memo for the one Autoscaler. Handlers receive per-object
    shallow copies of the memo, so an attribute set from a handler would stay with one
    InferenceService; this dict is shared by every copy."""
    memo.shared_autoscaler = {}


def shared_autoscaler(memo: Any) -> Autoscaler:
    """The operator's one Autoscaler: its Prometheus sources, memory and own writes are shared
    by every service's loop."""
    slot: dict[str, Autoscaler] = memo.shared_autoscaler
    if SHARED not in slot:
        slot[SHARED] = Autoscaler(memo.kube, memo.cache, PROMETHEUS_URL, memo.platform)
    return slot[SHARED]


def existing_autoscaler(memo: Any) -> Autoscaler | None:
    """The operator's Autoscaler if a service's loop has created it."""
    slot: dict[str, Autoscaler] = memo.get("shared_autoscaler") or {}
    return slot.get(SHARED)


@kopf.on.cleanup()
async def autoscaler_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the Prometheus threads."""
    autoscaler = existing_autoscaler(memo)
    if autoscaler is not None:
        autoscaler.close()


@kopf.daemon(
    constants.GROUP, constants.VERSION, constants.PLURAL,
    cancellation_timeout=5.0, initial_delay=1.0,
)  # fmt: skip
async def inferenceservice_autoscaler(
    *, namespace: str | None, name: str, body: kopf.Body, memo: Any,
    stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any,
) -> None:  # fmt: skip
    """Evaluate, act, sleep for the service's interval; until the service is deleted."""
    autoscaler = shared_autoscaler(memo)
    due: float | None = None
    while not stopped:
        started = time.monotonic()
        if due is not None:
            EVALUATION_LAG.observe(max(0.0, started - due))
        interval = RETRY_SECONDS
        try:
            evaluation = await autoscaler.evaluate(
                namespace or "", name, datetime.datetime.now(datetime.UTC)
            )
        except ApiError as error:
            EVALUATIONS.labels("failed").inc()
            logger.warning(f"autoscaler pass failed: {error}")
        else:
            EVALUATIONS.labels("skipped" if evaluation is None else "decided").inc()
            if evaluation is not None:
                interval = evaluation.interval_seconds
                decision = evaluation.decision
                if evaluation.state_problem:
                    await post_event(
                        memo.kube,
                        dict(body),
                        type="Warning",
                        reason=EVENT_INVALID_STATE,
                        message=evaluation.state_problem,
                    )
                if decision.desired_replicas != evaluation.previous_replicas:
                    up = decision.desired_replicas > evaluation.previous_replicas
                    await post_event(
                        memo.kube,
                        dict(body),
                        type="Normal",
                        reason=EVENT_SCALED_UP if up else EVENT_SCALED_DOWN,
                        message=f"{evaluation.previous_replicas} -> {decision.desired_replicas}"
                        f" ({decision.reason}): {decision.message}",
                    )
        due = started + interval
        await stopped.wait(interval)
    autoscaler.forget(namespace or "", name)

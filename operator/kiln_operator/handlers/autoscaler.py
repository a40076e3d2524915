"""The autoscaler's kopf handlers: its job in the operator's scheduler, one pass per
InferenceService at the service's own `evaluationIntervalSeconds`.

No kopf daemon: the operator-wide scheduler (`k8s.scheduler`, fed by the InferenceService watch
handler) runs every service's pass, so kopf keeps no task, stopper or copy of the object per
service and puts no finalizer on it. Each pass is one `k8s.autoscaler.Autoscaler.evaluate`; a
change of replicas is announced as an event with the decision's reason and explanation. Errors
are logged and the service's passes go on: a failed pass changes nothing, and the next pass
decides from the cluster as it then is. Two metrics on the operator's own /metrics
(`KILN_OPERATOR_METRICS_PORT`) show that every service is evaluated, and how late: the status
itself is written only on a change.
"""

import asyncio
import datetime
import logging
from typing import Any

import kopf
from prometheus_client import Counter, Histogram

from kiln_operator import constants, telemetry
from kiln_operator.handlers.inferenceservice import (
    IMITATED_GPUS,
    PROMETHEUS_URL,
    operator_scheduler,
)
from kiln_operator.k8s.activator import Activators
from kiln_operator.k8s.autoscaler import Autoscaler
from kiln_operator.k8s.client import RequestFailed
from kiln_operator.k8s.events import post_event
from kiln_operator.k8s.resources import INFERENCE_SERVICES
from kiln_operator.k8s.scheduler import Job

RETRY_SECONDS = 15.0
"""Until the next pass of a service with nothing to scale yet, or after a failed pass."""
FIRST_PASS_SECONDS = 1.0
"""From a service's first sighting to its first pass."""

EVALUATIONS = Counter(
    "kiln_operator_autoscaler_evaluations_total",
    "Autoscaler passes by outcome: decided, skipped (nothing to scale yet), failed.",
    ["outcome"],
)
EVALUATION_LAG = Histogram(
    "kiln_operator_autoscaler_evaluation_lag_seconds",
    "How much later than due a service's pass started: its evaluationIntervalSeconds after "
    "the start of its previous pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

EVENT_SCALED_UP = "ScaledUp"
EVENT_SCALED_DOWN = "ScaledDown"
EVENT_INVALID_STATE = "InvalidAutoscalerState"
EVENT_LEARNED_FLOOR = "LearnedFloorChanged"

logger = logging.getLogger(__name__)


SHARED = "autoscaler"
JOB = "autoscaler"


@kopf.on.startup()
async def autoscaler_startup(memo: kopf.Memo, **_: Any) -> None:
    """A slot in the operator-wide memo for the one Autoscaler (handlers receive per-object
    shallow copies of the memo, so an attribute set later would stay with one InferenceService;
    this dict is shared by every copy), and the autoscaler's pass for every service in the
    operator's scheduler."""
    memo.shared_autoscaler = {}

    async def evaluate(namespace: str, name: str) -> float:
        return await _evaluate(memo, namespace, name)

    def forget(namespace: str, name: str) -> None:
        autoscaler = existing_autoscaler(memo)
        if autoscaler is not None:
            autoscaler.forget(namespace, name)

    scheduler = operator_scheduler(memo)
    scheduler.add_job(
        Job(
            JOB,
            run=evaluate,
            first_delay=lambda namespace, name: FIRST_PASS_SECONDS,
            retry_seconds=RETRY_SECONDS,
            lag=EVALUATION_LAG.observe,
            forget=forget,
        )
    )
    activators: Activators | None = memo.get("activators")
    if activators is not None:
        # a request held at zero wakes its service's pass now, not at its next interval
        memo.demand_watch = asyncio.create_task(
            activators.watch_demand(lambda key: scheduler.run_soon(JOB, *key)),
            name="kiln-activator-demand",
        )
        memo.demand_watch.add_done_callback(_report_end)


def _report_end(task: "asyncio.Task[None]") -> None:
    """The demand watch runs until the operator stops: an end by an error is a bug, said loudly
    (services at zero then wake at their next pass only)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error("the activators' demand watch ended", exc_info=error)


def shared_autoscaler(memo: Any) -> Autoscaler:
    """The operator's one Autoscaler: its Prometheus sources, memory and own writes are shared
    by every service's passes."""
    slot: dict[str, Autoscaler] = memo.shared_autoscaler
    if SHARED not in slot:
        slot[SHARED] = Autoscaler(
            memo.kube,
            memo.cache,
            PROMETHEUS_URL,
            memo.platform,
            activators=memo.get("activators"),
            imitated_gpus=IMITATED_GPUS,
        )
    return slot[SHARED]


def existing_autoscaler(memo: Any) -> Autoscaler | None:
    """The operator's Autoscaler if a service's pass has created it."""
    slot: dict[str, Autoscaler] = memo.get("shared_autoscaler") or {}
    return slot.get(SHARED)


@kopf.on.cleanup()
async def autoscaler_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the Prometheus threads and the activators' demand watch."""
    watch: asyncio.Task[None] | None = memo.get("demand_watch")
    if watch is not None:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    autoscaler = existing_autoscaler(memo)
    if autoscaler is not None:
        autoscaler.close()
    activators = memo.get("activators")
    if activators is not None:
        await activators.close()


async def _evaluate(memo: Any, namespace: str, name: str) -> float:
    """Evaluate and act once; the seconds until the service's next pass."""
    autoscaler = shared_autoscaler(memo)
    try:
        evaluation = await autoscaler.evaluate(namespace, name, datetime.datetime.now(datetime.UTC))
    except RequestFailed as error:  # refused, or never answered: the next pass decides afresh
        EVALUATIONS.labels("failed").inc()
        logger.warning(f"autoscaler pass of {namespace}/{name} failed: {error}")
        return RETRY_SECONDS
    EVALUATIONS.labels("skipped" if evaluation is None else "decided").inc()
    if evaluation is None:
        return RETRY_SECONDS
    decision = evaluation.decision
    telemetry.observe_decision(
        namespace,
        name,
        reason=decision.reason,
        desired=decision.desired_replicas,
        previous=evaluation.previous_replicas,
        slo_p99_seconds=evaluation.slo_p99_seconds,
    )
    body = memo.cache.get(INFERENCE_SERVICES.plural, namespace, name)
    if body is not None and evaluation.state_problem:
        await post_event(
            memo.kube,
            body,
            type="Warning",
            reason=EVENT_INVALID_STATE,
            message=evaluation.state_problem,
        )
    if body is not None and evaluation.learned_change:
        await post_event(
            memo.kube,
            body,
            type="Normal",
            reason=EVENT_LEARNED_FLOOR,
            message=evaluation.learned_change,
        )
    for event in evaluation.rollout_events if body is not None else ():
        await post_event(
            memo.kube, body, type=event.type, reason=event.reason, message=event.message
        )
    if evaluation.rollout_changed and memo.get("workqueue") is not None:
        # status.rollout says which Deployment runs what; its write is the autoscaler's own, so
        # its watch event queues nothing: ask the reconcile loop directly.
        memo.workqueue.add(namespace, name, trigger="rollout")
    if body is not None and decision.desired_replicas != evaluation.previous_replicas:
        outside = f"{evaluation.changed_outside}; " if evaluation.changed_outside else ""
        await post_event(
            memo.kube,
            body,
            type="Normal",
            reason=scaling_event(evaluation.previous_replicas, decision.desired_replicas),
            message=f"{evaluation.previous_replicas} -> {decision.desired_replicas}"
            f" ({decision.reason}): {outside}{decision.message}",
        )
    return evaluation.interval_seconds


def scaling_event(previous: int, desired: int) -> str:
    """The event reason of a change of replicas: to and from zero are sleep and wake."""
    if desired == 0:
        return constants.EVENT_SCALED_TO_ZERO
    if previous == 0:
        return constants.EVENT_WAKING_UP
    return EVENT_SCALED_UP if desired > previous else EVENT_SCALED_DOWN

"""The warm-up gate's kopf handlers: warm each new Kiln pod up, then open its readiness gate.

Every Kiln pod carries a readinessGates entry for `serving.kiln.dev/warmed-up`, so it is not
Ready — not in its Service's endpoints — until this handler sets that condition True, after
real-shaped requests through the pod's own address met the p99 bound (`warmup.plan`).

One asyncio task per pod UID does the work. A low-level event handler (no finalizer on pods, so
a stopped operator never blocks pod deletion) starts a task when a pod needs warming and cancels
it when the pod is deleted. The pod condition is the only state: an operator restarted
mid-attempt finds the condition at WarmingUp and starts the pod's warm-up again; a decided pod
is left alone. Peering keeps a second operator from warming the same pod.
"""

import asyncio
import datetime
import logging
import os
import time
from typing import Any, cast

import kopf
from prometheus_client import Counter, Histogram, start_http_server

from kiln_operator import constants, telemetry
from kiln_operator.handlers.inferenceservice import WARMUP_BUDGET_BYTES
from kiln_operator.k8s.activator import Activators
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import ApiError, KubeClient
from kiln_operator.k8s.events import post_event
from kiln_operator.k8s.platform import PlatformObjects
from kiln_operator.k8s.resources import INFERENCE_SERVICES, PODS
from kiln_operator.status.download import model_download, model_download_failure
from kiln_operator.warmup import plan as warmup
from kiln_operator.warmup.budget import ByteBudget
from kiln_operator.warmup.podstate import (
    cold_start_seconds,
    condition_patch,
    needs_warmup,
    ready_addresses,
    summarize,
    summary_status,
    verdict_outlived_its_container,
)

logger = logging.getLogger(__name__)

FIELD_MANAGER = "kiln-warmup-gate"
"""The gate's server-side-apply field manager: it owns status.warmup of InferenceServices."""
POD_LABELS = {
    constants.LABEL_MANAGED_BY: constants.MANAGER,
    constants.LABEL_COMPONENT: constants.COMPONENT_PREDICTOR,
}
METRICS_PORT = int(os.environ.get("KILN_OPERATOR_METRICS_PORT", "0"))
"""Port of the operator's own /metrics (warm-up telemetry); 0 serves none."""

COLD_START = Histogram(
    "kiln_operator_pod_cold_start_seconds",
    "Time from a Kiln pod's creation until it passed warm-up.",
    ["namespace", "inferenceservice"],
    buckets=(1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600),
)
WARMUP_P99 = Histogram(
    "kiln_operator_warmup_p99_seconds",
    "Judged p99 latency of each warm-up attempt, per pod attempt.",
    ["namespace", "inferenceservice"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DOWNLOAD_SECONDS = Histogram(
    "kiln_operator_model_download_seconds",
    "Time the fetch init container of a warmed-up Kiln pod took to fetch its model.",
    ["namespace", "inferenceservice"],
    buckets=(1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 1800),
)
DOWNLOAD_BYTES = Histogram(
    "kiln_operator_model_download_bytes",
    "Bytes the fetch init container of a warmed-up Kiln pod downloaded (0: copied from the cache).",
    ["namespace", "inferenceservice"],
    buckets=(0, 2**20, 2**24, 2**26, 2**28, 2**30, 2**32, 2**34, 2**36),
)
ATTEMPTS = Counter(
    "kiln_operator_warmup_attempts_total",
    "Warm-up attempts by outcome reason.",
    ["namespace", "inferenceservice", "reason"],
)
telemetry.register_per_service(COLD_START, WARMUP_P99, DOWNLOAD_SECONDS, DOWNLOAD_BYTES, ATTEMPTS)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@kopf.on.startup()
async def warmup_gate_startup(memo: kopf.Memo, **_: Any) -> None:
    """Keep the per-pod tasks and the shared warm-up byte budget in the memo; serve the
    operator's metrics if a port is set."""
    memo.warmup_tasks = {}
    memo.downloads_observed = set()
    memo.warmup_budget = ByteBudget(WARMUP_BUDGET_BYTES)
    if METRICS_PORT:
        start_http_server(METRICS_PORT)


@kopf.on.cleanup()
async def warmup_gate_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Cancel attempts under way: the conditions stay at WarmingUp for the next operator."""
    for task in memo.warmup_tasks.values():
        task.cancel()


@kopf.on.event("", "v1", "pods", labels=POD_LABELS)
async def pod_warmup_gate(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    """Cache the pod; start its warm-up once it needs one; stop it when the pod goes away."""
    memo.cache.observe(PODS.plural, type, body)
    pod = cast(dict[str, Any], dict(body))
    service = pod["metadata"].get("labels", {}).get(constants.LABEL_INFERENCESERVICE)
    listing = type is None  # the watch's first listing after a start: read afresh
    if service and model_download_failure([pod]) is not None:
        # The Deployment's status does not change when a pod cannot fetch its model.
        memo.workqueue.add(
            pod["metadata"]["namespace"], service, trigger="model download", fresh=listing
        )
    uid = pod["metadata"]["uid"]
    _queue_status(memo, pod, fresh=listing)
    tasks: dict[str, asyncio.Task[None]] = memo.warmup_tasks
    if type == "DELETED" or pod["metadata"].get("deletionTimestamp"):
        if (task := tasks.pop(uid, None)) is not None:
            task.cancel()
        if type == "DELETED":
            memo.downloads_observed.discard(uid)
            service = pod["metadata"].get("labels", {}).get(constants.LABEL_INFERENCESERVICE)
            if service:
                await publish_summary(memo.kube, memo.cache, pod["metadata"]["namespace"], service)
        return
    if uid not in tasks and verdict_outlived_its_container(pod):
        # Before the restarted container turns ready: the old verdict must not admit it.
        namespace, name, now = pod["metadata"]["namespace"], pod["metadata"]["name"], _now()
        patch = condition_patch(
            False, warmup.REASON_WARMING, "the runtime container restarted: warming up again", now
        )
        await memo.kube.strategic_patch_status(PODS, namespace, name, patch)
        # The kubelet computes Ready, when the restarted container's readiness probe passes,
        # from its own cached copy of the pod's conditions, and a status-only change does not
        # refresh that copy: it would admit the pod on the old verdict (seen on the real node:
        # Ready 0.1 s before the new verdict). A change of the pod's metadata makes the kubelet
        # sync the pod and read the closed gate.
        reopened = {constants.ANNOTATION_GATE_REOPENED: now.isoformat(timespec="seconds")}
        await memo.kube.merge_patch(PODS, namespace, name, {"metadata": {"annotations": reopened}})
        return  # the patches come back as events; needs_warmup takes it from there
    if uid in tasks or not needs_warmup(pod):
        return
    task = asyncio.create_task(
        _warm_up(
            memo.kube,
            memo.cache,
            memo.warmup_budget,
            memo.downloads_observed,
            pod,
            platform=memo.platform,
            activators=memo.get("activators"),
        ),
        name=f"warm-up {uid}",
    )
    tasks[uid] = task
    task.add_done_callback(lambda _: tasks.pop(uid, None))


def _queue_status(memo: Any, pod: dict[str, Any], *, fresh: bool) -> None:
    """A pod that does not serve (pending, crashing, warming up, gone) may change why its
    InferenceService is not Ready: queue a reconcile, which reads the pod from the cache. A pod
    turning Ready changes its Deployment's status, whose event queues one already. `fresh` for
    the pods watch's listing after a start: the watches list in no fixed order, and a reconcile
    from a cache that has not yet seen the service's children would try to create them again
    (as the InferenceService handlers' _queue_reconcile)."""
    service = pod["metadata"].get("labels", {}).get(constants.LABEL_INFERENCESERVICE)
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    workqueue = getattr(memo, "workqueue", None)
    if service and not ready and workqueue is not None:
        workqueue.add(pod["metadata"]["namespace"], service, trigger="pod", fresh=fresh)


async def publish_summary(
    kube: KubeClient, cache: ObjectCache, namespace: str, service: str
) -> None:
    """Write the service's `status.warmup` (warm and failed pods, cold starts) if it changed.

    Reads the API server, not the cache: this follows the gate's own pod write, which the pod
    watch may not have delivered yet, and runs once per pod decision."""
    owner = await kube.get(INFERENCE_SERVICES, namespace, service)
    if owner is None:
        return
    pods = await kube.list(PODS, namespace, f"{constants.LABEL_INFERENCESERVICE}={service}")
    wanted = summary_status(summarize(pods))
    if (owner.get("status") or {}).get("warmup") != wanted:
        written = await kube.apply_status(
            INFERENCE_SERVICES, namespace, service, {"warmup": wanted}, manager=FIELD_MANAGER
        )
        cache.store(INFERENCE_SERVICES.plural, written)


async def _release_held(
    activators: Activators,
    cache: ObjectCache,
    decided: dict[str, Any],
    namespace: str,
    service: str,
) -> None:
    """The pod just passed its gate: the activator releases what it holds for the service to
    it now, not when the pod's watch event reaches the reconcile loop (the cache keeps the
    decided pod, so a reconcile that runs first reports the same backends)."""
    cache.store(PODS.plural, decided)
    await activators.report(
        (namespace, service), *ready_addresses(cache.pods_of(namespace, service))
    )


def observe_warm_pod(pod: dict[str, Any], service: str, downloads_observed: set[str]) -> None:
    """Observe a pod that just passed warm-up: its cold start, and its model fetch once.

    A runtime container that restarts is warmed up again, but its pod's init container does
    not fetch again: ``downloads_observed`` (pod UIDs, dropped when the pod is deleted) keeps the
    download histograms at one observation per pod."""
    namespace = pod["metadata"]["namespace"]
    if (seconds := cold_start_seconds(pod)) is not None:
        COLD_START.labels(namespace, service).observe(seconds)
    uid = pod["metadata"]["uid"]
    if uid in downloads_observed or (download := model_download(pod)) is None:
        return
    downloads_observed.add(uid)
    DOWNLOAD_SECONDS.labels(namespace, service).observe(download.seconds)
    DOWNLOAD_BYTES.labels(namespace, service).observe(download.bytes)


async def _warm_up(
    kube: KubeClient,
    cache: ObjectCache,
    budget: ByteBudget,
    downloads_observed: set[str],
    pod: dict[str, Any],
    *,
    platform: PlatformObjects,
    activators: Activators | None,
) -> None:
    meta = pod["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    service = meta.get("labels", {}).get(constants.LABEL_INFERENCESERVICE, "")
    try:
        await _gate(
            kube,
            cache,
            budget,
            downloads_observed,
            pod,
            platform=platform,
            activators=activators,
            namespace=namespace,
            name=name,
            service=service,
        )
    except asyncio.CancelledError:
        raise
    except ApiError as error:
        if not error.is_not_found:  # a pod deleted mid-attempt needs nothing more
            logger.error("warm-up of pod %s/%s: %s", namespace, name, error)
    except Exception:
        logger.exception("warm-up of pod %s/%s failed unexpectedly", namespace, name)


async def _gate(
    kube: KubeClient,
    cache: ObjectCache,
    budget: ByteBudget,
    downloads_observed: set[str],
    pod: dict[str, Any],
    *,
    platform: PlatformObjects,
    activators: Activators | None,
    namespace: str,
    name: str,
    service: str,
) -> None:
    owner = await kube.get(INFERENCE_SERVICES, namespace, service)
    if owner is None:
        return
    spec = platform.effective(owner, budget.capacity).spec
    if spec is None:
        return  # the reconcile loop reports it; the last valid template keeps its pods
    plan = warmup.plan_for(spec, spec.model_name(service))

    async def set_condition(passed: bool, reason: str, message: str) -> dict[str, Any]:
        patch = condition_patch(passed, reason, message, _now())
        return await kube.strategic_patch_status(PODS, namespace, name, patch)

    if not plan.enabled:
        await set_condition(True, warmup.REASON_GATE_DISABLED, "spec.warmup.requests is 0")
        return
    # Imported at the first warm-up, not at start-up: tritonclient and numpy take 44 MB of RSS
    # (measured), which an operator whose services warm up no pod never needs.
    from kiln_operator.warmup.probe import run_attempt

    attempts = plan.retries + 1
    verdict: warmup.Verdict | None = None
    for attempt in range(1, attempts + 1):
        await set_condition(
            False,
            warmup.REASON_WARMING,
            f"attempt {attempt}/{attempts}: {plan.requests} requests at concurrency "
            f"{plan.in_flight_within(budget.capacity)}, p99 bound {plan.p99_bound_ms:g} ms",
        )
        started = time.perf_counter()
        result = await run_attempt(
            plan, pod["status"]["podIP"], constants.GRPC_PORT, constants.HTTP_PORT, budget
        )
        verdict = warmup.judge(plan, result)
        ATTEMPTS.labels(namespace, service, verdict.reason).inc()
        telemetry.WARMUP_ATTEMPT_DURATION.labels("passed" if verdict.passed else "failed").observe(
            time.perf_counter() - started
        )
        if verdict.p99_ms is not None:
            WARMUP_P99.labels(namespace, service).observe(verdict.p99_ms / 1000)
        logger.info("pod %s/%s attempt %d: %s", namespace, name, attempt, verdict.message)
        if verdict.passed:
            break
        if attempt < attempts:
            await asyncio.sleep(warmup.backoff_seconds(attempt))
    assert verdict is not None
    decided = await set_condition(verdict.passed, verdict.reason, verdict.message)
    if verdict.passed and activators is not None and spec.autoscaling.min_replicas == 0:
        await _release_held(activators, cache, decided, namespace, service)
    telemetry.WARMUP_GATES.labels(
        namespace, service, "passed" if verdict.passed else "failed"
    ).inc()
    await publish_summary(kube, cache, namespace, service)
    if verdict.passed:
        warmed = await kube.get(PODS, namespace, name)
        if warmed is not None:
            observe_warm_pod(warmed, service, downloads_observed)
    else:
        await post_event(
            kube,
            {"apiVersion": "v1", "kind": "Pod", **pod},
            type="Warning",
            reason=verdict.reason,
            message=f"warm-up failed after {attempts} attempts: {verdict.message}",
        )

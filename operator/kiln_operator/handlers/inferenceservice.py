"""kopf handlers for InferenceServices and their children.

Level-based, as controller-runtime: every watch event of an InferenceService (the initial
listing after a start included), every change to a child Deployment, Service or
PodDisruptionBudget, and the periodic resync queue the same reconcile in a `WorkQueue`,
whose workers run it (a failed one again, with backoff). The handlers return at once, so kopf
never holds a backlog of events. No create/update handlers: kopf would keep a copy of every
spec in an annotation (a write per change, and a deep copy per event) to tell the two apart,
and a level-based reconcile needs no such difference. Every watch event of these kinds also
feeds the operator's ObjectCache, from which the reconcile loop, the autoscaler and the warm-up
gate read. The InferenceService events also keep the operator's `Scheduler` (`k8s.scheduler`)
tracking every live service: it runs the resync here and the autoscaler's passes. Nothing
here is a kopf daemon or timer, so kopf puts no finalizer on InferenceServices, and removes the
one an earlier version's daemons left (`kopf.zalando.org/KopfFinalizerMarker`) at the first
event of each. Settings (peering, posting) are set at start-up here too.
"""

import logging
import os
import time
import zlib
from collections.abc import Iterable
from typing import Any

import kopf

from kiln_operator import constants, telemetry
from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES
from kiln_operator.k8s.activator import Activators
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import KubeClient, load_configuration
from kiln_operator.k8s.events import post_event
from kiln_operator.k8s.peering import ensure_peering_object, kopf_pause_state
from kiln_operator.k8s.platform import PlatformObjects
from kiln_operator.k8s.reconciler import ChildrenNotApplied, Outcome, Reconciler
from kiln_operator.k8s.scheduler import Job, Scheduler
from kiln_operator.k8s.workqueue import Request, WorkQueue


def operator_flag(name: str) -> bool:
    """A boolean setting of the operator's environment: `true`, or `false`/unset. Anything else
    stops the start, naming the variable (a typo must not silently leave a setting off)."""
    value = os.environ.get(name, "").strip().lower()
    if value not in ("", "true", "false"):
        raise ValueError(f"{name} must be 'true' or 'false', not {value!r}")
    return value == "true"


RECONCILE_WORKERS = int(os.environ.get("KILN_RECONCILE_WORKERS", "64"))
"""Reconciles running at once (controller-runtime's MaxConcurrentReconciles). Most of a new
service's reconcile waits for its Service's cluster IP (seconds when many are allocated at
once), so this is wider than the API server's CPUs alone would need; the API connection pool
matches it."""
RESYNC_SECONDS = float(os.environ.get("KILN_RESYNC_SECONDS", "300"))
"""How often every InferenceService is reconciled without a trigger, from the API server (drift
the watch missed). A service's first resync comes between half and one and a half of this after
its first sighting, at a point its name fixes: services created (or listed) together resync
spread over the whole interval, not in the same second."""
PEERING_LIFETIME_SECONDS = int(os.environ.get("KILN_PEERING_LIFETIME_SECONDS", "60"))
"""How long a silent peer counts as alive: the failover time when the active replica dies."""
WARMUP_BUDGET_BYTES = int(
    os.environ.get("KILN_WARMUP_BUDGET_BYTES", str(DEFAULT_WARMUP_BUDGET_BYTES))
)
"""Bytes of warm-up tensor data the operator holds at once, all services together; a spec
whose single warm-up request needs more is refused (InvalidSpec naming spec.model.inputs)."""
PROMETHEUS_URL = os.environ.get("KILN_PROMETHEUS_URL") or None
ACTIVATOR_CONTROL = os.environ.get("KILN_ACTIVATOR_CONTROL") or None
"""host:port of Kiln's activator pods' control port (the chart's headless Service): services at
minReplicas 0 send their traffic to the activator while no pod serves, the autoscaler reads the
requests it holds there, and their ready pods are reported there (docs/scale-to-zero.md).
Unset: no activator; every Service selects its pods, and a service at zero is woken only by a
pre-warm window."""
"""The operator's default Prometheus; `spec.autoscaling.prometheusUrl` overrides it where the
platform's policies allow."""
ALLOWED_PROMETHEUS_URLS = tuple(
    entry.strip()
    for entry in os.environ.get("KILN_ALLOWED_PROMETHEUS_URLS", "").split(",")
    if entry.strip()
)
"""Prometheus endpoints a service may name besides the operator's own, comma-separated (see
InferencePolicy's allowedPrometheusUrls for the matching rule); ClusterInferencePolicies add
their own. Empty: services may name only the Prometheus URLs the platform set elsewhere."""
IMITATED_GPUS = operator_flag(constants.ENV_IMITATED_GPUS)
"""Whether this cluster's GPUs are imitated (constants.ENV_IMITATED_GPUS): GPU pods' runtimes are
then told to run on CPU. Only for clusters without GPUs that test Kiln (the local cluster, kind)."""
OTHER_CONNECTIONS = 16
"""Open API connections of the operator's other client (autoscaler, warm-up gate, events,
profiles): it has few requests in flight, and each open connection holds a 256 KiB TLS read
buffer. With this pool as wide as the reconcile loop's, 1,000 new services left 146
connections open, 18 MiB of such buffers (docs/benchmarks/operator.md)."""
RECONCILE_COMPONENT = "reconcile"
"""User agent suffix of the reconcile loop's API client (kiln-operator/reconcile)."""
CHILD_LABELS = {constants.LABEL_MANAGED_BY: constants.MANAGER}
WATCHED_KINDS_OF_OTHERS = (
    ("apps", "deployments"),
    ("v1", "services"),
    ("policy", "poddisruptionbudgets"),
    ("v1", "pods"),
)
"""Kinds the operator watches that are not its own: the API server sends it only the objects
labelled as Kiln's (`settings.watching.label_selectors`). kopf's `labels=` on a handler filters
in the operator, after the API server has encoded and sent every Deployment, Service, PDB and
pod of the watched namespaces (every one in the cluster, when it serves all) and kopf has parsed
each event. A child that lost the label is not seen by its watch; the periodic resync reads it
from the API server and puts the label back."""

logger = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf builds one from every event of every watched object (a deep copy of
    the whole body) for create/update/delete handlers to tell changes apart; this operator has
    none (see above), and the copies took a tenth of its CPU with 1,000 new services (py-spy).
    Every object's essence is empty, so kopf finds no change to hand to such handlers."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return {}

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing to keep."""


def tune_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for a level-based operator that watches only what it owns."""
    settings.posting.level = logging.WARNING
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.reporting_component = constants.MANAGER
    settings.posting.event_name_prefix = "kiln-"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    for kind in WATCHED_KINDS_OF_OTHERS:
        settings.watching.label_selectors[kind] = ",".join(
            f"{key}={value}" for key, value in CHILD_LABELS.items()
        )
    settings.networking.request_timeout = 60
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Connect to the API server and tune kopf for a level-based operator."""
    tune_kopf(settings)
    configuration = await load_configuration()
    memo.kube = KubeClient(configuration, connections=OTHER_CONNECTIONS)
    memo.reconcile_kube = KubeClient(configuration, component=RECONCILE_COMPONENT)
    memo.cache = ObjectCache()
    memo.platform = PlatformObjects(PROMETHEUS_URL, ALLOWED_PROMETHEUS_URLS, WARMUP_BUDGET_BYTES)
    await memo.platform.prime(memo.kube, list(memo.get("namespaces") or []) or None)
    if IMITATED_GPUS:
        logger.warning(
            "%s is on: GPU pods request GPUs but their runtime runs on CPU",
            constants.ENV_IMITATED_GPUS,
        )
    memo.activators = Activators(ACTIVATOR_CONTROL) if ACTIVATOR_CONTROL else None
    memo.reconciler = Reconciler(
        memo.reconcile_kube,
        memo.cache,
        memo.platform,
        imitated_gpus=IMITATED_GPUS,
        activators=memo.activators,
    )

    async def reconcile(namespace: str, name: str, request: Request) -> None:
        started = time.perf_counter()
        try:
            outcome = await memo.reconciler.reconcile(namespace, name, fresh=request.fresh)
        except Exception as error:
            reason = telemetry.error_reason(error)
            telemetry.observe_reconcile(
                request.trigger, "error", reason, time.perf_counter() - started
            )
            raise
        result, reason = telemetry.reconcile_outcome(
            writes=bool(outcome.writes),
            deleted=not outcome.body,
            spec_error_reason=outcome.spec_error_reason,
            child_problem=outcome.child_problems[0].reason if outcome.child_problems else None,
        )
        telemetry.observe_reconcile(request.trigger, result, reason, time.perf_counter() - started)
        if outcome.conditions:
            telemetry.observe_conditions(namespace, name, outcome.conditions)
        await _announce(memo.reconcile_kube, outcome, request.trigger)
        if outcome.child_problems:
            raise ChildrenNotApplied(outcome)  # the work queue retries with backoff
        if request.trigger == "resync":
            logger.info("resynced %s/%s", namespace, name)

    memo.workqueue = WorkQueue(reconcile, workers=RECONCILE_WORKERS, paused=kopf_pause_state())
    memo.workqueue.start()
    queue: WorkQueue = memo.workqueue
    telemetry.watch_workqueue(lambda: len(queue), queue.oldest_seconds, lambda: queue.active)

    async def resync(namespace: str, name: str) -> float:
        memo.workqueue.add(namespace, name, trigger="resync", fresh=True)
        return RESYNC_SECONDS

    scheduler = operator_scheduler(memo)
    scheduler.add_job(
        Job("resync", run=resync, first_delay=_resync_phase, retry_seconds=RESYNC_SECONDS)
    )
    scheduler.start()
    if not settings.peering.standalone:
        scopes: list[str | None] = list(memo.get("namespaces") or []) or [None]
        for scope in scopes:
            if await ensure_peering_object(memo.kube, settings.peering.name, scope):
                logger.info(
                    "created peering object %s (%s)", settings.peering.name, scope or "cluster"
                )


def operator_scheduler(memo: Any) -> Scheduler:
    """The operator's one Scheduler (made by the first startup handler that asks for it), which
    acts only while kopf has not paused the operator."""
    if memo.get("scheduler") is None:
        memo.scheduler = Scheduler(kopf_pause_state())
    scheduler: Scheduler = memo.scheduler
    return scheduler


def _resync_phase(namespace: str, name: str) -> float:
    """Seconds from a service's first sighting to its first resync: RESYNC_SECONDS times a
    fraction in [0.5, 1.5) that the name fixes (the same in every replica and restart)."""
    fraction = zlib.crc32(f"{namespace}/{name}".encode()) / 2**32
    return RESYNC_SECONDS * (0.5 + fraction)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the scheduler and the reconcile workers, close the API connections."""
    await memo.scheduler.close()
    await memo.workqueue.close()
    await memo.kube.close()
    await memo.reconcile_kube.close()


def _namespaced(namespace: str | None) -> str:
    if namespace is None:
        raise kopf.PermanentError("InferenceServices and their children are namespaced")
    return namespace


async def _announce(kube: KubeClient, outcome: Outcome, trigger: str) -> None:
    """Log each write with what triggered it (the benchmark counts the resync's), post events."""
    for line in outcome.writes:
        logger.info(f"{line} [{trigger}]")
    for event in outcome.events:
        await post_event(
            kube, outcome.body, type=event.type, reason=event.reason, message=event.message
        )


@kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL)
async def inferenceservice_event(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    meta: kopf.Meta,
    memo: Any,
    **_: Any,
) -> None:
    """Cache the newest copy, keep the scheduler tracking the service while it lives, and queue
    a reconcile, unless the event only echoes the reconcile loop's or the autoscaler's own write
    (a listing after a start reads afresh: see _queue_reconcile)."""
    memo.cache.observe(constants.PLURAL, type, body)
    ns = _namespaced(namespace)
    if type == "DELETED" or meta.get("deletionTimestamp"):
        memo.scheduler.untrack(ns, name)  # no more autoscaler passes or resyncs
        memo.reconciler.forget(ns, name)  # the garbage collector removes the children
        memo.workqueue.forget(ns, name)
        telemetry.forget_service(ns, name)
        return
    memo.scheduler.track(ns, name)
    version = meta.get("resourceVersion")
    if type is not None and memo.reconciler.is_own_write(constants.PLURAL, ns, name, version):
        return
    # The autoscaler's status and state writes: nothing to reconcile. Looked up, not imported:
    # importing its module would register its handlers in a reconcile-only operator.
    autoscaler = (memo.get("shared_autoscaler") or {}).get("autoscaler")
    if type is not None and autoscaler is not None and autoscaler.is_own_write(ns, name, version):
        return
    _queue_reconcile(memo, ns, name, type, trigger="spec")


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS)
async def child_changed(
    *,
    type: str | None,
    namespace: str | None,
    name: str,
    labels: kopf.Labels,
    meta: kopf.Meta,
    body: kopf.Body,
    resource: kopf.Resource,
    memo: Any,
    **_: Any,
) -> None:
    """A child changed (rollout progress, drift, deletion): cache it and queue a reconcile of
    its InferenceService, unless the event only echoes the operator's own write (a listing
    after a start reads afresh: see _queue_reconcile)."""
    memo.cache.observe(resource.plural, type, body)
    parent = labels.get(constants.LABEL_INFERENCESERVICE)
    if not parent:
        return
    echo = memo.reconciler.is_own_write(
        resource.plural, _namespaced(namespace), name, meta.get("resourceVersion")
    )
    if echo and type != "DELETED":
        return
    _queue_reconcile(memo, _namespaced(namespace), parent, type, trigger="child")


def _queue_reconcile(memo: Any, namespace: str, name: str, event: str | None, trigger: str) -> None:
    """Queue a reconcile of the InferenceService. An event of a watch's initial listing after
    a start (type None) asks for a fresh read: the watches list in no fixed order, and a
    reconcile from a cache that has not yet seen the children would try to create them again."""
    listing = event is None
    memo.workqueue.add(namespace, name, trigger="listing" if listing else trigger, fresh=listing)

"""kopf handlers for InferenceServices and their children.

Level-based, as controller-runtime: every watch event of an InferenceService (the initial
listing after a start included), every change to a child Deployment, Service or
PodDisruptionBudget, and the periodic resync timer run the same reconcile; a failed one is
queued again with backoff (`Requeue`). No create/update handlers: kopf would keep a copy of
every spec in an annotation (a write per change, and a deep copy per event) to tell the two
apart, and a level-based reconcile needs no such difference. Every watch event of these kinds
also feeds the operator's ObjectCache, from which the reconcile loop, the autoscaler and the
warm-up gate read. Settings (peering, posting) are set at start-up here too.
"""

import logging
import os
from typing import Any, cast

import kopf

from kiln_operator import constants
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import KubeClient, load_configuration
from kiln_operator.k8s.peering import ensure_peering_object
from kiln_operator.k8s.reconciler import Outcome, Reconciler
from kiln_operator.k8s.requeue import Requeue

RESYNC_SECONDS = float(os.environ.get("KILN_RESYNC_SECONDS", "300"))
"""How often every InferenceService is reconciled without a trigger (drift the watch missed)."""
PEERING_LIFETIME_SECONDS = int(os.environ.get("KILN_PEERING_LIFETIME_SECONDS", "60"))
"""How long a silent peer counts as alive: the failover time when the active replica dies."""
RECONCILE_COMPONENT = "reconcile"
"""User agent suffix of the reconcile loop's API client (kiln-operator/reconcile)."""
CHILD_LABELS = {constants.LABEL_MANAGED_BY: constants.MANAGER}

logger = logging.getLogger(__name__)


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Connect to the API server and tune kopf for a level-based operator."""
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = constants.MANAGER
    settings.posting.event_name_prefix = "kiln-"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    configuration = await load_configuration()
    memo.kube = KubeClient(configuration)
    memo.reconcile_kube = KubeClient(configuration, component=RECONCILE_COMPONENT)
    memo.cache = ObjectCache()
    memo.reconciler = Reconciler(memo.reconcile_kube, memo.cache)

    async def retry(namespace: str, name: str) -> None:
        await _reconcile(memo, namespace, name, logger, trigger="retry")

    memo.requeue = Requeue(retry)
    if not settings.peering.standalone:
        scopes: list[str | None] = list(memo.get("namespaces") or []) or [None]
        for scope in scopes:
            if await ensure_peering_object(memo.kube, settings.peering.name, scope):
                logger.info(
                    "created peering object %s (%s)", settings.peering.name, scope or "cluster"
                )


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop pending retries, close the API connections."""
    await memo.requeue.close()
    await memo.kube.close()
    await memo.reconcile_kube.close()


def _namespaced(namespace: str | None) -> str:
    if namespace is None:
        raise kopf.PermanentError("InferenceServices and their children are namespaced")
    return namespace


def _announce(outcome: Outcome, logger: kopf.Logger | logging.Logger, trigger: str) -> None:
    """Log each write with what triggered it (the benchmark counts the resync's), post events."""
    for line in outcome.writes:
        logger.info(f"{line} [{trigger}]")
    for event in outcome.events:
        kopf.event(
            kopf.Body(cast(kopf.RawBody, outcome.body)),
            type=event.type,
            reason=event.reason,
            message=event.message,
        )


async def _reconcile(
    memo: Any,
    namespace: str,
    name: str,
    logger: kopf.Logger | logging.Logger,
    *,
    trigger: str,
    fresh: bool = False,
) -> None:
    """Reconcile one InferenceService; on an error, log it and queue a retry with backoff."""
    try:
        outcome = await memo.reconciler.reconcile(namespace, name, fresh=fresh)
    except Exception as error:
        delay = memo.requeue.failed(namespace, name)
        logger.warning(f"reconcile of {namespace}/{name} failed ({error}); retry in {delay:g} s")
        return
    memo.requeue.succeeded(namespace, name)
    _announce(outcome, logger, trigger)


@kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL)
async def inferenceservice_event(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    meta: kopf.Meta,
    memo: Any,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Cache the newest copy and reconcile, unless the event only echoes the reconcile loop's
    own status write. The initial listing after a start (type None) reads the API server: the
    child watches may not have delivered the children yet."""
    memo.cache.observe(constants.PLURAL, type, body)
    ns = _namespaced(namespace)
    if type == "DELETED" or meta.get("deletionTimestamp"):
        memo.reconciler.forget(ns, name)  # the garbage collector removes the children
        memo.requeue.succeeded(ns, name)
        return
    if type is not None and memo.reconciler.is_own_write(
        constants.PLURAL, ns, name, meta.get("resourceVersion")
    ):
        return
    trigger = "listing" if type is None else "spec"
    await _reconcile(memo, ns, name, logger, trigger=trigger, fresh=type is None)


@kopf.timer(
    constants.GROUP,
    constants.VERSION,
    constants.PLURAL,
    interval=RESYNC_SECONDS,
    initial_delay=RESYNC_SECONDS,
)
async def inferenceservice_resync(
    namespace: str | None, name: str, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    """Periodic resync from the API server: converged objects cause no writes."""
    await _reconcile(memo, _namespaced(namespace), name, logger, trigger="resync", fresh=True)


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
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A child changed (rollout progress, drift, deletion): cache it and reconcile its
    InferenceService, unless the event only echoes the operator's own write."""
    memo.cache.observe(resource.plural, type, body)
    parent = labels.get(constants.LABEL_INFERENCESERVICE)
    if not parent:
        return
    echo = memo.reconciler.is_own_write(
        resource.plural, _namespaced(namespace), name, meta.get("resourceVersion")
    )
    if echo and type != "DELETED":
        return
    await _reconcile(memo, _namespaced(namespace), parent, logger, trigger="child")

"""kopf handlers for InferenceServices and their children.

Every trigger — create, update, resume after a restart, the periodic resync timer, and any
change to a child Deployment, Service or PodDisruptionBudget — runs the same level-based
reconcile. Settings (peering, persistence, posting) are set at start-up here too.
"""

import logging
import os
from typing import Any, cast

import kopf

from kiln_operator import constants
from kiln_operator.k8s.client import KubeClient, load_configuration
from kiln_operator.k8s.peering import ensure_peering_object
from kiln_operator.k8s.reconciler import Outcome, Reconciler

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
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=constants.GROUP, key="last-handled-configuration"
    )
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
    memo.reconciler = Reconciler(memo.reconcile_kube)
    if not settings.peering.standalone:
        scopes: list[str | None] = list(memo.get("namespaces") or []) or [None]
        for scope in scopes:
            if await ensure_peering_object(memo.kube, settings.peering.name, scope):
                logger.info(
                    "created peering object %s (%s)", settings.peering.name, scope or "cluster"
                )


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Close the API connections."""
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


@kopf.on.resume(constants.GROUP, constants.VERSION, constants.PLURAL)
@kopf.on.create(constants.GROUP, constants.VERSION, constants.PLURAL)
@kopf.on.update(constants.GROUP, constants.VERSION, constants.PLURAL)
async def inferenceservice_reconcile(
    namespace: str | None, name: str, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    """Create, update, resume: reconcile. An invalid spec fails permanently until it changes."""
    outcome = await memo.reconciler.reconcile(_namespaced(namespace), name)
    _announce(outcome, logger, "spec")
    if outcome.spec_error is not None:
        raise kopf.PermanentError(f"invalid spec: {outcome.spec_error.message}")


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
    """Periodic resync: converged objects cause no writes."""
    _announce(await memo.reconciler.reconcile(_namespaced(namespace), name), logger, "resync")


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
    """A child changed (rollout progress, drift, deletion): reconcile its InferenceService,
    unless the event only echoes the operator's own write."""
    parent = labels.get(constants.LABEL_INFERENCESERVICE)
    if not parent:
        return
    echo = memo.reconciler.is_own_write(
        resource.plural, _namespaced(namespace), name, meta.get("resourceVersion")
    )
    if echo and type != "DELETED":
        return
    rollout = resource.plural == "deployments" and type != "DELETED"
    if rollout:
        memo.reconciler.note_deployment(cast(dict[str, Any], dict(body)))
    outcome = await memo.reconciler.reconcile(_namespaced(namespace), parent, full=not rollout)
    _announce(outcome, logger, "child")

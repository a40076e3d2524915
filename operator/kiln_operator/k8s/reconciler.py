"""The reconcile loop's effects: read the children, write only what differs, write status.

Why it exists: one idempotent, level-based `reconcile()` serves create, update, resume, resync
and child events alike. It never writes `replicas` of an existing Deployment (the autoscaler
owns it), never touches children while the spec is invalid (the last valid spec keeps
serving), and writes nothing at all when everything has converged.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.validation import SpecError, parse_spec
from kiln_operator.builders import (
    Owner,
    build_deployment,
    build_pdb,
    build_service,
    build_service_monitor,
)
from kiln_operator.builders.compare import build_update, needs_update
from kiln_operator.builders.naming import grpc_address, http_url, label_selector_string
from kiln_operator.builders.pdb import wants_pdb
from kiln_operator.constants import MANAGER
from kiln_operator.k8s.client import ApiError, KubeClient, Manifest
from kiln_operator.k8s.resources import (
    CRDS,
    DEPLOYMENTS,
    INFERENCE_SERVICES,
    PDBS,
    SERVICE_MONITOR_CRD,
    SERVICE_MONITORS,
    SERVICES,
    Resource,
)
from kiln_operator.status import Event, compute_status
from kiln_operator.status.compute import Observation

logger = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 4
"""A 409 (someone wrote the child between our read and our write) re-reads and retries."""
KEEP_LIVE_SPEC = (SERVICES,)
"""Kinds whose live spec holds fields the server assigns (a Service's clusterIP): an update
merges ours into it instead of replacing it."""
CRD_PROBE_SECONDS = 60.0
STATUS_MANAGER = f"{MANAGER}-reconcile"
"""Field manager of the reconcile loop's status fields and conditions."""
"""How long the answer to "is the Prometheus Operator installed?" is reused."""


@dataclass
class Outcome:
    """What one reconcile did: the writes it made and the events to emit on the parent."""

    body: Manifest = field(default_factory=dict)
    """The InferenceService as read at the start (events are posted on it)."""
    writes: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    spec_error: SpecError | None = None


class Reconciler:
    """Reconciles InferenceServices through one KubeClient; one reconcile per object at a time."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._queued: dict[tuple[str, str, bool], asyncio.Future[Outcome]] = {}
        self._deployments: dict[tuple[str, str], Manifest] = {}
        self._written: dict[tuple[str, str, str], str] = {}
        self._service_monitors: tuple[float, bool] | None = None

    async def _service_monitor_crd_exists(self) -> bool:
        now = time.monotonic()
        if self._service_monitors is None or now - self._service_monitors[0] > CRD_PROBE_SECONDS:
            exists = await self._kube.get(CRDS, None, SERVICE_MONITOR_CRD) is not None
            self._service_monitors = (now, exists)
        return self._service_monitors[1]

    def _remember(self, resource: Resource, owner: Owner, written: Manifest) -> None:
        version = written.get("metadata", {}).get("resourceVersion")
        if version:
            self._written[(resource.plural, owner.namespace, owner.name)] = version

    def is_own_write(self, plural: str, namespace: str, name: str, version: str | None) -> bool:
        """Whether a child event only echoes this operator's own last write of that child: such an
        event carries nothing to reconcile (a later change has another resourceVersion)."""
        return version is not None and self._written.get((plural, namespace, name)) == version

    def note_deployment(self, deployment: Manifest) -> None:
        """Keep the Deployment a watch event delivered: the next Deployment-scoped reconcile of
        its InferenceService uses it instead of reading it again."""
        meta = deployment["metadata"]
        self._deployments[(meta["namespace"], meta["name"])] = deployment

    async def reconcile(self, namespace: str, name: str, *, full: bool = True) -> Outcome:
        """Bring one InferenceService's children and status in line with its spec.

        `full=False` (a Deployment changed, e.g. rollout progress): the Deployment (as last
        delivered by its watch, see note_deployment), the PodDisruptionBudget and the status
        only; every other trigger, the resync included, reconciles everything.

        Runs at most one reconcile per object at a time, each on a fresh read of the object.
        Callers arriving while one of the same scope is already queued share it instead of
        queueing another (it will read their change too); they get its outcome without its
        writes and events, so each event is posted once.
        """
        key = (namespace, name, full)
        queued = self._queued.get(key)
        if queued is not None:
            shared = await asyncio.shield(queued)
            return Outcome(body=shared.body, spec_error=shared.spec_error)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_mark_retrieved)
        self._queued[key] = future
        try:
            async with self._locks.setdefault((namespace, name), asyncio.Lock()):
                if self._queued.get(key) is future:
                    del self._queued[key]
                outcome = await self._reconcile_fresh(namespace, name, full)
        except BaseException as error:
            if self._queued.get(key) is future:
                del self._queued[key]
            future.set_exception(error)
            raise
        future.set_result(outcome)
        return outcome

    async def _reconcile_fresh(self, namespace: str, name: str, full: bool) -> Outcome:
        body = await self._kube.get(INFERENCE_SERVICES, namespace, name)
        delivered = self._deployments.pop((namespace, name), None)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._locks.pop((namespace, name), None)
            for plural in (
                DEPLOYMENTS.plural,
                SERVICES.plural,
                PDBS.plural,
                SERVICE_MONITORS.plural,
            ):
                self._written.pop((plural, namespace, name), None)
            return Outcome()
        if full or delivered is None:
            delivered = await self._kube.get(DEPLOYMENTS, namespace, name)
        return await self._reconcile(body, delivered, full)

    async def _reconcile(self, body: Manifest, deployment: Manifest | None, full: bool) -> Outcome:
        meta = body["metadata"]
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        outcome = Outcome(body=body)
        parsed = parse_spec(owner.name, body.get("spec"))
        if isinstance(parsed, SpecError):
            outcome.spec_error = parsed
        else:
            deployment = await self._apply_children(parsed, owner, deployment, outcome, full)
        observation = Observation(
            generation=int(meta.get("generation") or 0),
            spec_error=None if outcome.spec_error is None else outcome.spec_error.message,
            deployment=deployment,
            selector=label_selector_string(owner.name),
            url=http_url(owner),
            grpc_address=grpc_address(owner),
        )
        update = compute_status(body.get("status") or {}, observation, datetime.now(UTC))
        if update.patch is not None:
            await self._kube.apply_status(
                INFERENCE_SERVICES, owner.namespace, owner.name, update.applied, STATUS_MANAGER
            )
            outcome.writes.append(f"status of {owner.namespace}/{owner.name}")
        outcome.events.extend(update.events)
        return outcome

    async def _apply_children(
        self,
        spec: InferenceServiceSpec,
        owner: Owner,
        deployment: Manifest | None,
        outcome: Outcome,
        full: bool,
    ) -> Manifest | None:
        """Create or correct the children (only the Deployment and the PDB unless `full`);
        returns the live Deployment after the writes."""
        initial_replicas = spec.autoscaling.min_replicas
        desired = build_deployment(spec, owner)
        if deployment is None:
            deployment = await self._create(
                DEPLOYMENTS, owner, build_deployment(spec, owner, initial_replicas), outcome
            )
        else:
            deployment = await self._correct(DEPLOYMENTS, owner, deployment, desired, outcome)

        if full:
            with_monitor = await self._service_monitor_crd_exists()
            await self._ensure(
                SERVICES,
                owner,
                build_service(owner, scrape_annotations=not with_monitor),
                outcome,
            )
            if with_monitor:
                await self._ensure(SERVICE_MONITORS, owner, build_service_monitor(owner), outcome)

        live_replicas = int((deployment.get("spec") or {}).get("replicas", initial_replicas))
        if wants_pdb(max(initial_replicas, live_replicas)):
            await self._ensure(PDBS, owner, build_pdb(owner), outcome)
        else:
            await self._remove(PDBS, owner, outcome)
        return deployment

    async def _ensure(
        self,
        resource: Resource,
        owner: Owner,
        desired: Manifest,
        outcome: Outcome,
    ) -> Manifest:
        live = await self._kube.get(resource, owner.namespace, owner.name)
        if live is None:
            return await self._create(resource, owner, desired, outcome)
        return await self._correct(resource, owner, live, desired, outcome)

    async def _create(
        self, resource: Resource, owner: Owner, desired: Manifest, outcome: Outcome
    ) -> Manifest:
        try:
            created = await self._kube.create(resource, owner.namespace, desired)
        except ApiError as error:
            if not error.is_conflict:
                raise
            # Created meanwhile (a previous run of a killed operator, or a peer): adopt it.
            live = await self._kube.get(resource, owner.namespace, owner.name)
            if live is None:
                raise
            return await self._correct(resource, owner, live, desired, outcome)
        outcome.writes.append(f"created {desired['kind']} {owner.namespace}/{owner.name}")
        self._remember(resource, owner, created)
        return created

    async def _correct(
        self,
        resource: Resource,
        owner: Owner,
        live: Manifest,
        desired: Manifest,
        outcome: Outcome,
    ) -> Manifest:
        """Write the child only if a field we set differs; retry on 409 with a fresh read."""
        for attempt in range(CONFLICT_ATTEMPTS):
            if not needs_update(live, desired):
                return live
            try:
                written = await self._kube.replace(
                    resource,
                    owner.namespace,
                    build_update(live, desired, keep_live_spec=resource in KEEP_LIVE_SPEC),
                )
            except ApiError as error:
                if not error.is_conflict or attempt == CONFLICT_ATTEMPTS - 1:
                    raise
                logger.info(
                    "conflict writing %s %s/%s; re-reading",
                    desired["kind"],
                    owner.namespace,
                    owner.name,
                )
                fresh = await self._kube.get(resource, owner.namespace, owner.name)
                if fresh is None:
                    return await self._create(resource, owner, desired, outcome)
                live = fresh
                continue
            outcome.writes.append(f"updated {desired['kind']} {owner.namespace}/{owner.name}")
            self._remember(resource, owner, written)
            return written
        return live

    async def _remove(self, resource: Resource, owner: Owner, outcome: Outcome) -> None:
        live = await self._kube.get(resource, owner.namespace, owner.name)
        if live is None or not _owned_by(live, owner):
            return
        await self._kube.delete(resource, owner.namespace, owner.name, live["metadata"]["uid"])
        outcome.writes.append(f"deleted {resource.plural} {owner.namespace}/{owner.name}")


def _mark_retrieved(future: "asyncio.Future[Outcome]") -> None:
    """Nobody may be waiting on a shared reconcile; its error is raised to its own caller."""
    if not future.cancelled():
        future.exception()


def _owned_by(child: Manifest, owner: Owner) -> bool:
    return any(
        ref.get("uid") == owner.uid for ref in child["metadata"].get("ownerReferences") or []
    )

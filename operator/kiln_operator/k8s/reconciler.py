"""The reconcile loop's effects: read the children, write only what differs, write status.

Why it exists: one idempotent, level-based `reconcile()` serves create, update, resume, resync
and child events alike. It never writes `replicas` of an existing Deployment (the autoscaler
owns it), never touches children while the spec is invalid (the last valid spec keeps
serving), and writes nothing at all when everything has converged.

It reads from the watch-fed `ObjectCache` (no request when nothing differs); the periodic resync
reads the API server itself, the safety net for anything the watches missed.

It writes to and deletes only children whose controller owner is the InferenceService: a name
held by anything else is reported (Ready=False, ChildConflict) and never written. Every other
error of applying a child is reported too, with the server's answer: a refusal (ChildRejected)
or a failure that may pass (ChildApplyFailed: a 5xx, a conflict that stays, no answer). Either
way the other children are still applied, the reconcile's Outcome carries the problem, and the
caller retries with backoff; the first reconcile without a problem clears it.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.rollout import RolloutStatus
from kiln_operator.autoscaling.state import InvalidScalerState, ScalerState, written_state_text
from kiln_operator.builders import (
    Owner,
    build_deployment,
    build_pdb,
    build_service,
    build_service_monitor,
)
from kiln_operator.builders.canary import build_canary_deployment, canary_name, revision_of
from kiln_operator.builders.compare import build_update, needs_update
from kiln_operator.builders.endpoints import build_endpoint_slice
from kiln_operator.builders.naming import Manifest, grpc_address, http_url, label_selector_string
from kiln_operator.builders.pdb import wants_pdb
from kiln_operator.builders.route import (
    HTTP_ROUTE_CRD,
    build_grpc_route,
    build_http_route,
    build_ingress,
)
from kiln_operator.constants import MANAGER
from kiln_operator.k8s.activator import Activators
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import ApiError, KubeClient, RequestFailed
from kiln_operator.k8s.platform import PlatformObjects
from kiln_operator.k8s.resources import (
    CRDS,
    DEPLOYMENTS,
    ENDPOINT_SLICES,
    GRPC_ROUTES,
    HTTP_ROUTES,
    INFERENCE_SERVICES,
    INGRESSES,
    PDBS,
    SERVICE_MONITOR_CRD,
    SERVICE_MONITORS,
    SERVICES,
    Resource,
)
from kiln_operator.status import Event, compute_status
from kiln_operator.status.compute import ChildProblem, ReconcileObservation
from kiln_operator.status.download import model_download_failure
from kiln_operator.warmup.podstate import ready_addresses

logger = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 4
"""A 409 (someone wrote the child between our read and our write) re-reads and retries."""
VERBS = {"GET": "read", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
"""What a failed request tried to do, in a condition's words."""
KEEP_LIVE_SPEC = (SERVICES,)
"""Kinds whose live spec holds fields the server assigns (a Service's clusterIP): an update
merges ours into it instead of replacing it."""
CRD_PROBE_SECONDS = 60.0
"""How long the answer to "is the Prometheus Operator installed?" is reused."""
ROUTE_RESOURCES = (HTTP_ROUTES, GRPC_ROUTES, INGRESSES)
"""The children spec.route renders; none unless the service opts in."""
STATUS_MANAGER = f"{MANAGER}-reconcile"
"""Field manager of the reconcile loop's status fields and conditions."""


@dataclass
class Outcome:
    """What one reconcile did: the writes it made and the events to emit on the parent."""

    body: Manifest = field(default_factory=dict)
    """The InferenceService as read at the start (events are posted on it)."""
    writes: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    spec_error: str | None = None
    """Why the spec cannot run (invalid, a policy broken, a profile missing), else None."""
    spec_error_reason: str | None = None
    """The condition reason of `spec_error` (InvalidSpec, PolicyViolation, ProfileNotFound…)."""
    child_problems: list[ChildProblem] = field(default_factory=list)
    """Children not written: held by another object, refused or failed by the API server."""
    conditions: list[Manifest] = field(default_factory=list)
    """The reconcile loop's conditions as it computed them (written or already current)."""


class ChildrenNotApplied(Exception):
    """Raised by the caller after reporting an Outcome with child problems, so the work queue
    tries again with backoff (a conflicting object may go, a refusal may be a quota, a server
    error may pass)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("; ".join(problem.message for problem in outcome.child_problems))


class Reconciler:
    """Reconciles InferenceServices through one KubeClient; one reconcile per object at a time."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ObjectCache,
        platform: PlatformObjects | None = None,
        *,
        imitated_gpus: bool = False,
        activators: Activators | None = None,
    ) -> None:
        self._kube = kube
        self._imitated_gpus = imitated_gpus
        self._activators = activators
        """Kiln's activator (KILN_ACTIVATOR_CONTROL): a service at minReplicas 0 sends its
        traffic to it while no pod serves. None: no activator, every Service selects pods."""
        self._cache = cache
        self._platform = platform if platform is not None else PlatformObjects()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._written: dict[tuple[str, str, str], str] = {}
        self._crds: dict[str, tuple[float, bool]] = {}

    async def _crd_exists(self, name: str) -> bool:
        """Whether the cluster serves an optional kind (the Prometheus Operator's
        ServiceMonitor, the Gateway API's HTTPRoute), asked at most every CRD_PROBE_SECONDS."""
        now = time.monotonic()
        known = self._crds.get(name)
        if known is None or now - known[0] > CRD_PROBE_SECONDS:
            known = (now, await self._kube.get(CRDS, None, name) is not None)
            self._crds[name] = known
        return known[1]

    async def _service_monitor_crd_exists(self) -> bool:
        return await self._crd_exists(SERVICE_MONITOR_CRD)

    async def _read(
        self, resource: Resource, namespace: str, name: str, fresh: bool
    ) -> Manifest | None:
        """The cached object; from the API server when `fresh`, or for an InferenceService the
        cache has not seen. A child the cache has not seen counts as missing: creating it then
        answers 409 if it exists, and the object is adopted (see _create)."""
        if not fresh:
            cached = self._cache.get(resource.plural, namespace, name)
            if cached is not None or resource is not INFERENCE_SERVICES:
                return cached
        live = await self._kube.get(resource, namespace, name)
        if live is None:
            self._cache.forget(resource.plural, namespace, name)
        else:
            self._cache.store(resource.plural, live)
        return live

    def _remember(self, resource: Resource, owner: Owner, written: Manifest) -> None:
        self._cache.store(resource.plural, written)
        version = written.get("metadata", {}).get("resourceVersion")
        if version:
            self._written[(resource.plural, owner.namespace, owner.name)] = version

    def is_own_write(self, plural: str, namespace: str, name: str, version: str | None) -> bool:
        """Whether an event only echoes the reconcile loop's own last write of that object (a
        child, or an InferenceService's status): it carries nothing to reconcile (a later change
        has another resourceVersion)."""
        return version is not None and self._written.get((plural, namespace, name)) == version

    def forget(self, namespace: str, name: str) -> None:
        """The InferenceService is gone or going: drop what was kept for it."""
        self._locks.pop((namespace, name), None)
        for resource in (
            INFERENCE_SERVICES,
            DEPLOYMENTS,
            SERVICES,
            PDBS,
            SERVICE_MONITORS,
            *ROUTE_RESOURCES,
        ):
            self._written.pop((resource.plural, namespace, name), None)
        self._written.pop((DEPLOYMENTS.plural, namespace, canary_name(name)), None)

    async def reconcile(self, namespace: str, name: str, *, fresh: bool = False) -> Outcome:
        """Bring one InferenceService's children and status in line with its spec.

        Reads come from the cache unless `fresh` (the resync), which reads the API server.
        One reconcile per object at a time, each on the newest copy of the object (read once it
        runs). The operator's work queue already runs one per object and drops duplicate
        triggers; the lock keeps direct callers just as safe.
        """
        async with self._locks.setdefault((namespace, name), asyncio.Lock()):
            return await self._reconcile_now(namespace, name, fresh)

    async def _reconcile_now(self, namespace: str, name: str, fresh: bool) -> Outcome:
        body = await self._read(INFERENCE_SERVICES, namespace, name, fresh)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget(namespace, name)
            return Outcome()
        return await self._reconcile(body, fresh)

    async def _reconcile(self, body: Manifest, fresh: bool) -> Outcome:
        meta = body["metadata"]
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        outcome = Outcome(body=body)
        deployment = await self._read_deployment(owner, outcome, fresh)
        effective = self._platform.effective(body)
        parsed = effective.spec
        rollout = _rollout_status(body)
        canary_phase: str | None = None
        if parsed is None:
            outcome.spec_error = effective.message
            outcome.spec_error_reason = effective.reason or constants.REASON_INVALID_SPEC
        else:
            plan = _canary_plan(
                parsed, deployment, owner, rollout, imitated_gpus=self._imitated_gpus
            )
            canary_phase = plan.phase
            deployment = await self._apply_children(
                parsed, owner, deployment, outcome, fresh, plan=plan
            )
            deployment = self._newest_known(deployment)
        observation = ReconcileObservation(
            generation=int(meta.get("generation") or 0),
            spec_error=outcome.spec_error,
            spec_error_reason=outcome.spec_error_reason or constants.REASON_INVALID_SPEC,
            profiles=tuple(profile.as_status() for profile in effective.profiles),
            child_problems=tuple(outcome.child_problems),
            pods=tuple(self._cache.pods_of(owner.namespace, owner.name)),
            min_replicas=None if parsed is None else parsed.autoscaling.min_replicas,
            deployment=deployment,
            selector=label_selector_string(owner.name),
            url=http_url(owner),
            grpc_address=grpc_address(owner),
            download_failure=model_download_failure(
                self._cache.pods_of(owner.namespace, owner.name)
            ),
            cold_start_seconds=_last_cold_start(body),
            canary_phase=canary_phase,
            canary_message=_canary_message(rollout, canary_phase),
        )
        update = compute_status(body.get("status") or {}, observation, datetime.now(UTC))
        if update.patch is not None:
            written = await self._kube.apply_status(
                INFERENCE_SERVICES, owner.namespace, owner.name, update.applied, STATUS_MANAGER
            )
            self._remember(INFERENCE_SERVICES, owner, written)
            outcome.writes.append(f"status of {owner.namespace}/{owner.name}")
        outcome.events.extend(update.events)
        outcome.conditions = list(update.applied.get("conditions") or [])
        return outcome

    def _newest_known(self, deployment: Manifest | None) -> Manifest | None:
        """The newest copy of our Deployment seen by the time status is computed. A new
        service's Service create can wait seconds for a cluster IP (the API server allocates
        them one at a time), and meanwhile the Deployment controller has usually reported on the
        Deployment just created: status then says what it reported in one write, not two (the
        cache keeps a copy only when it is newer than the one it holds, our own writes'
        included)."""
        if deployment is None:
            return None
        meta = deployment["metadata"]
        cached = self._cache.get(DEPLOYMENTS.plural, meta["namespace"], meta["name"])
        if cached is None or cached["metadata"].get("uid") != meta.get("uid"):
            return deployment
        return cached

    async def _read_deployment(
        self, owner: Owner, outcome: Outcome, fresh: bool
    ) -> Manifest | None:
        """The Deployment, as _read has it. A fresh read that fails is reported and the cache's
        copy serves instead, as in a reconcile that does not read afresh."""
        try:
            return await self._read(DEPLOYMENTS, owner.namespace, owner.name, fresh)
        except RequestFailed as error:
            outcome.child_problems.append(_failure(_named("Deployment", owner), error))
            return self._cache.get(DEPLOYMENTS.plural, owner.namespace, owner.name)

    async def _apply_children(
        self,
        spec: InferenceServiceSpec,
        owner: Owner,
        deployment: Manifest | None,
        outcome: Outcome,
        fresh: bool,
        *,
        plan: "CanaryPlan",
    ) -> Manifest | None:
        """Create or correct the children; returns the live Deployment after the writes (None
        when there is none of ours: not created yet, refused, or the name is held by another).
        While a canary runs (`plan`), the stable Deployment keeps its template and the canary
        Deployment runs the spec's.

        The Deployment (with its PodDisruptionBudget, which depends on its replicas) and the
        Service are written concurrently: a Service create waits for a cluster IP, and at scale
        that wait should not delay the Deployment's pods, nor the other way round."""

        async def deployment_and_pdb() -> Manifest | None:
            # A service at minReplicas 0 starts with one pod: its first rollout is proven and
            # its cold start measured; the autoscaler takes it to zero after the idle window.
            initial_replicas = max(1, spec.autoscaling.min_replicas)
            if deployment is None:
                desired = build_deployment(
                    spec, owner, initial_replicas, imitated_gpus=self._imitated_gpus
                )
                step = self._create(DEPLOYMENTS, owner, desired, outcome)
            elif plan.keep_stable:
                step = _as_awaitable(deployment)
            else:
                desired = build_deployment(spec, owner, imitated_gpus=self._imitated_gpus)
                step = self._correct(DEPLOYMENTS, owner, deployment, desired, outcome)
            live = await self._reported(step, "Deployment", owner, outcome)
            await self._apply_canary(spec, owner, plan, outcome, fresh)
            if live is None or not _controlled_by(live, owner):
                return None
            live_replicas = int((live.get("spec") or {}).get("replicas", initial_replicas))
            if wants_pdb(max(initial_replicas, live_replicas)):
                await self._ensure(PDBS, owner, build_pdb(owner), outcome, fresh)
            else:
                removal = self._remove(PDBS, owner, outcome, fresh)
                await self._reported(removal, "PodDisruptionBudget", owner, outcome)
            return live

        async def service_and_monitor() -> None:
            try:
                with_monitor = await self._service_monitor_crd_exists()
            except RequestFailed as error:  # whether the Service carries scrape annotations
                target = f"CustomResourceDefinition {SERVICE_MONITOR_CRD}"
                outcome.child_problems.append(_failure(target, error))
                return
            through_activator = spec.autoscaling.min_replicas == 0 and self._activators is not None
            service = build_service(
                owner, scrape_annotations=not with_monitor, selects_pods=not through_activator
            )
            await self._ensure(SERVICES, owner, service, outcome, fresh)
            await self._endpoints(owner, through_activator, outcome, fresh)
            if with_monitor:
                monitor = build_service_monitor(owner)
                await self._ensure(SERVICE_MONITORS, owner, monitor, outcome, fresh)

        try:
            async with asyncio.TaskGroup() as group:
                written = group.create_task(deployment_and_pdb())
                group.create_task(service_and_monitor())
                group.create_task(self._apply_routes(spec, owner, outcome, fresh))
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None  # as a sequential reconcile would have raised
        return written.result()

    async def _endpoints(
        self, owner: Owner, through_activator: bool, outcome: Outcome, fresh: bool
    ) -> None:
        """A service at minReplicas 0: Kiln's EndpointSlice lists its serving pods, else the
        activator's (`builders.endpoints`); otherwise one Kiln made earlier is deleted (the
        EndpointSlice controller keeps the Service's endpoints from its selector again)."""
        if self._activators is None:
            return
        if through_activator:
            pods = self._cache.pods_of(owner.namespace, owner.name)
            ips = [address.rsplit(":", 1)[0] for address in await self._activators.addresses()]
            desired = build_endpoint_slice(owner, pods, ips)
            await self._ensure(ENDPOINT_SLICES, owner, desired, outcome, fresh)
            # the held requests go to a pod as soon as one passed its gate (its Deployment's
            # readyReplicas change queues this reconcile), not at the autoscaler's next pass
            await self._activators.report((owner.namespace, owner.name), *ready_addresses(pods))
        else:
            removal = self._remove(ENDPOINT_SLICES, owner, outcome, fresh)
            await self._reported(removal, "EndpointSlice", owner, outcome)

    async def _apply_canary(
        self,
        spec: InferenceServiceSpec,
        owner: Owner,
        plan: "CanaryPlan",
        outcome: Outcome,
        fresh: bool,
    ) -> None:
        """Create or correct the canary Deployment while the plan wants one, else delete it (only
        ever one this InferenceService controls). Its replicas are written at creation only:
        the autoscaler sizes it for the step's share."""
        canary = Owner(canary_name(owner.name), owner.namespace, owner.uid)
        if not plan.wants_canary:
            # Without the strategy the watch-fed cache is asked (no extra read per resync).
            wanted_fresh = fresh and spec.rollout.canary is not None
            removal = self._remove(DEPLOYMENTS, canary, outcome, wanted_fresh)
            await self._reported(removal, "Deployment", canary, outcome)
            return
        stable = build_deployment(spec, owner, imitated_gpus=self._imitated_gpus)

        async def read_and_write() -> Manifest | None:
            live = await self._read(DEPLOYMENTS, canary.namespace, canary.name, fresh)
            if live is None:
                created = build_canary_deployment(stable, owner, initial_replicas=1)
                return await self._create(DEPLOYMENTS, canary, created, outcome)
            desired = build_canary_deployment(stable, owner)
            return await self._correct(DEPLOYMENTS, canary, live, desired, outcome)

        await self._reported(read_and_write(), "Deployment", canary, outcome)

    async def _apply_routes(
        self, spec: InferenceServiceSpec, owner: Owner, outcome: Outcome, fresh: bool
    ) -> None:
        """The routes spec.route asks for (Gateway API routes, or the Ingress fallback), each
        created or corrected like every child; one of Kiln's the spec no longer asks for is
        deleted (never one Kiln did not create)."""
        try:
            gateway_api = await self._crd_exists(HTTP_ROUTE_CRD)
        except RequestFailed as error:
            outcome.child_problems.append(
                _failure(f"CustomResourceDefinition {HTTP_ROUTE_CRD}", error)
            )
            return
        api = spec.route.api
        if spec.route.enabled and api == "GatewayAPI" and not gateway_api:
            outcome.child_problems.append(
                ChildProblem(
                    constants.REASON_CHILD_REJECTED,
                    f"spec.route.api is GatewayAPI but the cluster does not serve {HTTP_ROUTE_CRD}"
                    ": install the Gateway API's CRDs, or set route.api to Auto or Ingress",
                )
            )
            return
        use_gateway = api == "GatewayAPI" or (api == "Auto" and gateway_api)
        wanted: list[tuple[Resource, str, Manifest | None]] = [
            (INGRESSES, "Ingress", None if use_gateway else build_ingress(spec, owner)),
        ]
        if use_gateway or gateway_api:  # without the kinds there is nothing of Kiln's to delete
            wanted.append(
                (HTTP_ROUTES, "HTTPRoute", build_http_route(spec, owner) if use_gateway else None)
            )
            wanted.append(
                (GRPC_ROUTES, "GRPCRoute", build_grpc_route(spec, owner) if use_gateway else None)
            )
        for resource, kind, desired in wanted:
            if desired is not None:
                await self._ensure(resource, owner, desired, outcome, fresh)
            else:
                removal = self._remove(resource, owner, outcome, fresh)
                await self._reported(removal, kind, owner, outcome)

    async def _reported(
        self, step: Awaitable[Manifest | None], kind: str, owner: Owner, outcome: Outcome
    ) -> Manifest | None:
        """Run one child's read, create, update or delete; if the API server refuses it, fails
        it or never answers, report that on the outcome (None: no live child known) instead of
        ending the reconcile, so the other children are still applied and Ready says why."""
        try:
            return await step
        except RequestFailed as error:
            outcome.child_problems.append(_failure(_named(kind, owner), error))
            return None

    async def _ensure(
        self,
        resource: Resource,
        owner: Owner,
        desired: Manifest,
        outcome: Outcome,
        fresh: bool,
    ) -> Manifest | None:
        async def read_and_write() -> Manifest | None:
            live = await self._read(resource, owner.namespace, owner.name, fresh)
            if live is None:
                return await self._create(resource, owner, desired, outcome)
            return await self._correct(resource, owner, live, desired, outcome)

        return await self._reported(read_and_write(), desired["kind"], owner, outcome)

    async def _create(
        self, resource: Resource, owner: Owner, desired: Manifest, outcome: Outcome
    ) -> Manifest | None:
        """Create the child; None when the name is held by another. Errors other than a 409
        raise: the caller reports them (_reported)."""
        try:
            created = await self._kube.create(resource, owner.namespace, desired)
        except ApiError as error:
            if not error.is_conflict:
                raise
            # Exists: ours (created by a killed operator's earlier run, or a peer), or someone
            # else's; _correct tells them apart and writes only to ours.
            live = await self._read(resource, owner.namespace, owner.name, fresh=True)
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
    ) -> Manifest | None:
        """Write the child only if it is ours and a field we set differs; retry on 409 with a
        fresh read. Returns the live child; None when the name is held by another object. A
        write that fails (refused, a server error, a 409 on every attempt, no answer) is
        reported and the live child returned: status keeps reflecting what runs."""
        for attempt in range(CONFLICT_ATTEMPTS):
            if not _controlled_by(live, owner):
                self._cache.forget(resource.plural, owner.namespace, owner.name)
                outcome.child_problems.append(_conflict(desired["kind"], owner, live))
                return None
            if not needs_update(live, desired):
                return live
            try:
                written = await self._kube.replace(
                    resource,
                    owner.namespace,
                    build_update(live, desired, keep_live_spec=resource in KEEP_LIVE_SPEC),
                )
            except RequestFailed as error:
                last = attempt == CONFLICT_ATTEMPTS - 1
                if not isinstance(error, ApiError) or not error.is_conflict or last:
                    outcome.child_problems.append(_failure(_named(desired["kind"], owner), error))
                    return live
                logger.info(
                    "conflict writing %s %s/%s; re-reading",
                    desired["kind"],
                    owner.namespace,
                    owner.name,
                )
                reread = await self._read(resource, owner.namespace, owner.name, fresh=True)
                if reread is None:
                    return await self._create(resource, owner, desired, outcome)
                live = reread
                continue
            outcome.writes.append(f"updated {desired['kind']} {owner.namespace}/{owner.name}")
            self._remember(resource, owner, written)
            return written
        return live

    async def _remove(
        self, resource: Resource, owner: Owner, outcome: Outcome, fresh: bool
    ) -> None:
        live = await self._read(resource, owner.namespace, owner.name, fresh)
        if live is None or not _controlled_by(live, owner):
            return
        await self._kube.delete(resource, owner.namespace, owner.name, live["metadata"]["uid"])
        self._cache.forget(resource.plural, owner.namespace, owner.name)
        outcome.writes.append(f"deleted {resource.plural} {owner.namespace}/{owner.name}")


def _controller(child: Manifest) -> dict[str, str] | None:
    return next(
        (
            ref
            for ref in (child.get("metadata") or {}).get("ownerReferences") or []
            if ref.get("controller")
        ),
        None,
    )


def _controlled_by(child: Manifest, owner: Owner) -> bool:
    """Whether the InferenceService is the child's controller owner: the only children Kiln
    writes to or deletes."""
    controller = _controller(child)
    return controller is not None and controller.get("uid") == owner.uid


def _conflict(kind: str, owner: Owner, live: Manifest) -> ChildProblem:
    controller = _controller(live)
    if controller is None:
        holder = "it has no controller owner"
    else:
        holder = f"its controller is {controller.get('kind')} {controller.get('name')}"
    return ChildProblem(
        constants.REASON_CHILD_CONFLICT,
        f"{kind} {owner.namespace}/{owner.name} already exists and is not controlled by this "
        f"InferenceService ({holder}): Kiln leaves it unchanged; delete or rename it, or rename "
        "the InferenceService",
    )


def _named(kind: str, owner: Owner) -> str:
    """A child as a condition names it: every child is named like its InferenceService."""
    return f"{kind} {owner.namespace}/{owner.name}"


def _failure(target: str, error: RequestFailed) -> ChildProblem:
    """What Ready says about a failed request for `target`: a refusal (the same request gets
    the same answer until something changes) or a failure that may pass on a retry."""
    logger.warning("%s: %s", target, error)
    verb = VERBS.get(error.method, error.method)
    if isinstance(error, ApiError) and error.is_rejection:
        return ChildProblem(
            constants.REASON_CHILD_REJECTED,
            f"the API server refused to {verb} {target} (HTTP {error.status}): {error.answer}",
        )
    if not isinstance(error, ApiError):
        how = ""  # the answer says it: no answer in time, or the connection failed
    elif error.is_conflict and error.method == "PUT":
        how = f" (HTTP 409 on each of {CONFLICT_ATTEMPTS} attempts)"
    else:
        how = f" (HTTP {error.status})"
    return ChildProblem(
        constants.REASON_CHILD_APPLY_FAILED,
        f"could not {verb} {target}{how}: {error.answer}; retrying with backoff",
    )


def _last_cold_start(body: Manifest) -> float | None:
    """The last cold start measured: the autoscaler remembers it through the time at zero (no
    pod left to measure); else the warm-up gate's status."""
    try:
        remembered = ScalerState.from_text(written_state_text(body))
    except InvalidScalerState:
        remembered = ScalerState()  # the autoscaler reports it; the message can do without
    if remembered.cold_start_seconds is not None:
        return remembered.cold_start_seconds
    warmup = (body.get("status") or {}).get("warmup") or {}
    measured = warmup.get("coldStartP90Seconds")
    return float(measured) if isinstance(measured, int | float) else None


@dataclass(frozen=True)
class CanaryPlan:
    """What spec.rollout.canary asks of the two Deployments in this reconcile."""

    keep_stable: bool = False
    """The stable Deployment keeps its template (a canary runs or was rolled back)."""
    wants_canary: bool = False
    """The canary Deployment of the spec's template exists."""
    phase: str | None = None
    """status.rollout.phase for the spec's revision; "Progressing" before the autoscaler's pass
    registers a new one; None when no canary concerns the spec."""


def _rollout_status(body: Manifest) -> RolloutStatus | None:
    written = (body.get("status") or {}).get("rollout")
    if not isinstance(written, dict):
        return None
    try:
        return RolloutStatus.model_validate(written)
    except ValueError:
        return None


def _canary_plan(
    spec: InferenceServiceSpec,
    deployment: Manifest | None,
    owner: Owner,
    rollout: RolloutStatus | None,
    *,
    imitated_gpus: bool,
) -> CanaryPlan:
    """Level-based: from the spec, the live stable Deployment and status.rollout (the autoscaler's
    pass writes it), which Deployment runs what. A new template runs as a canary while its steps
    run; Promoting rolls the stable Deployment to it (the canary stays until that is done); a
    rolled-back revision leaves the stable Deployment as it is until the spec changes."""
    if spec.rollout.canary is None or deployment is None or not _controlled_by(deployment, owner):
        return CanaryPlan()
    desired = build_deployment(spec, owner, imitated_gpus=imitated_gpus)
    target = revision_of(desired)
    phase = rollout.phase if rollout is not None and rollout.revision == target else None
    differs = needs_update(deployment, desired)
    if not differs and phase != "Promoting":
        phase = None  # the stable Deployment runs the spec: no canary concerns it
    if differs and phase in (None, "Promoted", "Abandoned"):
        phase = "Progressing"  # the autoscaler's next pass starts it
    keep_stable = differs and phase != "Promoting"
    wants_canary = (differs and phase != "RolledBack") or phase == "Promoting"
    return CanaryPlan(keep_stable=keep_stable, wants_canary=wants_canary, phase=phase)


def _canary_message(rollout: RolloutStatus | None, phase: str | None) -> str:
    if phase is None:
        return ""
    if rollout is None or rollout.phase != phase:
        return "a canary of the new version starts"
    verdict = rollout.last_verdict
    said = f": {verdict.message}" if verdict is not None else ""
    if phase == "RolledBack":
        return f"the canary of revision {rollout.revision} was rolled back{said}"
    return (
        f"canary of revision {rollout.revision}: step {rollout.step + 1} of {rollout.steps}, "
        f"{rollout.share_percent} % of traffic{said}"
    )


async def _as_awaitable(value: Manifest) -> Manifest:
    return value

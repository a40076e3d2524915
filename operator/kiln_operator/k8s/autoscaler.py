"""One autoscaler evaluation of one InferenceService: read, decide, act, explain.

Why it exists: `decide` is pure; this module gathers its inputs (the Deployment's replicas, the
pods' warm-up times, whether pods asked for cannot be created or scheduled, Prometheus' signals,
the state kept in the object's status), and carries out the decision: pod-deletion-cost on
the idlest pods before a scale-down, the Deployment's scale subresource (the only write of
`replicas` anywhere in Kiln), status and state written only when something a reader would act on
changed (`autoscaling.quiet`), and an event on each change of replicas. It reads the
InferenceService, its Deployment and its pods from the operator's watch-fed ObjectCache, and each
Prometheus endpoint through one shared `PrometheusSource`. Between evaluations it keeps the full
decision state in memory; status.autoscalerState holds the part a restarted operator needs. It
remembers the resourceVersions of its own writes, so the watch handlers can drop their echoes
instead of queueing a reconcile.
"""

import asyncio
import dataclasses
import logging
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.autoscaling import AutoscalingStatus
from kiln_operator.api.v1alpha1.rollout import RolloutStatus
from kiln_operator.autoscaling.deletion_cost import DELETION_COST_ANNOTATION, deletion_costs
from kiln_operator.autoscaling.history import HistoryCache
from kiln_operator.autoscaling.inputs import MetricsObservation, ScalingSpec
from kiln_operator.autoscaling.policy import Decision, decide
from kiln_operator.autoscaling.prometheus import PrometheusSource, observation
from kiln_operator.autoscaling.quiet import (
    has_something_to_say,
    state_needs_write,
    status_needs_write,
)
from kiln_operator.autoscaling.state import (
    STATE_FIELD,
    InvalidScalerState,
    ScalerState,
    written_state_text,
)
from kiln_operator.builders.canary import canary_name, revision_of
from kiln_operator.builders.compare import needs_update
from kiln_operator.builders.deployment import build_deployment
from kiln_operator.builders.naming import Owner
from kiln_operator.k8s.activator import Activators
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import KubeClient
from kiln_operator.k8s.platform import PlatformObjects
from kiln_operator.k8s.resources import DEPLOYMENTS, INFERENCE_SERVICES, PODS
from kiln_operator.rollout.machine import (
    CanaryMetrics,
    RolloutEvent,
    RolloutObservation,
    advance,
    metrics_window,
    split_replicas,
)
from kiln_operator.status.causes import failed_warmup, first_cause, placement_failure
from kiln_operator.status.conditions import find_condition, set_condition
from kiln_operator.status.deployment import rollout_state
from kiln_operator.warmup.podstate import ready_addresses, summarize

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation did: the decision, the replicas before it, and when to look again."""

    decision: Decision
    previous_replicas: int
    interval_seconds: float
    slo_p99_seconds: float | None = None
    """The effective spec's p99 latency objective (spec.slo, or its profile's)."""
    state_problem: str | None = None
    learned_change: str | None = None
    """The learned pre-warm's floor changed (or it turned on or off): what to announce."""
    changed_outside: str | None = None
    """Why the replicas before it are not what the autoscaler left them at (someone scaled the
    Deployment: `kubectl scale deployment`, another controller), until it corrects them; or
    None."""
    rollout_events: tuple[RolloutEvent, ...] = ()
    """The canary's transitions in this pass (spec.rollout.canary)."""
    rollout_changed: bool = False
    """status.rollout was written: the reconcile loop must look again (it decides which
    Deployment runs what from it)."""


@dataclass(frozen=True)
class CanaryPass:
    """What the canary's part of a pass decided."""

    stable_replicas: int | None = None
    """The stable Deployment's replicas for the step's share, None: the autoscaler's own."""
    events: tuple[RolloutEvent, ...] = ()
    changed: bool = False


FIELD_MANAGER = "kiln-autoscaler"
"""The autoscaler's server-side-apply field manager: it owns status.autoscaling and the
MetricsAvailable condition; the reconcile loop's manager owns the other conditions."""
STATE_FIELD_MANAGER = "kiln-autoscaler-state"
"""The manager of status.autoscalerState, written apart from status.autoscaling (each is
written only when it changed: `autoscaling.quiet`)."""
ROLLOUT_FIELD_MANAGER = "kiln-rollout"
"""The manager of status.rollout, written apart from status.autoscaling (an apply that left
out a field its manager owns would remove it)."""


def metrics_condition(
    conditions: list[dict[str, Any]], decision: Decision, body: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The MetricsAvailable condition for this decision (its transition time kept if unchanged)."""
    available = decision.metrics_available
    updated = set_condition(
        conditions,
        condition_type=constants.CONDITION_METRICS_AVAILABLE,
        status="True" if available else "False",
        reason=constants.REASON_METRICS_READ if available else constants.REASON_METRICS_UNAVAILABLE,
        message="" if available else decision.message[:1024],
        observed_generation=int(body["metadata"].get("generation") or 0),
        now=now,
    )
    found = find_condition(updated, constants.CONDITION_METRICS_AVAILABLE)
    assert found is not None
    return found


OWN_VERSIONS_KEPT = 4
"""resourceVersions of its own writes remembered per service (status.autoscaling and the state
come in pairs; their watch events may arrive after the next pair)."""


class Autoscaler:
    """Evaluates InferenceServices against Prometheus; one instance per operator."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ObjectCache,
        default_prometheus_url: str | None,
        platform: PlatformObjects | None = None,
        activators: Activators | None = None,
        *,
        imitated_gpus: bool = False,
    ) -> None:
        self.kube = kube
        self.activators = activators
        """Kiln's activator (KILN_ACTIVATOR_CONTROL), for the services at minReplicas 0."""
        self.imitated_gpus = imitated_gpus
        """As the reconcile loop's: the spec's pod template (a canary's revision) is built
        alike."""
        self.cache = cache
        self.default_prometheus_url = default_prometheus_url
        self.platform = (
            platform
            if platform is not None
            else PlatformObjects(operator_prometheus_url=default_prometheus_url)
        )
        """The profiles and policies: the spec is resolved and judged exactly as the reconcile
        resolves and judges it."""
        self.sources: dict[str, PrometheusSource] = {}
        self.histories: dict[str, HistoryCache] = {}
        """Per endpoint, the learned pre-warm's history reads and fits."""
        self._memory: dict[tuple[str, str], tuple[str | None, ScalerState]] = {}
        self._own_versions: dict[tuple[str, str], deque[str]] = {}
        self._replicas_seen: dict[tuple[str, str], tuple[int, int]] = {}
        """Per service, the Deployment's replicas at its last evaluation and the count it
        decided: a count that is neither was set by someone else."""
        self._outside: dict[tuple[str, str], tuple[int, str]] = {}
        """Per service, a count set outside the autoscaler and not corrected yet (a hold
        window may delay the correction), with what to say when it is."""

    def source(self, url: str) -> PrometheusSource:
        """The one PrometheusSource of this endpoint."""
        if url not in self.sources:
            self.sources[url] = PrometheusSource(url)
        return self.sources[url]

    def history(self, url: str) -> HistoryCache:
        """The one HistoryCache of this endpoint."""
        if url not in self.histories:
            self.histories[url] = HistoryCache(url)
        return self.histories[url]

    def is_own_write(self, namespace: str, name: str, version: str | None) -> bool:
        """Whether an InferenceService event only echoes one of the autoscaler's own writes."""
        return version is not None and version in self._own_versions.get((namespace, name), ())

    def forget(self, namespace: str, name: str) -> None:
        """The service is gone: drop what was kept for it."""
        self._memory.pop((namespace, name), None)
        self._own_versions.pop((namespace, name), None)
        for history in self.histories.values():
            history.forget((namespace, name))
        self._replicas_seen.pop((namespace, name), None)
        self._outside.pop((namespace, name), None)
        if self.activators is not None:
            self.activators.forget((namespace, name))

    def close(self) -> None:
        for source in self.sources.values():
            source.close()
        for history in self.histories.values():
            history.close()

    def _written(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.cache.store(INFERENCE_SERVICES.plural, body)
        version = body.get("metadata", {}).get("resourceVersion")
        if version:
            kept = self._own_versions.setdefault((namespace, name), deque(maxlen=OWN_VERSIONS_KEPT))
            kept.append(version)

    async def evaluate(self, namespace: str, name: str, now: datetime) -> Evaluation | None:
        """Decide and act once; None when there is nothing to scale (yet), or the watches have
        not delivered the service or its Deployment yet (the next pass looks again)."""
        body = self.cache.get(INFERENCE_SERVICES.plural, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        spec = self.platform.effective(body).spec
        if spec is None:
            # invalid, against a policy or its profile missing: the reconcile loop reports it,
            # and the service is frozen (replicas stay as they are)
            return None
        deployment = self.cache.get(DEPLOYMENTS.plural, namespace, name)
        if deployment is None:
            return None  # the reconcile loop creates it; its watch delivers it
        controller = next(
            (r for r in deployment["metadata"].get("ownerReferences") or [] if r.get("controller")),
            None,
        )
        if controller is None or controller.get("uid") != body["metadata"].get("uid"):
            return None  # someone else's Deployment holds the name (ChildConflict): never scale it
        current = int(deployment["spec"].get("replicas", 1))
        ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
        pods = self.cache.pods_of(namespace, name)

        url = spec.autoscaling.prometheus_url or self.default_prometheus_url
        source = self.source(url) if url else None
        observed = await self._observe(
            source,
            (namespace, name),
            ready,
            spec.autoscaling.metrics_window_seconds,
            spec.autoscaling.evaluation_interval_seconds / 2.0,
        )
        cold_start = summarize(pods).cold_start_p90_seconds
        placement = placement_failure(deployment, pods)
        learned_spec = spec.prewarm.learned
        if learned_spec is not None and url:
            learned = self.history(url).fit_for((namespace, name), learned_spec, now)
        else:
            learned = None
            for history in self.histories.values():
                history.forget((namespace, name))
        held = None
        if spec.autoscaling.min_replicas == 0 and self.activators is not None:
            # the activator holds the requests of a service at zero: it releases them to the
            # pods past their warm-up gate, and its count is the demand that wakes the service
            await self.activators.report((namespace, name), *ready_addresses(pods))
            held = await self.activators.held((namespace, name))
        observed = dataclasses.replace(
            observed,
            cold_start_seconds=cold_start,
            placement_failure=None if placement is None else placement.message,
            learned=learned,
            held_requests=held,
        )

        state_problem = None
        written_text = written_state_text(body)
        try:
            written_state = ScalerState.from_text(written_text)
        except InvalidScalerState as error:
            state_problem, written_state = str(error), ScalerState()
        state = written_state
        remembered = self._memory.get((namespace, name))
        if remembered is not None and remembered[0] == written_text:
            state = remembered[1]  # the written state is ours and current: use the full state
        scaling = ScalingSpec(
            slo=spec.slo,
            autoscaling=spec.autoscaling,
            prewarm=spec.prewarm,
            max_batch_size=spec.runtime.batching.max_batch_size,
        )
        decision = decide(current, observed, scaling, state, now)
        canary = CanaryPass()
        if spec.rollout.canary is not None:
            canary = await self._canary_pass(
                body,
                spec=spec,
                stable=deployment,
                pods=pods,
                source=source,
                decision=decision,
                now=now,
            )
        if (
            canary.stable_replicas is not None
            and canary.stable_replicas != decision.desired_replicas
        ):
            decision = dataclasses.replace(
                decision,
                desired_replicas=canary.stable_replicas,
                message=f"{decision.message}; {canary.stable_replicas} stable replicas keep the "
                f"canary's share (the demand asks {decision.desired_replicas})",
            )
        changed_outside = self._changed_outside(namespace, name, current, decision)

        # The explanation first, so whoever sees replicas change can read why.
        current_status = body.get("status") or {}
        conditions = current_status.get("conditions") or []
        condition = metrics_condition(conditions, decision, body, now)
        new_status = decision.status(observed).model_copy(update={"updated_at": now})
        said = current_status.get("autoscaling")
        scales = decision.desired_replicas != current
        if has_something_to_say(said is not None, new_status, scales) and (
            not _condition_holds(conditions, condition)
            or status_needs_write(_parsed_status(said), new_status)
        ):
            status = new_status.model_dump(by_alias=True, mode="json", exclude_none=True)
            written = await self.kube.apply_status(
                INFERENCE_SERVICES, namespace, name,
                {"autoscaling": status, "conditions": [condition]}, manager=FIELD_MANAGER,
            )  # fmt: skip
            self._written(namespace, name, written)
        if state_problem is not None or state_needs_write(written_state, decision.state):
            written_text = decision.state.to_text()
            written = await self.kube.apply_status(
                INFERENCE_SERVICES, namespace, name, {STATE_FIELD: written_text},
                manager=STATE_FIELD_MANAGER,
            )  # fmt: skip
            self._written(namespace, name, written)
        self._memory[(namespace, name)] = (written_text, decision.state)
        if decision.desired_replicas < current:
            window = spec.autoscaling.metrics_window_seconds
            # The stable Deployment's pods only: a canary's are never candidates (and go when
            # its Deployment does, so annotating one may find it gone).
            stable_pods = [p for p in pods if constants.LABEL_TRACK not in _labels(p)]
            await self._mark_idlest(namespace, name, stable_pods, source, window)
        if decision.desired_replicas != current:
            await self.kube.merge_patch(
                DEPLOYMENTS,
                namespace,
                name,
                {"spec": {"replicas": decision.desired_replicas}},
                subresource="scale",
            )
        return Evaluation(
            decision=decision,
            previous_replicas=current,
            interval_seconds=float(spec.autoscaling.evaluation_interval_seconds),
            slo_p99_seconds=spec.slo.p99_latency_milliseconds / 1000.0,
            state_problem=state_problem,
            learned_change=learned_change(said, new_status),
            changed_outside=changed_outside,
            rollout_events=canary.events,
            rollout_changed=canary.changed,
        )

    async def _canary_pass(
        self,
        body: dict[str, Any],
        *,
        spec: InferenceServiceSpec,
        stable: dict[str, Any],
        pods: list[dict[str, Any]],
        source: PrometheusSource | None,
        decision: Decision,
        now: datetime,
    ) -> CanaryPass:
        """spec.rollout.canary: judge the canary (`rollout.machine.advance`), write status.rollout
        on a change, and size the canary Deployment for its step's share. Returns the stable
        Deployment's replicas for that share (the caller writes them with its own decision)."""
        canary_spec = spec.rollout.canary
        assert canary_spec is not None
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        owner = Owner(name=name, namespace=namespace, uid=meta["uid"])
        desired = build_deployment(spec, owner, imitated_gpus=self.imitated_gpus)
        target = revision_of(desired)
        previous = _parsed_rollout((body.get("status") or {}).get("rollout"))
        canary = self.cache.get(DEPLOYMENTS.plural, namespace, canary_name(name))
        if canary is not None and not _controlled_by(canary, meta.get("uid")):
            canary = None  # someone else's holds the name: never judge nor scale it
        stable_matches = not needs_update(stable, desired)
        current = previous if previous is not None and previous.revision == target else None
        metrics: CanaryMetrics | None = None
        ready = _canary_ready(canary, target)
        # The canary's pods, once every one of them runs the target revision: a pod of the
        # revision before (a spec change mid-canary) says nothing of this one.
        canary_pods = (
            [p for p in pods if _labels(p).get(constants.LABEL_TRACK) == constants.TRACK_CANARY]
            if _runs_revision(canary, target)
            else []
        )
        cause = first_cause(canary, canary_pods) if canary_pods else None
        live_canary = None if canary is None else int(canary["spec"].get("replicas", 1))
        step_replicas: tuple[int, int] | None = None
        if not stable_matches and current is not None and current.phase == "Progressing":
            window = metrics_window(canary_spec, current, now)
            if source is None:
                metrics = CanaryMetrics(window, error="no Prometheus URL")
            elif ready > 0:
                metrics = await source.canary(namespace, name, window)
            step_replicas = split_replicas(
                decision.desired_replicas, current.share_percent, spec.autoscaling.max_replicas
            )
        step = advance(
            canary_spec,
            spec.slo.p99_latency_milliseconds,
            previous,
            RolloutObservation(
                target_revision=target,
                stable_matches=stable_matches,
                canary_ready=ready,
                stable_rolled_out=not rollout_state(stable).in_progress,
                metrics=metrics,
                canary_replicas=live_canary or 0,
                stable_replicas=int(stable["spec"].get("replicas", 1)),
                stable_ready=_stable_ready(stable),
                step_replicas=step_replicas,
                canary_warmup_failed=failed_warmup(canary_pods),
                canary_cause=None if cause is None else f"{cause.reason}: {cause.message}",
            ),
            now,
        )
        status = step.status
        stable_replicas: int | None = None
        canary_replicas: int | None = None
        if status is not None and status.revision == target and live_canary is not None:
            if status.phase == "Progressing":
                stable_replicas, canary_replicas = split_replicas(
                    decision.desired_replicas,
                    status.share_percent,
                    spec.autoscaling.max_replicas,
                )
            elif status.phase == "Promoting":
                canary_replicas = live_canary  # it serves until the stable rollout is done
        if (
            status is not None
            and status.revision == target
            and status.phase
            in (
                "Progressing",
                "Promoting",
            )
        ):
            status = status.model_copy(
                update={
                    "canary_replicas": canary_replicas or 0,
                    "stable_replicas": stable_replicas or decision.desired_replicas,
                }
            )
        changed = status is not None and status != previous
        if changed and status is not None:
            written = await self.kube.apply_status(
                INFERENCE_SERVICES,
                namespace,
                name,
                {"rollout": status.model_dump(by_alias=True, mode="json", exclude_none=True)},
                manager=ROLLOUT_FIELD_MANAGER,
            )
            self._written(namespace, name, written)
        if canary_replicas is not None and canary_replicas != live_canary:
            await self.kube.merge_patch(
                DEPLOYMENTS,
                namespace,
                canary_name(name),
                {"spec": {"replicas": canary_replicas}},
                subresource="scale",
            )
        return CanaryPass(stable_replicas, tuple(step.events), changed)

    def _changed_outside(
        self, namespace: str, name: str, current: int, decision: Decision
    ) -> str | None:
        """What to say of a count set outside the autoscaler, until it is corrected."""
        key = (namespace, name)
        changed = _changed_outside(self._replicas_seen.get(key), current)
        self._replicas_seen[key] = (current, decision.desired_replicas)
        if changed is not None:
            logger.info(f"{namespace}/{name}: {changed}")
        else:
            pending = self._outside.get(key)
            changed = pending[1] if pending is not None and pending[0] == current else None
        if changed is None or decision.desired_replicas != current:
            self._outside.pop(key, None)  # corrected now (the event says so), or nothing to say
        else:
            self._outside[key] = (current, changed)
        return changed

    async def _observe(
        self,
        source: PrometheusSource | None,
        key: tuple[str, str],
        ready: int,
        window: int,
        max_age: float,
    ) -> MetricsObservation:
        if source is None:
            return MetricsObservation(
                ready_replicas=ready,
                metrics_error="no Prometheus URL: set the operator's KILN_PROMETHEUS_URL "
                "or spec.autoscaling.prometheusUrl",
            )
        snapshot = await source.snapshot(window, max_age)
        return observation(snapshot, key, ready)

    async def _mark_idlest(
        self,
        namespace: str,
        name: str,
        pods: list[dict[str, Any]],
        source: PrometheusSource | None,
        window_seconds: int,
    ) -> None:
        """Annotate pods so the ReplicaSet removes the idlest first (least load)."""
        load = (
            await asyncio.to_thread(source.load_by_pod, namespace, name, window_seconds)
            if source
            else {}
        )
        for pod_name, cost in deletion_costs(pods, load).items():
            written = await self.kube.merge_patch(
                PODS,
                namespace,
                pod_name,
                {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}},
            )
            self.cache.store(PODS.plural, written)


def learned_change(written: Any, new: AutoscalingStatus) -> str | None:
    """What to announce when the learned pre-warm's floor changed, or it turned on or off,
    since the written status; None when nothing did (or the service does not opt in)."""
    learned = new.learned
    if learned is None:
        return None
    before = (written or {}).get("learned") if isinstance(written, dict) else None
    before = before if isinstance(before, dict) else {}
    old_floor = int(before.get("floorReplicas") or 0)
    same = bool(before.get("active")) == learned.active and old_floor == learned.floor_replicas
    if same and (learned.active or before.get("reason") == learned.reason):
        return None
    if not learned.active:
        return f"learned pre-warm off ({learned.reason}): {learned.message}"
    return f"learned floor {old_floor} -> {learned.floor_replicas}: {learned.message}"


def _changed_outside(seen: tuple[int, int] | None, current: int) -> str | None:
    """Whether someone else set the Deployment's replicas since the last evaluation: they are
    neither what they were then nor what the autoscaler decided (while its own write has not
    reached the cache yet, they are what they were)."""
    if seen is None or current in seen:
        return None
    return (
        f"the Deployment's replicas were set to {current} outside the autoscaler "
        f"(it had left them at {seen[1]})"
    )


def _parsed_status(written: Any) -> AutoscalingStatus | None:
    """The written status.autoscaling, or None when absent or not in today's shape."""
    if not isinstance(written, dict):
        return None
    try:
        return AutoscalingStatus.model_validate(written)
    except ValueError:
        return None


def _condition_holds(conditions: list[dict[str, Any]], condition: dict[str, Any]) -> bool:
    """Whether the written conditions already say what `condition` says. The message is not
    compared: while blind it carries numbers (the metrics' age) that change at every pass."""
    written = find_condition(conditions, condition["type"])
    keys = ("status", "reason", "observedGeneration")
    return written is not None and all(written.get(k) == condition.get(k) for k in keys)


def _parsed_rollout(written: Any) -> RolloutStatus | None:
    """The written status.rollout, or None when absent or not in today's shape."""
    if not isinstance(written, dict):
        return None
    try:
        return RolloutStatus.model_validate(written)
    except ValueError:
        return None


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = (pod.get("metadata") or {}).get("labels") or {}
    return labels


def _controlled_by(child: dict[str, Any], uid: str | None) -> bool:
    controller = next(
        (r for r in child["metadata"].get("ownerReferences") or [] if r.get("controller")), None
    )
    return controller is not None and uid is not None and controller.get("uid") == uid


def _runs_revision(canary: dict[str, Any] | None, revision: str) -> bool:
    """Every pod of the canary Deployment runs `revision`: False while it runs another one or
    still rolls to it (a spec change mid-canary), or while there is no canary Deployment."""
    if canary is None:
        return False
    annotations = canary["metadata"].get("annotations") or {}
    if annotations.get(constants.ANNOTATION_REVISION) != revision:
        return False
    state = rollout_state(canary)
    return state.observed and state.replicas == state.updated


def _canary_ready(canary: dict[str, Any] | None, revision: str) -> int:
    """Ready pods of the canary Deployment that run `revision` (0 unless every pod does)."""
    if canary is None or not _runs_revision(canary, revision):
        return 0
    return int((canary.get("status") or {}).get("readyReplicas") or 0)


def _stable_ready(stable: dict[str, Any]) -> int:
    """Ready pods of the stable Deployment, once its controller has seen its replicas (0 before:
    a count of the previous size is no evidence the new one is reached)."""
    state = rollout_state(stable)
    return state.ready if state.observed else 0

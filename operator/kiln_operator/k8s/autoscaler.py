"""One autoscaler evaluation of one InferenceService: read, decide, act, explain.

Why it exists: `decide` is pure; this module gathers its inputs (the Deployment's replicas, the
pods' warm-up times, Prometheus' signals, the state kept in an annotation on the object), and
carries out the decision: pod-deletion-cost on the idlest pods before a scale-down, the
Deployment's scale subresource (the only write of `replicas` anywhere in Kiln), status and state
written only when they changed, and an event on each change of replicas. It reads the
InferenceService, its Deployment and its pods from the operator's watch-fed ObjectCache.
"""

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES, SpecError, parse_spec
from kiln_operator.autoscaling.deletion_cost import DELETION_COST_ANNOTATION, deletion_costs
from kiln_operator.autoscaling.policy import Decision, Observation, ScalingSpec, decide
from kiln_operator.autoscaling.prometheus import PrometheusReader
from kiln_operator.autoscaling.state import STATE_ANNOTATION, InvalidScalerState, ScalerState
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.client import KubeClient
from kiln_operator.k8s.resources import DEPLOYMENTS, INFERENCE_SERVICES, PODS
from kiln_operator.status.conditions import find_condition, set_condition
from kiln_operator.warmup.podstate import summarize

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation did: the decision, the replicas before it, and when to look again."""

    decision: Decision
    previous_replicas: int
    interval_seconds: float
    state_problem: str | None = None


FIELD_MANAGER = "kiln-autoscaler"
"""The autoscaler's server-side-apply field manager: it owns status.autoscaling and the
MetricsAvailable condition; the reconcile loop's manager owns the other conditions."""


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


class Autoscaler:
    """Evaluates InferenceServices against Prometheus; one instance per operator."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ObjectCache,
        default_prometheus_url: str | None,
        warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.default_prometheus_url = default_prometheus_url
        self.warmup_budget_bytes = warmup_budget_bytes
        """The operator's warm-up budget: the spec is judged valid exactly as the reconcile
        judges it."""

    async def evaluate(self, namespace: str, name: str, now: datetime) -> Evaluation | None:
        """Decide and act once; None when there is nothing to scale (yet), or the watches have
        not delivered the service or its Deployment yet (the next pass looks again)."""
        body = self.cache.get(INFERENCE_SERVICES.plural, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        spec = parse_spec(name, body.get("spec"), warmup_budget_bytes=self.warmup_budget_bytes)
        if isinstance(spec, SpecError):
            return None  # the reconcile loop reports it; replicas stay as they are
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
        reader = PrometheusReader(url) if url else None
        observation = await self._observe(
            reader, namespace, name, ready, spec.autoscaling.metrics_window_seconds
        )
        cold_start = summarize(pods).cold_start_p90_seconds
        observation = dataclasses.replace(observation, cold_start_seconds=cold_start)

        annotations = body["metadata"].get("annotations") or {}
        state_problem = None
        try:
            state = ScalerState.from_annotation(annotations.get(STATE_ANNOTATION))
        except InvalidScalerState as error:
            state_problem, state = str(error), ScalerState()
        scaling = ScalingSpec(slo=spec.slo, autoscaling=spec.autoscaling, prewarm=spec.prewarm)
        decision = decide(current, observation, scaling, state, now)

        # The explanation first, so whoever sees replicas change can read why.
        status = decision.status(observation).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        current_status = body.get("status") or {}
        condition = metrics_condition(current_status.get("conditions") or [], decision, body, now)
        if current_status.get("autoscaling") != status or condition not in (
            current_status.get("conditions") or []
        ):
            written = await self.kube.apply_status(
                INFERENCE_SERVICES, namespace, name,
                {"autoscaling": status, "conditions": [condition]}, manager=FIELD_MANAGER,
            )  # fmt: skip
            self.cache.store(INFERENCE_SERVICES.plural, written)
        stored = decision.state.to_annotation()
        if annotations.get(STATE_ANNOTATION) != stored:
            written = await self.kube.merge_patch(
                INFERENCE_SERVICES,
                namespace,
                name,
                {"metadata": {"annotations": {STATE_ANNOTATION: stored}}},
            )
            self.cache.store(INFERENCE_SERVICES.plural, written)
        if decision.desired_replicas < current:
            await self._mark_idlest(namespace, name, pods, reader)
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
            state_problem=state_problem,
        )

    async def _observe(
        self, reader: PrometheusReader | None, namespace: str, name: str, ready: int, window: int
    ) -> Observation:
        if reader is None:
            return Observation(
                ready_replicas=ready,
                metrics_error="no Prometheus URL: set the operator's KILN_PROMETHEUS_URL "
                "or spec.autoscaling.prometheusUrl",
            )
        return await asyncio.to_thread(reader.observe, namespace, name, window, ready)

    async def _mark_idlest(
        self, namespace: str, name: str, pods: list[dict[str, Any]], reader: PrometheusReader | None
    ) -> None:
        """Annotate pods so the ReplicaSet removes the idlest first (fewest in flight)."""
        inflight = (
            await asyncio.to_thread(reader.inflight_by_pod, namespace, name) if reader else {}
        )
        for pod_name, cost in deletion_costs(pods, inflight).items():
            written = await self.kube.merge_patch(
                PODS,
                namespace,
                pod_name,
                {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}},
            )
            self.cache.store(PODS.plural, written)

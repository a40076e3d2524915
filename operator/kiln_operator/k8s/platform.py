"""The platform's profiles and policies as the operator last saw them, and the effective spec of
an InferenceService read through them.

Why it exists: every reader of a spec (the reconcile loop, the autoscaler, the warm-up gate)
must resolve it against the same profiles and policies, without a request per read. kopf's watches
of the four kinds feed this store (handlers/platform.py); a listing at start-up fills it before
the first reconcile, so a restarted operator never resolves a service without its profile (which
would roll every pod to built-in defaults and back).
"""

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES
from kiln_operator.builders.naming import Manifest
from kiln_operator.k8s.client import ApiError, KubeClient, RequestFailed
from kiln_operator.k8s.resources import PLATFORM_RESOURCES, Resource
from kiln_operator.profiles.effective import Effective, PlatformState, effective_spec

logger = logging.getLogger(__name__)

PRIME_SECONDS = 120.0
"""How long the start-up listing retries an answer that may pass (429, 5xx, none)."""
PRIME_FIRST_RETRY_SECONDS = 0.5
PRIME_LAST_RETRY_SECONDS = 5.0


class PlatformObjects:
    """The newest copy of every profile and policy seen, by plural, namespace and name."""

    def __init__(
        self,
        operator_prometheus_url: str | None = None,
        allowed_prometheus_urls: tuple[str, ...] = (),
        warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES,
    ) -> None:
        self._objects: dict[str, dict[tuple[str, str], Manifest]] = {
            resource.plural: {} for resource in PLATFORM_RESOURCES
        }
        self._operator_prometheus_url = operator_prometheus_url
        self._allowed_prometheus_urls = allowed_prometheus_urls
        self._warmup_budget_bytes = warmup_budget_bytes

    def observe(self, plural: str, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """A watch event of a profile or policy: DELETED forgets it, anything else stores it.
        Whether what applies changed (its spec, its generation, its presence)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        held = self._objects[plural].get(key)
        if event_type == "DELETED":
            self._objects[plural].pop(key, None)
            return held is not None
        kept = {
            "metadata": {k: meta[k] for k in ("name", "namespace", "generation") if k in meta},
            "spec": body.get("spec") or {},
        }
        self._objects[plural][key] = kept
        return held != kept

    async def prime(self, kube: KubeClient, namespaces: list[str] | None = None) -> None:
        """List every profile and policy (once, before the first reconcile); the namespaced
        kinds of `namespaces` only, when the operator serves only those. A kind whose CRD is
        not installed (an upgrade that skipped the CRDs) counts as having no objects."""
        for resource in PLATFORM_RESOURCES:
            scopes: list[str | None] = list(namespaces or []) or [None]
            for scope in scopes if resource.namespaced else [None]:
                await self._prime(kube, resource, scope)

    async def _prime(self, kube: KubeClient, resource: Resource, namespace: str | None) -> None:
        """One kind's listing. A CRD applied a moment ago answers 429 ("storage is
        (re)initializing") for a while, as a restarting API server answers 5xx or not at all:
        those are retried for up to PRIME_SECONDS, so an operator installed with its CRDs
        starts instead of failing its start-up."""
        deadline = time.monotonic() + PRIME_SECONDS
        delay = PRIME_FIRST_RETRY_SECONDS
        while True:
            try:
                items = await kube.list(resource, namespace)
                break
            except RequestFailed as error:
                if isinstance(error, ApiError) and error.is_not_found:
                    logger.warning("%s: CRD not installed; none apply", resource.plural)
                    items = []
                    break
                passing = (
                    not isinstance(error, ApiError) or error.status == 429 or (error.status >= 500)
                )
                if not passing or time.monotonic() + delay > deadline:
                    raise
                logger.warning("listing %s: %s; retrying in %.1f s", resource.plural, error, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, PRIME_LAST_RETRY_SECONDS)
        for item in items:
            self.observe(resource.plural, None, item)

    def _of(self, resource: Resource, namespace: str) -> list[Manifest]:
        return [body for (ns, _), body in self._objects[resource.plural].items() if ns == namespace]

    def state(self, namespace: str) -> PlatformState:
        """The profiles and policies that apply to InferenceServices of `namespace`."""
        cluster_profiles, profiles, cluster_policies, policies = PLATFORM_RESOURCES
        return PlatformState(
            cluster_profiles=self._of(cluster_profiles, ""),
            namespace_profiles=self._of(profiles, namespace),
            cluster_policies=self._of(cluster_policies, ""),
            namespace_policies=self._of(policies, namespace),
            operator_prometheus_url=self._operator_prometheus_url,
            allowed_prometheus_urls=self._allowed_prometheus_urls,
        )

    def effective(
        self, body: Mapping[str, Any], warmup_budget_bytes: int | None = None
    ) -> Effective:
        """The InferenceService's spec as the operator runs it, or why it cannot run."""
        meta = body.get("metadata") or {}
        return effective_spec(
            str(meta.get("name") or ""),
            body.get("spec"),
            self.state(str(meta.get("namespace") or "")),
            warmup_budget_bytes=warmup_budget_bytes or self._warmup_budget_bytes,
        )


async def read_platform_state(
    kube: KubeClient,
    namespace: str,
    operator_prometheus_url: str | None = None,
    allowed_prometheus_urls: tuple[str, ...] = (),
) -> PlatformState:
    """The profiles and policies that apply to `namespace`, listed now from the API server
    (four requests): for the admission webhook, which every replica serves. A replica waiting
    for its peering turn has its watches paused, so its own PlatformObjects is only as new as
    its start."""
    objects = PlatformObjects(operator_prometheus_url, allowed_prometheus_urls)
    await objects.prime(kube, [namespace])
    return objects.state(namespace)

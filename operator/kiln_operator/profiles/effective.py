"""The spec the operator acts on: resolved against its profiles, validated, checked against the
policies.

Why it exists: the reconcile loop, the autoscaler, the warm-up gate and the admission webhook
must agree on one answer for one object, with one reason when there is none: ProfileNotFound or
ProfileInvalid (resolution), InvalidSpec (validation), PolicyViolation (guardrails). In each case
the caller changes nothing that runs.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES, SpecError, parse_spec
from kiln_operator.profiles.guardrails import PrometheusAllowList, parse_policies, violations
from kiln_operator.profiles.resolution import ProfileUsed, Unresolved, resolve

Bodies = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class PlatformState:
    """The platform's objects that apply to one namespace, and the operator's own settings."""

    cluster_profiles: Bodies = ()
    namespace_profiles: Bodies = ()
    cluster_policies: Bodies = ()
    namespace_policies: Bodies = ()
    operator_prometheus_url: str | None = None
    """The operator's KILN_PROMETHEUS_URL: always allowed, used when a spec names none."""
    allowed_prometheus_urls: tuple[str, ...] = ()
    """The operator's KILN_ALLOWED_PROMETHEUS_URLS."""

    def prometheus_allow_list(self) -> PrometheusAllowList:
        """The operator's own entries and the Prometheus URLs of ClusterInferenceProfiles (only
        the platform writes those)."""
        from_profiles = []
        for body in self.cluster_profiles:
            defaults = (body.get("spec") or {}).get("defaults") or {}
            url = (defaults.get("autoscaling") or {}).get("prometheusUrl")
            if isinstance(url, str):
                from_profiles.append(url)
        return PrometheusAllowList(
            self.operator_prometheus_url, self.allowed_prometheus_urls + tuple(from_profiles)
        )


@dataclass(frozen=True)
class Effective:
    """The spec to act on, or why there is none (`reason`, `message`), and the profiles used."""

    spec: InferenceServiceSpec | None
    reason: str | None = None
    message: str | None = None
    profiles: tuple[ProfileUsed, ...] = field(default_factory=tuple)


def _resolved_with(profiles: tuple[ProfileUsed, ...]) -> str:
    if not profiles:
        return ""
    return " (spec resolved with " + ", ".join(f"{p.kind} {p.name}" for p in profiles) + ")"


def effective_spec(
    name: str,
    spec: Mapping[str, Any] | None,
    platform: PlatformState,
    *,
    warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES,
) -> Effective:
    """The InferenceService `name`'s spec as the operator runs it, or why it cannot run."""
    resolution = resolve(spec, platform.cluster_profiles, platform.namespace_profiles)
    if isinstance(resolution, Unresolved):
        return Effective(None, resolution.reason, resolution.message)
    profiles = resolution.profiles
    parsed = parse_spec(name, resolution.spec, warmup_budget_bytes=warmup_budget_bytes)
    if isinstance(parsed, SpecError):
        message = parsed.message + _resolved_with(profiles)
        return Effective(None, constants.REASON_INVALID_SPEC, message, profiles)
    policies, unparsed = parse_policies(platform.cluster_policies, platform.namespace_policies)
    problems = unparsed + violations(parsed, policies, platform.prometheus_allow_list())
    if problems:
        message = "; ".join(problems) + _resolved_with(profiles)
        return Effective(None, constants.REASON_POLICY_VIOLATION, message, profiles)
    return Effective(parsed, profiles=profiles)

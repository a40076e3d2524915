"""Decide whether the API server may store an InferenceService: the validating webhook's verdict.

Why it exists: without it, a spec the CRD schema lets through but the operator cannot run is
stored and only later shown as Ready=False; GitOps tools (Argo CD, Flux) want `kubectl apply`
itself to fail, naming the fields. The verdict is the operator's own answer for the object
(`effective_spec`: resolved against its profiles, validated, checked against the policies), so
the webhook refuses exactly what the reconcile would mark InvalidSpec, PolicyViolation or
ProfileInvalid, with the same message. This is the single place where admission decides;
handlers/admission.py only gathers the request and the platform's objects and raises what this
returns. Pure: no kopf, no client, no clock.

What is never refused: a DELETE (deleting must always work), a write to a subresource (status,
scale: the spec is not being changed), and an UPDATE that leaves the spec as it was (labels,
annotations, finalizers; an object stored before the webhook existed, while it was down, or
before a policy was tightened stays editable and deletable, and its condition keeps explaining
it). A profile that does not exist yet is a warning, not a refusal: a GitOps sync may apply a
service before its profile, and the operator resolves it once the profile arrives.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kiln_operator import constants
from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES
from kiln_operator.profiles.effective import PlatformState, effective_spec

JUDGED_OPERATIONS = frozenset({"CREATE", "UPDATE"})
"""The operations whose new object is judged; any other (DELETE, CONNECT) is admitted."""
WARNED_REASONS = frozenset({constants.REASON_PROFILE_NOT_FOUND})
"""Reasons the operator waits out by itself: admitted, with the message as a warning."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What the API server asks about one write of an InferenceService (its AdmissionReview's
    request, reduced to what the verdict depends on)."""

    operation: str
    """CREATE, UPDATE, DELETE or CONNECT."""
    subresource: str | None
    """e.g. "status" for a status write; None for the object itself."""
    new: Mapping[str, Any] | None
    """The object as it would be stored (None for a DELETE)."""
    old: Mapping[str, Any] | None = None
    """The object as it is stored (an UPDATE's or DELETE's), else None."""

    @property
    def judged(self) -> bool:
        """Whether the verdict depends on the spec at all: a CREATE, or an UPDATE of the
        object itself that changes its spec."""
        if self.operation not in JUDGED_OPERATIONS or self.subresource is not None:
            return False
        if self.new is None:
            return False
        return self.operation == "CREATE" or _spec(self.new) != _spec(self.old)


@dataclass(frozen=True)
class Verdict:
    """Refused (with one message, naming every field), or admitted, possibly with warnings
    (`kubectl apply` prints them)."""

    refusal: str | None = None
    warnings: tuple[str, ...] = ()


def _spec(body: Mapping[str, Any] | None) -> Any:
    return None if body is None else body.get("spec")


def admission_verdict(
    request: AdmissionRequest,
    platform: PlatformState,
    *,
    warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES,
) -> Verdict:
    """Whether the write may be stored. `platform`: the profiles and policies of the object's
    namespace and the operator's settings; `warmup_budget_bytes`: the operator's warm-up budget,
    as the reconcile applies them."""
    if not request.judged or request.new is None:
        return Verdict()
    metadata = request.new.get("metadata") or {}
    effective = effective_spec(
        str(metadata.get("name") or ""),
        _spec(request.new),
        platform,
        warmup_budget_bytes=warmup_budget_bytes,
    )
    if effective.reason is None:
        return Verdict()
    message = f"{effective.reason}: {effective.message}"
    if effective.reason in WARNED_REASONS:
        return Verdict(warnings=(f"{message}; admitted, the operator waits for it",))
    return Verdict(refusal=message)

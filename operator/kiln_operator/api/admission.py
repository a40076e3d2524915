"""Decide whether the API server may store an InferenceService: the validating webhook's verdict.

Why it exists: without it, a spec that passes the CRD schema but fails `parse_spec` is stored
and only later shown as Ready=False/InvalidSpec; GitOps tools (Argo CD, Flux) want `kubectl
apply` itself to fail, naming the fields. This is the single place where admission decides
(handlers/admission.py only hands over the request and raises what this returns), so platform
policy checks belong here too. Pure: no kopf, no client, no clock; the same spec is refused at
admission with the same messages the InvalidSpec condition would show.

What is never refused: a DELETE (deleting must always work), a write to a subresource (status,
scale: the spec is not being changed), and an UPDATE that leaves the spec as it was (labels,
annotations, finalizers, or anything else about an object stored before the webhook existed
or while it was down: such an object stays editable and deletable, and its InvalidSpec
condition keeps explaining it).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES, SpecError, parse_spec

JUDGED_OPERATIONS = frozenset({"CREATE", "UPDATE"})
"""The operations whose new object is judged; any other (DELETE, CONNECT) is admitted."""


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


def _spec(body: Mapping[str, Any] | None) -> Any:
    return None if body is None else body.get("spec")


def admission_problems(
    request: AdmissionRequest, *, warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES
) -> tuple[str, ...]:
    """Why the write must be refused, one message per problem naming its field; empty when it
    may be stored. `warmup_budget_bytes`: the operator's warm-up budget, as the reconcile
    applies it."""
    if request.operation not in JUDGED_OPERATIONS or request.subresource is not None:
        return ()
    if request.new is None:
        return ()
    if request.operation == "UPDATE" and _spec(request.new) == _spec(request.old):
        return ()
    metadata = request.new.get("metadata") or {}
    parsed = parse_spec(
        str(metadata.get("name") or ""),
        _spec(request.new),
        warmup_budget_bytes=warmup_budget_bytes,
    )
    return parsed.problems if isinstance(parsed, SpecError) else ()


def refusal_message(problems: tuple[str, ...]) -> str:
    """The one message `kubectl apply` prints for a refused write: every problem, each naming
    its field, so a pipeline's log shows all of them at once."""
    count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
    return f"InferenceService refused by Kiln ({count}): " + "; ".join(problems)

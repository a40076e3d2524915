"""status.conditions: the standard Kubernetes condition shape (metav1.Condition).

Why it exists: kubectl, Argo CD and `kubectl wait --for=condition=Ready` read conditions in this
exact shape; one model keeps every writer to it.
"""

from typing import Annotated, Literal

from pydantic import Field

from kiln_operator.api.v1alpha1.base import ApiModel

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """One aspect of the InferenceService's state, as metav1.Condition."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    """Condition type in CamelCase, e.g. Ready, DeploymentAvailable, Progressing, SpecValid."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[
        str,
        Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    """Machine-readable CamelCase cause of the last transition, e.g. InvalidSpec."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """Human-readable detail; for InvalidSpec it names the field path."""
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    """When status last changed (RFC 3339)."""
    observed_generation: Annotated[int | None, Field(ge=0)] = None
    """metadata.generation this condition was computed from."""

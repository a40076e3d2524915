"""set_condition: update one condition in a list the way Kubernetes expects.

Why it exists: lastTransitionTime must change only when status changes, or every resync would
rewrite it (and write the object); that rule lives here once.
"""

from datetime import datetime
from typing import Any

ConditionDict = dict[str, Any]
"""One entry of status.conditions as the API server stores it (camelCase keys); its schema is
`api.v1alpha1.Condition`."""


def format_time(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time serialises."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: list[ConditionDict], condition_type: str) -> ConditionDict | None:
    """The condition of that type, if any."""
    return next((c for c in conditions if c.get("type") == condition_type), None)


def set_condition(
    conditions: list[ConditionDict],
    *,
    condition_type: str,
    status: str,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime,
) -> list[ConditionDict]:
    """A new list with the condition set; lastTransitionTime kept unless status changed."""
    previous = find_condition(conditions, condition_type)
    transition_time = format_time(now)
    if previous is not None and previous.get("status") == status:
        transition_time = previous.get("lastTransitionTime", transition_time)
    updated: ConditionDict = {
        "type": condition_type,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition_time,
    }
    if observed_generation is not None:
        updated["observedGeneration"] = observed_generation
    if previous is None:
        return [*conditions, updated]
    return [updated if c is previous else c for c in conditions]

"""Which pods a scale-down removes first. Pure.

Why it exists: a ReplicaSet scaling down deletes the pods with the lowest
`controller.kubernetes.io/pod-deletion-cost` first. Marking the idlest pods cheapest means the
pods that go are the ones with the least work: the fewest requests answered per second lately
plus in flight (`PrometheusSource.load_by_pod`). Fewer clients' connections end, and the drain
on SIGTERM has less to finish.
"""

from typing import Any

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""Read by the ReplicaSet controller; lower cost is deleted first (an int32)."""


def deletion_costs(pods: list[dict[str, Any]], load: dict[str, float]) -> dict[str, int]:
    """Cost per pod name: its load (requests per second plus in flight, rounded), only where
    the annotation differs.

    Pods absent from the metrics count as idle (0). Pods being deleted are left alone.
    """
    changes = {}
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        cost = round(load.get(meta["name"], 0.0))
        if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) != str(cost):
            changes[meta["name"]] = cost
    return changes

"""Deployment and Pod bodies as the operator's watch cache holds them, for the status tests.

Why it exists: the cause, status and kstatus tests all judge hand-made children; one builder
keeps their shape (the fields the API server returns and ``status/`` reads) in one place.
"""

from typing import Any


def deployment(
    *,
    generation: int = 2,
    desired: int = 2,
    replicas: int = 2,
    updated: int = 2,
    available: int = 2,
    ready: int | None = None,
    observed: int | None = None,
    progressing: str = "NewReplicaSetAvailable",
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Deployment its controller has observed (``observed``, default ``generation``), with
    ``ready`` pods (default ``available``); ``conditions`` replaces the Available and
    Progressing pair derived from ``available`` and ``progressing``."""
    if conditions is None:
        conditions = [
            {"type": "Available", "status": "True" if available else "False"},
            {"type": "Progressing", "status": "True", "reason": progressing},
        ]
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": generation if observed is None else observed,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": available if ready is None else ready,
            "availableReplicas": available,
            "conditions": conditions,
        },
    }


def pod(
    name: str,
    *conditions: dict[str, Any],
    created: str = "2026-11-25T11:00:00Z",
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod of the service with these pod conditions and container statuses."""
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "status": {"conditions": list(conditions), "containerStatuses": containers or []},
    }

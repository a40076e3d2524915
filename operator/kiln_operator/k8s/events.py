"""Post a Kubernetes Event (core/v1) on an InferenceService.

Why it exists: the reconcile loop runs in work-queue workers, outside kopf's handler context,
where `kopf.event` has no queue to post to. This creates the same Event kopf would: on the
object, from the operator's component, so `kubectl describe` and `kubectl get events` show it.
A failure to post is logged, never a failed reconcile: events are notices, not state.
"""

import logging
from datetime import UTC, datetime

from kiln_operator.builders.naming import Manifest
from kiln_operator.constants import MANAGER
from kiln_operator.k8s.client import ApiError, KubeClient
from kiln_operator.k8s.resources import EVENTS

logger = logging.getLogger(__name__)

MAX_MESSAGE = 1024


async def post_event(
    kube: KubeClient, body: Manifest, *, type: str, reason: str, message: str
) -> None:
    """Create an Event about `body` (an object as read from the API server)."""
    meta = body["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{MANAGER}-", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": type,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await kube.create(EVENTS, meta["namespace"], event)
    except (ApiError, OSError) as error:
        logger.warning(
            "could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], error
        )

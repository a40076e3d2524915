"""Post a Kubernetes Event (core/v1) on an object: the one way Kiln posts events.

Why it exists: the reconcile loop's events (Ready, NotReady, InvalidSpec: decided by
`status.compute`, posted by `handlers/inferenceservice.py`'s `_announce`) are posted from the
work queue's workers, which the startup handler starts. kopf sets its event queue only in the
tasks that handle one object's watch events, so there `kopf.event` has no queue to post to.

Every event Kiln posts goes through here: the reconcile loop's (posted by
`handlers/inferenceservice.py`'s `_announce`), the autoscaler's (ScaledUp, ScaledDown,
InvalidAutoscalerState on the InferenceService, `handlers/autoscaler.py`) and the warm-up gate's
(a failed verdict's reason on the Pod, `handlers/warmup_gate.py`). One way, so every Event is
named `kiln-operator-…`, reports the component `kiln-operator`, is cut at the end to 1024
characters, and is posted with the operator's own client (its writes are counted as the
operator's). kopf's `kopf.event` would need an object's handler context the work queue lacks.

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

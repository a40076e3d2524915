"""Post a Kubernetes Event (core/v1) on an object from outside kopf's handler context.

Why it exists: the reconcile loop's events (Ready, NotReady, InvalidSpec: decided by
`status.compute`, posted by `handlers/inferenceservice.py`'s `_announce`) are posted from the
work queue's workers, which the startup handler starts. kopf sets its event queue only in the
tasks that handle one object's watch events, so there `kopf.event` has no queue to post to.

Kiln posts events two ways, and this is one of them. The other is kopf's own `kopf.event` /
`kopf.warn`, used from code that runs inside an object's handler: the autoscaler daemon
(ScaledUp, ScaledDown, InvalidAutoscalerState on the InferenceService, `handlers/autoscaler.py`)
and the warm-up gate (the failed verdict's reason on the Pod, `handlers/warmup_gate.py`). kopf
queues those and posts them in the background, so neither loop waits on the API server.
They stay two because moving either changes what is posted: kopf names its Events `kiln-…`,
adds action, eventTime and reportingInstance, cuts a long message in the middle and posts with
its own client; these are named `kiln-operator-…`, cut at the end and posted with the
operator's client (user agent kiln-operator/…, counted as the operator's writes by the operator
benchmark). Both put the same type, reason and involved object as the caller gives them.

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

"""Peering: kopf's peering object created when missing, and kopf's pause state for the
operator's own scheduler.

Why it exists: kopf only patches an existing peering object; when it is absent, keep-alives
silently go nowhere and every operator replica acts at once. Creating it at start-up (and
tolerating a peer that created it first) makes "exactly one replica acts" hold without an
install step that must run after the CRDs are established. kopf pauses its own watches and
daemons in a standby replica; the operator's scheduler (`k8s.scheduler`) is no kopf daemon, so
it follows the same pause state, taken from kopf.
"""

import asyncio
import inspect

from kopf._cogs.aiokits import aiotoggles

from kiln_operator.k8s.client import ApiError, KubeClient
from kiln_operator.k8s.resources import CLUSTER_PEERINGS, NAMESPACED_PEERINGS
from kiln_operator.k8s.scheduler import Pausing


async def ensure_peering_object(kube: KubeClient, name: str, namespace: str | None) -> bool:
    """Create the ClusterKopfPeering (namespace None) or KopfPeering; True if this call made it."""
    resource = CLUSTER_PEERINGS if namespace is None else NAMESPACED_PEERINGS
    if await kube.get(resource, namespace, name) is not None:
        return False
    kind = "ClusterKopfPeering" if namespace is None else "KopfPeering"
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    try:
        await kube.create(
            resource, namespace, {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": metadata}
        )
    except ApiError as error:
        if error.is_conflict:  # a peer starting at the same moment created it
            return False
        raise
    return True


KOPF_PAUSER = "daemon killer"
"""kopf's root task that stops every daemon while the operator is paused: it holds kopf's pause
state (kopf 1.45, `kopf/_core/reactor/running.py`)."""


def kopf_pause_state() -> Pausing:
    """kopf's own pause state of the running operator: on while peering has paused it (another
    replica is active, or the peering CRD is missing), off while it acts; the same toggles that
    pause kopf's watches and daemons. kopf hands it to no handler, so it is taken from the task
    kopf stops its daemons with. Called from a startup handler; an operator that cannot find it
    refuses to start rather than act while another replica does."""
    for task in asyncio.all_tasks():
        if task.get_name() == KOPF_PAUSER:
            found = _pause_state_in(task.get_coro(), depth=3)
            if found is not None:
                return found
    raise RuntimeError(
        f"kopf's pause state not found (no task {KOPF_PAUSER!r} holding `operator_paused`): "
        "this kopf version is not one the operator supports (see constraints.txt)"
    )


def _pause_state_in(coroutine: object, depth: int) -> Pausing | None:
    """`operator_paused` among the locals of the coroutine or of those it wraps or awaits."""
    frame = getattr(coroutine, "cr_frame", None)
    if frame is None or depth < 0:
        return None
    found = frame.f_locals.get("operator_paused")
    if isinstance(found, aiotoggles.ToggleSet):
        return found
    inner: list[object] = [v for v in frame.f_locals.values() if inspect.iscoroutine(v)]
    inner.append(getattr(coroutine, "cr_await", None))
    for candidate in inner:
        if (state := _pause_state_in(candidate, depth - 1)) is not None:
            return state
    return None

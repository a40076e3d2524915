"""Create kopf's peering object when it is missing.

Why it exists: kopf only patches an existing peering object; when it is absent, keep-alives
silently go nowhere and every operator replica acts at once. Creating it at start-up (and
tolerating a peer that created it first) makes "exactly one replica acts" hold without an
install step that must run after the CRDs are established.
"""

from kiln_operator.k8s.client import ApiError, KubeClient
from kiln_operator.k8s.resources import CLUSTER_PEERINGS, NAMESPACED_PEERINGS


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

"""kopf handlers for the platform's profiles and policies.

Why it exists: a change of a ClusterInferenceProfile, InferenceProfile, ClusterInferencePolicy or
InferencePolicy changes the effective spec of the InferenceServices it applies to: every event
updates the operator's PlatformObjects and queues a reconcile of those services (all of them for
a cluster-scoped kind, the namespace's for a namespaced one). A profile change then rolls them
like a spec change (the warm-up gate holds new pods); a tightened policy freezes them.
"""

from typing import Any

import kopf

from kiln_operator import constants


@kopf.on.event(constants.GROUP, constants.VERSION, constants.CLUSTER_PROFILE_PLURAL)
@kopf.on.event(constants.GROUP, constants.VERSION, constants.PROFILE_PLURAL)
@kopf.on.event(constants.GROUP, constants.VERSION, constants.CLUSTER_POLICY_PLURAL)
@kopf.on.event(constants.GROUP, constants.VERSION, constants.POLICY_PLURAL)
async def platform_object_changed(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    resource: kopf.Resource,
    memo: Any,
    **_: Any,
) -> None:
    """Keep the newest copy; reconcile the services it applies to if what applies changed."""
    if not memo.platform.observe(resource.plural, type, body):
        return  # e.g. the watch's first listing of what PlatformObjects.prime read
    listing = type is None  # after a start the cache may not have the children: read afresh
    for service_namespace, name in memo.cache.names(constants.PLURAL, namespace):
        memo.workqueue.add(service_namespace, name, trigger=resource.plural, fresh=listing)

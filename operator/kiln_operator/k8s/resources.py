"""The Kubernetes resources the operator reads and writes, and their REST paths.

Why it exists: the client is one JSON client for every kind; a resource is only its group,
version and plural, named here once so no caller spells a URL.
"""

from dataclasses import dataclass

from kiln_operator import constants
from kiln_operator.builders import route, service_monitor


@dataclass(frozen=True)
class Resource:
    """One REST resource: group ("" for core), version and plural."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The URL path of the collection, or of one object when `name` is given."""
        root = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:
            root += f"/namespaces/{namespace}"
        root += f"/{self.plural}"
        return root if name is None else f"{root}/{name}"


DEPLOYMENTS = Resource("apps", "v1", "deployments")
SERVICES = Resource("", "v1", "services")
PODS = Resource("", "v1", "pods")
EVENTS = Resource("", "v1", "events")
PDBS = Resource("policy", "v1", "poddisruptionbudgets")
SERVICE_MONITORS = Resource(
    service_monitor.SERVICE_MONITOR_GROUP,
    service_monitor.SERVICE_MONITOR_VERSION,
    service_monitor.SERVICE_MONITOR_PLURAL,
)
HTTP_ROUTES = Resource(route.GATEWAY_GROUP, route.GATEWAY_VERSION, route.HTTP_ROUTE_PLURAL)
GRPC_ROUTES = Resource(route.GATEWAY_GROUP, route.GATEWAY_VERSION, route.GRPC_ROUTE_PLURAL)
INGRESSES = Resource("networking.k8s.io", "v1", "ingresses")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices")
INFERENCE_SERVICES = Resource(constants.GROUP, constants.VERSION, constants.PLURAL)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
SERVICE_MONITOR_CRD = (
    f"{service_monitor.SERVICE_MONITOR_PLURAL}.{service_monitor.SERVICE_MONITOR_GROUP}"
)
CLUSTER_PEERINGS = Resource("kopf.dev", "v1", "clusterkopfpeerings", namespaced=False)
NAMESPACED_PEERINGS = Resource("kopf.dev", "v1", "kopfpeerings")
CLUSTER_PROFILES = Resource(
    constants.GROUP, constants.VERSION, constants.CLUSTER_PROFILE_PLURAL, namespaced=False
)
PROFILES = Resource(constants.GROUP, constants.VERSION, constants.PROFILE_PLURAL)
CLUSTER_POLICIES = Resource(
    constants.GROUP, constants.VERSION, constants.CLUSTER_POLICY_PLURAL, namespaced=False
)
POLICIES = Resource(constants.GROUP, constants.VERSION, constants.POLICY_PLURAL)
PLATFORM_RESOURCES = (CLUSTER_PROFILES, PROFILES, CLUSTER_POLICIES, POLICIES)
"""The platform's profiles and policies, which every InferenceService is resolved against."""

"""build_http_route, build_grpc_route, build_ingress: a service reachable from outside.

Why it exists: spec.route (opt-in) turns into Gateway API routes attached to the platform's
Gateway, or into an Ingress where the cluster has no Gateway API; each is a child like the
Service (same name, Kiln's labels, the InferenceService as controller owner), sent to the
Service's HTTP port (HTTP) and gRPC port (h2c), whose endpoints are only warmed-up pods.
"""

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.route import GatewayRef, render_hostname
from kiln_operator.builders.naming import Manifest, Owner

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
HTTP_ROUTE_PLURAL = "httproutes"
GRPC_ROUTE_PLURAL = "grpcroutes"
HTTP_ROUTE_CRD = f"{HTTP_ROUTE_PLURAL}.{GATEWAY_GROUP}"
"""The CRD whose presence means the cluster has the Gateway API (route.api Auto)."""


def _parent(gateway: GatewayRef) -> Manifest:
    parent: Manifest = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name}
    if gateway.namespace is not None:
        parent["namespace"] = gateway.namespace
    if gateway.section_name is not None:
        parent["sectionName"] = gateway.section_name
    return parent


def _backend(owner: Owner, port: int) -> Manifest:
    return {"group": "", "kind": "Service", "name": owner.name, "port": port, "weight": 1}


def http_hostname(spec: InferenceServiceSpec, owner: Owner) -> str | None:
    """The HTTP hostname of the service's route, if it has one."""
    template = spec.route.hostname_template
    return None if template is None else render_hostname(template, owner.name, owner.namespace)


def grpc_hostname(spec: InferenceServiceSpec, owner: Owner) -> str | None:
    """The gRPC hostname of the service's GRPCRoute, if it has one."""
    template = spec.route.grpc_hostname_template
    return None if template is None else render_hostname(template, owner.name, owner.namespace)


def _route(kind: str, owner: Owner, gateway: GatewayRef, hostname: str, rule: Manifest) -> Manifest:
    return {
        "apiVersion": f"{GATEWAY_GROUP}/{GATEWAY_VERSION}",
        "kind": kind,
        "metadata": owner.metadata(),
        "spec": {"parentRefs": [_parent(gateway)], "hostnames": [hostname], "rules": [rule]},
    }


def build_http_route(spec: InferenceServiceSpec, owner: Owner) -> Manifest | None:
    """The desired HTTPRoute: every path of the HTTP hostname to the Service's HTTP port; None
    when the spec asks for none."""
    hostname, gateway = http_hostname(spec, owner), spec.route.gateway
    if not spec.route.enabled or hostname is None or gateway is None:
        return None
    rule: Manifest = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [_backend(owner, constants.HTTP_PORT)],
    }
    return _route("HTTPRoute", owner, gateway, hostname, rule)


def build_grpc_route(spec: InferenceServiceSpec, owner: Owner) -> Manifest | None:
    """The desired GRPCRoute: every method on the gRPC hostname to the Service's gRPC port
    (h2c); None without route.grpcHostnameTemplate."""
    hostname, gateway = grpc_hostname(spec, owner), spec.route.gateway
    if not spec.route.enabled or hostname is None or gateway is None:
        return None
    rule: Manifest = {"backendRefs": [_backend(owner, constants.GRPC_PORT)]}
    return _route("GRPCRoute", owner, gateway, hostname, rule)


def build_ingress(spec: InferenceServiceSpec, owner: Owner) -> Manifest | None:
    """The desired Ingress (the fallback without Gateway API): the HTTP hostname to the
    Service's HTTP port. gRPC needs the Gateway API."""
    hostname = http_hostname(spec, owner)
    if not spec.route.enabled or hostname is None:
        return None
    route = spec.route
    ingress: Manifest = {}
    if route.ingress_class_name is not None:
        ingress["ingressClassName"] = route.ingress_class_name
    if route.ingress_tls_secret_name is not None:
        ingress["tls"] = [{"hosts": [hostname], "secretName": route.ingress_tls_secret_name}]
    ingress["rules"] = [
        {
            "host": hostname,
            "http": {
                "paths": [
                    {
                        "path": "/",
                        "pathType": "Prefix",
                        "backend": {
                            "service": {
                                "name": owner.name,
                                "port": {"number": constants.HTTP_PORT},
                            }
                        },
                    }
                ]
            },
        }
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": owner.metadata(),
        "spec": ingress,
    }

"""spec.route: a service reachable from outside the cluster, opt-in.

Why it exists: without it every team writes its own Ingress or Gateway API route by hand. The
platform names its Gateway and a hostname pattern once, in a profile; a model owner opts in with
`route.enabled: true`. Kiln renders a Gateway API HTTPRoute (and a GRPCRoute when a gRPC
hostname is given), or an Ingress where the cluster has no Gateway API. TLS is the Gateway's
(or the Ingress controller's): Kiln's routes carry plain HTTP and h2c to the Service.
"""

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from kiln_operator.api.v1alpha1.base import ApiModel
from kiln_operator.api.v1alpha1.model import DNS_LABEL, DNS_SUBDOMAIN

PLACEHOLDERS = ("{name}", "{namespace}")
"""What a hostname template may contain besides the host's own characters."""
LONGEST_NAME = "a" * 63
"""A name and a namespace are DNS labels: a template must leave room for both at full length."""
HOSTNAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_HOSTNAME = 253
HostnameTemplate = Annotated[
    str, Field(min_length=1, max_length=MAX_HOSTNAME, pattern=r"^[-a-z0-9.{}]+$")
]


def render_hostname(template: str, name: str, namespace: str) -> str:
    """The hostname of one service: {name} and {namespace} replaced."""
    return template.replace("{name}", name).replace("{namespace}", namespace)


def hostname_template_problem(template: str) -> str | None:
    """Why `template` cannot make a hostname for every service; None if it can."""
    rendered = render_hostname(template, LONGEST_NAME, LONGEST_NAME)
    if "{" in rendered or "}" in rendered:
        return f"{template!r} may contain only the placeholders {list(PLACEHOLDERS)}"
    if len(rendered) > MAX_HOSTNAME or not HOSTNAME.match(rendered):
        return (
            f"{template!r} does not make a hostname (lower-case DNS labels joined by '.', at most "
            f"{MAX_HOSTNAME} characters with a 63-character name and namespace)"
        )
    return None


class GatewayRef(ApiModel):
    """The Gateway (Gateway API) the routes attach to: the platform's, named in a profile."""

    name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN)]
    """The Gateway's name."""
    namespace: Annotated[str | None, Field(max_length=63, pattern=DNS_LABEL)] = None
    """The Gateway's namespace; empty: the service's own. The Gateway's listeners must allow
    routes from the service's namespace (allowedRoutes)."""
    section_name: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """One listener of the Gateway (e.g. `https`); empty: every listener that accepts the
    route."""


class RouteSpec(ApiModel):
    """Exposure outside the cluster. A route or Ingress Kiln did not create is never written:
    a name already taken by another object is reported as ChildConflict."""

    enabled: bool = False
    """Opt-in: render the route. Turned off, Kiln deletes the routes it created."""
    api: Literal["Auto", "GatewayAPI", "Ingress"] = "Auto"
    """Auto: Gateway API routes when the cluster serves the HTTPRoute kind, else an Ingress.
    GatewayAPI or Ingress: that one only."""
    gateway: GatewayRef | None = None
    """The Gateway the HTTPRoute and GRPCRoute attach to (parentRefs); required unless api is
    Ingress. TLS is configured on its listeners."""
    hostname_template: HostnameTemplate | None = None
    """The HTTP hostname, with {name} and {namespace} replaced by the service's, e.g.
    `{name}.{namespace}.models.example.com`. Required when enabled."""
    grpc_hostname_template: HostnameTemplate | None = None
    """The gRPC hostname (a GRPCRoute), e.g. `{name}-grpc.{namespace}.models.example.com`; it
    must differ from the HTTP one (Gateway API lets an HTTPRoute and a GRPCRoute share no
    hostname on a listener). Empty: no GRPCRoute. Not carried by an Ingress (HTTP only)."""
    ingress_class_name: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """The IngressClass of the Ingress; empty: the cluster's default class."""
    ingress_tls_secret_name: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = (
        None
    )
    """A TLS Secret of the service's namespace the Ingress serves its hostname with; empty: the
    Ingress controller's default certificate, if any."""

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> "RouteSpec":
        problems = []
        for field, template in (
            ("hostnameTemplate", self.hostname_template),
            ("grpcHostnameTemplate", self.grpc_hostname_template),
        ):
            problem = None if template is None else hostname_template_problem(template)
            if problem is not None:
                problems.append(f"route.{field}: {problem}")
        if self.enabled and self.hostname_template is None:
            problems.append(
                "route.hostnameTemplate is required when route.enabled is true (usually set by "
                "the profile, e.g. '{name}.{namespace}.models.example.com')"
            )
        if self.enabled and self.api != "Ingress" and self.gateway is None:
            problems.append(
                f"route.gateway is required when route.enabled is true and route.api is "
                f"{self.api} (usually set by the profile): name the platform's Gateway, or set "
                "route.api to Ingress"
            )
        if (
            self.grpc_hostname_template is not None
            and self.grpc_hostname_template == self.hostname_template
        ):
            problems.append(
                "route.grpcHostnameTemplate equals route.hostnameTemplate: an HTTPRoute and a "
                "GRPCRoute cannot share a hostname on one listener; give gRPC its own"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

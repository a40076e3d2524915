"""The activator process's parts wired together: the hold, the two client ports, the control
port; started and stopped as one.

Why it exists: ``__main__`` (the process) and the tests (in their own event loop, on loopback)
start the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from kiln_runtime.activator.control import ControlAdapter, HeldRequests
from kiln_runtime.activator.forward import GrpcChannels, PodSlots
from kiln_runtime.activator.fronts import ActivatorGrpc, ActivatorHttp
from kiln_runtime.activator.hold import HoldLimits, Holds
from kiln_runtime.config import Http2Limits, HttpLimits
from kiln_runtime.protocol.grpcserver import GrpcServer, GrpcService
from kiln_runtime.protocol.httpserver import HttpServer


@dataclass(frozen=True)
class Ports:
    """The ports an activator listens on (0: any free port, as the tests ask)."""

    http: int = 8000
    grpc: int = 8001
    control: int = 9090


@dataclass(frozen=True)
class Settings:
    """What the activator is started with (``__main__``'s flags)."""

    hold: HoldLimits = field(default_factory=HoldLimits)
    max_body_bytes: int = 64 << 20
    """The largest request body (HTTP) or message (gRPC) accepted."""
    max_response_bytes: int = 256 << 20
    """The largest answer a pod may give to a released HTTP request."""
    max_connection_age_seconds: float = 30.0
    """gRPC connections are drained (GOAWAY, as gRPC's MAX_CONNECTION_AGE) at this age, so a
    channel that connected while its service was at zero reconnects through the Service, to the
    pods, once the service is awake; calls on it finish first (the grace outlasts the hold)."""
    max_in_flight_per_pod: int = 64
    """Released requests in flight to one pod at once; keep it below the services'
    `spec.runtime.batching.maxQueueSize` (256 by default), beyond which a pod refuses."""


class Activator:
    """The hold and its three ports."""

    def __init__(self, settings: Settings) -> None:
        self.holds = Holds(settings.hold)
        self.channels = GrpcChannels(settings.max_body_bytes)
        self.slots = PodSlots(settings.max_in_flight_per_pod)
        registry = CollectorRegistry()
        registry.register(HeldRequests(self.holds))
        limits = HttpLimits()
        front = ActivatorHttp(
            self.holds, self.slots, limits, settings.max_body_bytes, settings.max_response_bytes
        )
        self.http = HttpServer(front)
        handler = ActivatorGrpc(self.holds, self.slots, self.channels, settings.max_body_bytes)
        service = GrpcService("kiln.activator", {}, settings.max_body_bytes)
        self.grpc = GrpcServer(
            service,
            max_connection_age=settings.max_connection_age_seconds,
            max_age_grace=settings.hold.timeout_seconds + 10.0,
            limits=Http2Limits(),
            handler=handler.handle,
        )
        self.control = HttpServer(
            ControlAdapter(self.holds, self.channels, self.slots, limits, registry)
        )

    async def start(self, host: str, ports: Ports) -> Ports:
        """Listen; the ports bound."""
        return Ports(
            http=await self.http.start(host, ports.http),
            grpc=await self.grpc.start(host, ports.grpc),
            control=await self.control.start(host, ports.control),
        )

    async def stop(self, grace: float = 5.0) -> None:
        await self.http.stop()
        await self.grpc.stop(grace)
        await self.control.stop()
        await self.channels.close()

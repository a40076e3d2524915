"""The activator's control port: the operator reports ready pods and reads the held demand.

Why it exists: the autoscaler is the only writer of replicas, so the activator only says how
many requests it holds per service (``GET /v1/demand``, and ``kiln_activator_held_requests`` on
``GET /metrics``), and the operator, which watches the pods' warm-up gate, says where each
service's ready pods are (``PUT /v1/services/NAMESPACE/NAME/backends`` with
``{"http": ["ip:port", …], "grpc": ["ip:port", …]}``; empty lists: none ready). The demand
is also a long poll: ``GET /v1/demand?after=G&wait=S`` answers once the hold's generation (in
every answer) differs from ``G``, at most ``S`` seconds later (``MAX_DEMAND_WAIT_SECONDS``),
so the operator hears of a service's first held request at once, not at its next pass. The port is
for the operator only (the chart's NetworkPolicy admits nothing else). Served by the runtime's
HTTP/1.1 server like the client ports.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import orjson
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kiln_runtime.activator.forward import GrpcChannels, PodSlots
from kiln_runtime.activator.hold import Holds
from kiln_runtime.config import HttpLimits
from kiln_runtime.protocol.rest import HttpResponse, empty, json_response

WAKE_SECONDS = Histogram(
    "kiln_activator_wake_seconds",
    "From the first request held for a service to the first ready pod reported for it.",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
BACKENDS_PATH = re.compile(
    r"^/v1/services/([a-z0-9][-a-z0-9.]{0,252})/([a-z0-9][-a-z0-9]{0,62})/backends$"
)
ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[0-9.]+|[a-z0-9][-a-z0-9.]*):[0-9]{1,5}$")
MAX_BACKENDS = 1000
MAX_CONTROL_BODY = 256 << 10
MAX_DEMAND_WAIT_SECONDS = 30.0
"""The longest a demand long poll is held open."""


class HeldRequests(Collector):
    """``kiln_activator_held_requests``, read from the hold at each scrape."""

    def __init__(self, holds: Holds) -> None:
        self.holds = holds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kiln_activator_held_requests",
            "Requests the activator holds now for a service without a ready pod.",
            labels=["namespace", "inferenceservice"],
        )
        for (namespace, name), held in sorted(self.holds.demand().items()):
            family.add_metric([namespace, name], held)
        yield family


class ControlAdapter:
    """The control port's handler (``protocol.httpserver.HttpHandler``)."""

    def __init__(
        self,
        holds: Holds,
        channels: GrpcChannels,
        slots: PodSlots,
        limits: HttpLimits,
        registry: CollectorRegistry,
    ) -> None:
        self.holds = holds
        self.channels = channels
        self.slots = slots
        self.http_limits = limits
        self.max_body = MAX_CONTROL_BODY
        self.registry = registry

    def refused(self, code: str) -> None:
        """Nothing to count: the control port serves no inference."""

    async def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> HttpResponse:
        path, _, query = path.partition("?")
        if method == "GET" and path == "/healthz":
            return json_response(200, {"live": True})
        if method == "GET" and path == "/metrics":
            text: list[bytes | memoryview] = [
                generate_latest(REGISTRY),
                generate_latest(self.registry),
            ]
            return HttpResponse(200, text, content_type=b"text/plain; version=0.0.4")
        if method == "GET" and path == "/v1/demand":
            try:
                after, wait = _long_poll(query)
            except ValueError as error:
                return json_response(400, {"error": str(error)})
            generation = self.holds.generation
            if after is not None and wait > 0:
                generation = await self.holds.next_demand(after, wait)
            demand = [
                {"namespace": namespace, "name": name, "held": held}
                for (namespace, name), held in sorted(self.holds.demand().items())
            ]
            return json_response(200, {"generation": generation, "services": demand})
        found = BACKENDS_PATH.match(path)
        if found is not None and method == "PUT":
            try:
                http, grpc = _backends(orjson.loads(body))
            except (orjson.JSONDecodeError, ValueError) as error:
                return json_response(400, {"error": str(error)})
            self.holds.set_backends((found[1], found[2]), http, grpc)
            await self.channels.keep(self.holds.grpc_addresses())
            self.slots.keep(self.holds.addresses())
            for seconds in self.holds.wakes:
                WAKE_SECONDS.observe(seconds)
            self.holds.wakes.clear()
            return empty(204)
        return json_response(404, {"error": f"no route for {method} {path[:200]}"})


def _long_poll(query: str) -> tuple[int | None, float]:
    """``after`` (None: answer at once) and ``wait`` of a demand long poll's query."""
    try:
        if len(query) > 200:
            raise ValueError
        fields = parse_qs(query, strict_parsing=bool(query), max_num_fields=4)
        after = int(fields["after"][0]) if "after" in fields else None
        wait = float(fields["wait"][0]) if "wait" in fields else 0.0
    except (KeyError, ValueError, IndexError):
        raise ValueError(
            f"the demand's query is after=INT&wait=SECONDS, not {query[:100]!r}"
        ) from None
    if not 0.0 <= wait <= MAX_DEMAND_WAIT_SECONDS:
        raise ValueError(f"wait is 0 to {MAX_DEMAND_WAIT_SECONDS:g} seconds, not {wait:g}")
    return after, wait


def _backends(document: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(document, dict):
        raise ValueError('the body must be {"http": [...], "grpc": [...]}')
    lists = []
    for key in ("http", "grpc"):
        addresses = document.get(key, [])
        if not isinstance(addresses, list) or len(addresses) > MAX_BACKENDS:
            raise ValueError(f"{key} must be a list of at most {MAX_BACKENDS} host:port")
        for address in addresses:
            if not isinstance(address, str) or not ADDRESS.match(address):
                raise ValueError(f"{key}: {str(address)[:100]!r} is not host:port")
        lists.append(tuple(addresses))
    return lists[0], lists[1]

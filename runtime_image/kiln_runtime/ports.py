"""What each listening port did at its connection cap: metrics, and readiness when saturated.

A port that refuses new connections is serving nobody new, whatever the model's state: the
issue that made this module saw 1,100 idle gRPC connections lock every new client out while
the health check, on an existing channel, answered SERVING. Each server reports its open
connections, the idle ones it closed at its cap to admit new ones, and the ones it refused (no
connection was idle); this module exports them as ``kiln_connections``,
``kiln_connections_evicted_total`` and ``kiln_connections_refused_total`` by port, and turns
readiness off while the HTTP or gRPC port has refused a connection within the last
``SATURATED_SECONDS`` (the pod leaves the Service's endpoints until it has room again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# open connections, idle ones closed at the cap, refused ones, when the last was refused (the
# event loop's clock, time.monotonic; 0: never)
PortStatus = Callable[[], tuple[int, int, int, float]]
SATURATED_SECONDS = 10.0
SERVING_PORTS = ("http", "grpc")  # the metrics port's saturation does not stop serving


class PortsCollector(Collector):
    def __init__(self, model: str, ports: Mapping[str, PortStatus]) -> None:
        self._model = model
        self._ports = dict(ports)

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "port"]
        open_ = GaugeMetricFamily("kiln_connections", "Open connections, by port.", labels=labels)
        evicted = CounterMetricFamily(
            "kiln_connections_evicted",
            "Idle connections closed at the port's connection cap to admit a new one.",
            labels=labels,
        )
        refused = CounterMetricFamily(
            "kiln_connections_refused",
            "New connections refused at the port's cap (no connection was idle): the port is "
            "saturated, and readiness is off while it lasts.",
            labels=labels,
        )
        for port, status in self._ports.items():
            count, out, no, _ = status()
            open_.add_metric([self._model, port], count)
            evicted.add_metric([self._model, port], out)
            refused.add_metric([self._model, port], no)
        yield open_
        yield evicted
        yield refused


def saturated(ports: Mapping[str, PortStatus], now: float | None = None) -> str:
    """The serving port that refused a connection within ``SATURATED_SECONDS``, or ""."""
    now = time.monotonic() if now is None else now
    for port in SERVING_PORTS:
        status = ports.get(port)
        if status is not None:
            refused_at = status()[3]
            if refused_at and now - refused_at < SATURATED_SECONDS:
                return port
    return ""

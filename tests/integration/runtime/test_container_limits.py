"""The runtime under a container's descriptor limit, with every port flooded by idle sockets
(issue 39, items 2, 3 and 5): the caps follow ``RLIMIT_NOFILE``, so probes, new gRPC clients
and scrapes are still served.

Before, the caps (1,024 per port plus health budgets) exceeded a 1,024-descriptor limit, the
metrics port took a thread and a descriptor per socket without a cap, and idle gRPC sockets
locked new clients out for the 300 s idle timeout.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator

import pytest

from kiln_runtime.protocol.http2 import wire

from .abuse import Watch
from .conftest import ModelFactory
from .runtime_process import HOST, Runtime, start

OPEN_FILES = 1024


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    model_dir = example_model("mlp")
    logs = tmp_path_factory.mktemp("logs")
    runtime = start(
        model_dir / "model.pt", logs, config=model_dir / "config.json", open_files=OPEN_FILES
    )
    try:
        runtime.wait_for("/v2/health/ready", 200, seconds=90)
        yield runtime
    finally:
        runtime.terminate()


def idle_sockets(port: int, count: int, first: bytes = b"") -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        try:
            sock = socket.create_connection((HOST, port), timeout=5)
        except OSError:
            continue  # refused at accept, or the backlog is full: the flood is what matters
        if first:
            with contextlib.suppress(OSError):
                sock.sendall(first)
        sockets.append(sock)
    return sockets


def stats(runtime: Runtime) -> dict[str, object]:
    connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=5)
    connection.request("GET", "/v2/models/stats")
    document: dict[str, object] = json.loads(connection.getresponse().read())
    return document


def test_the_caps_follow_the_descriptor_limit(runtime: Runtime) -> None:
    limits = stats(runtime)["limits"]
    assert isinstance(limits, dict)
    assert limits["open_files"] == OPEN_FILES
    total = sum(
        limits[port]["max_connections"] + limits[port].get("health_connections", 0)
        for port in ("http", "grpc", "metrics")
    )
    assert total <= OPEN_FILES - 64
    assert "limits for this container" in runtime.output()


def test_idle_floods_on_every_port_leave_probes_clients_and_scrapes_served(
    runtime: Runtime,
) -> None:
    preface = wire.PREFACE + wire.frame(wire.SETTINGS, 0, 0)
    with Watch(runtime) as watch:
        floods = [
            idle_sockets(runtime.grpc_port, 1100, preface),  # gRPC clients that never call
            idle_sockets(runtime.metrics_port, 600),  # sockets that never ask
            idle_sockets(runtime.http_port, 600),
        ]
        try:
            probes = [runtime.status("/v2/health/ready") for _ in range(30)]  # new connections
            serving = runtime.grpc_health("")  # a new gRPC client
            scraped = runtime.metrics()
        finally:
            for sock in (s for flood in floods for s in flood):
                sock.close()
    opened = "/".join(str(len(flood)) for flood in floods)
    watch.report(
        f"under ulimit -n {OPEN_FILES}: idle sockets on the gRPC (preface only), metrics and "
        f"HTTP ports, {opened} opened",
        f"{probes.count(200)} of 30 readiness probes 200; new gRPC client "
        + ("SERVING" if serving == 1 else f"failed ({serving})")
        + "; /metrics answered",
    )
    assert probes.count(200) == 30, probes
    assert serving == 1
    assert 'kiln_connections_evicted_total{model="mlp",port="grpc"}' in scraped
    assert 'kiln_ready{model="mlp"} 1.0' in scraped  # no port refused: still ready
    assert not watch.failures, watch.failures[:3]
    assert not watch.readiness.failures, watch.readiness.failures[:3]

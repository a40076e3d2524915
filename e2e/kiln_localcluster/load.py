"""Bounded gRPC inference load (tritonclient) for the demo and the autoscaler's tests.

Why it exists: one load loop for two ways of reaching an InferenceService: its ready pods' IPs,
spread by the client (the fake GPU nodes have no kube-proxy), or a Service's cluster IP through
kube-proxy on the real node, over several connections, since kube-proxy balances connections,
not calls. Every run stops at its time limit or its request limit.
"""

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as triton_grpc

from kiln_localcluster.cluster import ClusterInfo, kubectl

GRPC_PORT = 8001


def cluster_ip(info: ClusterInfo, namespace: str, service: str) -> str:
    """The Service's cluster IP (kube-proxy on the real node leads it to a ready pod)."""
    return kubectl(
        info, "get", "service", service, "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()


def ready_endpoints(info: ClusterInfo, namespace: str, service: str) -> list[str]:
    """The pod IPs a Service's EndpointSlices list as ready."""
    slices = json.loads(kubectl(
        info, "get", "endpointslices", "-n", namespace, "-o", "json",
        "-l", f"kubernetes.io/service-name={service}",
    ).stdout)["items"]  # fmt: skip
    return sorted(
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e["addresses"]
    )


@dataclass
class LoadReport:
    """What a run measured."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] if ordered else 0.0

    def summary(self, pods: int) -> str:
        done = len(self.latencies_ms)
        rate = done / self.seconds if self.seconds else 0.0
        return (
            f"{done} requests in {self.seconds:.1f}s over {pods} pods ({rate:.0f} req/s), "
            f"p50 {self.percentile(50):.2f} ms, p99 {self.percentile(99):.2f} ms, "
            f"{self.errors} errors"
        )


async def run_load(
    endpoints: Callable[[], list[str]],
    model: str,
    *,
    seconds: float,
    max_requests: int,
    concurrency: int,
    connections_per_target: int = 1,
    stop: threading.Event | None = None,
) -> LoadReport:
    """Send one-item MLP requests (INPUT__0, 512 floats) until a bound or ``stop`` is reached.

    ``endpoints`` is asked again every second, so pods that join or leave are followed. Each
    target gets ``connections_per_target`` connections of its own (grpcio would otherwise share
    one among a process's channels to the same address), the workers taking turns over them.
    """
    report = LoadReport()
    request = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
    request.set_data_from_numpy(np.random.default_rng(0).standard_normal((1, 512), np.float32))
    clients: dict[tuple[str, int], triton_grpc.InferenceServerClient] = {}
    targets: list[str] = []
    refreshed = 0.0
    sent = 0
    started = time.monotonic()
    deadline = started + seconds

    def bounded() -> bool:
        return (
            time.monotonic() < deadline
            and sent < max_requests
            and not (stop is not None and stop.is_set())
        )

    async def worker() -> None:
        nonlocal sent, targets, refreshed
        while bounded():
            if time.monotonic() - refreshed > 1.0:
                refreshed = time.monotonic()
                targets = endpoints()
            if not targets:
                await asyncio.sleep(0.1)
                continue
            key = (targets[sent % len(targets)], sent % connections_per_target)
            sent += 1
            if (client := clients.get(key)) is None:
                client = clients[key] = triton_grpc.InferenceServerClient(
                    f"{key[0]}:{GRPC_PORT}", channel_args=[("grpc.use_local_subchannel_pool", 1)]
                )
            began = time.perf_counter()
            try:
                await client.infer(model, [request], client_timeout=10)
            except Exception:  # counted: a load run reports errors, it does not stop on them
                report.errors += 1
            else:
                report.latencies_ms.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.seconds = time.monotonic() - started
    for client in clients.values():
        await client.close()
    return report

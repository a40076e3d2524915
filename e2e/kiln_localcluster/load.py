"""Bounded inference load over an InferenceService's ready pods, as a client-side balancer.

Why it exists: the local cluster has no kube-proxy, so a Service's ClusterIP leads nowhere; the
demo and the autoscaler's tests resolve the Service's ready endpoints and spread gRPC requests
(tritonclient) over those pod IPs. Every run stops at its time limit or its request limit.
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
    stop: threading.Event | None = None,
) -> LoadReport:
    """Send one-item MLP requests (INPUT__0, 512 floats) until a bound or ``stop`` is reached.

    ``endpoints`` is asked again every second, so pods that join or leave are followed.
    """
    report = LoadReport()
    request = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
    request.set_data_from_numpy(np.random.default_rng(0).standard_normal((1, 512), np.float32))
    clients: dict[str, triton_grpc.InferenceServerClient] = {}
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
            ip = targets[sent % len(targets)]
            sent += 1
            client = clients.setdefault(ip, triton_grpc.InferenceServerClient(f"{ip}:{GRPC_PORT}"))
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

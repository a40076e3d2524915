"""A bounded load against an InferenceService's ready pods, as a client-side balancer would send it.

Why it exists: the local cluster has no kube-proxy, so the demo resolves the Service's ready
endpoints (EndpointSlices) and spreads gRPC requests over those pod IPs with tritonclient. The run
stops at its time limit or its request limit, whichever comes first.
"""

import argparse
import asyncio
import json
import subprocess
import sys
import time

import numpy as np
import tritonclient.grpc.aio as triton_grpc


def ready_endpoints(kubectl: str, namespace: str, service: str) -> list[str]:
    slices = json.loads(subprocess.run(
        [kubectl, "get", "endpointslices", "-n", namespace, "-o", "json",
         "-l", f"kubernetes.io/service-name={service}"],
        capture_output=True, text=True, check=True,
    ).stdout)["items"]  # fmt: skip
    return sorted(
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e["addresses"]
    )


async def run(args: argparse.Namespace, ips: list[str]) -> int:
    clients = [triton_grpc.InferenceServerClient(f"{ip}:8001") for ip in ips]
    batch = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
    batch.set_data_from_numpy(np.random.default_rng(0).standard_normal((1, 512), np.float32))
    latencies: list[float] = []
    errors = 0
    sent = 0
    deadline = time.monotonic() + args.seconds

    async def worker(index: int) -> None:
        nonlocal errors, sent
        while time.monotonic() < deadline and sent < args.max_requests:
            sent += 1
            client = clients[(index + sent) % len(clients)]
            started = time.perf_counter()
            try:
                await client.infer(args.model, [batch], client_timeout=10)
            except Exception:  # counted and reported: the demo shows errors, it does not stop
                errors += 1
            else:
                latencies.append((time.perf_counter() - started) * 1000)

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    elapsed = time.monotonic() - started
    for client in clients:
        await client.close()
    ordered = sorted(latencies)
    if not ordered:
        print(f"no request succeeded ({errors} errors)")
        return 1
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"{len(ordered)} requests in {elapsed:.1f}s over {len(ips)} pods "
        f"({len(ordered) / elapsed:.0f} req/s), p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
        f"{errors} errors"
    )
    return 0 if errors == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--max-requests", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    ips = ready_endpoints(args.kubectl, args.namespace, args.service)
    if not ips:
        print("the Service has no ready endpoints", file=sys.stderr)
        return 1
    return asyncio.run(run(args, ips))


if __name__ == "__main__":
    sys.exit(main())

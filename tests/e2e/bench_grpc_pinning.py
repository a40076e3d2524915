"""gRPC connection pinning on a real node: who serves a long-lived client's calls after 1 -> 3.

Why it exists: kube-proxy balances connections, not calls, and `tritonclient` keeps one HTTP/2
connection. Clients that connected while one replica ran keep every call on it after the
autoscaler added two more — unless the runtime ends aged connections (spec.runtime.connections)
so they reconnect through the Service. That spreads many clients, never one: a single client's
one connection is on one pod at a time. For one client the fix is on its side, gRPC's
`round_robin` over a headless Service's pod addresses. This runs each case on the local
cluster's real node — 12 clients and then one through the Service's cluster IP, one through the
headless Service — and writes the per-pod shares over time to docs/benchmarks/grpc-pinning.md.

    python -m tests.e2e.bench_grpc_pinning --out docs/benchmarks   (`make bench-pinning`)
"""

import argparse
import datetime
import json
import platform
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from kiln_localcluster.cluster import kubectl
from kiln_localcluster.waiting import wait_for
from tests.e2e.benchcluster import IMAGE, REPO, BenchCluster, bench_cluster
from tests.e2e.headless_dns import HeadlessDns

WINDOW_SECONDS = 15.0
MEASURE_SECONDS = 90.0
CALL_GAP_SECONDS = 0.02
"""Each client paces its calls: load is steady, and the 2 cores stay shared fairly."""
MAX_CALLS_PER_CLIENT = 20_000
CLIENTS = 12
GRPC_PORT = 8001
HEADLESS = "pin-pods"
LOCAL_SUBCHANNELS = ("grpc.use_local_subchannel_pool", 1)
"""grpcio shares one connection among the channels of a process that name the same target;
a local subchannel pool gives each client its own, as separate client processes have."""
ROUND_ROBIN = ("grpc.lb_policy_name", "round_robin")


@dataclass
class Variant:
    name: str
    max_age_seconds: int
    clients: int
    headless: bool = False
    """Through a headless Service with `round_robin`, instead of the Service's cluster IP."""
    windows: list[dict[str, float]] = field(default_factory=list)
    errors: int = 0
    error_kinds: Counter[str] = field(default_factory=Counter)
    """Failed calls by what the client said (gRPC status and the start of its message)."""
    calls: int = 0
    dns_queries: int = 0


def service(name: str, max_age: int, replicas: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "serving.kiln.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {
                "model": {
                    "uri": "pvc://models/mlp/model.pt",
                    "format": "torchscript",
                    "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
                    "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
                },
                "runtime": {
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "connections": {"maxAgeSeconds": max_age, "maxAgeGraceSeconds": 5},
                },
                "resources": {"gpuCount": 0, "cpu": "500m", "memory": "1Gi"},
                "warmup": {"requests": 20, "concurrency": 2, "p99Milliseconds": 2000},
                "slo": {"p99LatencyMilliseconds": 1000},
                "autoscaling": {"minReplicas": replicas, "maxReplicas": 3},
            },
        }
    )


def pod_counts(cluster: Any, namespace: str) -> dict[str, float]:
    """Each ready pod's count of answered gRPC calls, read from its own metrics endpoint."""
    pods = kubectl(cluster, "get", "pods", "-n", namespace, "-o", "yaml").stdout
    counts: dict[str, float] = {}
    for pod in yaml.safe_load(pods)["items"]:
        ip = pod["status"].get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp"):
            continue
        try:
            with urllib.request.urlopen(f"http://{ip}:8002/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            continue
        counts[pod["metadata"]["name"]] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kiln_requests_total{") and 'protocol="grpc"' in line
        )
    return counts


def headless_service(selector: dict[str, str]) -> str:
    """The headless Service a user adds for client-side balancing: no cluster IP, its DNS name
    answers with the ready pods' addresses."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": HEADLESS},
            "spec": {
                "clusterIP": "None",
                "selector": selector,
                "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}],
            },
        }
    )


def ready_addresses(cluster: Any, namespace: str) -> list[str]:
    """The headless Service's ready endpoints, as cluster DNS answers its name."""
    listing = kubectl(cluster, "get", "endpointslices", "-n", namespace, "-o", "json",
                      "-l", f"kubernetes.io/service-name={HEADLESS}", check=False)  # fmt: skip
    if listing.returncode != 0:
        return []
    return sorted(
        address
        for item in json.loads(listing.stdout)["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    )


def load(
    target: str,
    channel_args: list[tuple[str, Any]],
    stop: threading.Event,
    variant: Variant,
    lock: threading.Lock,
) -> None:
    """One long-lived client: one tritonclient (one channel), calls until told to stop."""
    client = grpcclient.InferenceServerClient(target, channel_args=channel_args)
    tensor = grpcclient.InferInput("INPUT__0", [1, 512], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
    try:
        for _ in range(MAX_CALLS_PER_CLIENT):
            if stop.is_set():
                break
            try:
                client.infer("pin", [tensor], client_timeout=5.0)
                with lock:
                    variant.calls += 1
            except Exception as error:
                with lock:
                    variant.errors += 1
                    variant.error_kinds[failure_kind(error)] += 1
            time.sleep(CALL_GAP_SECONDS)
    finally:
        client.close()


def failure_kind(error: Exception) -> str:
    """A failed call's kind: tritonclient's gRPC status and the start of its message."""
    if isinstance(error, InferenceServerException):
        return f"{error.status()}: {(error.message() or '')[:80]}"
    return f"{type(error).__name__}: {str(error)[:80]}"


def ready_pods(cluster: Any, namespace: str) -> int:
    body = kubectl(cluster, "get", "deployment", "pin", "-n", namespace, "-o", "yaml").stdout
    return int(yaml.safe_load(body)["status"].get("readyReplicas") or 0)


def run_variant(bench: BenchCluster, variant: Variant) -> None:
    cluster = bench.info
    namespace = f"pinning-{variant.name}"
    bench.namespace_with_models(namespace)
    kubectl(cluster, "apply", "-n", namespace, "-f", "-",
            input=service("pin", variant.max_age_seconds, 1))  # fmt: skip
    wait_for(lambda: ready_pods(cluster, namespace) == 1, timeout=180, description="1 pod")
    try:
        if not variant.headless:
            ip = yaml.safe_load(
                kubectl(cluster, "get", "svc", "pin", "-n", namespace, "-o", "yaml").stdout
            )["spec"]["clusterIP"]
            measure(bench, variant, namespace, f"{ip}:{GRPC_PORT}", [LOCAL_SUBCHANNELS])
            return
        deployment = kubectl(cluster, "get", "deployment", "pin", "-n", namespace, "-o", "yaml")
        selector = yaml.safe_load(deployment.stdout)["spec"]["selector"]["matchLabels"]
        kubectl(cluster, "apply", "-n", namespace, "-f", "-",
                input=headless_service(selector))  # fmt: skip
        wait_for(lambda: len(ready_addresses(cluster, namespace)) == 1, timeout=30,
                 description="the headless Service's endpoint")  # fmt: skip
        name = f"{HEADLESS}.{namespace}.svc.cluster.local"
        with HeadlessDns(name, lambda: ready_addresses(cluster, namespace)) as dns:
            channel_args = [LOCAL_SUBCHANNELS, ROUND_ROBIN]
            measure(bench, variant, namespace, dns.target(GRPC_PORT), channel_args)
            variant.dns_queries = dns.queries
    finally:
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)


def measure(
    bench: BenchCluster,
    variant: Variant,
    namespace: str,
    target: str,
    channel_args: list[tuple[str, Any]],
) -> None:
    """The clients connect to the one pod; then 1 -> 3, and each pod's share per window."""
    cluster = bench.info
    stop, lock = threading.Event(), threading.Lock()
    threads = [
        threading.Thread(target=load, args=(target, channel_args, stop, variant, lock), daemon=True)
        for _ in range(variant.clients)
    ]
    for thread in threads:
        thread.start()
    try:
        time.sleep(5)  # every client connected to the one pod there is
        kubectl(cluster, "apply", "-n", namespace, "-f", "-",
                input=service("pin", variant.max_age_seconds, 3))  # fmt: skip
        wait_for(lambda: ready_pods(cluster, namespace) == 3, timeout=240, description="3 pods")
        before = pod_counts(cluster, namespace)
        deadline = time.monotonic() + MEASURE_SECONDS
        while time.monotonic() < deadline:
            time.sleep(WINDOW_SECONDS)
            after = pod_counts(cluster, namespace)
            delta = {pod: after[pod] - before.get(pod, 0.0) for pod in after}
            total = sum(delta.values()) or 1.0
            variant.windows.append({pod: value / total for pod, value in sorted(delta.items())})
            before = after
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)


def report(variants: list[Variant], started: datetime.datetime) -> str:
    lines = [
        "# gRPC connection pinning on a real node",
        "",
        "Generated by `make bench-pinning` (`tests/e2e/bench_grpc_pinning.py`). Do not edit by "
        "hand: re-run the benchmark.",
        "",
        f"- When: {started:%Y-%m-%d %H:%M} UTC; machine: 2 CPUs ({platform.machine()}), shared "
        "by the local control plane, the real node (kubelet, containerd, kube-proxy) and the pods",
        "- Each variant: an InferenceService of the example MLP at 1 replica; long-lived "
        f"`tritonclient.grpc` clients (one channel each, a call every "
        f"{CALL_GAP_SECONDS * 1000:.0f} ms) through the Service's cluster IP (kube-proxy, "
        "iptables mode) or, with `round_robin`, through a headless Service; then "
        "minReplicas 1 -> 3. "
        f"Shares: each pod's part of the gRPC calls answered in successive {WINDOW_SECONDS:.0f} s "
        "windows, counted from the pods' own `kiln_requests_total`, from the moment all 3 pods "
        "are ready.",
        "- Target: each pod serves 33 % ± 10 % of the calls within 60 s of the scale-up.",
        "",
    ]
    for variant in variants:
        age = f"{variant.max_age_seconds} s" if variant.max_age_seconds else "off"
        route = "`round_robin` over a headless Service" if variant.headless else "the cluster IP"
        resolved = (
            f" The client resolved the headless name {variant.dns_queries} times (DNS queries)."
            if variant.headless
            else ""
        )
        lines += [
            f"## {variant.clients} client(s), {route}, maximum connection age {age}",
            "",
            f"Calls answered {variant.calls}, failed {variant.errors}.{resolved}",
            "",
            *(f"- failed: {count} x `{kind}`" for kind, count in variant.error_kinds.most_common()),
            *([""] if variant.error_kinds else []),
            "| window (s after 3 ready) | shares per pod | largest deviation from 33 % |",
            "|---|---|---:|",
        ]
        for i, shares in enumerate(variant.windows):
            values = sorted(shares.values(), reverse=True) + [0.0] * (3 - len(shares))
            deviation = max(abs(v - 1 / 3) for v in values[:3])
            text = " / ".join(f"{v:.0%}" for v in values[:3])
            window = f"{i * WINDOW_SECONDS:.0f}-{(i + 1) * WINDOW_SECONDS:.0f}"
            lines.append(f"| {window} | {text} | {deviation:.0%} |")
        met = [
            max(abs(v - 1 / 3) for v in (sorted(s.values()) + [0.0] * 3)[:3]) <= 0.10
            for s in variant.windows[round(60 / WINDOW_SECONDS) :]
        ]
        verdict = "met" if met and all(met) else "**missed**"
        lines += [
            "",
            f"Windows from 60 s on within 33 % ± 10 %: {sum(met)}/{len(met)} ({verdict}).",
            "",
        ]
    lines += [
        "## Reading the numbers",
        "",
        "- Without a maximum age every connection stays on the pod it found: the two replicas "
        "the autoscaler added serve none of these clients' calls.",
        "- With it, each connection is drained after 30 s (±10 %), as grpc-go drains one: a "
        "GOAWAY that still admits every stream and a PING, the final GOAWAY once the PING's ACK "
        "shows the client read the first, then the end of the connection (FIN) once its calls "
        "are answered. The client reconnects through the Service, where kube-proxy picks a pod "
        "at random, and shares move towards a third each as connections rotate; with "
        f"{CLIENTS} connections placed at random, a {WINDOW_SECONDS:.0f} s window can still miss "
        "33 % ± 10 %. Every failed call a client saw is listed under its variant by gRPC status "
        "and message (none listed: none failed).",
        "- Connection-level balancing cannot split one connection: a single client through the "
        "cluster IP is on one pod at a time, and moves, pod by pod, at every maximum age. Its "
        "windows show one or two pods, never a fair share.",
        "- For one client the fix is on the client's side: gRPC's `round_robin` over the pods' "
        "own addresses, which a headless Service (`clusterIP: None`, the InferenceService's "
        "pod selector) gives through DNS: "
        '`tritonclient.grpc.InferenceServerClient("dns:///<headless>.<ns>.svc.cluster.local:8001", '
        'channel_args=[("grpc.lb_policy_name", "round_robin")])`. The client holds a connection '
        "to every ready pod and sends each call to the next. It re-resolves the name when a "
        "connection ends (at most every 30 s, grpc's default), so it is the maximum connection "
        "age that lets it find the replicas added after it connected.",
        "- The local cluster runs no cluster DNS: the benchmark answers the headless Service's "
        "name itself, from its EndpointSlices' ready addresses as CoreDNS does "
        "(`tests/e2e/headless_dns.py`), and the client names that server in its target "
        "(`dns://127.0.0.1:<port>/<headless>.<ns>.svc.cluster.local:8001`); the rest of "
        "the resolution is grpc's own.",
        "- grpcio shares one connection among a process's channels to the same target; the "
        "clients here use `grpc.use_local_subchannel_pool` so that each has its own, as separate "
        "client processes do.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    with bench_cluster("pinning") as bench:
        variants = [
            Variant("pinned", max_age_seconds=0, clients=CLIENTS),
            Variant("aged", max_age_seconds=30, clients=CLIENTS),
            Variant("one-aged", max_age_seconds=30, clients=1),
            Variant("one-round-robin", max_age_seconds=30, clients=1, headless=True),
        ]
        for variant in variants:
            print(f"[bench-pinning] {variant.name}", file=sys.stderr, flush=True)
            run_variant(bench, variant)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpc-pinning.md").write_text(report(variants, started))
    print((args.out / "grpc-pinning.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

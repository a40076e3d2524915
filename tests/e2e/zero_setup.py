"""Scale to zero on the real node: Kiln's activator deployed from the chart, the operator told
where it is, services at `minReplicas: 0`, and clients that name a service as cluster DNS does.

Why it exists: the end-to-end test (`test_scale_to_zero.py`) and the real-node benchmark
(`bench_scale_to_zero.py`) stand up the same thing. The activator runs as the chart deploys it:
`helm template --set activator.enabled=true`, two restricted replicas of the runtime image in
their own namespace. The operator runs as a process of this machine, where no cluster DNS
answers the chart's headless control Service, so it is given the activator pods one by one
(`KILN_ACTIVATOR_CONTROL=ip:9090,ip:9090`). The activator names a request's service by its Host
(HTTP) or :authority (gRPC), which an in-cluster client's DNS name `mlp.NAMESPACE` gives; here the
clients connect to the Service's cluster IP and send that name, as the client in a pod would.
"""

import asyncio
import calendar
import json
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from kiln_localcluster.waiting import wait_for
from tests.e2e.conftest import E2ECluster, Model
from tests.e2e.test_real_node import MODEL, inference_service
from tests.gotools import go_tool
from tests.sessioncluster import REPO, RUNTIME_IMAGE

ACTIVATOR_NAMESPACE = "kiln-activator"
RELEASE = "kiln"
ACTIVATOR = f"{RELEASE}-activator"
CONTROL_PORT = 9090
HOLD_TIMEOUT_SECONDS = 60
"""The activator's hold (`activator.hold.timeoutSeconds`): above the cold start on a loaded
2-core host plus the autoscaler's pass."""
IDLE_SECONDS = 30
"""`scaleToZero.idleSeconds`: the shortest the API accepts."""
EVALUATION_SECONDS = 5
METRICS_WINDOW_SECONDS = 15


def activator_manifest() -> str:
    """The chart's activator objects, for the runtime image imported into the real node."""
    repository, _, tag = RUNTIME_IMAGE.rpartition(":")
    result = subprocess.run(
        [str(go_tool("helm")), "template", RELEASE, str(REPO / "manifests" / "charts" / "kiln"),
         "-n", ACTIVATOR_NAMESPACE, "--show-only", "templates/activator.yaml",
         "--set", "activator.enabled=true",
         "--set", f"activator.image.repository={repository}",
         "--set", f"activator.image.tag={tag}",
         "--set", "activator.image.pullPolicy=Never",
         "--set", f"activator.hold.timeoutSeconds={HOLD_TIMEOUT_SECONDS}"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return result.stdout


def restricted_namespace(cluster: E2ECluster, name: str) -> None:
    if cluster.kubectl("get", "namespace", name, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", name)
    cluster.kubectl(
        "label", "--overwrite", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        timeout=30,
        description=f"default service account in {name}",
    )


@dataclass(frozen=True)
class ActivatorPod:
    name: str
    ip: str


def deploy_activator(cluster: E2ECluster) -> list[ActivatorPod]:
    """The chart's activator Deployment (2 replicas) ready; its pods."""
    restricted_namespace(cluster, ACTIVATOR_NAMESPACE)
    cluster.kubectl("apply", "-n", ACTIVATOR_NAMESPACE, "-f", "-", input=activator_manifest())
    cluster.kubectl(
        "rollout", "status", "-n", ACTIVATOR_NAMESPACE, f"deployment/{ACTIVATOR}",
        "--timeout=180s", timeout=200,
    )  # fmt: skip
    return activator_pods(cluster)


def activator_pods(cluster: E2ECluster) -> list[ActivatorPod]:
    listing = cluster.get_json(
        "pods", "-n", ACTIVATOR_NAMESPACE, "-l", f"app.kubernetes.io/name={ACTIVATOR}"
    )
    pods = [
        ActivatorPod(item["metadata"]["name"], item["status"]["podIP"])
        for item in listing["items"]
        if item["metadata"].get("deletionTimestamp") is None and item["status"].get("podIP")
    ]
    return sorted(pods, key=lambda pod: pod.name)


def remove_activator(cluster: E2ECluster) -> None:
    cluster.kubectl("delete", "namespace", ACTIVATOR_NAMESPACE, "--wait=false", check=False)


def control_env(pods: list[ActivatorPod]) -> dict[str, str]:
    """The operator's environment naming every activator pod's control port."""
    return {"KILN_ACTIVATOR_CONTROL": ",".join(f"{pod.ip}:{CONTROL_PORT}" for pod in pods)}


def zero_service(name: str, model: Model, **spec: Any) -> str:
    """A CPU service of the example MLP at `minReplicas: 0` with the shortest idle window."""
    return inference_service(
        name,
        model,
        resources={"gpuCount": 0, "cpu": "500m", "memory": "1Gi"},
        autoscaling={
            "minReplicas": 0,
            "maxReplicas": 1,
            "evaluationIntervalSeconds": EVALUATION_SECONDS,
            "metricsWindowSeconds": METRICS_WINDOW_SECONDS,
            "staleAfterSeconds": 30,
            "scaleToZero": {"idleSeconds": IDLE_SECONDS},
        },
        **spec,
    )


def replicas(cluster: E2ECluster, namespace: str, name: str) -> int | None:
    got = cluster.kubectl(
        "get", "deployment", name, "-n", namespace, "-o", "jsonpath={.spec.replicas}", check=False
    )
    return int(got.stdout) if got.returncode == 0 and got.stdout.strip() else None


def endpoint_ips(cluster: E2ECluster, namespace: str, name: str) -> set[str]:
    slices = cluster.get_json(
        "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={name}"
    )
    return {
        address
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def runtime_pod_names(cluster: E2ECluster, namespace: str, name: str) -> list[str]:
    listing = cluster.get_json(
        "pods", "-n", namespace, "-l", f"serving.kiln.dev/inferenceservice={name}"
    )
    return [item["metadata"]["name"] for item in listing["items"]]


def at_zero(cluster: E2ECluster, namespace: str, name: str, activator_ips: set[str]) -> bool:
    """Replicas 0, no pod left, and the Service's endpoints the activator's pods."""
    return (
        replicas(cluster, namespace, name) == 0
        and not runtime_pod_names(cluster, namespace, name)
        and endpoint_ips(cluster, namespace, name) == activator_ips
    )


def wait_at_zero(
    cluster: E2ECluster, namespace: str, name: str, activator_ips: set[str], timeout: float = 180
) -> float:
    """Seconds until the service is at zero (`at_zero`)."""
    started = time.monotonic()
    wait_for(
        lambda: at_zero(cluster, namespace, name, activator_ips),
        timeout=timeout, interval=1, description=f"{namespace}/{name} at zero",
    )  # fmt: skip
    return time.monotonic() - started


def service_ip(cluster: E2ECluster, namespace: str, name: str) -> str:
    return str(cluster.get_json("service", name, "-n", namespace)["spec"]["clusterIP"])


ROW = [1.0] * 512
INFER_BODY = json.dumps(
    {"inputs": [{"name": "INPUT__0", "shape": [1, 512], "datatype": "FP32", "data": ROW}]}
).encode()


@dataclass(frozen=True)
class Answer:
    """One call's outcome: `status` 200 with the model's output shape, 503 refused (waking),
    or anything else (-1: no answer at all); `seconds` from send to answer."""

    status: int
    seconds: float
    detail: str = ""
    via_activator: bool = False
    """An HTTP answer that came through Kiln's activator (its Via header)."""

    @property
    def answered(self) -> bool:
        return self.status == 200

    @property
    def refused(self) -> bool:
        return self.status == 503


def http_infer(address: str, host: str, timeout: float) -> Answer:
    """One HTTP inference to `address` (the cluster IP) naming the service as `host`."""
    request = urllib.request.Request(
        f"http://{address}/v2/models/{MODEL}/infer",
        data=INFER_BODY,
        headers={"Host": host, "Content-Type": "application/json"},
        method="POST",
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.loads(response.read())
            shape = body["outputs"][0]["shape"]
            status = 200 if shape == [1, 10] else -1
            via = "kiln-activator" in (response.headers.get("Via") or "")
            return Answer(status, time.monotonic() - began, f"shape {shape}", via)
    except urllib.error.HTTPError as error:
        detail = error.read()[:300].decode("utf-8", "replace")
        retry = error.headers.get("Retry-After")
        if error.code == 503 and not retry:
            detail = f"no Retry-After: {detail}"
            return Answer(-1, time.monotonic() - began, detail)
        return Answer(error.code, time.monotonic() - began, detail)
    except Exception as error:
        return Answer(-1, time.monotonic() - began, repr(error)[:300])


def grpc_infer(address: str, host: str, timeout: float) -> Answer:
    """One tritonclient gRPC inference on a channel of its own, with `host` as :authority."""
    client = grpcclient.InferenceServerClient(
        address, channel_args=[("grpc.default_authority", host)]
    )
    began = time.monotonic()
    try:
        tensor = grpcclient.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
        out = client.infer(MODEL, [tensor], client_timeout=timeout).as_numpy("OUTPUT__0")
        status = 200 if out is not None and out.shape == (1, 10) else -1
        return Answer(status, time.monotonic() - began)
    except Exception as error:
        text = str(error)
        status = 503 if "StatusCode.UNAVAILABLE" in text and "waking" in text else -1
        return Answer(status, time.monotonic() - began, text[:300])
    finally:
        client.close()


def gate_passed_at(pod: dict[str, Any]) -> float | None:
    """When the pod's warm-up gate turned True (epoch seconds), if it did."""
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "serving.kiln.dev/warmed-up" and condition["status"] == "True":
            return _epoch(condition["lastTransitionTime"])
    return None


def _epoch(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def pod_cold_start(pod: dict[str, Any]) -> float | None:
    """Seconds from the pod's creation to its warm-up gate (1 s resolution)."""
    gated = gate_passed_at(pod)
    if gated is None:
        return None
    return gated - _epoch(pod["metadata"]["creationTimestamp"])


def read_control(ip: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{ip}:{CONTROL_PORT}{path}", timeout=5) as response:
        body = response.read()
    return json.loads(body) if path != "/metrics" else body.decode()


def activator_memory(cluster: E2ECluster, pod: ActivatorPod) -> tuple[int, int]:
    """(the activator process's RSS, its container's memory as the kernel charges it: cgroup
    v2's memory.current, v1's usage_in_bytes, or the RSS where the container sees neither) in
    bytes."""
    code = (
        "import re\n"
        "rss = int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/1/status').read())[1]) * 1024\n"
        "charged = rss\n"
        "for path in ('/sys/fs/cgroup/memory.current',\n"
        "             '/sys/fs/cgroup/memory/memory.usage_in_bytes'):\n"
        "    try:\n"
        "        charged = int(open(path).read()); break\n"
        "    except OSError:\n"
        "        pass\n"
        "print(rss, charged)\n"
    )
    got = cluster.kubectl(
        "exec", "-n", ACTIVATOR_NAMESPACE, pod.name, "--", "python", "-c", code, timeout=30
    )
    rss, charged = got.stdout.split()
    return int(rss), int(charged)


def memory_limit(cluster: E2ECluster) -> int:
    deployment = cluster.get_json("deployment", ACTIVATOR, "-n", ACTIVATOR_NAMESPACE)
    limit = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    found = re.fullmatch(r"(\d+)(Mi|Gi)", limit)
    assert found is not None, limit
    return int(found[1]) << (20 if found[2] == "Mi" else 30)


async def hold_many(ip: str, host: str, count: int, body_bytes: int) -> list[asyncio.StreamWriter]:
    """`count` HTTP requests of `body_bytes` each sent to one activator pod for `host` and left
    waiting (the connections returned open); each one's request fully written."""
    body = json.dumps({"inputs": [], "pad": "x" * max(0, body_bytes - 30)}).encode()
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()

    async def one() -> asyncio.StreamWriter:
        _, writer = await asyncio.open_connection(ip, 8000)
        writer.write(head + body)
        await writer.drain()
        return writer

    writers: list[asyncio.StreamWriter] = []
    for start in range(0, count, 100):
        writers += await asyncio.gather(*(one() for _ in range(min(100, count - start))))
    return writers

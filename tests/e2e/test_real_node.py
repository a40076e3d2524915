"""Kiln on a real node: its image under a kubelet, its pod spec under `restricted`, its traffic
through a Service's cluster IP."""

import json
import os
import signal
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from kiln_localcluster import node
from kiln_localcluster.cluster import ClusterOptions
from kiln_localcluster.waiting import wait_for
from tests.e2e.conftest import RUNTIME_UID, E2ECluster, Model, service_address
from tests.sessioncluster import REAL_NODE, RUNTIME_IMAGE, missing_component

GATE = "serving.kiln.dev/warmed-up"
HTTP, GRPC = 8000, 8001
READ_ONLY = "Read-only file system"
MODEL = "mlp"
GPU, GPU_PRODUCT = "nvidia.com/gpu", "nvidia.com/gpu.product"
IMITATED = "serving.kiln.dev/imitated-gpus"


def inference_service(name: str, model: Model, **spec: Any) -> str:
    body: dict[str, Any] = {
        "apiVersion": "serving.kiln.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "uri": model.uri,
                "format": "torchscript",
                "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
                "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
            },
            "runtime": {"image": RUNTIME_IMAGE, "imagePullPolicy": "Never"},
            "resources": {"gpuCount": 0, "cpu": "1", "memory": "2Gi"},
            "warmup": {"requests": 50, "concurrency": 4, "p99Milliseconds": 500},
            "slo": {"p99LatencyMilliseconds": 100},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
            **spec,
        },
    }
    return yaml.safe_dump(body)


def infer_http(address: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(address, connection_timeout=2.0, network_timeout=5.0)
    try:
        tensor = httpclient.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
        result: np.ndarray = client.infer(MODEL, [tensor]).as_numpy("OUTPUT__0")
        return result
    finally:
        client.close()


def infer_grpc(address: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(address)
    try:
        tensor = grpcclient.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
        result: np.ndarray = client.infer(MODEL, [tensor], client_timeout=5.0).as_numpy("OUTPUT__0")
        return result
    finally:
        client.close()


def runtime_pods(cluster: E2ECluster, namespace: str) -> list[dict[str, Any]]:
    listing = cluster.get_json("pods", "-n", namespace, "-l", "serving.kiln.dev/inferenceservice")
    pods: list[dict[str, Any]] = listing["items"]
    return pods


def ready_addresses(cluster: E2ECluster, namespace: str, name: str) -> set[str]:
    slices = cluster.get_json(
        "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={name}"
    )
    return {
        address
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


def apply_and_serve(
    cluster: E2ECluster, namespace: str, model: Model, name: str, **spec: Any
) -> float:
    """Apply, then infer through the Service until it answers; seconds from apply."""
    body = inference_service(name, model, **spec)
    return apply_manifest_and_serve(cluster, namespace, body, name)


def apply_manifest_and_serve(
    cluster: E2ECluster, namespace: str, manifest: str, name: str
) -> float:
    """Apply the InferenceService ``name``'s manifest, then infer through the Service until it
    answers; seconds from apply."""
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    wait_for(
        lambda: cluster.kubectl("get", "svc", name, "-n", namespace, check=False).returncode == 0,
        timeout=30,
        description="the Service",
    )
    with service_address(cluster, namespace, name) as address:

        def answered() -> bool:
            try:
                return infer_http(address[HTTP]).shape == (1, 10)
            except Exception:
                return False

        wait_for(answered, timeout=240, interval=0.25, description="an inference via the Service")
    return time.monotonic() - started


def test_apply_to_ready_to_inference_through_the_cluster_ip(
    cluster: E2ECluster, namespace: str, model: Model
) -> None:
    seconds = apply_and_serve(cluster, namespace, model, "mlp")
    print(f"\napply -> first inference through the Service: {seconds:.1f} s")
    with service_address(cluster, namespace, "mlp") as address:
        assert infer_grpc(address[GRPC]).shape == (1, 10)
        np.testing.assert_allclose(infer_grpc(address[GRPC]), infer_http(address[HTTP]), rtol=1e-5)
    # The first answer came only once the warm-up gate had admitted the pod.
    (pod,) = runtime_pods(cluster, namespace)
    gate = next(c for c in pod["status"]["conditions"] if c["type"] == GATE)
    assert gate["status"] == "True", gate
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "inferenceservice/mlp", "--timeout=60s"
    )
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    if cluster.local is not None:  # the local cluster's Prometheus scrapes the real node's pods
        wait_for(
            lambda: condition(cluster, namespace, "mlp", "MetricsAvailable") == "True",
            timeout=90,
            description="the autoscaler reading the pod's metrics from Prometheus",
        )


def condition(cluster: E2ECluster, namespace: str, name: str, kind: str) -> str | None:
    service = cluster.get_json("inferenceservice", name, "-n", namespace)
    for item in (service.get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return str(item["status"])
    return None


def exec_in_runtime(cluster: E2ECluster, namespace: str, pod: str, code: str) -> str:
    result = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "runtime", "--", "python", "-c", code, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_generated_pod_runs_restricted_as_the_images_user_on_a_read_only_model(
    cluster: E2ECluster, namespace: str, model: Model
) -> None:
    apply_and_serve(cluster, namespace, model, "mlp")
    (pod,) = runtime_pods(cluster, namespace)
    name = pod["metadata"]["name"]
    # Admitted by Pod Security `restricted` (the namespace enforces it) and run as the image's
    # own user, not root.
    ids = json.loads(
        exec_in_runtime(
            cluster,
            namespace,
            name,
            "import os, json; print(json.dumps([os.getuid(), os.getgid()]))",
        )
    )
    assert ids == [RUNTIME_UID, RUNTIME_UID]
    # Writable only where the spec gives a writable volume; the model's claim is read-only.
    expected = {"/probe": READ_ONLY, "/opt/kiln/probe": READ_ONLY, "/tmp/probe": "written"}
    if model.claim is not None:
        expected[f"/models/{model.claim}/probe"] = READ_ONLY
    probe = (
        "import json\n"
        "out = {}\n"
        f"for path in {sorted(expected)!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); out[path] = 'written'\n"
        "    except OSError as error:\n"
        "        out[path] = error.strerror\n"
        "print(json.dumps(out))\n"
    )
    outcome = json.loads(exec_in_runtime(cluster, namespace, name, probe))
    assert outcome == expected, outcome


def test_killed_runtime_restarts_and_takes_traffic_only_after_warm_up_again(
    cluster: E2ECluster, namespace: str, model: Model
) -> None:
    if cluster.local is None:
        missing_component("the runtime is killed from the node's side: local cluster only")
        return
    apply_and_serve(cluster, namespace, model, "mlp")
    (pod,) = runtime_pods(cluster, namespace)
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    assert ready_addresses(cluster, namespace, "mlp") == {ip}
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    tasks = node.ctr(cluster.local.node_paths, "tasks", "ls")
    (pid,) = [int(line.split()[1]) for line in tasks.splitlines() if line.startswith(container_id)]
    os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer would
    killed_at = time.monotonic()

    wait_for(
        lambda: ip not in ready_addresses(cluster, namespace, "mlp"),
        timeout=10,
        interval=0.1,
        description="the killed pod leaving the Service's ready endpoints",
    )
    left_after = time.monotonic() - killed_at

    def regated() -> dict[str, Any] | None:
        current = cluster.get_json("pod", name, "-n", namespace)
        restarts = current["status"]["containerStatuses"][0]["restartCount"]
        gate = next(c for c in current["status"]["conditions"] if c["type"] == GATE)
        return current if restarts >= 1 and gate["reason"] == "WarmingUp" else None

    wait_for(regated, timeout=60, interval=0.2, description="the gate reopened for warm-up")
    wait_for(
        lambda: ip in ready_addresses(cluster, namespace, "mlp"),
        timeout=180,
        description="the restarted pod back in the endpoints",
    )
    after = cluster.get_json("pod", name, "-n", namespace)
    gate = next(c for c in after["status"]["conditions"] if c["type"] == GATE)
    started = after["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    # Back only through a new warm-up verdict, given to the restarted container.
    assert gate["status"] == "True" and gate["lastTransitionTime"] >= started, (gate, started)
    with service_address(cluster, namespace, "mlp") as address:
        wait_for(  # kube-proxy follows the endpoints within its sync period
            lambda: infer_http(address[HTTP]).shape == (1, 10),
            timeout=15,
            description="an inference through the Service after the restart",
        )
    print(f"\nkilled pod left the ready endpoints after {left_after:.2f} s")


def test_a_gpu_service_runs_on_the_real_nodes_cpu_and_says_so(
    cluster: E2ECluster, namespace: str, model: Model
) -> None:
    """The node advertises `nvidia.com/gpu` without having one, and the operator runs with
    KILN_IMITATED_GPUS: the GPU pod is placed as on a GPU cluster, its runtime told to use CPU."""
    product = ClusterOptions().gpu_product
    resources: dict[str, Any] = {"gpuCount": 1, "gpuProduct": product, "cpu": "1", "memory": "2Gi"}
    if cluster.local is not None:  # the local cluster's fake GPU nodes run no container
        resources["nodeSelector"] = REAL_NODE
    apply_and_serve(cluster, namespace, model, MODEL, resources=resources)
    cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Ready",
        f"inferenceservice/{MODEL}",
        "--timeout=60s",
    )
    with service_address(cluster, namespace, MODEL) as address:
        assert infer_grpc(address[GRPC]).shape == (1, 10)
    (pod,) = runtime_pods(cluster, namespace)
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["requests"][GPU] == "1"
    assert container["resources"]["limits"][GPU] == "1"
    assert pod["spec"]["nodeSelector"][GPU_PRODUCT] == product
    placed = cluster.get_json("node", pod["spec"]["nodeName"])
    assert placed["metadata"]["labels"][GPU_PRODUCT] == product
    assert int(placed["status"]["allocatable"][GPU]) >= 1
    if cluster.local is not None:
        assert pod["spec"]["nodeName"] == node.NODE_NAME
    # The pod says its GPU is imitated, and its runtime was told to run on CPU.
    assert "runs on CPU" in pod["metadata"]["annotations"][IMITATED]
    config = next(e["value"] for e in container["env"] if e["name"] == "KILN_RUNTIME_CONFIG")
    assert json.loads(config)["optimization"]["device"] == "cpu"


def ready_and_stalled(cluster: E2ECluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    service = cluster.get_json("inferenceservice", name, "-n", namespace)
    return {
        item["type"]: item
        for item in (service.get("status") or {}).get("conditions") or []
        if item["type"] in ("Ready", "Stalled")
    }


def test_a_runtime_that_cannot_load_its_model_says_why_in_ready(
    cluster: E2ECluster, namespace: str, model: Model
) -> None:
    """A rollout to a model path that does not exist: the new pod's runtime writes why it exits
    to its termination log, and Ready (RolloutStalled) and Stalled carry that reason within 60 s
    and keep it through the crash loop's retries (it was "the runtime is not ready yet",
    alternating with "no termination message")."""
    apply_and_serve(cluster, namespace, model, MODEL)
    missing = model.uri.rsplit("/", 1)[0] + "/missing.pt"
    body = inference_service(MODEL, Model(uri=missing, claim=model.claim))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body)
    applied = time.monotonic()
    cause = "failed to start: model path '/models/"

    def said() -> dict[str, dict[str, Any]] | None:
        found = ready_and_stalled(cluster, namespace, MODEL)
        stalled = found.get("Stalled", {})
        if stalled.get("status") == "True" and cause in stalled.get("message", ""):
            return found
        return None

    found = wait_for(said, timeout=60, interval=0.5, description="Stalled naming the cause")
    seconds = time.monotonic() - applied
    ready = found["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "RolloutStalled"), ready
    assert "missing.pt' does not exist" in ready["message"], ready
    assert "1 pods of the previous spec keep serving" in ready["message"], ready
    # the new pod: the runtime's own words in its terminated state, and the policy that keeps them
    new = max(runtime_pods(cluster, namespace), key=lambda p: p["metadata"]["creationTimestamp"])
    (container,) = new["spec"]["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # through the loop's next retry (the kubelet's back-off is 10 s, then 20 s) the reason holds:
    # watched until a retry has run and ended in back-off again
    reasons: set[str] = set()
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reasons.add(ready_and_stalled(cluster, namespace, MODEL)["Ready"]["reason"])
        pod = cluster.get_json("pod", new["metadata"]["name"], "-n", namespace)
        status = pod["status"]["containerStatuses"][0]
        seen.append((status["restartCount"], next(iter(status["state"]))))
        if any(state == "running" and count >= 1 for count, state in seen) and seen[-1][1] in (
            "waiting",
            "terminated",
        ):
            break
        time.sleep(0.3)
    assert any(state == "running" and count >= 1 for count, state in seen), seen
    assert seen[-1][1] != "running", seen
    assert reasons == {"RolloutStalled"}, reasons
    message = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["message"]
    assert message.startswith(f"model '{MODEL}' failed to start: model path"), message
    print(f"\nStalled named the runtime's cause {seconds:.1f} s after the apply")

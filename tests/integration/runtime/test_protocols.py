"""tritonclient, unchanged, against a real runtime process: HTTP and gRPC, good and bad input."""

import concurrent.futures
import http.client
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from kiln_runtime.examples import build

from .conftest import ModelFactory
from .runtime_process import Runtime, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    with running(example_model("mlp"), tmp_path_factory.mktemp("logs")) as served:
        yield served


REFERENCE, _ = build("mlp")  # built once: building seeds torch's global generator


def expected(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return REFERENCE(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def batch(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 512)).astype(np.float32)


def test_health_and_metadata_over_both_protocols(runtime: Runtime) -> None:
    http_client = triton_http.InferenceServerClient(runtime.http_url)
    for client in (http_client, triton_grpc.InferenceServerClient(runtime.grpc_url)):
        assert client.is_server_live()
        assert client.is_server_ready()
        server = client.get_server_metadata(**({} if client is http_client else {"as_json": True}))
        assert server["name"] == "kiln"
        assert "binary_tensor_data" in server["extensions"]
        assert client.is_model_ready("mlp")
        assert client.is_model_ready("mlp", "1")
        if isinstance(client, triton_http.InferenceServerClient):
            meta = client.get_model_metadata("mlp")
            config = client.get_model_config("mlp")
        else:
            meta = client.get_model_metadata("mlp", as_json=True)
            config = client.get_model_config("mlp", as_json=True)["config"]
        assert meta["inputs"][0]["name"] == "INPUT__0"
        assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, 512]
        assert int(config["max_batch_size"]) == 32


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_binary_and_json(runtime: Runtime, binary: bool) -> None:
    client = triton_http.InferenceServerClient(runtime.http_url)
    x = batch(3)
    tensor = triton_http.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    output = triton_http.InferRequestedOutput("OUTPUT__0", binary_data=binary)
    result = client.infer("mlp", [tensor], outputs=[output], request_id="abc")
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected(x), atol=1e-4)
    assert result.get_response()["id"] == "abc"


def test_grpc_infer(runtime: Runtime) -> None:
    client = triton_grpc.InferenceServerClient(runtime.grpc_url)
    x = batch(5)
    tensor = triton_grpc.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("mlp", [tensor], client_timeout=30)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected(x), atol=1e-4)


def test_concurrent_requests_each_get_their_own_answer(runtime: Runtime) -> None:
    def one(seed: int) -> None:
        client = triton_http.InferenceServerClient(runtime.http_url)
        x = batch(1 + seed % 4, seed)
        tensor = triton_http.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("mlp", [tensor])
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected(x), atol=1e-4)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(128)))


def http_infer(
    runtime: Runtime, name: str, datatype: str, x: np.ndarray, model: str = "mlp"
) -> None:
    client = triton_http.InferenceServerClient(runtime.http_url)
    tensor = triton_http.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    client.infer(model, [tensor])


def grpc_infer(
    runtime: Runtime, name: str, datatype: str, x: np.ndarray, model: str = "mlp"
) -> None:
    client = triton_grpc.InferenceServerClient(runtime.grpc_url)
    tensor = triton_grpc.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    client.infer(model, [tensor])


@dataclass(frozen=True)
class Bad:
    name: str
    datatype: str
    x: np.ndarray
    model: str
    message: str


BAD_REQUESTS = [
    Bad("WRONG", "FP32", batch(1), "mlp", "unknown: ['WRONG']"),
    Bad("INPUT__0", "FP64", batch(1).astype(np.float64), "mlp", "datatype FP64, expected FP32"),
    Bad("INPUT__0", "FP32", batch(1)[:, :100], "mlp", "shape [1, 100]"),
    Bad("INPUT__0", "FP32", batch(33), "mlp", "outside 1..32"),
    Bad("INPUT__0", "FP32", batch(1), "nope", "unknown model 'nope'"),
]


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=lambda bad: bad.message)
def test_bad_requests_get_a_clear_error_over_http(runtime: Runtime, bad: Bad) -> None:
    with pytest.raises(InferenceServerException) as failure:
        http_infer(runtime, bad.name, bad.datatype, bad.x, bad.model)
    assert bad.message in failure.value.message()
    assert failure.value.status() == ("404" if bad.model == "nope" else "400")


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=lambda bad: bad.message)
def test_bad_requests_get_a_clear_error_over_grpc(runtime: Runtime, bad: Bad) -> None:
    with pytest.raises(InferenceServerException) as failure:
        grpc_infer(runtime, bad.name, bad.datatype, bad.x, bad.model)
    assert bad.message in failure.value.message()
    want = "StatusCode.NOT_FOUND" if bad.model == "nope" else "StatusCode.INVALID_ARGUMENT"
    assert failure.value.status() == want


def test_oversized_payloads_are_refused_before_they_are_read(runtime: Runtime) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", runtime.http_port, timeout=10)
    connection.putrequest("POST", "/v2/models/mlp/infer")
    connection.putheader("Content-Length", str(64 << 20))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert "exceeds the limit" in json.loads(response.read())["error"]
    with pytest.raises(InferenceServerException) as failure:
        grpc_infer(runtime, "INPUT__0", "FP32", batch(300))
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "limit" in failure.value.message()


def test_garbage_gets_400_and_the_server_keeps_serving(runtime: Runtime) -> None:
    for body in (b"{", b"[1,2]", b'{"inputs": "x"}', bytes(range(256))):
        connection = http.client.HTTPConnection("127.0.0.1", runtime.http_port, timeout=10)
        connection.request("POST", "/v2/models/mlp/infer", body=body)
        assert connection.getresponse().status == 400
    raw = http.client.HTTPConnection("127.0.0.1", runtime.http_port, timeout=10)
    raw.request("GET", "/v3/nothing")
    assert raw.getresponse().status == 404
    assert runtime.status("/v2/health/ready") == 200
    test_grpc_infer(runtime)


def test_metrics_carry_the_contract_names(runtime: Runtime) -> None:
    http_infer(runtime, "INPUT__0", "FP32", batch(2))
    text = runtime.metrics()
    for needle in (
        'kiln_request_duration_seconds_bucket{code="ok",le="0.001",model="mlp",protocol="http"}',
        'kiln_requests_total{code="ok",model="mlp",protocol="http"}',
        'kiln_queue_depth{model="mlp"}',
        'kiln_inflight_requests{model="mlp"}',
        'kiln_stage_duration_seconds_count{model="mlp",stage="forward"}',
        'kiln_queue_wait_seconds_count{model="mlp"}',
        'kiln_batch_size_count{model="mlp"}',
        'kiln_warmup_duration_seconds{model="mlp"}',
    ):
        assert needle in text, needle
    ok = [line for line in text.splitlines() if line.startswith('kiln_requests_total{code="ok"')]
    assert any(float(line.split()[-1]) >= 1 for line in ok)


def test_pipelined_requests_are_answered_in_order_and_close_is_honoured(runtime: Runtime) -> None:
    with socket.create_connection(("127.0.0.1", runtime.http_port), timeout=10) as sock:
        sock.sendall(
            b"GET /v2/models/mlp HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v2/models/nope HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        received = b""
        while chunk := sock.recv(65536):  # the server closes after the third answer
            received += chunk
    statuses = re.findall(rb"HTTP/1\.1 (\d{3})", received)
    assert statuses == [b"200", b"404", b"200"]
    assert b"Connection: close" in received

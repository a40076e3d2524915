"""The standard gRPC services and behaviours third-party clients rely on, through grpcio's own
client and grpcurl against a real runtime process: grpc.health.v1.Health (Check and Watch),
server reflection, gzip-compressed messages, and UNIMPLEMENTED at once for methods the runtime
does not serve (streaming ones included)."""

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2

from kiln_runtime.protocol import health
from tests.sessioncluster import missing_component

from .conftest import ModelFactory
from .runtime_process import Runtime, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    with running(example_model("mlp"), tmp_path_factory.mktemp("logs")) as served:
        yield served


@pytest.fixture
def channel(runtime: Runtime) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(runtime.grpc_url) as opened:
        yield opened


def check(channel: grpc.Channel, service: str) -> int:
    call = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health.HealthCheckRequest.SerializeToString,
        response_deserializer=health.HealthCheckResponse.FromString,
    )
    return int(call(health.HealthCheckRequest(service=service), timeout=5).status)


def test_health_check_reports_serving_when_ready(channel: grpc.Channel) -> None:
    assert check(channel, "") == health.SERVING
    assert check(channel, "inference.GRPCInferenceService") == health.SERVING
    assert check(channel, health.LIVENESS) == health.SERVING
    with pytest.raises(grpc.RpcError) as failed:
        check(channel, "no.such.Service")
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND


def test_gzip_messages_are_inflated(runtime: Runtime) -> None:
    client = triton_grpc.InferenceServerClient(runtime.grpc_url)
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    tensor = triton_grpc.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    plain = client.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
    zipped = client.infer("mlp", [tensor], compression_algorithm="gzip").as_numpy("OUTPUT__0")
    np.testing.assert_array_equal(zipped, plain)
    with pytest.raises(triton_grpc.InferenceServerException, match="deflate"):
        client.infer("mlp", [tensor], compression_algorithm="deflate")


def test_streaming_methods_are_unimplemented_at_once(channel: grpc.Channel) -> None:
    stream = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )

    def requests() -> Iterator[object]:
        yield service_pb2.ModelInferRequest(model_name="mlp")
        time.sleep(30)  # the client never half-closes: the answer must not wait for it

    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as failed:
        next(iter(stream(requests(), timeout=10)))
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert time.monotonic() - started < 5


def test_health_watch_streams_the_status(channel: grpc.Channel) -> None:
    watch = channel.unary_stream(
        "/grpc.health.v1.Health/Watch",
        request_serializer=health.HealthCheckRequest.SerializeToString,
        response_deserializer=health.HealthCheckResponse.FromString,
    )
    updates = watch(health.HealthCheckRequest(), timeout=10)
    assert next(updates).status == health.SERVING
    updates.cancel()  # the stream stays open until the client leaves
    unknown = watch(health.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert next(unknown).status == health.SERVICE_UNKNOWN
    unknown.cancel()
    assert check(channel, "") == health.SERVING  # the channel still serves


GO_TOOL = Path(__file__).parents[3] / "runtime_image" / "tools" / "go-tool.sh"


@pytest.fixture(scope="module")
def grpcurl() -> str:
    built = subprocess.run(
        ["bash", str(GO_TOOL), "grpcurl"], check=False, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    if built.returncode != 0:
        missing_component(f"grpcurl could not be built: {built.stderr[-2000:]}")
    return built.stdout.strip()


def test_grpcurl_lists_describes_and_calls_through_reflection(
    grpcurl: str, runtime: Runtime
) -> None:
    def run(*args: str) -> str:  # grpcurl [flags] address [verb or method] [symbol]
        done = subprocess.run(
            [grpcurl, "-plaintext", "-max-time", "10", runtime.grpc_url, *args], check=False,
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run("list").split() == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "inference.GRPCInferenceService",
    ]
    described = run("describe", "inference.GRPCInferenceService")
    assert "rpc ModelInfer (" in described
    # declared in Triton's service.proto but answered UNIMPLEMENTED here: not advertised
    assert "ModelStreamInfer" not in described
    assert "RepositoryIndex" not in described
    assert "ModelStreamInfer" not in run("list", "inference.GRPCInferenceService")
    assert '"ready": true' in run("inference.GRPCInferenceService/ServerReady")

"""The same gRPC calls, through grpcio's client, against both transports: the runtime's own
(``GrpcServer``) and grpcio's server (``GrpcioServer``, ``--grpc-transport grpcio``), over
loopback: unary answers, failures as statuses, the deadline, streamed calls, unknown methods;
the inference service's statistics and refused calls; TLS on grpcio's."""

import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.grpc import service_pb2, service_pb2_grpc

from kiln_runtime import errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.grpc import InferenceServicer
from kiln_runtime.protocol.grpcio_server import GrpcioServer
from kiln_runtime.protocol.grpcserver import GrpcServer, GrpcService, StreamMethod, UnaryMethod

from .fakes import Adder, config

SERVICE = "inference.GRPCInferenceService"


async def model_ready(request: Any, time_left: float | None) -> Any:
    if request.name == "missing":
        raise errors.not_found("unknown model 'missing'")
    return service_pb2.ModelReadyResponse(ready=time_left is not None and time_left > 1)


async def echo_names(messages: AsyncIterator[Any], send: Callable[[Any], bool]) -> None:
    async for message in messages:  # each request answered before the next arrives
        if message.name == "stop":
            raise errors.invalid("asked to stop")
        send(service_pb2.ModelReadyResponse(ready=message.name == "yes"))


def service() -> GrpcService:
    built = GrpcService(
        SERVICE, {"ModelReady": UnaryMethod(service_pb2.ModelReadyRequest, model_ready)}, 1 << 20
    )
    built.add_streaming(
        SERVICE, {"ModelStreamReady": StreamMethod(service_pb2.ModelReadyRequest, echo_names)}
    )
    return built


@pytest.fixture(params=[GrpcServer, GrpcioServer], ids=["kiln", "grpcio"])
async def channel(request: pytest.FixtureRequest) -> AsyncIterator[grpc.aio.Channel]:
    server = request.param(service())
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as opened:
        yield opened
    await server.stop(0.5)


def unary(channel: grpc.aio.Channel, method: str = "ModelReady") -> Any:
    return channel.unary_unary(
        f"/{SERVICE}/{method}",
        request_serializer=service_pb2.ModelReadyRequest.SerializeToString,
        response_deserializer=service_pb2.ModelReadyResponse.FromString,
    )


async def test_a_unary_call_gets_its_answer_and_deadline(channel: grpc.aio.Channel) -> None:
    answer = await unary(channel)(service_pb2.ModelReadyRequest(name="m"), timeout=5)
    assert answer.ready  # the method saw the call's deadline, more than 1 s away


async def test_failures_are_statuses(channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await unary(channel)(service_pb2.ModelReadyRequest(name="missing"), timeout=5)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown model 'missing'" in (failed.value.details() or "")


async def test_unknown_methods_are_unimplemented(channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await unary(channel, "NoSuchMethod")(service_pb2.ModelReadyRequest(), timeout=5)
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_streamed_call_answers_each_message_as_it_comes(channel: grpc.aio.Channel) -> None:
    call = channel.stream_stream(
        f"/{SERVICE}/ModelStreamReady",
        request_serializer=service_pb2.ModelReadyRequest.SerializeToString,
        response_deserializer=service_pb2.ModelReadyResponse.FromString,
    )(timeout=5)
    await call.write(service_pb2.ModelReadyRequest(name="yes"))
    assert (await call.read()).ready  # answered before the client half-closes
    await call.write(service_pb2.ModelReadyRequest(name="no"))
    assert not (await call.read()).ready
    await call.write(service_pb2.ModelReadyRequest(name="stop"))
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "asked to stop" in (await call.details() or "")


@pytest.fixture(params=[GrpcServer, GrpcioServer], ids=["kiln", "grpcio"])
async def inference(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[DataPlane, grpc.aio.Channel]]:
    """The inference service of a data plane (the adder), served by each transport."""
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)
    server = request.param(InferenceServicer(dp).service())
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as opened:
        yield dp, opened
    await server.stop(0.5)
    await dp.stop()


def infer_request() -> Any:
    message = service_pb2.ModelInferRequest(model_name="adder")
    message.inputs.add(name="A", datatype="FP32", shape=[1, 4])
    message.inputs.add(name="B", datatype="INT64", shape=[1, 4])
    message.raw_input_contents.extend([np.ones(4, np.float32).tobytes(), bytes(32)])
    return message


async def test_statistics_and_refused_infer_calls_on_both_transports(
    inference: tuple[DataPlane, grpc.aio.Channel],
) -> None:
    dp, channel = inference
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    await stub.ModelInfer(infer_request(), timeout=5)
    garbage = channel.unary_unary(f"/{SERVICE}/ModelInfer")  # bytes sent as they are
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await garbage(b"\xff\xff\xff", timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dp.metrics.request_duration[("grpc", "invalid")].count == 1  # counted once

    answer = await stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="adder"))
    (stats,) = answer.model_stats
    expected = dp.statistics("adder")
    assert (stats.name, stats.version) == ("adder", "1")
    assert (
        stats.inference_stats.success.count == 1 == expected["inference_stats"]["success"]["count"]
    )
    assert stats.inference_stats.fail.count == 1
    assert stats.inference_stats.success.ns == expected["inference_stats"]["success"]["ns"]
    assert stats.execution_count == expected["execution_count"] >= 1
    everything = await stub.ModelStatistics(service_pb2.ModelStatisticsRequest())
    assert [s.name for s in everything.model_stats] == ["adder"]
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="nope"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def self_signed() -> tuple[bytes, bytes]:
    """A certificate for ``localhost`` and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


async def test_the_grpcio_transport_serves_tls() -> None:
    certificate, key = self_signed()
    server = GrpcioServer(service(), tls=(certificate, key))
    port = await server.start("127.0.0.1", 0)
    trusted = grpc.ssl_channel_credentials(root_certificates=certificate)
    target = f"127.0.0.1:{port}"
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(target, trusted, options=options) as secure:
        answer = await unary(secure)(service_pb2.ModelReadyRequest(name="m"), timeout=5)
    assert answer.ready
    async with grpc.aio.insecure_channel(target) as cleartext:  # TLS only
        with pytest.raises(grpc.aio.AioRpcError):
            await unary(cleartext)(service_pb2.ModelReadyRequest(name="m"), timeout=5)
    await server.stop(0.5)

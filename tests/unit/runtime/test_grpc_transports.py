"""The same gRPC calls, through grpcio's client, against both transports: the runtime's own
(``GrpcServer``) and grpcio's server (``GrpcioServer``, ``--grpc-transport grpcio``), over
loopback: unary answers, failures as statuses, the deadline, streamed calls, unknown methods."""

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2

from kiln_runtime import errors
from kiln_runtime.protocol.grpcio_server import GrpcioServer
from kiln_runtime.protocol.grpcserver import GrpcServer, GrpcService, StreamMethod, UnaryMethod

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

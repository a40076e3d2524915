"""The gRPC adapter: ``inference.GRPCInferenceService`` (KServe v2 / Triton) on ``grpc.aio``.

Serves the message and service definitions that ``tritonclient.grpc`` itself ships, so the wire
format is the client's own. Tensors travel as ``raw_input_contents``/``raw_output_contents``
and are viewed without copies; typed ``contents`` are accepted too.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from kiln_runtime import __version__, errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.datatypes import from_json_values
from kiln_runtime.protocol.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    tensor_from_buffer,
    tensor_from_flat,
)

_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
EXTENSIONS = ["binary_tensor_data", "model_configuration"]


def decode_infer(message: Any, max_bytes: int) -> InferRequest:
    raw_contents = message.raw_input_contents
    tensors = message.inputs  # each protobuf field access builds a wrapper: read them once
    inputs = []
    if raw_contents:
        total = 0
        for raw in raw_contents:
            total += len(raw)
        if total > max_bytes:
            raise errors.invalid(f"request tensors exceed the limit of {max_bytes} bytes")
        if len(raw_contents) != len(tensors):
            raise errors.invalid(
                f"{len(raw_contents)} raw_input_contents for {len(tensors)} inputs"
            )
        for tensor, raw in zip(tensors, raw_contents, strict=True):
            inputs.append(tensor_from_buffer(tensor.name, tensor.datatype, list(tensor.shape), raw))
    else:
        for tensor in tensors:
            inputs.append(_typed_tensor(tensor))
    timeout = None
    parameters = message.parameters
    if "timeout" in parameters:
        micros = parameters["timeout"].int64_param
        if micros <= 0:
            raise errors.invalid(f"parameter 'timeout' must be positive microseconds: {micros}")
        timeout = micros / 1e6
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=[RequestedOutput(o.name) for o in message.outputs],
        timeout_seconds=timeout,
    )


def _typed_tensor(tensor: Any) -> Tensor:
    """An input sent in typed ``contents`` rather than raw bytes."""
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise errors.invalid(
            f"input '{tensor.name}': send {tensor.datatype} data in raw_input_contents"
        )
    values = getattr(tensor.contents, field)
    try:
        flat = from_json_values(np.asarray(values), tensor.datatype)
    except (ValueError, TypeError, OverflowError) as error:
        raise errors.invalid(f"input '{tensor.name}': bad contents: {error}") from None
    return tensor_from_flat(tensor.name, tensor.datatype, list(tensor.shape), flat)


def encode_infer(response: InferResponse) -> Any:
    message = service_pb2.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_output_contents.append(tensor.data.tobytes())
    return message


def _tensor_metadata(document: dict[str, Any]) -> Any:
    return service_pb2.ModelMetadataResponse.TensorMetadata(
        name=document["name"], datatype=document["datatype"], shape=document["shape"]
    )


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.max_bytes = dataplane.config.max_request_bytes()

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=self.dataplane.live)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.dataplane.ready)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="kiln", version=__version__, extensions=EXTENSIONS
        )

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            ready = self.dataplane.model_ready(request.name, request.version)
        except errors.InferError as error:
            await _abort(context, error)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            meta = self.dataplane.model_metadata(request.name, request.version)
        except errors.InferError as error:
            await _abort(context, error)
        return service_pb2.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[_tensor_metadata(t) for t in meta["inputs"]],
            outputs=[_tensor_metadata(t) for t in meta["outputs"]],
        )

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            doc = self.dataplane.model_config(request.name, request.version)
        except errors.InferError as error:
            await _abort(context, error)

        def tensors(kind: Any, entries: list[dict[str, Any]]) -> list[Any]:
            return [kind(name=e["name"], data_type=e["data_type"], dims=e["dims"]) for e in entries]

        batching = doc["dynamic_batching"]
        config = model_config_pb2.ModelConfig(
            name=doc["name"],
            platform=doc["platform"],
            max_batch_size=doc["max_batch_size"],
            input=tensors(model_config_pb2.ModelInput, doc["input"]),
            output=tensors(model_config_pb2.ModelOutput, doc["output"]),
            dynamic_batching=model_config_pb2.ModelDynamicBatching(
                max_queue_delay_microseconds=batching["max_queue_delay_microseconds"],
                default_queue_policy=model_config_pb2.ModelQueuePolicy(
                    max_queue_size=batching["default_queue_policy"]["max_queue_size"]
                ),
            ),
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def decode() -> InferRequest:
            infer_request = decode_infer(request, self.max_bytes)
            remaining = context.time_remaining()
            if remaining is not None:
                infer_request.timeout_seconds = min(
                    remaining, infer_request.timeout_seconds or remaining
                )
            return infer_request

        try:
            return await self.dataplane.handle("grpc", decode, encode_infer)
        except errors.InferError as error:
            await _abort(context, error)


async def _abort(context: grpc.aio.ServicerContext, error: errors.InferError) -> Any:
    await context.abort(grpc.StatusCode[error.kind.mapping.grpc_code], error.message)


class GrpcServer:
    def __init__(self, dataplane: DataPlane) -> None:
        limit = dataplane.config.max_request_bytes()
        # grpc's own limit sits above ours so an oversized request gets our clear message.
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 2 * limit + (1 << 20)),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(dataplane), self._server
        )

    async def start(self, host: str, port: int) -> int:
        bound: int = self._server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot bind gRPC to {host}:{port}")
        await self._server.start()
        return bound

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace)

"""The gRPC adapter: ``inference.GRPCInferenceService`` (KServe v2 / Triton) over ``grpcserver``.

Serves the message definitions that ``tritonclient.grpc`` itself ships, so the wire format is
the client's own. Tensors travel as ``raw_input_contents``/``raw_output_contents``
and are viewed without copies; typed ``contents`` are accepted too.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from kiln_runtime import __version__, errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.datatypes import from_json_values
from kiln_runtime.protocol import health, reflection
from kiln_runtime.protocol.grpcserver import GrpcService, StreamMethod, UnaryMethod
from kiln_runtime.protocol.tracecontext import TRACEPARENT
from kiln_runtime.protocol.types import (
    WARMUP_PARAMETER,
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
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics"]
SERVICE = "inference.GRPCInferenceService"
WATCH_POLL_SECONDS = 0.5


def decode_infer(message: Any, max_bytes: int) -> InferRequest:
    # Each protobuf field access builds a wrapper, so each field is read once; repeated
    # fields are read as slices, plain lists: a repeated field iterates by indexing until an
    # IndexError (whose message is formatted each time), about 3 times the cost of a slice.
    raw_contents = message.raw_input_contents[:]
    tensors = message.inputs[:]
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
            inputs.append(tensor_from_buffer(tensor.name, tensor.datatype, tensor.shape[:], raw))
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
    warmup = False
    if WARMUP_PARAMETER in parameters:
        marked = parameters[WARMUP_PARAMETER]
        if marked.WhichOneof("parameter_choice") != "bool_param":
            raise errors.invalid(f"parameter '{WARMUP_PARAMETER}' must be a boolean")
        warmup = marked.bool_param
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=[RequestedOutput(o.name) for o in message.outputs[:]],
        timeout_seconds=timeout,
        parameters=parameters,
        warmup=warmup,
    )


def _typed_tensor(tensor: Any) -> Tensor:
    """An input sent in typed ``contents`` rather than raw bytes."""
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise errors.invalid(
            f"input '{tensor.name}': send {tensor.datatype} data in raw_input_contents"
        )
    values = getattr(tensor.contents, field)[:]  # a list: see decode_infer
    try:
        flat = from_json_values(np.asarray(values), tensor.datatype)
    except (ValueError, TypeError, OverflowError) as error:
        raise errors.invalid(f"input '{tensor.name}': bad contents: {error}") from None
    return tensor_from_flat(tensor.name, tensor.datatype, tensor.shape[:], flat)


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


class InferenceServicer:
    """The methods of ``inference.GRPCInferenceService``; failures raise ``InferError``."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.max_bytes = dataplane.config.max_request_bytes()

    def service(self) -> GrpcService:
        methods = {
            "ServerLive": UnaryMethod(service_pb2.ServerLiveRequest, self.server_live),
            "ServerReady": UnaryMethod(service_pb2.ServerReadyRequest, self.server_ready),
            "ServerMetadata": UnaryMethod(service_pb2.ServerMetadataRequest, self.server_metadata),
            "ModelReady": UnaryMethod(service_pb2.ModelReadyRequest, self.model_ready),
            "ModelMetadata": UnaryMethod(service_pb2.ModelMetadataRequest, self.model_metadata),
            "ModelConfig": UnaryMethod(service_pb2.ModelConfigRequest, self.model_config),
            "ModelStatistics": UnaryMethod(
                service_pb2.ModelStatisticsRequest, self.model_statistics
            ),
            # calls the transport refuses before model_infer are counted as the data plane
            # counts the rest
            "ModelInfer": UnaryMethod(
                service_pb2.ModelInferRequest, self.model_infer,
                refused=functools.partial(self.dataplane.refused, "grpc"),
                traced=self.dataplane.tracer is not None,
            ),
        }  # fmt: skip
        # The message limit sits above the tensor limit (typed contents and field overhead can
        # outgrow the raw bytes) so that most oversized requests get decode_infer's message.
        service = GrpcService(SERVICE, methods, max_message=2 * self.max_bytes + (1 << 20))
        service.add(health.SERVICE, {"Check": UnaryMethod(health.HealthCheckRequest, self.check)})
        service.add_streaming(
            health.SERVICE, {"Watch": StreamMethod(health.HealthCheckRequest, self.watch)}
        )
        names = [SERVICE, health.SERVICE, *(f"{p}.ServerReflection" for p in reflection.PACKAGES)]
        files = [service_pb2.DESCRIPTOR, health.DESCRIPTOR, *reflection.DESCRIPTORS]
        reflecting = reflection.Reflection(names, files, served={SERVICE: list(methods)})
        for package in reflection.PACKAGES:
            info = StreamMethod(reflection.request_type(package), reflecting.method(package))
            service.add_streaming(f"{package}.ServerReflection", {"ServerReflectionInfo": info})
        return service

    def _status(self, name: str) -> int:
        """Readiness for the server (``""``) and the inference service, as ``/v2/health/ready``;
        liveness for ``liveness``, as ``/v2/health/live`` (the pods' gRPC liveness probe)."""
        if name == health.LIVENESS:
            return health.SERVING if self.dataplane.live else health.NOT_SERVING
        if name not in ("", SERVICE):
            return health.SERVICE_UNKNOWN
        return health.SERVING if self.dataplane.ready else health.NOT_SERVING

    async def watch(self, messages: AsyncIterator[Any], send: Callable[[Any], bool]) -> None:
        """grpc.health.v1.Health/Watch: the status at once, then each change (readiness is
        polled every ``WATCH_POLL_SECONDS``) until the client cancels; an unknown service is
        SERVICE_UNKNOWN, as the health protocol specifies, not an error."""
        request = None
        async for message in messages:
            request = message
            break
        if request is None:
            raise errors.invalid("Watch needs a HealthCheckRequest")
        sent = None
        while True:
            status = self._status(request.service)
            if status != sent:
                if not send(health.HealthCheckResponse(status=status)):
                    return
                sent = status
            await asyncio.sleep(WATCH_POLL_SECONDS)

    async def check(self, request: Any, time_left: float | None) -> Any:
        """grpc.health.v1.Health/Check: the server (``""``) and its inference service serve
        when the model is ready (not while loading or draining); ``liveness`` whenever the
        process answers at all."""
        status = self._status(request.service)
        if status == health.SERVICE_UNKNOWN:
            raise errors.not_found(f"unknown service '{request.service}'")
        return health.HealthCheckResponse(status=status)

    async def server_live(self, request: Any, time_left: float | None) -> Any:
        return service_pb2.ServerLiveResponse(live=self.dataplane.live)

    async def server_ready(self, request: Any, time_left: float | None) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.dataplane.ready)

    async def server_metadata(self, request: Any, time_left: float | None) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="kiln", version=__version__, extensions=EXTENSIONS
        )

    async def model_ready(self, request: Any, time_left: float | None) -> Any:
        ready = self.dataplane.model_ready(request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def model_metadata(self, request: Any, time_left: float | None) -> Any:
        meta = self.dataplane.model_metadata(request.name, request.version)
        return service_pb2.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[_tensor_metadata(t) for t in meta["inputs"]],
            outputs=[_tensor_metadata(t) for t in meta["outputs"]],
        )

    async def model_config(self, request: Any, time_left: float | None) -> Any:
        doc = self.dataplane.model_config(request.name, request.version)

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

    async def model_statistics(self, request: Any, time_left: float | None) -> Any:
        """Triton's statistics extension: the document ``/v2/models/{m}/stats`` answers
        (``DataPlane.statistics``), parsed into ``ModelStatisticsResponse``, whose field names
        it uses, so both protocols report the same numbers. An empty name means every model
        (this runtime's one), as Triton's ``/v2/models/stats`` does."""
        stats = self.dataplane.statistics(request.name, request.version)
        return json_format.ParseDict(
            {"model_stats": [stats]}, service_pb2.ModelStatisticsResponse()
        )

    async def model_infer(self, request: Any, time_left: float | None) -> Any:
        def decode() -> InferRequest:
            infer_request = decode_infer(request, self.max_bytes)
            if time_left is not None:  # the call's deadline bounds the request's own timeout
                infer_request.timeout_seconds = min(
                    time_left, infer_request.timeout_seconds or time_left
                )
            return infer_request

        if self.dataplane.tracer is None:
            return await self.dataplane.handle("grpc", decode, encode_infer)
        traceparent = TRACEPARENT.get()
        return await self.dataplane.handle("grpc", decode, encode_infer, traceparent=traceparent)

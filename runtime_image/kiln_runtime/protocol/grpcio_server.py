"""The same gRPC services served by grpcio's own server instead of Kiln's transport.

For users who need what Kiln's transport does not do: TLS (``--grpc-tls-cert``/``-key``:
grpcio's server credentials; Kiln's transport is cleartext h2c), or client-streaming calls Kiln
does not implement. It costs several times the CPU per call (``bench/grpc_floor.py``: grpc.aio
answers about a tenth of the calls per core), so it is an option (``--grpc-transport grpcio``),
not the default. It serves every method of a ``GrpcService`` (unary and streaming) through one
generic handler; the limits map onto grpcio's channel arguments where grpcio has them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from kiln_runtime import errors
from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol.grpcserver import (
    GrpcService,
    StreamMethod,
    UnaryMethod,
    parse_message,
)
from kiln_runtime.protocol.tracecontext import TRACEPARENT, traceparent_of

_END = object()


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()  # type: ignore[no-any-return]


def _unary(method: UnaryMethod) -> Callable[[bytes, grpc.aio.ServicerContext], Any]:
    """The behaviour of a unary method; it parses the message itself (grpcio hands it the
    bytes) so that a malformed one is INVALID_ARGUMENT, told to ``method.refused``, as on
    Kiln's transport (grpcio's own parsing would answer UNKNOWN and tell no one)."""

    async def behaviour(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            try:
                request = parse_message(method.request_type, raw)
            except errors.InferError as failure:
                if method.refused is not None:
                    method.refused(failure.kind.mapping.metric_code, 0.0)
                raise
            if method.traced:
                metadata = dict(context.invocation_metadata() or ())
                TRACEPARENT.set(traceparent_of(metadata.get("traceparent")))
            return await method.call(request, context.time_remaining())
        except errors.InferError as error:
            await context.abort(grpc.StatusCode[error.kind.mapping.grpc_code], error.message)

    return behaviour


def _streaming(method: StreamMethod) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
    async def behaviour(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        answers: asyncio.Queue[Any] = asyncio.Queue()

        def send(message: Any) -> bool:
            answers.put_nowait(message)
            return True

        async def run() -> None:
            try:
                await method.call(requests, send)
            finally:
                answers.put_nowait(_END)

        task = asyncio.get_running_loop().create_task(run())
        try:
            while (answer := await answers.get()) is not _END:
                yield answer
            await task
        except errors.InferError as error:
            await context.abort(grpc.StatusCode[error.kind.mapping.grpc_code], error.message)
        finally:
            task.cancel()

    return behaviour


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, service: GrpcService) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for path, unary in service.unary_methods.items():
            self._handlers[path.decode()] = grpc.unary_unary_rpc_method_handler(
                _unary(unary), None, _serialize
            )
        for path, streamed in service.streaming_methods.items():
            self._handlers[path.decode()] = grpc.stream_stream_rpc_method_handler(
                _streaming(streamed), streamed.request_type.FromString, _serialize
            )

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._handlers.get(handler_call_details.method)


class GrpcioServer:
    """``GrpcServer``'s interface (start, stop) over ``grpc.aio.server``."""

    def __init__(
        self,
        service: GrpcService,
        max_connection_age: float = 0.0,
        max_age_grace: float = 10.0,
        limits: Http2Limits | None = None,
        tls: tuple[bytes, bytes] | None = None,
    ) -> None:
        """``tls``: a PEM certificate chain and its private key, to serve TLS instead of
        cleartext HTTP/2 (the client need not present a certificate)."""
        limits = limits or Http2Limits()
        self._credentials = None
        if tls is not None:
            self._credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", service.max_message),
            ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
            ("grpc.max_metadata_size", limits.max_header_list_size),
        ]
        if max_connection_age > 0:
            options += [
                ("grpc.max_connection_age_ms", int(max_connection_age * 1000)),
                ("grpc.max_connection_age_grace_ms", int(max_age_grace * 1000)),
            ]
        self._server = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers((_Handler(service),))

    async def start(self, host: str, port: int) -> int:
        address = f"{host}:{port}"
        if self._credentials is not None:
            bound = int(self._server.add_secure_port(address, self._credentials))
        else:
            bound = int(self._server.add_insecure_port(address))
        await self._server.start()
        return bound

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace)

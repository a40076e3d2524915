"""A server that costs next to nothing: every infer call gets the same answer, computed once.

Exists so the benchmark can say how fast a *client* can go at all. The Python clients
(``tritonclient.http`` with JSON tensors, ``tritonclient.grpc`` and its ``.aio``) spend hundreds
of µs of their own CPU per call, and on the benchmark host they have one core; against this
server, on the server core, whatever they reach is their ceiling, the most any server could
show through them. ``bench.client_ceiling`` puts it beside Triton and Kiln in the same run.

The answers are the runtime's own bytes for the MLP's output (``rest.encode_infer`` and
``grpc.encode_infer`` over one fixed [1, 10] FP32 tensor), so the client parses what it parses
from Kiln. HTTP/1.1 is read by httptools (the runtime's own parser) and answers keep-alive;
gRPC is the runtime's own HTTP/2 transport with a handler that returns the stored message.
No model, no batching, no metrics: the request body is read and dropped.

    python -m bench.constant_server --host 127.0.0.1 --http-port P --grpc-port Q --model mlp
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, cast

import httptools
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2

from kiln_runtime.protocol import grpc as grpc_codec
from kiln_runtime.protocol import httpserver, rest
from kiln_runtime.protocol.grpcserver import GrpcServer, GrpcService, UnaryMethod
from kiln_runtime.protocol.types import InferResponse, Tensor

OUTPUT = "OUTPUT__0"
SERVICE = "inference.GRPCInferenceService"


def constant_response(model: str) -> InferResponse:
    """The answer every call gets: an MLP-shaped output of ordinary float32 values."""
    values = np.random.default_rng(0).standard_normal((1, 10)).astype(np.float32)
    return InferResponse(
        model_name=model, model_version="1", id="", outputs=[Tensor(OUTPUT, "FP32", values)],
        binary={OUTPUT: False},
    )  # fmt: skip


def http_answer_of(response: rest.HttpResponse) -> bytes:
    """A whole keep-alive HTTP/1.1 answer, head and body, as the runtime writes it."""
    return httpserver.response_head(response, keep_alive=True) + b"".join(response.body)


_READY = http_answer_of(rest.json_response(200, {"ready": True}))


class ConstantHttp(asyncio.Protocol):
    """Answers each request as soon as its last byte arrives: infer with the stored answer,
    anything else (the readiness probe) with the runtime's ready answer."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._infer = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._infer = httpserver.infer_target(url)

    def on_message_complete(self) -> None:
        if self._transport is not None:
            self._transport.write(self._answer if self._infer else _READY)


async def serve(host: str, http_port: int, grpc_port: int, model: str) -> None:
    response = constant_response(model)
    answer = http_answer_of(rest.encode_infer(response))
    message = grpc_codec.encode_infer(response)

    async def infer(request: Any, time_left: float | None) -> Any:
        return message

    methods = {"ModelInfer": UnaryMethod(service_pb2.ModelInferRequest, infer)}
    await GrpcServer(GrpcService(SERVICE, methods, max_message=1 << 20)).start(host, grpc_port)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: ConstantHttp(answer), host, http_port, backlog=1024)
    print("ready", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.http_port, args.grpc_port, args.model))


if __name__ == "__main__":
    main()

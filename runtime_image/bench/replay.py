"""The gRPC path's CPU per call in one process: no kernel, no client, no other process's noise.

On the shared benchmark host, CPU per call over loopback moves by 10-15 % from one round to
the next. This replays what ``tritonclient.grpc`` sends (per call: a HEADERS frame with its
header list, one DATA frame ending the stream, a connection and a stream WINDOW_UPDATE),
``--per-read`` calls per read, into the runtime's own ``Http2Connection`` serving the real
``InferenceServicer`` and ``DataPlane`` with the MLP, answers written to a transport that only
counts them, and prints the process's CPU time per call. Run it for each version of the runtime
alternately (``PYTHONPATH=DIR``) to compare them.

    cd /tmp && PYTHONPATH=DIR:RUNTIME_IMAGE taskset -c 0 python -m bench.replay --precision int8

(from a directory without a ``kiln_runtime``: ``-m`` puts the working directory first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from tritonclient.grpc import service_pb2

from kiln_runtime.config import parse_config
from kiln_runtime.examples import example_input, write_example
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.model import ModelRunner
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.grpc import InferenceServicer
from kiln_runtime.protocol.http2 import wire
from kiln_runtime.protocol.http2.connection import Http2Connection
from kiln_runtime.server import serving_dataplane

# What grpcio sends as a call's headers (tritonclient.grpc, a deadline set).
FIELDS = [
    (b":method", b"POST"), (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"), (b":authority", b"127.0.0.1:8001"),
    (b"te", b"trailers"), (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-python/1.0"), (b"grpc-accept-encoding", b"identity,deflate,gzip"),
    (b"grpc-timeout", b"9999m"),
]  # fmt: skip


class CountingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: Any) -> None:
        self.writes += 1

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request_body() -> bytes:
    message = service_pb2.ModelInferRequest(model_name="mlp")
    message.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 512])
    message.outputs.add(name="OUTPUT__0")
    message.raw_input_contents.append(example_input("mlp", 1).numpy().tobytes())
    payload: bytes = message.SerializeToString()
    return struct.pack(">?I", False, len(payload)) + payload


async def replay(model_dir: Path, precision: str, calls: int, per_read: int) -> tuple[float, int]:
    document = json.loads((model_dir / "config.json").read_text())
    document["optimization"]["precision"] = precision
    config = parse_config(document)
    dataplane = serving_dataplane(config, RuntimeMetrics("mlp"), ThreadPoolExecutor(1))
    service = InferenceServicer(dataplane).service()
    await dataplane.start(lambda: ModelRunner(config, model_dir / "model.pt"))
    connection = Http2Connection(
        service.handle, service.max_message, set(), answers_early=service.answers_early,
        streaming=service.streaming,
    )  # fmt: skip
    transport = CountingTransport()
    connection.connection_made(transport)
    connection.data_received(wire.PREFACE + wire.frame(wire.SETTINGS, 0, 0))
    block, body = hpack.encode(FIELDS), request_body()
    reads = []
    for first in range(0, calls, per_read):
        frames = []
        for index in range(first, min(calls, first + per_read)):
            stream_id = 2 * index + 1
            frames += [
                wire.frame(wire.HEADERS, wire.END_HEADERS, stream_id, block),
                wire.frame(wire.DATA, wire.END_STREAM, stream_id, body),
                wire.window_update(0, 100), wire.window_update(stream_id, 100),
            ]  # fmt: skip
        reads.append(b"".join(frames))
    started = time.process_time()
    for data in reads:
        connection.data_received(data)
        for _ in range(8):  # the loop turns an inline batch takes, without a timer
            await asyncio.sleep(0)
        # Then wait without spinning (a batch in the model thread): a timer costs the
        # process next to nothing while it waits.
        while connection._streams:  # noqa: ASYNC110 (no event says all calls are answered)
            await asyncio.sleep(0.0001)
    seconds = time.process_time() - started
    await dataplane.stop()
    return seconds / calls, transport.writes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--per-read", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "mlp"
        write_example("mlp", model_dir)
        per_call, writes = asyncio.run(replay(model_dir, args.precision, args.calls, args.per_read))
    print(f"{per_call * 1e6:.1f} µs CPU per call ({args.precision}, {args.per_read} calls per "
          f"read, {args.calls} calls, {writes} writes)")  # fmt: skip


if __name__ == "__main__":
    main()

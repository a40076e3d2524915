"""The gRPC floor: how many unary calls a *trivial* Python gRPC server answers on one core.

Exists to tell whether a throughput target over a given transport is reachable at all, and
why the runtime serves gRPC over its own HTTP/2 transport rather than over grpcio. Each variant
serves ``inference.GRPCInferenceService/ModelInfer`` through a generic handler that returns a
constant ``ModelInferResponse`` (the MLP's 1x10 FP32 output) - no model, no batching, no
metrics - pinned to the server core the benchmark uses, and is driven by the benchmark's own
h2load command (``loadgen.run_h2load``, c=16, ``-m1``, a raw ModelInfer frame) on the client
core. The server's CPU time (utime + stime from ``/proc/PID/stat``) divided by the calls it
answered is the cost per call, which other load on the host disturbs far less than req/s.

Variants: ``aio`` (grpc.aio, request parsed and response serialised by protobuf), ``aio-bytes``
(grpc.aio, identity (de)serialisers, pre-serialised response: the transport alone), ``sync``
(``grpc.server`` with a thread pool), ``sync-bridge`` (the same, each call handed to an asyncio
loop in another thread and waited for, as a sync server in front of the runtime's asyncio data
plane would have to), ``aio-uvloop`` (grpc.aio on uvloop's event loop, which ``serve`` runs
the runtime's own transports on), and ``kiln`` (the runtime's own
transport, ``kiln_runtime.protocol.grpcserver``, with the same constant answer), and ``h2``
(the same service over python-hyper's ``h2`` state machine, ``bench.h2_transport``: the
transport decision's A/B; run them interleaved with ``--variants kiln h2 --repeat N``).

    cd runtime_image && python -m bench.grpc_floor [--seconds 5] [--clients 16] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from bench import loadgen, servers

SERVER_CORE = 0
CLIENT_CORE = 1
SERVICE = "inference.GRPCInferenceService"
VARIANTS = ("kiln", "h2", "aio", "aio-bytes", "sync", "sync-bridge", "aio-uvloop")


def _response() -> Any:
    message = service_pb2.ModelInferResponse(model_name="mlp", model_version="1")
    message.outputs.add(name="OUTPUT__0", datatype="FP32", shape=[1, 10])
    message.raw_output_contents.append(np.zeros((1, 10), np.float32).tobytes())
    return message


def _handler(variant: str, asynchronous: bool) -> grpc.GenericRpcHandler:
    response = _response()
    if variant == "aio-bytes":
        reply: Any = response.SerializeToString()
        deserializer = serializer = None  # bytes in, bytes out
    else:
        reply = response
        deserializer = service_pb2.ModelInferRequest.FromString
        serializer = service_pb2.ModelInferResponse.SerializeToString

    if asynchronous:

        async def infer(request: Any, context: Any) -> Any:
            return reply

    elif variant == "sync-bridge":
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="data-plane", daemon=True).start()

        async def answer() -> Any:
            return reply

        def infer(request: Any, context: Any) -> Any:  # type: ignore[misc]
            return asyncio.run_coroutine_threadsafe(answer(), loop).result()

    else:

        def infer(request: Any, context: Any) -> Any:  # type: ignore[misc]
            return reply

    method = grpc.unary_unary_rpc_method_handler(
        infer, request_deserializer=deserializer, response_serializer=serializer
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": method})


async def _serve_kiln(port: int, transport: str) -> None:
    from kiln_runtime.protocol.grpcserver import GrpcServer, GrpcService, UnaryMethod

    reply = _response()

    async def infer(request: Any, time_left: float | None) -> Any:
        return reply

    methods = {"ModelInfer": UnaryMethod(service_pb2.ModelInferRequest, infer)}
    service = GrpcService(SERVICE, methods, max_message=1 << 20)
    if transport == "h2":
        from bench.h2_transport import H2Connection

        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: H2Connection(service.handle), servers.HOST, port)
    else:
        await GrpcServer(service).start(servers.HOST, port)
    print("ready", flush=True)
    await asyncio.Event().wait()


def serve(variant: str, port: int) -> None:
    """Run one variant until killed (the driver starts this in a pinned subprocess)."""
    if variant in {"kiln", "h2"}:
        asyncio.run(_serve_kiln(port, variant))
        return
    address = f"{servers.HOST}:{port}"
    if variant.startswith("sync"):
        server = grpc.server(ThreadPoolExecutor(max_workers=16))
        server.add_generic_rpc_handlers((_handler(variant, asynchronous=False),))
        server.add_insecure_port(address)
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(variant, asynchronous=True),))
        server.add_insecure_port(address)
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    if variant == "aio-uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (grpc's poller threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(variant: str, seconds: float, clients: int) -> dict[str, float]:
    port = servers.free_port()
    command = [
        "taskset", "-c", str(SERVER_CORE), sys.executable, "-m", "bench.grpc_floor",
        "--serve", variant, "--port", str(port),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"{variant} did not start")
        frame = loadgen.grpc_frame("mlp", "INPUT__0", "FP32", np.zeros((1, 512), np.float32))
        url = f"http://{servers.HOST}:{port}/{SERVICE}/ModelInfer"
        # warm the server (connections, code paths) before the counted run
        server_cpu = lambda: cpu_seconds(process.pid)  # noqa: E731
        loadgen.run_h2load(
            url, frame, concurrency=clients, seconds=1, core=CLIENT_CORE, server_cpu=server_cpu
        )
        cpu_before, wall_before = cpu_seconds(process.pid), time.monotonic()
        result = loadgen.run_h2load(
            url, frame, concurrency=clients, seconds=seconds, core=CLIENT_CORE,
            server_cpu=server_cpu,
        )  # fmt: skip
        cpu = cpu_seconds(process.pid) - cpu_before
        wall = time.monotonic() - wall_before
    finally:
        process.terminate()
        process.wait(10)
    # h2load logs only the calls after its own 1 s warm-up, but the server's CPU counts over
    # the whole run: the calls it answered are estimated at the measured rate over that time.
    calls = result.throughput * wall
    return {
        "req_s": result.throughput,
        "p50_ms": result.p50_ms,
        "errors": result.errors,
        "server_cpu": cpu / wall,
        "cpu_us_per_call": cpu / calls * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", choices=VARIANTS)
    parser.add_argument("--port", type=int)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    os.sched_setaffinity(0, {CLIENT_CORE})
    variants = args.variants
    print(f"grpcio {grpc.__version__}, h2load c={args.clients} -m1, {args.seconds:.0f} s each")
    print("| server | req/s | p50 ms | server CPU | CPU us/call | errors |")
    print("|---|---|---|---|---|---|")
    for _ in range(args.repeat):
        for variant in variants:
            row = measure(variant, args.seconds, args.clients)
            print(
                f"| {variant} | {row['req_s']:.0f} | {row['p50_ms']:.3f} | "
                f"{row['server_cpu']:.0%} | {row['cpu_us_per_call']:.0f} | {row['errors']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

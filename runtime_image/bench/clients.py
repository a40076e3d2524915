"""Closed-loop load through the official Python clients, as users drive a server.

wrk and h2load measure a server's ceiling; users send through ``tritonclient``, whose own costs
change what the server sees (JSON tensors; grpcio's BDP pings, WINDOW_UPDATEs and separate
HEADERS and DATA frames). Each path keeps ``--concurrency`` requests in flight:

- ``tritonclient-http``: ``tritonclient.http`` with ``binary_data=False`` on the input and the
  output (JSON tensors both ways); one client whose connection pool holds one keep-alive
  connection per in-flight request, driven by that many greenlets (how the client's own
  ``async_infer`` runs requests concurrently);
- ``tritonclient-grpc``: ``tritonclient.grpc``, blocking ``infer`` from that many threads;
- ``tritonclient-grpc-aio``: ``tritonclient.grpc.aio``, that many asyncio tasks.

gRPC clients share one channel: grpcio would put separate channels to the same address with the
same options on one connection anyway (its global subchannel pool), so N clients are N streams
on one connection, as users get. The request is built once and re-sent, so the client spends
its CPU on the protocol rather than on converting the same array again.

Run by ``bench.loadgen.run_python_client`` in its own process pinned to the client core. Every
worker sends one request first (connections made, lazy imports done); then the window opens,
bounded by ``--seconds`` and by ``--max-requests`` (answers and errors together). At the
window's edges it reads the server's CPU time (``--server-pid`` and its children) and its own,
so both cover exactly the requests counted. Prints one JSON object.

    python -m bench.clients --path tritonclient-grpc --url 127.0.0.1:8001 --model mlp \
        --input x.npy --concurrency 16 --seconds 5 --max-requests 200000 --server-pid PID
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench import proc

PATHS = ("tritonclient-http", "tritonclient-grpc", "tritonclient-grpc-aio")
INPUT = "INPUT__0"
OUTPUT = "OUTPUT__0"


@dataclass
class Window:
    """The measured window: its bounds, and what the workers recorded inside it."""

    deadline: float
    max_requests: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    def open(self) -> bool:
        """Whether a worker may send another request (time and count both bound the loop)."""
        return (
            time.monotonic() < self.deadline
            and len(self.latencies) + self.errors < self.max_requests
        )

    def record(self, started: float, error: BaseException | None) -> None:
        if error is None:
            self.latencies.append(time.perf_counter() - started)
            return
        self.errors += 1
        self.first_error = self.first_error or f"{type(error).__name__}: {error}"

    def run(self, one: Callable[[], None]) -> None:
        """One worker's closed loop: ``one`` request after another while the window is open;
        a failed request is counted and reported, and the loop goes on."""
        while self.open():
            started = time.perf_counter()
            try:
                one()
            except Exception as error:
                self.record(started, error)
            else:
                self.record(started, None)


def datatype_of(array: npt.NDArray[Any]) -> str:
    return {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}[array.dtype]


def _http(args: argparse.Namespace, x: npt.NDArray[Any], window: Callable[[], Window]) -> Window:
    import gevent  # tritonclient.http's transport (geventhttpclient) is cooperative
    import tritonclient.http as client_module

    client = client_module.InferenceServerClient(
        args.url, concurrency=args.concurrency, connection_timeout=10, network_timeout=10
    )
    tensor = client_module.InferInput(INPUT, list(x.shape), datatype_of(x))
    tensor.set_data_from_numpy(x, binary_data=False)
    outputs = [client_module.InferRequestedOutput(OUTPUT, binary_data=False)]

    def one() -> None:
        if client.infer(args.model, [tensor], outputs=outputs).as_numpy(OUTPUT) is None:
            raise RuntimeError("no output in the answer")

    gevent.joinall([gevent.spawn(one) for _ in range(args.concurrency)], raise_error=True)
    measured = window()

    gevent.joinall([gevent.spawn(measured.run, one) for _ in range(args.concurrency)])
    client.close()
    return measured


def _grpc(args: argparse.Namespace, x: npt.NDArray[Any], window: Callable[[], Window]) -> Window:
    import tritonclient.grpc as client_module

    client = client_module.InferenceServerClient(args.url)
    tensor = client_module.InferInput(INPUT, list(x.shape), datatype_of(x))
    tensor.set_data_from_numpy(x)
    outputs = [client_module.InferRequestedOutput(OUTPUT)]

    def one() -> None:
        answer = client.infer(args.model, [tensor], outputs=outputs, client_timeout=10)
        if answer.as_numpy(OUTPUT) is None:
            raise RuntimeError("no output in the answer")

    ready = threading.Barrier(args.concurrency + 1)
    holder: list[Window] = []

    def worker() -> None:
        try:
            one()
        except BaseException:
            ready.abort()  # the main thread's wait fails at once rather than at its timeout
            raise
        ready.wait()  # every worker connected and warm; the main thread opens the window
        ready.wait()
        holder[0].run(one)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=60)
    holder.append(window())
    ready.wait(timeout=60)
    for thread in threads:
        thread.join(args.seconds + 30)
    client.close()
    return holder[0]


def _grpc_aio(
    args: argparse.Namespace, x: npt.NDArray[Any], window: Callable[[], Window]
) -> Window:
    import tritonclient.grpc as grpc_module
    import tritonclient.grpc.aio as client_module

    async def run() -> Window:
        client = client_module.InferenceServerClient(args.url)
        tensor = grpc_module.InferInput(INPUT, list(x.shape), datatype_of(x))
        tensor.set_data_from_numpy(x)
        outputs = [grpc_module.InferRequestedOutput(OUTPUT)]

        async def one() -> None:
            answer = await client.infer(args.model, [tensor], outputs=outputs, client_timeout=10)
            if answer.as_numpy(OUTPUT) is None:
                raise RuntimeError("no output in the answer")

        await asyncio.gather(*(one() for _ in range(args.concurrency)))
        measured = window()

        async def worker() -> None:
            while measured.open():
                started = time.perf_counter()
                try:
                    await one()
                except Exception as error:  # counted and reported, the loop goes on
                    measured.record(started, error)
                else:
                    measured.record(started, None)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        await client.close()
        return measured

    return asyncio.run(run())


RUNNERS = {
    "tritonclient-http": _http,
    "tritonclient-grpc": _grpc,
    "tritonclient-grpc-aio": _grpc_aio,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=PATHS, required=True)
    parser.add_argument("--url", required=True, help="host:port, no scheme")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", type=Path, required=True, help="the input tensor, .npy")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--max-requests", type=int, required=True)
    parser.add_argument("--server-pid", type=int, required=True)
    args = parser.parse_args()
    x = np.load(args.input)
    marks: dict[str, float] = {}

    def window() -> Window:
        marks["server_cpu"] = proc.tree_cpu_seconds(args.server_pid)
        marks["client_cpu"] = time.process_time()
        marks["wall"] = time.monotonic()
        return Window(deadline=marks["wall"] + args.seconds, max_requests=args.max_requests)

    measured = RUNNERS[args.path](args, x, window)
    wall = time.monotonic() - marks["wall"]
    client_cpu = time.process_time() - marks["client_cpu"]
    server_cpu = proc.tree_cpu_seconds(args.server_pid) - marks["server_cpu"]
    latencies = np.array(measured.latencies or [0.0]) * 1e3
    print(
        json.dumps({
            "requests": len(measured.latencies),
            "errors": measured.errors,
            "first_error": measured.first_error,
            "seconds": wall,
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)),
            "client_cpu": client_cpu / wall,
            "server_cpu_seconds": server_cpu,
        })
    )  # fmt: skip


if __name__ == "__main__":
    main()

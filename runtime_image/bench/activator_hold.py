"""The activator at its hold's limit, on loopback: its memory with 1,000 held HTTP requests and
1,000 held gRPC calls, the refusal of the next one, and the time from the report of a ready pod
to the last held request answered.

One activator process (``python -m kiln_runtime.activator``) with the default hold (1,000
requests per service), one runtime process serving the example MLP as the "pod". 1,000 HTTP
clients (one connection each, a 512-float JSON infer request, Host ``mlp.http.svc``) and 1,000
gRPC calls (tritonclient's request, over 10 channels, :authority ``mlp.grpc.svc``) are held; the
activator's RSS (``VmRSS``) is read before and while they are held; one more of each is refused
at once; then the runtime is reported ready and every held request must be answered 200/OK.
Every loop is bounded in count and time.

    cd runtime_image && python -m bench.activator_hold --out ../docs/benchmarks/scale-to-zero.md
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from kiln_runtime.examples import write_example

HOST = "127.0.0.1"
HELD = 1000
CHANNELS = 10
SECTION_BEGIN = "<!-- activator-hold:begin (cd runtime_image && python -m bench.activator_hold) -->"
SECTION_END = "<!-- activator-hold:end -->"


def free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def control(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(HOST, port, timeout=10)
    connection.request(method, path, body=None if body is None else json.dumps(body))
    answer = connection.getresponse()
    data = answer.read()
    return answer.status, json.loads(data) if data else None


def held(port: int) -> dict[str, int]:
    _, document = control(port, "GET", "/v1/demand")
    return {f"{s['namespace']}/{s['name']}": s["held"] for s in document["services"]}


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "INPUT__0",
                "datatype": "FP32",
                "shape": [1, 512],
                "data": np.random.default_rng(0).standard_normal(512).astype(np.float32).tolist(),
            }
        ]
    }
).encode()


def one_more(port: int) -> tuple[int, str | None, float]:
    """Request HELD + 1: its status, Retry-After and seconds to the answer."""
    started = time.monotonic()
    connection = http.client.HTTPConnection(HOST, port, timeout=10)
    connection.request("POST", "/v2/models/mlp/infer", body=BODY, headers={"Host": "mlp.http.svc"})
    answer = connection.getresponse()
    answer.read()
    return answer.status, answer.getheader("Retry-After"), time.monotonic() - started


def ready(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection(HOST, port, timeout=5)
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False


async def http_request(port: int) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    head = (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: mlp.http.svc\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    writer.write(head + BODY)
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 300)
    writer.close()
    return int(status_line.split()[1])


def grpc_request() -> bytes:
    """tritonclient's ModelInfer message for one row of the MLP, serialized."""
    request = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT__0", "FP32"
    tensor.shape.extend([1, 512])
    request.raw_input_contents.append(np.zeros((1, 512), dtype=np.float32).tobytes())
    return bytes(request.SerializeToString())


@dataclass
class Processes:
    activator: subprocess.Popen[bytes]
    runtime: subprocess.Popen[bytes]
    ports: list[int]
    """http, grpc, control (activator); http, grpc (runtime)."""


def start(model: Path) -> Processes:
    """The activator and the runtime (the woken pod), on free loopback ports."""
    http_port, grpc_port, control_port, rt_http, rt_grpc, rt_metrics = free_ports(6)
    write_example("mlp", model)
    activator = subprocess.Popen(
        [sys.executable, "-m", "kiln_runtime.activator", "--host", HOST,
         "--http-port", str(http_port), "--grpc-port", str(grpc_port),
         "--control-port", str(control_port), "--hold-timeout-seconds", "300"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    runtime = subprocess.Popen(
        [sys.executable, "-m", "kiln_runtime", "serve", "--model-path", str(model / "model.pt"),
         "--config", str(model / "config.json"), "--model-name", "mlp", "--host", HOST,
         "--http-port", str(rt_http), "--grpc-port", str(rt_grpc),
         "--metrics-port", str(rt_metrics), "--torch-threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return Processes(activator, runtime, [http_port, grpc_port, control_port, rt_http, rt_grpc])


async def run(processes: Processes) -> str:
    """Hold, measure, release; the page's section."""
    http_port, grpc_port, control_port, rt_http, rt_grpc = processes.ports
    activator = processes.activator
    channels: list[grpc.aio.Channel] = []
    extra_channel: grpc.aio.Channel | None = None
    try:

        def answers() -> bool:
            try:
                return control(control_port, "GET", "/healthz")[0] == 200
            except OSError:
                return False

        wait_until(answers, 30, "the activator")
        idle_rss = rss_mib(activator.pid)
        http_tasks = [asyncio.create_task(http_request(http_port)) for _ in range(HELD)]
        await asyncio.to_thread(
            wait_until, lambda: held(control_port).get("http/mlp", 0) == HELD, 120, "HTTP held"
        )
        http_rss = rss_mib(activator.pid)
        http_refused = await asyncio.to_thread(one_more, http_port)

        message = grpc_request()
        channels += [
            grpc.aio.insecure_channel(
                f"{HOST}:{grpc_port}",
                # a connection of its own per channel (grpcio shares one between equal channels)
                options=[
                    ("grpc.default_authority", "mlp.grpc.svc"),
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
            for _ in range(CHANNELS)
        ]
        calls = [
            channels[i % CHANNELS].unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                message, timeout=300
            )
            for i in range(HELD)
        ]
        grpc_tasks = [asyncio.ensure_future(call) for call in calls]
        await asyncio.sleep(0)
        await asyncio.to_thread(
            wait_until, lambda: held(control_port).get("grpc/mlp", 0) == HELD, 120, "gRPC held"
        )
        both_rss = rss_mib(activator.pid)
        extra_channel = grpc.aio.insecure_channel(
            f"{HOST}:{grpc_port}", options=[("grpc.default_authority", "mlp.grpc.svc")]
        )
        extra = extra_channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        refused_started = time.monotonic()
        try:
            await extra(message, timeout=10)
            grpc_refused = "answered"
        except grpc.aio.AioRpcError as error:
            grpc_refused = (
                f"{error.code().name} in {(time.monotonic() - refused_started) * 1000:.0f} ms: "
                f"{(error.details() or '')[:60]}…"
            )

        await asyncio.to_thread(wait_until, lambda: ready(rt_http), 60, "runtime")
        released = time.monotonic()
        for service in ("http", "grpc"):
            backends = {"http": [f"{HOST}:{rt_http}"], "grpc": [f"{HOST}:{rt_grpc}"]}
            control(control_port, "PUT", f"/v1/services/{service}/mlp/backends", backends)
        statuses = await asyncio.gather(*http_tasks)
        replies = await asyncio.gather(*grpc_tasks, return_exceptions=True)
        drained = time.monotonic() - released
        ok_http = sum(1 for status in statuses if status == 200)
        ok_grpc = sum(1 for reply in replies if isinstance(reply, bytes))
        refusals = Counter(str(status) for status in statuses if status != 200) + Counter(
            reply.code().name for reply in replies if isinstance(reply, grpc.aio.AioRpcError)
        )
    finally:
        for channel in channels:
            await channel.close()
        if extra_channel is not None:
            await extra_channel.close()

    section = "\n".join(
        [
            "## The activator's hold on loopback",
            "",
            f"`python -m bench.activator_hold` (loopback, this machine's 2 shared cores): one "
            f"activator, default hold ({HELD} requests per service), one runtime serving the "
            f"example MLP as the pod; {HELD} HTTP requests (one connection each, a 512-float "
            f"JSON body of {len(BODY) / 1024:.1f} KiB) held for one service and {HELD} gRPC "
            f"calls over {CHANNELS} channels for another.",
            "",
            "| measured | value |",
            "|---|---:|",
            f"| activator RSS, idle | {idle_rss:.1f} MiB |",
            f"| RSS with {HELD} HTTP requests held | {http_rss:.1f} MiB |",
            f"| RSS with {HELD} HTTP + {HELD} gRPC held | {both_rss:.1f} MiB |",
            f"| request {HELD + 1} (HTTP) | {http_refused[0]}, Retry-After {http_refused[1]}, "
            f"in {http_refused[2] * 1000:.0f} ms |",
            f"| call {HELD + 1} (gRPC) | {grpc_refused} |",
            f"| from the ready report to all {2 * HELD} answered | {drained:.2f} s |",
            f"| answered 200 / OK | {ok_http} of {HELD} HTTP, {ok_grpc} of {HELD} gRPC |",
            f"| not answered 200 / OK | {dict(refusals) or 'none'} |",
        ]
    )
    return section


def write_section(out: Path, section: str) -> None:
    page = out.read_text(encoding="utf-8") if out.exists() else "# Scale to zero\n"
    block = f"{SECTION_BEGIN}\n{section}\n{SECTION_END}\n"
    if SECTION_BEGIN in page:
        head, rest = page.split(SECTION_BEGIN, 1)
        page = head + block + rest.split(SECTION_END, 1)[1].lstrip("\n")
    else:
        page = page.rstrip("\n") + "\n\n" + block
    out.write_text(page, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory() as model:
        processes = start(Path(model))
        try:
            section = asyncio.run(run(processes))
        finally:
            for process in (processes.activator, processes.runtime):
                process.terminate()
                process.wait(30)
    write_section(out, section)
    print(section)


if __name__ == "__main__":
    main()

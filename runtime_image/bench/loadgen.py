"""Bounded load generators, each pinned to the client core, and what each run cost both sides.

Python clients saturate their core long before a fast server does, so the ceilings come from
Debian's ``wrk`` (binary-tensor HTTP bodies; also the plain JSON poster) and ``h2load`` (gRPC
frames over HTTP/2). The paths users take through ``tritonclient`` run in ``bench.clients``, a
separate process. Every run is bounded in time (the Python clients in count too); the
generator's CPU use is measured from the kernel's accounting, so the report shows whether the
client was the bottleneck, and the server's CPU time over the same run gives its cost per
request.
"""

from __future__ import annotations

import json
import re
import resource
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tritonclient.grpc import service_pb2


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    client_cpu: float  # cores the generator used on average (1.0 = its whole core)
    server_cpu_seconds: float  # the server's process tree, over the same run

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    @property
    def server_us_per_request(self) -> float:
        """Server CPU per answered request: a path's cost, less moved by a busy host."""
        return self.server_cpu_seconds / max(self.requests, 1) * 1e6


def http_body(model: str, name: str, datatype: str, array: npt.NDArray[Any]) -> tuple[bytes, int]:
    """A binary-tensor infer body (JSON header + raw bytes) and its header length."""
    header = json.dumps(
        {
            "inputs": [
                {"name": name, "datatype": datatype, "shape": list(array.shape),
                 "parameters": {"binary_data_size": array.nbytes}}
            ],
            "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    return header + array.tobytes(), len(header)


def json_body(name: str, datatype: str, array: npt.NDArray[Any]) -> bytes:
    """The KServe v2 REST body ``curl`` and most clients post: one input, flat JSON ``data``.

    No ``outputs``: the answer's tensors come back as JSON too. Numbers are written as
    ``tritonclient.http`` writes them (each value widened to a double, its shortest text).
    """
    document = {
        "inputs": [
            {"name": name, "shape": list(array.shape), "datatype": datatype,
             "data": array.ravel().tolist()}
        ]
    }  # fmt: skip
    return json.dumps(document, separators=(",", ":")).encode()


def grpc_frame(model: str, name: str, datatype: str, array: npt.NDArray[Any]) -> bytes:
    """A length-prefixed gRPC message carrying one ModelInferRequest."""
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
    message.raw_input_contents.append(array.tobytes())
    payload: bytes = message.SerializeToString()
    return struct.pack(">?I", False, len(payload)) + payload


_WRK_SCRIPT = """
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
{headers}
done = function(summary, latency, requests)
  io.write(string.format("KILN %d %d %d %d %d %d\\n", summary.requests, summary.duration,
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), 0))
end
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(
    url: str,
    body: bytes,
    header_length: int | None,
    *,
    concurrency: int,
    seconds: float,
    core: int,
    server_cpu: Callable[[], float],
) -> LoadResult:
    """``header_length`` for a binary-tensor body; ``None`` posts ``body`` as plain JSON."""
    if header_length is None:
        headers = {"Content-Type": "application/json"}
    else:
        headers = {
            "Inference-Header-Content-Length": str(header_length),
            "Content-Type": "application/octet-stream",
        }
    with tempfile.TemporaryDirectory() as scratch:
        body_file = Path(scratch) / "body.bin"
        body_file.write_bytes(body)
        script = Path(scratch) / "post.lua"
        script.write_text(
            _WRK_SCRIPT.format(
                body=body_file,
                headers="\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()),
            )
        )
        command = [
            "taskset", "-c", str(core), "wrk", "-t1", f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url,
        ]  # fmt: skip
        cpu_before = _children_cpu()
        server_before = server_cpu()
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 60, check=True
        )
        server = server_cpu() - server_before
        cpu = _children_cpu() - cpu_before
    match = re.search(r"^KILN (\d+) (\d+) (\d+) (\d+) (\d+)", completed.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{completed.stdout}\n{completed.stderr}")
    requests, duration_us, errors, p50_us, p99_us = (int(g) for g in match.groups())
    duration = duration_us / 1e6
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", completed.stdout)
    errors = max(errors, int(non_2xx.group(1)) if non_2xx else 0)
    return LoadResult(
        requests, errors, duration, p50_us / 1e3, p99_us / 1e3, cpu / duration, server
    )


H2LOAD_WARM_UP = 1.0


def run_h2load(
    url: str,
    frame: bytes,
    *,
    concurrency: int,
    seconds: float,
    core: int,
    server_cpu: Callable[[], float],
) -> LoadResult:
    """h2load logs only requests after its warm-up, so the server's CPU is read from then on
    (a timer from the start: connection set-up falls in the warm-up, the edge is approximate)."""
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "frame.bin"
        data.write_bytes(frame)
        log = Path(scratch) / "requests.log"
        command = [
            "taskset", "-c", str(core), "h2load", "-t1", f"-c{concurrency}", "-m1",
            f"-D{max(1, round(seconds))}", f"--warm-up-time={H2LOAD_WARM_UP:g}", "-d", str(data),
            f"--log-file={log}",
            "-H", "content-type: application/grpc", "-H", "te: trailers", url,
        ]  # fmt: skip
        cpu_before = _children_cpu()
        started = time.monotonic()
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as process:
            time.sleep(H2LOAD_WARM_UP)
            server_before = server_cpu()
            try:
                stdout, stderr = process.communicate(timeout=seconds + 60)
            except subprocess.TimeoutExpired:
                process.kill()  # the h2load this call started, and no other
                raise
        server = server_cpu() - server_before
        if process.returncode != 0:
            raise RuntimeError(f"h2load exited with {process.returncode}:\n{stdout}\n{stderr}")
        wall = time.monotonic() - started
        cpu = _children_cpu() - cpu_before
        rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    if not rows:
        raise RuntimeError(f"h2load logged no requests:\n{stdout}\n{stderr}")
    starts = np.array([float(r[0]) for r in rows])  # microseconds since the run began
    statuses = np.array([int(r[1]) for r in rows])
    latencies = np.array([float(r[2]) for r in rows]) / 1e3
    span = (starts.max() + latencies[starts.argmax()] * 1e3 - starts.min()) / 1e6
    return LoadResult(
        requests=len(rows),
        errors=int((statuses != 200).sum()),
        seconds=max(span, 1e-9),
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        client_cpu=cpu / wall,
        server_cpu_seconds=server,
    )


def run_python_client(
    path: str,
    url: str,
    model: str,
    array: npt.NDArray[Any],
    *,
    concurrency: int,
    seconds: float,
    max_requests: int,
    core: int,
    server_pid: int,
) -> LoadResult:
    """One ``bench.clients`` run in its own process on ``core``; it measures both sides."""
    with tempfile.TemporaryDirectory() as scratch:
        tensor = Path(scratch) / "input.npy"
        np.save(tensor, array)
        command = [
            "taskset", "-c", str(core), sys.executable, "-m", "bench.clients", "--path", path,
            "--url", url, "--model", model, "--input", str(tensor),
            "--concurrency", str(concurrency), "--seconds", str(seconds),
            "--max-requests", str(max_requests), "--server-pid", str(server_pid),
        ]  # fmt: skip
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 120, check=False,
            cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"{path} client failed:\n{completed.stderr[-4000:]}")
    summary = json.loads(completed.stdout.strip().splitlines()[-1])
    if summary["first_error"]:
        print(f"    {path}: first error: {summary['first_error']}", flush=True)
    return LoadResult(
        requests=summary["requests"],
        errors=summary["errors"],
        seconds=summary["seconds"],
        p50_ms=summary["p50_ms"],
        p99_ms=summary["p99_ms"],
        client_cpu=summary["client_cpu"],
        server_cpu_seconds=summary["server_cpu_seconds"],
    )

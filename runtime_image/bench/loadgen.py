"""Compiled, bounded load generators: wrk for HTTP, h2load for gRPC, pinned to their own core.

Python clients saturate their core long before a fast server does, so the closed-loop runs use
Debian's ``wrk`` (binary-tensor HTTP bodies) and ``h2load`` (gRPC frames over HTTP/2). Every
run is bounded in time; the generator's CPU use is measured from the kernel's accounting of
the child process, so the report shows whether the client was the bottleneck.
"""

from __future__ import annotations

import json
import re
import resource
import struct
import subprocess
import tempfile
import time
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

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds


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
wrk.headers["Inference-Header-Content-Length"] = "{header_length}"
wrk.headers["Content-Type"] = "application/octet-stream"
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
    url: str, body: bytes, header_length: int, *, concurrency: int, seconds: float, core: int
) -> LoadResult:
    with tempfile.TemporaryDirectory() as scratch:
        body_file = Path(scratch) / "body.bin"
        body_file.write_bytes(body)
        script = Path(scratch) / "post.lua"
        script.write_text(_WRK_SCRIPT.format(body=body_file, header_length=header_length))
        command = [
            "taskset", "-c", str(core), "wrk", "-t1", f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url,
        ]  # fmt: skip
        cpu_before = _children_cpu()
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 60, check=True
        )
        cpu = _children_cpu() - cpu_before
    match = re.search(r"^KILN (\d+) (\d+) (\d+) (\d+) (\d+)", completed.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{completed.stdout}\n{completed.stderr}")
    requests, duration_us, errors, p50_us, p99_us = (int(g) for g in match.groups())
    duration = duration_us / 1e6
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", completed.stdout)
    errors = max(errors, int(non_2xx.group(1)) if non_2xx else 0)
    return LoadResult(requests, errors, duration, p50_us / 1e3, p99_us / 1e3, cpu / duration)


def run_h2load(
    url: str, frame: bytes, *, concurrency: int, seconds: float, core: int
) -> LoadResult:
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "frame.bin"
        data.write_bytes(frame)
        log = Path(scratch) / "requests.log"
        command = [
            "taskset", "-c", str(core), "h2load", "-t1", f"-c{concurrency}", "-m1",
            f"-D{max(1, round(seconds))}", "--warm-up-time=1", "-d", str(data),
            f"--log-file={log}",
            "-H", "content-type: application/grpc", "-H", "te: trailers", url,
        ]  # fmt: skip
        cpu_before = _children_cpu()
        started = time.monotonic()
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 60, check=True
        )
        wall = time.monotonic() - started
        cpu = _children_cpu() - cpu_before
        rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    if not rows:
        raise RuntimeError(f"h2load logged no requests:\n{completed.stdout}\n{completed.stderr}")
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
    )

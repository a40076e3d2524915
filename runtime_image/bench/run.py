"""Run the runtime benchmark side by side and write the report.

kiln_runtime and Triton (nvidia-pytriton) serve the same TorchScript programs on loopback, the
server pinned to one core and every client to the other; wrk (HTTP) and h2load (gRPC) drive
closed loops at each concurrency; the raw forward pass is the limit; an open-loop run at 5x
capacity checks overload behaviour. Writes ``runtime.md``, ``runtime.json`` and ``runtime.png``.

    cd runtime_image && python -m bench.run --out ../docs/benchmarks --triton-python PY
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from bench import loadgen, overload, servers
from bench.report import write_report
from kiln_runtime.examples import example_input, write_example

SERVER_CORE = 0
CLIENT_CORE = 1

# Each model: the variants served, and the raw forward passes that bound them.
PLAN: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    # like for like: each precision served by both, the same program on each side
    "mlp": [
        ("kiln (fp32)", "kiln", {}),
        ("triton (fp32)", "triton", {}),
        ("kiln (int8)", "kiln", {"precision": "int8"}),
        ("triton (int8)", "triton", {"precision": "int8"}),
    ],
    "transformer": [
        ("kiln (fp32)", "kiln", {}),
        ("triton (fp32)", "triton", {}),
    ],
}


def check_answers(server: servers.Server, model: str, x: np.ndarray) -> None:
    """One request per protocol through tritonclient: the server computes, not just answers."""
    datatype = "FP32" if x.dtype == np.float32 else "INT64"
    for module, url in (
        (triton_http, f"{servers.HOST}:{server.http_port}"),
        (triton_grpc, f"{servers.HOST}:{server.grpc_port}"),
    ):
        client = module.InferenceServerClient(url)
        tensor = module.InferInput("INPUT__0", list(x.shape), datatype)
        tensor.set_data_from_numpy(x)
        output = client.infer(model, [tensor]).as_numpy("OUTPUT__0")
        if output.shape != (x.shape[0], 10):
            raise RuntimeError(f"{server.label} answered shape {output.shape}")


def measure(
    server: servers.Server,
    model: str,
    x: np.ndarray,
    concurrency: list[int],
    seconds: float,
) -> list[dict[str, Any]]:
    datatype = "FP32" if x.dtype == np.float32 else "INT64"
    body, header_length = loadgen.http_body(model, "INPUT__0", datatype, x)
    frame = loadgen.grpc_frame(model, "INPUT__0", datatype, x)
    http_url = f"http://{servers.HOST}:{server.http_port}/v2/models/{model}/infer"
    grpc_url = f"http://{servers.HOST}:{server.grpc_port}/inference.GRPCInferenceService/ModelInfer"
    rows = []
    for protocol in ("http", "grpc"):
        for clients in concurrency:
            if protocol == "http":
                result = loadgen.run_wrk(
                    http_url, body, header_length,
                    concurrency=clients, seconds=seconds, core=CLIENT_CORE,
                )  # fmt: skip
            else:
                result = loadgen.run_h2load(
                    grpc_url, frame, concurrency=clients, seconds=seconds, core=CLIENT_CORE
                )
            rows.append(
                {"protocol": protocol, "concurrency": clients, **asdict(result),
                 "throughput": result.throughput}
            )  # fmt: skip
            print(
                f"  {server.label:6} {protocol:4} c={clients:<3} {result.throughput:9.1f} req/s "
                f"p50 {result.p50_ms:7.3f} ms p99 {result.p99_ms:7.3f} ms "
                f"client cpu {result.client_cpu:4.2f} errors {result.errors}",
                flush=True,
            )
    return rows


def raw_forward(model_file: Path, kind: str, int8: bool, batches: list[int]) -> dict[str, float]:
    command = [
        "taskset", "-c", str(SERVER_CORE), sys.executable, "-m", "bench.raw_forward",
        "--model", str(model_file), "--kind", kind, "--batches", *map(str, batches),
    ] + (["--int8"] if int8 else [])  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
    timings: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return timings


def overload_run(model_dir: Path, capacity: float, seconds: float, log: Path) -> dict[str, Any]:
    """Open loop at 5x the measured capacity against kiln serving the transformer."""
    x = example_input("transformer", 1).numpy()
    body, header_length = loadgen.http_body("transformer", "INPUT__0", "INT64", x)
    samples: list[tuple[float, int]] = []
    with servers.kiln(model_dir, "transformer", SERVER_CORE, log) as server:
        stop = threading.Event()
        baseline = server.rss_bytes()

        def sample() -> None:
            started = time.monotonic()
            while not stop.wait(0.5):
                samples.append((time.monotonic() - started, server.rss_bytes()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = asyncio.run(
            overload.open_loop(
                servers.HOST, server.http_port, "/v2/models/transformer/infer", body,
                header_length, rate=5 * capacity, seconds=seconds,
            )
        )  # fmt: skip
        stop.set()
        sampler.join()
        after = loadgen.run_wrk(
            f"http://{servers.HOST}:{server.http_port}/v2/models/transformer/infer", body,
            header_length, concurrency=1, seconds=3, core=CLIENT_CORE,
        )  # fmt: skip
        ready = server.process.poll() is None
    latencies = np.array(result.ok_latencies_ms or [0.0])
    return {
        "rate": 5 * capacity,
        "seconds": result.seconds,
        "sent": result.sent,
        "statuses": {str(k): v for k, v in result.statuses.items()},
        "client_dropped": result.client_dropped,
        "ok_p50_ms": float(np.percentile(latencies, 50)),
        "ok_p99_ms": float(np.percentile(latencies, 99)),
        "rss_baseline_bytes": baseline,
        "rss_max_bytes": max((rss for _, rss in samples), default=baseline),
        "rss_samples": samples,
        "after": {**asdict(after), "throughput": after.throughput},
        "still_running": ready,
    }


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests, summed over this host's CPUs.

    On a shared virtual machine it is the one disturbance the other numbers cannot show:
    every server runs slower while it is high, whatever it does.
    """
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    steal = int(fields[8]) if len(fields) > 8 else 0
    return steal / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--triton-python", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--overload-seconds", type=float, default=30.0)
    parser.add_argument(
        "--abuse", type=Path,
        help="JSON lines from the HTTP abuse tests (KILN_ABUSE_OUT), rendered as their table",
    )  # fmt: skip
    parser.add_argument(
        "--models", nargs="+", choices=sorted(PLAN), default=sorted(PLAN),
        help="a subset for a short check; the report's transformer targets need it",
    )  # fmt: skip
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CORE})  # this process and the clients it starts

    results: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version()},
        "seconds_per_run": args.seconds,
        "models": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch) / "logs"  # server logs: only useful while the run lasts
        logs.mkdir()
        for kind, variants in PLAN.items():
            if kind not in args.models:
                continue
            model_dir = Path(scratch) / kind
            write_example(kind, model_dir)
            x = example_input(kind, 1).numpy()
            print(f"{kind}: raw forward", flush=True)
            raw = {
                "fp32": raw_forward(model_dir / "model.pt", kind, False, [1, 16, 32]),
            }
            if any(opt.get("precision") == "int8" for _, _, opt in variants):
                raw["int8"] = raw_forward(model_dir / "model.pt", kind, True, [1, 16, 32])
            model_results: dict[str, Any] = {
                "raw_forward_seconds": raw, "servers": {}, "load_average": {}, "steal": {}
            }  # fmt: skip
            for label, kind_of_server, optimization in variants:
                load_before = os.getloadavg()[0]
                steal_before = steal_seconds()
                wall_before = time.monotonic()
                log = (
                    logs / f"{kind}-{label.split()[0]}-{optimization.get('precision', 'fp32')}.log"
                )
                print(f"{kind}: {label}", flush=True)
                if kind_of_server == "kiln":
                    context = servers.kiln(model_dir, kind, SERVER_CORE, log, optimization)
                else:
                    context = servers.triton(
                        model_dir,
                        kind,
                        SERVER_CORE,
                        log,
                        args.triton_python,
                        optimization=optimization,
                    )
                with context as server:
                    check_answers(server, kind, x)
                    rows = measure(server, kind, x, args.concurrency, args.seconds)
                    rows.append({"rss_bytes": server.rss_bytes()})
                model_results["servers"][label] = rows
                model_results["load_average"][label] = [load_before, os.getloadavg()[0]]
                model_results["steal"][label] = (steal_seconds() - steal_before) / (
                    (time.monotonic() - wall_before) * (os.cpu_count() or 1)
                )
            # The limit measured again right after the servers: other work on the host shifts
            # both, and the ratio should compare numbers taken close together.
            raw_after = raw_forward(model_dir / "model.pt", kind, False, [1, 16, 32])
            raw["fp32"] = {
                size: (before + raw_after[size]) / 2 for size, before in raw["fp32"].items()
            }
            results["models"][kind] = model_results
            if kind == "transformer":
                capacity = max(
                    r["throughput"]
                    for r in model_results["servers"]["kiln (fp32)"]
                    if r.get("protocol") == "http"
                )
                print(f"transformer: overload at 5 x {capacity:.0f} req/s", flush=True)
                results["overload"] = overload_run(
                    model_dir, capacity, args.overload_seconds, logs / "overload.log"
                )
    if args.abuse is not None:
        results["abuse"] = [json.loads(line) for line in args.abuse.read_text().splitlines()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runtime.json").write_text(json.dumps(results, indent=1))
    write_report(results, args.out / "runtime.md")
    plot = subprocess.run(
        [str(args.triton_python), "-m", "bench.plot", str(args.out / "runtime.json"),
         str(args.out / "runtime.png")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if plot.returncode != 0:
        print(f"plot failed:\n{plot.stderr}", file=sys.stderr)
    print(f"wrote {args.out / 'runtime.md'}")


if __name__ == "__main__":
    main()

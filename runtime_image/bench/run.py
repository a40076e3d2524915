"""Run the runtime benchmark side by side and write the report.

kiln_runtime and Triton (nvidia-pytriton) serve the same TorchScript programs on loopback, the
servers pinned to one core and every client to the other. A model's servers are up together and
take turns run by run (``measure_interleaved``), so Kiln's and Triton's numbers for one path are
taken seconds apart on a host whose speed drifts over minutes. Closed loops at each concurrency on
each path (``PATHS``): the ceilings, wrk (binary-tensor HTTP) and h2load (raw gRPC frames), and
the paths users take, a plain JSON poster (wrk with a KServe v2 JSON body) and the official
clients (``bench.clients``: tritonclient HTTP with JSON tensors, gRPC sync and aio). Each run
reports the client's CPU and the server's CPU per request. The raw forward pass is the limit;
an open-loop run at 5x capacity checks overload behaviour. Writes ``runtime.md``,
``runtime.json`` and ``runtime.png``.

    cd runtime_image && python -m bench.run --out ../docs/benchmarks --triton-python PY
    cd runtime_image && python -m bench.run --out /tmp/smoke --triton-python PY --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from bench import loadgen, overload, proc, servers
from bench import profile as profiling
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


# Models whose target is a share of the raw forward: it is timed again right after the runs at
# 16 clients of each path the target names, so the two are taken seconds apart.
LIMIT_TIMED_BESIDE = ("transformer",)


def limit_beside(
    kind: str, model_file: Path, beside: dict[str, dict[str, float]]
) -> Callable[[str, int], None]:
    """For ``measure_interleaved``'s ``after_turn``: the raw forward timed right after the runs
    its target compares with, into ``beside`` under ``"<path>@<clients>"``."""

    def time_the_limit(path: str, clients: int) -> None:
        if kind in LIMIT_TIMED_BESIDE and path in ("wrk", "h2load") and clients == 16:
            print(f"{kind}: raw forward after {path} c={clients}", flush=True)
            beside[f"{path}@{clients}"] = raw_forward(model_file, kind, False, [16])

    return time_the_limit


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


def start_servers(
    stack: contextlib.ExitStack,
    kind: str,
    model_dir: Path,
    *,
    x: np.ndarray,
    logs: Path,
    triton_python: Path,
) -> dict[str, servers.Server]:
    """Every server of ``PLAN[kind]`` up on the server core (stopped when ``stack`` closes),
    each checked to compute one request per protocol; by label, in the plan's order."""
    running: dict[str, servers.Server] = {}
    for label, kind_of_server, optimization in PLAN[kind]:
        precision = optimization.get("precision", "fp32")
        log = logs / f"{kind}-{label.split()[0]}-{precision}.log"
        print(f"{kind}: starting {label}", flush=True)
        if kind_of_server == "kiln":
            context = servers.kiln(model_dir, kind, SERVER_CORE, log, optimization)
        else:
            context = servers.triton(
                model_dir, kind, SERVER_CORE, log, triton_python, optimization=optimization
            )
        running[label] = stack.enter_context(context)
        check_answers(running[label], kind, x)
    return running


# Each load path: its name in runtime.json and the report, and the protocol it speaks. The
# first two are the ceilings (compiled generators, binary tensors); the rest are what users send.
PATHS: dict[str, str] = {
    "wrk": "http",  # binary-tensor bodies
    "wrk-json": "http",  # the plain JSON poster: the KServe v2 REST body curl sends
    "tritonclient-http": "http",  # JSON tensors both ways (binary_data=False)
    "h2load": "grpc",  # one raw ModelInfer frame replayed
    "tritonclient-grpc": "grpc",  # blocking infer from one thread per client
    "tritonclient-grpc-aio": "grpc",
}


def measure(
    server: servers.Server,
    model: str,
    x: np.ndarray,
    *,
    label: str,
    path: str,
    clients: int,
    seconds: float,
    max_requests: int,
) -> dict[str, Any]:
    """One closed-loop run of ``clients`` on ``path`` against ``server`` (``label``): its row."""
    datatype = "FP32" if x.dtype == np.float32 else "INT64"
    http_url = f"http://{servers.HOST}:{server.http_port}/v2/models/{model}/infer"
    grpc_url = f"http://{servers.HOST}:{server.grpc_port}/inference.GRPCInferenceService/ModelInfer"
    protocol = PATHS[path]
    cpu = server.cpu_seconds
    if path == "wrk":
        body, header_length = loadgen.http_body(model, "INPUT__0", datatype, x)
        result = loadgen.run_wrk(
            http_url, body, header_length, concurrency=clients, seconds=seconds,
            core=CLIENT_CORE, server_cpu=cpu,
        )  # fmt: skip
    elif path == "wrk-json":
        result = loadgen.run_wrk(
            http_url, loadgen.json_body("INPUT__0", datatype, x), None, concurrency=clients,
            seconds=seconds, core=CLIENT_CORE, server_cpu=cpu,
        )  # fmt: skip
    elif path == "h2load":
        result = loadgen.run_h2load(
            grpc_url, loadgen.grpc_frame(model, "INPUT__0", datatype, x), concurrency=clients,
            seconds=seconds, core=CLIENT_CORE, server_cpu=cpu,
        )  # fmt: skip
    else:
        port = server.http_port if protocol == "http" else server.grpc_port
        result = loadgen.run_python_client(
            path, f"{servers.HOST}:{port}", model, x, concurrency=clients,
            seconds=seconds, max_requests=max_requests, core=CLIENT_CORE,
            server_pid=server.process.pid,
        )  # fmt: skip
    print(
        f"  {label:14} {path:21} c={clients:<3} {result.throughput:9.1f} req/s "
        f"p50 {result.p50_ms:7.3f} ms p99 {result.p99_ms:7.3f} ms "
        f"client cpu {result.client_cpu:4.2f} server {result.server_us_per_request:6.0f} "
        f"us/req errors {result.errors}",
        flush=True,
    )
    return {
        "path": path, "protocol": protocol, "concurrency": clients, **asdict(result),
        "throughput": result.throughput, "server_us_per_request": result.server_us_per_request,
    }  # fmt: skip


def measure_interleaved(
    running: dict[str, servers.Server],
    model: str,
    x: np.ndarray,
    *,
    paths: list[str],
    concurrency: list[int],
    seconds: float,
    max_requests: int,
    after_turn: Callable[[str, int], None] = lambda path, clients: None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Every path at every concurrency against every server, the servers taking turns.

    All the servers stay up, pinned to the server core; each run loads one of them while the
    others idle. For each path and concurrency the servers run one after another (in the
    order given, then reversed for the next, so none is always first): a ratio between two
    servers compares runs seconds apart, not minutes, and the host's drift over the run hits
    both alike. Returns the rows per server, and per server the host's load average at the
    start of its runs (lowest and highest), its share of steal, and the CPU it used while the
    others ran (the idle servers' cost to the one measured). ``after_turn(path, clients)`` runs
    once every server had its run of that path and concurrency (a limit to time beside them).
    """
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in running}
    loads: dict[str, list[float]] = {label: [] for label in running}
    stolen = dict.fromkeys(running, 0.0)
    measured_wall = dict.fromkeys(running, 0.0)
    idle_cpu = dict.fromkeys(running, 0.0)
    idle_wall = dict.fromkeys(running, 0.0)
    order = list(running)
    runs = [(path, clients) for path in paths for clients in concurrency]
    for turn, (path, clients) in enumerate(runs):
        for label in order if turn % 2 == 0 else order[::-1]:
            loads[label].append(os.getloadavg()[0])
            steal_before, wall_before = steal_seconds(), clock()
            cpu_before = {other: s.cpu_seconds() for other, s in running.items()}
            rows[label].append(
                measure(
                    running[label],
                    model,
                    x,
                    label=label,
                    path=path,
                    clients=clients,
                    seconds=seconds,
                    max_requests=max_requests,
                )
            )
            wall = clock() - wall_before
            stolen[label] += steal_seconds() - steal_before
            measured_wall[label] += wall
            for other, server in running.items():
                if other != label:
                    idle_cpu[other] += server.cpu_seconds() - cpu_before[other]
                    idle_wall[other] += wall
        after_turn(path, clients)
    host = {
        label: {
            "load_average": [min(loads[label]), max(loads[label])],
            "steal": stolen[label] / max(measured_wall[label] * (os.cpu_count() or 1), 1e-9),
            "idle_cpu": idle_cpu[label] / idle_wall[label] if idle_wall[label] else 0.0,
        }
        for label in running
    }
    return rows, host


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
            server_cpu=server.cpu_seconds,
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
    parser.add_argument("--seconds", type=float, default=5.0, help="each closed-loop run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
        help="load paths, each run against every server at every concurrency",
    )  # fmt: skip
    parser.add_argument(
        "--max-requests", type=int, default=500_000,
        help="bound on the requests of one Python-client run, beside its seconds",
    )  # fmt: skip
    parser.add_argument("--overload-seconds", type=float, default=30.0)
    parser.add_argument(
        "--quick", action="store_true",
        help="a smoke check that every path runs: 1 s runs, a 3 s overload",
    )  # fmt: skip
    parser.add_argument(
        "--abuse", type=Path,
        help="JSON lines from the HTTP abuse tests (KILN_ABUSE_OUT), rendered as their table",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true",
        help="end with py-spy profiles of the server under tritonclient.grpc and the HTTP JSON "
        "path (bench.profile): flame graphs beside the report, their breakdown in it",
    )  # fmt: skip
    parser.add_argument(
        "--models", nargs="+", choices=sorted(PLAN), default=sorted(PLAN),
        help="a subset for a short check; the report's transformer targets need it",
    )  # fmt: skip
    args = parser.parse_args()
    servers.exit_on_sigterm()
    proc.match_autogroup(os.getpid())
    if args.quick:
        args.seconds, args.overload_seconds = 1.0, 3.0
    started = time.monotonic()
    os.sched_setaffinity(0, {CLIENT_CORE})  # this process and the clients it starts

    results: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version(),
                 "runtime_build": servers.build_of(servers.BENCH_DIR.parent),
                 "nice": os.nice(0)},
        "seconds_per_run": args.seconds,
        "paths": args.paths,
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
                "raw_forward_seconds": raw, "servers": {}, "load_average": {}, "steal": {},
                "idle_cpu": {},
            }  # fmt: skip
            with contextlib.ExitStack() as stack:
                running = start_servers(
                    stack, kind, model_dir, x=x, logs=logs, triton_python=args.triton_python
                )
                beside: dict[str, dict[str, float]] = {}
                rows, host = measure_interleaved(
                    running, kind, x, paths=args.paths, concurrency=args.concurrency,
                    seconds=args.seconds, max_requests=args.max_requests,
                    after_turn=limit_beside(kind, model_dir / "model.pt", beside),
                )  # fmt: skip
                if beside:
                    model_results["raw_forward_beside"] = beside
                for label, server in running.items():
                    model_results["servers"][label] = [
                        *rows[label],
                        {"rss_bytes": server.rss_bytes()},
                    ]
                    model_results["load_average"][label] = host[label]["load_average"]
                    model_results["steal"][label] = host[label]["steal"]
                    model_results["idle_cpu"][label] = host[label]["idle_cpu"]
            # The limit measured again right after the servers: other work on the host shifts
            # both, and the ratio should compare numbers taken close together.
            raw_after = raw_forward(model_dir / "model.pt", kind, False, [1, 16, 32])
            raw["fp32"] = {
                size: (before + raw_after[size]) / 2 for size, before in raw["fp32"].items()
            }
            results["models"][kind] = model_results
            if kind == "transformer":
                kiln_rows = [r for r in model_results["servers"]["kiln (fp32)"] if "path" in r]
                capacity = max(
                    r["throughput"]
                    for r in [r for r in kiln_rows if r["path"] == "wrk"] or kiln_rows
                )
                print(f"transformer: overload at 5 x {capacity:.0f} req/s", flush=True)
                results["overload"] = overload_run(
                    model_dir, capacity, args.overload_seconds, logs / "overload.log"
                )
    if args.profile:
        args.out.mkdir(parents=True, exist_ok=True)
        try:  # a failed profile must not lose the measurements above
            results["profiles"] = profiling.run_profiles(
                args.out, seconds=2 * args.seconds, rate=profiling.RATE,
                names=list(profiling.PROFILES),
            )  # fmt: skip
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            print(f"profiles failed: {error}", file=sys.stderr, flush=True)
    if args.abuse is not None:
        results["abuse"] = [json.loads(line) for line in args.abuse.read_text().splitlines()]
    results["wall_seconds"] = time.monotonic() - started
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

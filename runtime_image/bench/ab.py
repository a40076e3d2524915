"""A/B: two (or more) versions of the runtime, measured interleaved on the same host.

The benchmark compares Kiln with Triton; a change to the runtime itself is judged against the
runtime before it, and on a shared 2-core host only numbers taken close together compare. Each
variant is a directory holding a ``kiln_runtime`` package (the working tree's ``runtime_image``,
or an older commit's, e.g. from ``git archive COMMIT runtime_image | tar -x -C DIR``), served
as it is, as it prints: compiled where its modules are (``make native`` in the working tree,
``KILN_RUNTIME_COMPILE=1 python setup.py build_ext --inplace`` in DIR), else pure Python. Every
variant's server runs for the whole session, pinned to the server core; the load goes to one at
a time, round by round, alternating the order, so drift in the host's load hits each alike.
Per run: throughput, p50, the server's CPU µs per request (the steadiest figure), the mean
batch size (from the server's ``kiln_batch_size`` histogram) and the host's steal; at the end
the median of each over the rounds, and each variant's throughput over the first one's paired
round by round (``paired_ratios``).

    cd runtime_image && python -m bench.ab --variant base=/tmp/base/runtime_image \\
        --variant new=. --model mlp --paths tritonclient-grpc h2load --concurrency 16 \\
        --rounds 5 --seconds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import loadgen, servers
from bench.run import CLIENT_CORE, PATHS, SERVER_CORE, raw_forward, steal_seconds
from kiln_runtime.examples import example_input, write_example

MINIMAL_SECTIONS = ("model", "optimization", "batching", "warmup")
_SUM = re.compile(
    r"^kiln_(batch_size|compute_duration_seconds)_(sum|count)\{[^}]*\} ([0-9.e+]+)$",
    re.MULTILINE,
)


def batch_totals(server: servers.Server) -> tuple[float, float, float]:
    """(rows, batches, compute seconds) the server has run so far, from its metrics port."""
    url = f"http://{servers.HOST}:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    found = {(metric, kind): float(value) for metric, kind, value in _SUM.findall(text)}
    return (
        found.get(("batch_size", "sum"), 0.0),
        found.get(("batch_size", "count"), 0.0),
        found.get(("compute_duration_seconds", "sum"), 0.0),
    )


def one_run(
    server: servers.Server, model: str, x: Any, path: str, *, clients: int, seconds: float
) -> dict[str, float]:
    datatype = "FP32" if x.dtype.kind == "f" else "INT64"
    rows_before, batches_before, compute_before = batch_totals(server)
    steal_before, wall_before = steal_seconds(), time.monotonic()
    cpu = server.cpu_seconds
    if path in ("wrk", "wrk-json"):
        length: int | None
        body, length = loadgen.http_body(model, "INPUT__0", datatype, x)
        if path == "wrk-json":
            body, length = loadgen.json_body("INPUT__0", datatype, x), None
        url = f"http://{servers.HOST}:{server.http_port}/v2/models/{model}/infer"
        result = loadgen.run_wrk(url, body, length, concurrency=clients, seconds=seconds,
                                 core=CLIENT_CORE, server_cpu=cpu)  # fmt: skip
    elif path == "h2load":
        frame = loadgen.grpc_frame(model, "INPUT__0", datatype, x)
        url = (f"http://{servers.HOST}:{server.grpc_port}"
               "/inference.GRPCInferenceService/ModelInfer")  # fmt: skip
        result = loadgen.run_h2load(url, frame, concurrency=clients, seconds=seconds,
                                    core=CLIENT_CORE, server_cpu=cpu)  # fmt: skip
    else:
        port = server.http_port if PATHS[path] == "http" else server.grpc_port
        result = loadgen.run_python_client(
            path, f"{servers.HOST}:{port}", model, x, concurrency=clients, seconds=seconds,
            max_requests=1_000_000, core=CLIENT_CORE, server_pid=server.process.pid,
        )  # fmt: skip
    rows_after, batches_after, compute_after = batch_totals(server)
    batches = batches_after - batches_before
    return {
        "throughput": result.throughput,
        "p50_ms": result.p50_ms,
        "server_us": result.server_us_per_request,
        "client_cpu": result.client_cpu,
        "batch": (rows_after - rows_before) / batches if batches else 0.0,
        "compute_ms": 1e3 * (compute_after - compute_before) / batches if batches else 0.0,
        "errors": result.errors,
        "steal": (steal_seconds() - steal_before)
        / ((time.monotonic() - wall_before) * (os.cpu_count() or 1)),
        "load": os.getloadavg()[0],
    }


def paired_ratios(
    results: dict[tuple[str, str, int], list[dict[str, float]]], base: str
) -> list[tuple[str, str, int, list[float], float]]:
    """Each other variant's throughput over ``base``'s, round by round: the two runs of a round
    are seconds apart, so the host's drift over the session cancels out of their ratio, which
    medians taken over all the rounds keep. Per variant, path and concurrency: the per-round
    ratios and their geometric mean."""
    paired = []
    for (name, path, clients), runs in results.items():
        base_runs = results.get((base, path, clients))
        if name == base or not base_runs:
            continue
        ratios = [
            run["throughput"] / ref["throughput"]
            for run, ref in zip(runs, base_runs, strict=False)
            if run["throughput"] > 0 and ref["throughput"] > 0
        ]
        if ratios:
            mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
            paired.append((name, path, clients, ratios, mean))
    return paired


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=DIR",
                        help="a directory holding the kiln_runtime package to serve")  # fmt: skip
    parser.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=["tritonclient-grpc"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--raw-forward", action="store_true",
        help="time the raw batch-16 forward (bench.raw_forward) before and after the rounds "
        "and print each run's throughput as a share of it (the transformer's target)",
    )  # fmt: skip
    parser.add_argument(
        "--minimal-config", action="store_true",
        help="keep only the config sections every runtime version knows (older ones refuse "
        "sections added after them)",
    )  # fmt: skip
    args = parser.parse_args()
    servers.exit_on_sigterm()
    variants = [(n, Path(d).resolve()) for n, d in (v.split("=", 1) for v in args.variant)]
    os.sched_setaffinity(0, {CLIENT_CORE})
    int8 = args.precision == "int8"
    optimization = {"precision": args.precision} if int8 else {}
    x = example_input(args.model, 1).numpy()
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        model_dir = Path(scratch) / args.model
        write_example(args.model, model_dir)
        if args.minimal_config:
            config = json.loads((model_dir / "config.json").read_text())
            kept = {k: v for k, v in config.items() if k in MINIMAL_SECTIONS}
            (model_dir / "config.json").write_text(json.dumps(kept))
        running = {}
        for name, code in variants:
            print(f"{name}: {code}, {servers.build_of(code)} build", flush=True)
            log = Path(scratch) / f"{name}.log"
            running[name] = stack.enter_context(
                servers.kiln(model_dir, args.model, SERVER_CORE, log, optimization, code=code)
            )
        raw_rows: list[float] = []  # the raw batch-16 forward's rows/s, before and after
        if args.raw_forward:
            seconds16 = raw_forward(model_dir / "model.pt", args.model, int8, [16])["16"]
            raw_rows.append(16 / seconds16)
        for server in running.values():  # connections made, first batches run
            for path in args.paths:
                one_run(server, args.model, x, path, clients=max(args.concurrency), seconds=1.0)
        for round_number in range(args.rounds):
            order = list(running) if round_number % 2 == 0 else list(reversed(running))
            for path in args.paths:
                for clients in args.concurrency:
                    for name in order:
                        run = one_run(
                            running[name], args.model, x, path, clients=clients,
                            seconds=args.seconds,
                        )  # fmt: skip
                        results.setdefault((name, path, clients), []).append(run)
                        print(
                            f"round {round_number + 1} {name:10} {path:21} c={clients:<3} "
                            f"{run['throughput']:8.1f} req/s p50 {run['p50_ms']:7.3f} ms "
                            f"server {run['server_us']:6.0f} us/req batch {run['batch']:5.2f} "
                            f"({run['compute_ms']:.2f} ms) "
                            f"client {run['client_cpu']:.2f} steal {run['steal']:.0%} "
                            f"load {run['load']:.1f} errors {run['errors']:.0f}",
                            flush=True,
                        )
        if args.raw_forward:
            seconds16 = raw_forward(model_dir / "model.pt", args.model, int8, [16])["16"]
            raw_rows.append(16 / seconds16)
    if raw_rows:
        raw16 = statistics.mean(raw_rows)
        print(
            f"\nraw batch-16 forward (before, after): {raw_rows[0]:.1f}, {raw_rows[1]:.1f} rows/s"
        )
        for (name, path, clients), runs in results.items():
            shares = ", ".join(f"{r['throughput'] / raw16:.3f}" for r in runs)
            print(f"{name} {path} c={clients}: x raw forward per round {shares}")
    print("\nmedians over the rounds:")
    print(
        "| variant | path | clients | req/s | p50 ms | server µs/req | batch | batch ms | steal |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, path, clients), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {name} | {path} | {clients} | {med['throughput']:.0f} | {med['p50_ms']:.3f} | "
            f"{med['server_us']:.0f} | {med['batch']:.2f} | {med['compute_ms']:.2f} | "
            f"{med['steal']:.0%} |"
        )
    base = variants[0][0]
    print(f"\nthroughput over {base}'s in the same round (rounds won, geometric mean, each round):")
    for name, path, clients, ratios, mean in paired_ratios(results, base):
        won = sum(r > 1 for r in ratios)
        each = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"{name} {path} c={clients}: {won}/{len(ratios)} won, {mean:.3f}x ({each})")


if __name__ == "__main__":
    main()

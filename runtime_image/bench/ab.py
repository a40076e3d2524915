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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import loadgen, proc, servers
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
        "p99_ms": result.p99_ms,
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


@dataclass(frozen=True)
class Variant:
    """One side of an A/B: a directory holding a ``kiln_runtime`` package, and config sections
    added to the model's (``{"tracing": {...}}``: the same code, configured otherwise)."""

    name: str
    code: Path
    sections: dict[str, Any] = field(default_factory=dict)


Results = dict[tuple[str, str, int], list[dict[str, float]]]


def run_rounds(
    variants: list[Variant],
    *,
    model: str,
    paths: list[str],
    concurrency: list[int],
    rounds: int,
    seconds: float,
    precision: str = "fp32",
    minimal_config: bool = False,
    raw_forward_rows: list[float] | None = None,
) -> Results:
    """Every variant's server up for the whole session on the server core; the load goes to one
    at a time, round by round, in an order reversed every round. ``raw_forward_rows``, when
    given, gets the raw batch-16 forward's rows/s before and after the rounds."""
    int8 = precision == "int8"
    optimization = {"precision": precision} if int8 else {}
    x = example_input(model, 1).numpy()
    results: Results = {}
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        model_dir = Path(scratch) / model
        write_example(model, model_dir)
        if minimal_config:
            config = json.loads((model_dir / "config.json").read_text())
            kept = {k: v for k, v in config.items() if k in MINIMAL_SECTIONS}
            (model_dir / "config.json").write_text(json.dumps(kept))
        running: dict[str, servers.Server] = {}
        for variant in variants:
            print(
                f"{variant.name}: {variant.code}, {servers.build_of(variant.code)} build"
                + (f", {json.dumps(variant.sections)}" if variant.sections else ""),
                flush=True,
            )
            log = Path(scratch) / f"{len(running)}.log"
            running[variant.name] = stack.enter_context(
                servers.kiln(
                    model_dir, model, SERVER_CORE, log, optimization, code=variant.code,
                    sections=variant.sections,
                )
            )  # fmt: skip
        if raw_forward_rows is not None:
            seconds16 = raw_forward(model_dir / "model.pt", model, int8, [16])["16"]
            raw_forward_rows.append(16 / seconds16)
        for server in running.values():  # connections made, first batches run
            for path in paths:
                one_run(server, model, x, path, clients=max(concurrency), seconds=1.0)
        for round_number in range(rounds):
            order = list(running) if round_number % 2 == 0 else list(reversed(running))
            for path in paths:
                for clients in concurrency:
                    for name in order:
                        run = one_run(
                            running[name], model, x, path, clients=clients, seconds=seconds
                        )
                        results.setdefault((name, path, clients), []).append(run)
                        print(
                            f"round {round_number + 1} {name:10} {path:21} c={clients:<3} "
                            f"{run['throughput']:8.1f} req/s p50 {run['p50_ms']:7.3f} ms "
                            f"p99 {run['p99_ms']:7.3f} ms "
                            f"server {run['server_us']:6.0f} us/req batch {run['batch']:5.2f} "
                            f"({run['compute_ms']:.2f} ms) "
                            f"client {run['client_cpu']:.2f} steal {run['steal']:.0%} "
                            f"load {run['load']:.1f} errors {run['errors']:.0f}",
                            flush=True,
                        )
        if raw_forward_rows is not None:
            seconds16 = raw_forward(model_dir / "model.pt", model, int8, [16])["16"]
            raw_forward_rows.append(16 / seconds16)
    return results


def medians(results: Results) -> dict[tuple[str, str, int], dict[str, float]]:
    """Per variant, path and concurrency: the median of each figure over the rounds."""
    return {
        key: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for key, runs in results.items()
    }


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
    proc.match_autogroup(os.getpid())
    variants = [Variant(n, Path(d).resolve()) for n, d in (v.split("=", 1) for v in args.variant)]
    os.sched_setaffinity(0, {CLIENT_CORE})
    raw_rows: list[float] = []
    results = run_rounds(
        variants, model=args.model, paths=args.paths, concurrency=args.concurrency,
        rounds=args.rounds, seconds=args.seconds, precision=args.precision,
        minimal_config=args.minimal_config,
        raw_forward_rows=raw_rows if args.raw_forward else None,
    )  # fmt: skip
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
        "| variant | path | clients | req/s | p50 ms | p99 ms | server µs/req | batch | batch ms "
        "| steal |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, path, clients), med in medians(results).items():
        print(
            f"| {name} | {path} | {clients} | {med['throughput']:.0f} | {med['p50_ms']:.3f} | "
            f"{med['p99_ms']:.3f} | {med['server_us']:.0f} | {med['batch']:.2f} | "
            f"{med['compute_ms']:.2f} | {med['steal']:.0%} |"
        )
    base = variants[0].name
    print(f"\nthroughput over {base}'s in the same round (rounds won, geometric mean, each round):")
    for name, path, clients, ratios, mean in paired_ratios(results, base):
        won = sum(r > 1 for r in ratios)
        each = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"{name} {path} c={clients}: {won}/{len(ratios)} won, {mean:.3f}x ({each})")


if __name__ == "__main__":
    main()

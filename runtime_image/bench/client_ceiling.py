"""How fast each Python client can go at all, beside Triton and Kiln in the same run.

The benchmark's targets through ``tritonclient`` are ratios to Triton, but on the benchmark
host the client has one core and spends hundreds of µs of it per call. A server that answers
in no time (``bench.constant_server``) shows the most any server can reach through a client:
its **ceiling**. Dividing it by Triton's throughput on the same path, in the same round, gives
the most a server could show against Triton through that client on this host; a target above
that cannot be met by any server here, and Kiln over its ceiling says how much of what the
client allows Kiln takes.

The MLP's servers (Kiln and Triton, fp32 and INT8, as ``bench.run`` serves them) and the
constant server are all up together on the server core; each round runs every path at every
concurrency against each of them in turn (``run.measure_interleaved``: the order reversed at
every turn), and the page gives medians over the rounds, ratios paired round by round.

    cd runtime_image && python -m bench.client_ceiling --triton-python PY \\
        --out ../docs/benchmarks [--rounds 3] [--seconds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import servers
from bench.report import PATH_NAMES, SATURATED_CLIENT, USER_PATH_FLOORS
from bench.run import CLIENT_CORE, SERVER_CORE, measure_interleaved, start_servers
from kiln_runtime.examples import example_input, write_example

CEILING = "constant"
PYTHON_CLIENTS = ("tritonclient-http", "tritonclient-grpc", "tritonclient-grpc-aio")
PRECISIONS = ("fp32", "int8")


def _rows(results: dict[str, Any], label: str, path: str, clients: int) -> list[dict[str, Any]]:
    """The rows of one server on one path and concurrency, one per round, in round order."""
    return [
        row
        for round_rows in results["rounds"]
        for row in round_rows.get(label, [])
        if row["path"] == path and row["concurrency"] == clients
    ]


def median_throughput(results: dict[str, Any], label: str, path: str, clients: int) -> float:
    rows = _rows(results, label, path, clients)
    return statistics.median(row["throughput"] for row in rows) if rows else 0.0


def paired_ratio(
    results: dict[str, Any], label: str, over: str, path: str, clients: int
) -> float | None:
    """The median over the rounds of ``label``'s throughput over ``over``'s in the same round."""
    pairs = zip(
        _rows(results, label, path, clients), _rows(results, over, path, clients), strict=True
    )
    ratios = [a["throughput"] / b["throughput"] for a, b in pairs if b["throughput"] > 0]
    return statistics.median(ratios) if ratios else None


def client_us_per_call(results: dict[str, Any], label: str, path: str, clients: int) -> float:
    """The client's own CPU per call (µs), median over the rounds."""
    rows = [row for row in _rows(results, label, path, clients) if row["throughput"] > 0]
    if not rows:
        return 0.0
    per_call = [float(row["client_cpu"]) / float(row["throughput"]) * 1e6 for row in rows]
    return statistics.median(per_call)


def client_most(results: dict[str, Any], path: str, clients: int) -> tuple[float, str]:
    """The most calls/s the client made on ``path`` against any server (median over the
    rounds), and which server that was: its ceiling, unless a real server beat it."""
    labels = list(results["rounds"][0]) if results["rounds"] else [CEILING]
    return max((median_throughput(results, label, path, clients), label) for label in labels)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render(results: dict[str, Any]) -> str:
    """The page: the ceilings and the servers per path, then what each target needs."""
    host = results["host"]
    lines = [
        "# The Python clients' ceilings (`make bench-client-ceiling`)",
        "",
        f"Host: {host['cpus']} CPUs ({host['machine']}), Python {host['python']}, kiln_runtime "
        f"{host['runtime_build']}. Server core {SERVER_CORE}, client core {CLIENT_CORE}. "
        f"{results['rounds_run']} rounds of {results['seconds_per_run']:.0f} s runs; in each "
        "round every server gets one run of each path in turn (the order reversed at every "
        "turn). `constant` answers every call with the same stored answer (no model: "
        "`bench/constant_server.py`); what a client reaches against it is its ceiling on this "
        "host. Throughput is the median over the rounds; a ratio is the median of the ratios "
        "paired round by round.",
        "",
        "| path | clients | constant (ceiling) | its client µs/call | triton fp32 | kiln fp32 "
        "| triton int8 | kiln int8 | ceiling / triton fp32, int8 | kiln / triton fp32, int8 "
        "| kiln / ceiling fp32, int8 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in results["paths"]:
        for clients in results["concurrency"]:
            ceiling = median_throughput(results, CEILING, path, clients)
            saturated = [
                row["client_cpu"] >= SATURATED_CLIENT
                for row in _rows(results, CEILING, path, clients)
            ]
            mark = "" if all(saturated) else " (client not saturated)"
            cells = [
                PATH_NAMES[path], str(clients), f"{ceiling:.0f}{mark}",
                f"{client_us_per_call(results, CEILING, path, clients):.0f}",
            ]  # fmt: skip
            for precision in PRECISIONS:
                for server in ("triton", "kiln"):
                    label = f"{server} ({precision})"
                    cells.append(f"{median_throughput(results, label, path, clients):.0f}")
            for label, over in (
                (CEILING, "triton"), ("kiln", "triton"), ("kiln", CEILING),
            ):  # fmt: skip
                pair = []
                for precision in PRECISIONS:
                    mine = label if label == CEILING else f"{label} ({precision})"
                    theirs = over if over == CEILING else f"{over} ({precision})"
                    pair.append(_x(paired_ratio(results, mine, theirs, path, clients)))
                cells.append(", ".join(pair))
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## What the targets at 16 clients need", ""]
    lines += [
        "| target | needs | the most this client did in the run | reachable through this "
        "client here |",
        "|---|---|---|---|",
    ]
    for path in results["paths"]:
        floor = USER_PATH_FLOORS.get(path)
        if floor is None or 16 not in results["concurrency"]:
            continue
        most, by = client_most(results, path, 16)
        for precision in PRECISIONS:
            triton = median_throughput(results, f"triton ({precision})", path, 16)
            needed = floor * triton
            share = needed / most if most else float("inf")
            verdict = f"yes, at {share:.0%} of it" if share <= 1 else f"**no**: {share:.2f}x of it"
            lines.append(
                f"| {PATH_NAMES[path]} {precision}: >= {floor:.0f}x Triton "
                f"| {needed:.0f} calls/s ({floor:.0f} x {triton:.0f}) | {most:.0f} calls/s "
                f"({by}) | {verdict} |"
            )
    lines += [
        "",
        "The most a client did is its ceiling, or a server's throughput through it where one "
        "came out above the ceiling: the constant server answers each call the moment it "
        "arrives, and a server that answers in batches can let a client do a little more per "
        "wake-up (16 threads contend less for the interpreter). A target beyond what the "
        "client did against every server, the one that costs nothing included, is a limit of "
        "one client core, not of a server: any server measured this way would miss it.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--triton-python", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=5.0, help="each closed-loop run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--paths", nargs="+", choices=PYTHON_CLIENTS, default=list(PYTHON_CLIENTS))
    parser.add_argument(
        "--max-requests", type=int, default=500_000,
        help="bound on the requests of one run, beside its seconds",
    )  # fmt: skip
    args = parser.parse_args()
    servers.exit_on_sigterm()
    started = time.monotonic()
    os.sched_setaffinity(0, {CLIENT_CORE})
    results: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version(),
                 "runtime_build": servers.build_of(servers.BENCH_DIR.parent)},
        "seconds_per_run": args.seconds, "rounds_run": args.rounds, "paths": args.paths,
        "concurrency": args.concurrency, "rounds": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        model_dir = Path(scratch) / "mlp"
        write_example("mlp", model_dir)
        x = example_input("mlp", 1).numpy()
        logs = Path(scratch)
        running = {CEILING: stack.enter_context(servers.constant("mlp", SERVER_CORE, logs / "c"))}
        running |= start_servers(
            stack, "mlp", model_dir, x=x, logs=logs, triton_python=args.triton_python
        )
        for round_number in range(args.rounds):
            print(f"round {round_number + 1}", flush=True)
            rows, _host = measure_interleaved(
                running, "mlp", x, paths=args.paths, concurrency=args.concurrency,
                seconds=args.seconds, max_requests=args.max_requests,
            )  # fmt: skip
            results["rounds"].append(rows)
    results["wall_seconds"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "client-ceiling.json").write_text(json.dumps(results, indent=1))
    (args.out / "client-ceiling.md").write_text(render(results))
    print(f"wrote {args.out / 'client-ceiling.md'}")


if __name__ == "__main__":
    main()

"""Tracing's cost through real servers: the runtime from before tracing existed, today's with
tracing off, and today's exporting 1 % of requests to a real Jaeger, A/B in one run
(`make bench-runtime`'s last step; its section of docs/benchmarks/runtime.md).

Why it exists: issue 44's targets are throughput shares measured as users load the runtime
(off ≤ 1 % below the runtime without tracing, 1 % sampling ≤ 5 % below off). `bench.tracing`
times the request path in process, where tracing's work is the largest share; this one puts it
under the sockets, HTTP/2 and batching it ships with. The three servers are up together on the
server core and take turns (`bench.ab.run_rounds`): a ratio compares runs seconds apart. Jaeger
(all-in-one, built from its Go module by e2e/gotools, shared with the trace tests through
`tests.jaeger`) runs on the client core, so what exporting costs the server is only the
server's own share: sampling, the spans and the OTLP exporter's thread.

The old runtime is taken from git (``BEFORE``, the parent of the commit that added tracing) and
compiled by mypyc as the working tree is (`make native`). Every server gets the config sections
that runtime knows (``bench.ab.MINIMAL_SECTIONS``) and the traced one its ``tracing`` section.

    cd runtime_image && python -m bench.tracing_ab --out ../docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import ab, proc, servers
from bench.report import write_report
from bench.run import CLIENT_CORE

REPO = servers.BENCH_DIR.parents[1]
BEFORE = "cfb8498^"
"""The runtime before per-request tracing (cfb8498 added it)."""
SAMPLING = 0.01
PATHS = ["h2load", "tritonclient-grpc"]
CLIENTS = 16


def runtime_before(scratch: Path) -> Path:
    """``BEFORE``'s runtime_image, compiled in place as `make native` compiles the working
    tree's (its setup.py), so the A/B compares like with like."""
    subprocess.run(
        f"git -C {REPO} archive {BEFORE} runtime_image | tar -x -C {scratch}",
        shell=True, check=True, timeout=120,
    )  # fmt: skip
    code = scratch / "runtime_image"
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=code, env={**os.environ, "KILN_RUNTIME_COMPILE": "1"}, check=True,
        capture_output=True, timeout=1800,
    )  # fmt: skip
    return code


def measure(rounds: int, seconds: float) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))  # tests.jaeger: the trace backend the tests use
    from tests.jaeger import running_jaeger

    os.sched_setaffinity(0, {CLIENT_CORE})  # Jaeger and the compile inherit the client core
    with (
        tempfile.TemporaryDirectory() as scratch,
        running_jaeger("127.0.0.1", Path(scratch)) as (
            endpoint,
            _query,
        ),
    ):
        print(f"compiling the runtime at {BEFORE}", flush=True)
        before = runtime_before(Path(scratch))
        today = servers.BENCH_DIR.parent
        tracing = {"tracing": {"otlpEndpoint": endpoint, "samplingRatio": SAMPLING}}
        variants = [
            ab.Variant("before tracing", before),
            ab.Variant("off", today),
            ab.Variant("on 1 %", today, tracing),
        ]
        results = ab.run_rounds(
            variants, model="mlp", paths=PATHS, concurrency=[CLIENTS], rounds=rounds,
            seconds=seconds, minimal_config=True,
        )  # fmt: skip
    return summarize(results, rounds, seconds)


def summarize(results: ab.Results, rounds: int, seconds: float) -> dict[str, Any]:
    """Medians per variant and path, and the paired throughput ratios the targets read."""
    rows = [
        {"variant": name, "path": path, **med}
        for (name, path, _clients), med in ab.medians(results).items()
    ]
    ratios = []
    for name, base in (("off", "before tracing"), ("on 1 %", "off")):
        for path in PATHS:
            pairs = [
                run["throughput"] / ref["throughput"]
                for run, ref in zip(
                    results[(name, path, CLIENTS)], results[(base, path, CLIENTS)], strict=True
                )
                if ref["throughput"] > 0 and run["throughput"] > 0
            ]
            mean = math.exp(sum(math.log(r) for r in pairs) / len(pairs)) if pairs else 0.0
            ratios.append({"variant": name, "base": base, "path": path, "rounds": pairs,
                           "geometric_mean": mean})  # fmt: skip
    return {
        "before": BEFORE, "sampling": SAMPLING, "clients": CLIENTS, "rounds": rounds,
        "seconds": seconds, "rows": rows, "ratios": ratios,
        "load_average": os.getloadavg()[0],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    servers.exit_on_sigterm()
    proc.match_autogroup(os.getpid())
    summary = measure(args.rounds, args.seconds)
    data_file = args.out / "runtime.json"
    results = json.loads(data_file.read_text())
    results["tracing_ab"] = summary
    data_file.write_text(json.dumps(results, indent=1))
    write_report(results, args.out / "runtime.md")
    print(json.dumps(summary["ratios"], indent=1))
    print(f"wrote {args.out / 'runtime.md'}")


if __name__ == "__main__":
    main()

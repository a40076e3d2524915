"""Today's runtime against its own history, through real servers, A/B in one run
(`make bench-runtime`'s last step; its section of docs/benchmarks/runtime.md).

Why it exists: two issues set targets on what a change costs as users load the runtime. Issue
39's limits (bounded ports, off-loop decoding, container-derived budgets) must cost no
throughput beyond the run-to-run noise, against the runtime from before them; issue 44's
tracing must cost at most 1 % when off (the commit that added it against its parent), and at
most 5 % more at 1 % sampling. `bench.tracing` times the request path in process, where
tracing's work is the largest share; this puts every change under the sockets, HTTP/2 and
batching it ships with.

The servers are up together on the server core and take turns (`bench.ab.run_rounds`): a ratio
pairs runs of one round, seconds apart. Jaeger (all-in-one, built from its Go module by
e2e/gotools, shared with the trace tests through `tests.jaeger`) runs on the client core, so
what exporting costs the server is only the server's own share: sampling, the spans and the
OTLP exporter's thread. The old runtimes are taken from git (``HISTORY``) and compiled by mypyc
as the working tree is (`make native`); every server gets the config sections the oldest knows
(``bench.ab.MINIMAL_SECTIONS``) and the traced one its ``tracing`` section.

    cd runtime_image && python -m bench.history_ab --out ../docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import ab, proc, servers
from bench.report import write_report
from bench.run import CLIENT_CORE

REPO = servers.BENCH_DIR.parents[1]
HISTORY = {
    "before issue 39": "08ce3f2^",  # 08ce3f2 began the runtime's limits (issue 39)
    "before tracing": "cfb8498^",  # cfb8498 added per-request tracing (issue 44)
    "tracing added, off": "cfb8498",
}
OFF, TRACED = "today, tracing off", "today, 1 % traced"
COMPARED = (  # (variant, against it, the target its ratio is held to, if any)
    (OFF, "before issue 39", "no loss beyond the noise"),  # issue 39
    ("tracing added, off", "before tracing", "off"),  # issue 44: what tracing's code costs off
    (OFF, "before tracing", None),  # everything since, shown
    (TRACED, OFF, "sampled"),  # issue 44: what 1 % sampling costs
)
SAMPLING = 0.01
PATHS = ["h2load", "tritonclient-grpc"]
CLIENTS = 16
T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t, two-sided 95 %, for 1 to 10 degrees of freedom (more use the last)."""


def runtime_at(revision: str, scratch: Path) -> Path:
    """``revision``'s runtime_image, compiled in place as `make native` compiles the working
    tree's (its setup.py), so the A/B compares like with like."""
    scratch.mkdir()
    subprocess.run(
        f"git -C {REPO} archive {revision} runtime_image | tar -x -C {scratch}",
        shell=True, check=True, timeout=120,
    )  # fmt: skip
    code = scratch / "runtime_image"
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=code, env={**os.environ, "KILN_RUNTIME_COMPILE": "1"}, check=True,
        capture_output=True, timeout=1800,
    )  # fmt: skip
    return code


def measure(rounds: int, seconds: float, *, today_only: bool = False) -> dict[str, Any]:
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
        variants = []
        for number, (name, revision) in enumerate({} if today_only else HISTORY.items()):
            print(f"compiling the runtime at {revision} ({name})", flush=True)
            variants.append(ab.Variant(name, runtime_at(revision, Path(scratch) / str(number))))
        today = servers.BENCH_DIR.parent
        tracing = {"tracing": {"otlpEndpoint": endpoint, "samplingRatio": SAMPLING}}
        variants += [ab.Variant(OFF, today), ab.Variant(TRACED, today, tracing)]
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
    for name, base, target in COMPARED:
        if (name, PATHS[0], CLIENTS) not in results or (base, PATHS[0], CLIENTS) not in results:
            continue  # a run of today's variants only
        for path in PATHS:
            pairs = [
                run["throughput"] / ref["throughput"]
                for run, ref in zip(
                    results[(name, path, CLIENTS)], results[(base, path, CLIENTS)], strict=True
                )
                if ref["throughput"] > 0 and run["throughput"] > 0
            ]
            low, mean, high = ratio_interval(pairs)
            ratios.append({"variant": name, "base": base, "path": path, "rounds": pairs,
                           "geometric_mean": mean, "interval_95": [low, high],
                           "target": target})  # fmt: skip
    return {
        "history": HISTORY, "sampling": SAMPLING, "clients": CLIENTS, "rounds": rounds,
        "seconds": seconds, "rows": rows, "ratios": ratios,
        "load_average": os.getloadavg()[0],
    }  # fmt: skip


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """(low, geometric mean, high): the 95 % confidence interval of the mean paired ratio, from
    Student's t on the ratios' logarithms (the rounds' ratios vary by the host's noise; a loss
    beyond that noise is one whose whole interval lies below 1)."""
    if not ratios:
        return 0.0, 0.0, 0.0
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    half = T_95[min(len(logs) - 1, len(T_95)) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean), math.exp(mean + half)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the page's directory (runtime.json there)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--today-only", action="store_true",
        help="only today's runtime, tracing off and 1 %% traced (no old runtime compiled): "
        "more rounds in the same time; prints the ratios, writes no page",
    )  # fmt: skip
    args = parser.parse_args()
    if args.out is None and not args.today_only:
        parser.error("--out is required unless --today-only")
    servers.exit_on_sigterm()
    proc.match_autogroup(os.getpid())
    summary = measure(args.rounds, args.seconds, today_only=args.today_only)
    if args.today_only:
        print(json.dumps({"rows": summary["rows"], "ratios": summary["ratios"]}, indent=1))
        return
    assert args.out is not None
    data_file = args.out / "runtime.json"
    results = json.loads(data_file.read_text())
    results["history_ab"] = summary
    data_file.write_text(json.dumps(results, indent=1))
    write_report(results, args.out / "runtime.md")
    print(json.dumps(summary["ratios"], indent=1))
    print(f"wrote {args.out / 'runtime.md'}")


if __name__ == "__main__":
    main()

"""`make bench-warmup-memory`: the operator's peak RSS while several services with large inputs
warm up at once, with the warm-up byte budget and without it.

Several warm-up attempts (one per "service") run at once in one process, as in the operator,
through the operator's own probe (tritonclient, gRPC) against a real kiln_runtime on loopback
serving a model with a large FP32 input. Each run is a fresh process, so its VmHWM is the peak
of that run alone: once with the default budget, once unbounded (the operator before the
budget). The section it writes is appended to docs/benchmarks/operator.md between markers of its
own; the rest of that page belongs to `make bench-operator`, which keeps the section
(tests/integration/benchpage.py).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kiln_operator.api.validation import DEFAULT_WARMUP_BUDGET_BYTES
from tests.integration.benchpage import write_section
from tests.integration.runtime.runtime_process import HOST, running

BEGIN = "<!-- bench-warmup-memory: begin -->"
END = "<!-- bench-warmup-memory: end -->"
MAX_SECONDS = 300
"""Every run is bounded in time: a run that takes longer fails the benchmark."""

CHILD = """
import asyncio, json, sys
from pathlib import Path
from kiln_operator.warmup import plan as warmup
from kiln_operator.warmup.budget import ByteBudget
from kiln_operator.warmup.probe import run_attempt

def rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)

host = sys.argv[8]
side, services, requests, concurrency, budget_bytes, grpc_port, http_port = map(
    int, sys.argv[1:8])
plan = warmup.WarmupPlan(
    model_name="big", inputs=(warmup.TensorPlan("INPUT__0", "FP32", (1, side, side)),),
    outputs=("OUTPUT__0",), requests=requests, concurrency=concurrency, p99_bound_ms=60_000.0,
    attempt_timeout_s=240.0, retries=0, input_bytes=side * side * 4, output_bytes=4)
budget = ByteBudget(budget_bytes) if budget_bytes else None
baseline = rss_kib("VmRSS")

async def main():
    return await asyncio.gather(*(
        run_attempt(plan, host, grpc_port, http_port, budget) for _ in range(services)))

results = asyncio.run(main())
print(json.dumps({
    "baseline_mib": baseline / 1024, "peak_mib": rss_kib("VmHWM") / 1024,
    "passed": sum(1 for r in results if warmup.judge(plan, r).passed),
    "errors": sum(r.errors for r in results),
    "first_error": next((r.first_error for r in results if r.first_error), ""),
    "peak_held_mib": (budget.peak_held / 2**20) if budget else None,
    "in_flight": plan.in_flight_within(budget_bytes) if budget_bytes else concurrency,
}))
"""


def write_model(directory: Path, side: int) -> Path:
    """A TorchScript model taking [batch, side, side] FP32 and returning its mean, [batch, 1]."""
    import torch

    class Mean(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=(1, 2)).unsqueeze(1)

    path = directory / "model.pt"
    torch.jit.save(torch.jit.script(Mean()), str(path))
    config = {
        "model": {
            "name": "big",
            "version": "1",
            "format": "torchscript",
            "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [side, side]}],
            "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [1]}],
        },
        "batching": {"maxBatchSize": 1, "maxQueueDelayMicroseconds": 100, "maxQueueSize": 64},
        "warmup": {"batchSizes": [1]},
    }
    (directory / "config.json").write_text(json.dumps(config))
    return path


def run(args: argparse.Namespace, budget_bytes: int, grpc_port: int, http_port: int) -> Any:
    command = [
        sys.executable, "-c", CHILD, str(args.side), str(args.services), str(args.requests),
        str(args.concurrency), str(budget_bytes), str(grpc_port), str(http_port), HOST,
    ]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=MAX_SECONDS)
    if done.returncode != 0:
        raise RuntimeError(f"the warm-up run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, runs: dict[str, Any]) -> str:
    input_mib = args.side * args.side * 4 / 2**20
    lines = [
        BEGIN,
        "## Warm-up memory: the byte budget",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d} by `make bench-warmup-memory` "
        "(`tests/integration/warmup/bench_warmup_memory.py`): "
        f"{args.services} services warming up at once in one process, through the operator's "
        f"own probe (tritonclient, gRPC) against a real kiln_runtime on loopback; each sends "
        f"{args.requests} requests at `concurrency: {args.concurrency}` with one "
        f"`[{args.side}, {args.side}]` FP32 input ({input_mib:.0f} MiB per request). Peak RSS is "
        "the process's VmHWM; the baseline is its RSS after start-up (Python, tritonclient, "
        "numpy).",
        "",
        "| budget | requests in flight per attempt | peak held of the budget | baseline RSS | "
        "peak RSS | peak above baseline | attempts passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, result in runs.items():
        held = result["peak_held_mib"]
        lines.append(
            f"| {label} | {result['in_flight']} | "
            f"{'—' if held is None else f'{held:.0f} MiB'} | {result['baseline_mib']:.0f} MiB | "
            f"{result['peak_mib']:.0f} MiB | {result['peak_mib'] - result['baseline_mib']:.0f} MiB "
            f"| {result['passed']} of {args.services} |"
        )
    lines += [
        "",
        f"The default budget is {DEFAULT_WARMUP_BUDGET_BYTES // 2**20} MiB "
        "(`KILN_WARMUP_BUDGET_BYTES`); the operator's memory limit is 512 Mi. With the budget the "
        "attempts take turns and each runs at the concurrency that fits, so the peak follows the "
        "budget, not the number of services or the spec's concurrency; unbounded, it grows with "
        "both. What the budget counts is the tensor data (`docs/warmup.md`): allocator and "
        "library overhead above it show as the difference between the peak held and the peak "
        "RSS above the baseline.",
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--side", type=int, default=2048)
    parser.add_argument("--services", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/operator.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-warmup-") as scratch:
        model_dir = Path(scratch) / "model"
        model_dir.mkdir()
        write_model(model_dir, args.side)
        with running(model_dir, Path(scratch), name="big") as runtime:
            runs = {
                f"{DEFAULT_WARMUP_BUDGET_BYTES // 2**20} MiB (default)": run(
                    args, DEFAULT_WARMUP_BUDGET_BYTES, runtime.grpc_port, runtime.http_port
                ),
                "none (before this change)": run(args, 0, runtime.grpc_port, runtime.http_port),
            }
    section = report(args, runs)
    write_section(args.out, BEGIN, END, section)
    (args.out.parent / "warmup-memory.json").write_text(json.dumps(runs, indent=2) + "\n")
    print(section)


if __name__ == "__main__":
    main()

"""The limit: the model's forward pass in-process, no server, at the batch sizes served.

Run pinned to the server's core with one compute thread; prints JSON
``{"<batch>": seconds_per_batch, ...}`` for the program and precision the server uses.

    python -m bench.raw_forward --model DIR/model.pt --kind mlp [--int8] --batches 1 16 32
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench import int8
from kiln_runtime.examples import example_input


def seconds_per_batch(module: torch.jit.ScriptModule, x: torch.Tensor, budget: float) -> float:
    with torch.inference_mode():
        for _ in range(5):
            module(x)
        runs = 0
        started = time.perf_counter()
        while time.perf_counter() - started < budget:
            module(x)
            runs += 1
        return (time.perf_counter() - started) / runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    module = int8.load(args.model, args.int8)
    result = {
        str(rows): seconds_per_batch(module, example_input(args.kind, rows), args.seconds)
        for rows in args.batches
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

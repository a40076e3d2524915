"""Plot throughput and latency from runtime.json (run with the benchmark venv: matplotlib).

Only the ceilings (wrk, h2load): with every path the plot would be unreadable; the report's
tables carry the paths users take.

python -m bench.plot docs/benchmarks/runtime.json docs/benchmarks/runtime.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source: Path, target: Path) -> None:
    results = json.loads(source.read_text())
    models = list(results["models"])
    figure, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for column, model in enumerate(models):
        servers = results["models"][model]["servers"]
        for label, rows in servers.items():
            for protocol, path, style in (("http", "wrk", "-o"), ("grpc", "h2load", "--s")):
                points = [
                    r for r in rows
                    if r.get("protocol") == protocol and r.get("path", path) == path
                ]  # fmt: skip
                if not points:  # a run of other paths (``--paths``)
                    continue
                clients = [r["concurrency"] for r in points]
                axes[0][column].plot(
                    clients, [r["throughput"] for r in points], style, label=f"{label} {protocol}"
                )
                axes[1][column].plot(
                    clients, [r["p99_ms"] for r in points], style, label=f"{label} {protocol}"
                )
        raw = results["models"][model]["raw_forward_seconds"]["fp32"]
        axes[0][column].axhline(
            16 / raw["16"], color="grey", linestyle=":", label="raw fp32 forward, batch 16"
        )
        axes[0][column].set_title(f"{model}: throughput (req/s)")
        axes[1][column].set_title(f"{model}: p99 latency (ms)")
        for row in (0, 1):
            if not axes[row][column].lines:
                continue
            axes[row][column].set_xscale("log", base=2)
            axes[row][column].set_yscale("log")
            axes[row][column].set_xlabel("concurrent clients")
            axes[row][column].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(target, dpi=100)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

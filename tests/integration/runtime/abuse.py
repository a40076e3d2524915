"""Measure a runtime under attack: a well-behaved probe client's latency and the process's RSS.

A ``Watch`` runs, for the length of a ``with`` block, a probe thread that sends one small MLP
inference every 10 ms on its own keep-alive connection (reconnecting if dropped), a sampler
that reads the runtime's resident memory every 20 ms, and the kubelet's readiness probe (a new
connection every 100 ms: ``ReadinessProbe``). Both stop with the block; their results
are the numbers the abuse table in docs/benchmarks/runtime.md reports.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .runtime_process import HOST, Runtime

PROBE_BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "INPUT__0",
                "datatype": "FP32",
                "shape": [1, 512],
                "data": np.zeros(512).tolist(),
            }
        ]
    }
).encode()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class ReadinessProbe:
    """The kubelet's readiness probe, as it probes: ``GET /v2/health/ready`` on a new
    connection every 100 ms (1 s timeout), for the length of a ``with`` block. Its p99 and
    maximum are the abuse page's readiness columns; a non-200 answer or no answer within the
    timeout is a failure (a kubelet would count it against the pod)."""

    def __init__(self, runtime: Runtime, every: float = 0.1, timeout: float = 1.0) -> None:
        self.runtime = runtime
        self.every, self.timeout = every, timeout
        self.latencies: list[float] = []  # seconds
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadinessProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.every) and len(self.latencies) < 10_000:
            started = time.perf_counter()
            connection = http.client.HTTPConnection(HOST, self.runtime.http_port, self.timeout)
            try:
                connection.request("GET", "/v2/health/ready")
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    self.failures.append(f"status {response.status}")
            except (OSError, http.client.HTTPException) as error:
                self.failures.append(repr(error))
            finally:
                connection.close()
            self.latencies.append(time.perf_counter() - started)

    def row(self) -> dict[str, float | int]:
        """The readiness columns of an abuse row (milliseconds)."""
        ms = np.array(self.latencies or [float("nan")]) * 1e3
        return {
            "ready_p99_ms": round(float(np.percentile(ms, 99)), 1),
            "ready_max_ms": round(float(ms.max()), 1),
            "ready_probes": len(self.latencies),
            "ready_failures": len(self.failures),
        }


@dataclass
class Watch:
    runtime: Runtime
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    peak_rss: int = 0
    start_rss: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Watch:
        self.readiness = ReadinessProbe(self.runtime).__enter__()
        self.start_rss = self.peak_rss = rss_bytes(self.runtime.process.pid)
        # connected and answered before the attack starts: a client already being served
        connection = http.client.HTTPConnection(HOST, self.runtime.http_port, timeout=5)
        connection.request("POST", "/v2/models/mlp/infer", body=PROBE_BODY)
        connection.getresponse().read()
        self._threads = [
            threading.Thread(target=self._probe, args=(connection,), daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        self.readiness.__exit__()

    def _probe(self, connection: http.client.HTTPConnection) -> None:
        while not self._stop.wait(0.01):
            started = time.perf_counter()
            try:
                connection.request("POST", "/v2/models/mlp/infer", body=PROBE_BODY)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    self.failures.append(f"status {response.status}")
            except (OSError, http.client.HTTPException) as error:
                self.failures.append(repr(error))
                connection.close()
                connection = http.client.HTTPConnection(HOST, self.runtime.http_port, timeout=5)
                continue
            self.latencies.append(time.perf_counter() - started)
        connection.close()

    def _sample(self) -> None:
        pid = self.runtime.process.pid
        while not self._stop.wait(0.02):
            self.peak_rss = max(self.peak_rss, rss_bytes(pid))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.latencies, 99) * 1e3) if self.latencies else float("inf")

    def report(self, attack: str, result: str) -> None:
        """Print the attack's row; with ``KILN_ABUSE_OUT`` set, also append it (JSON lines)
        there, for the benchmark report (``bench.run --abuse``)."""
        row = {
            "attack": attack,
            "result": result,
            "start_rss_mib": round(self.start_rss / 2**20),
            "peak_rss_mib": round(self.peak_rss / 2**20),
            "probe_p99_ms": round(self.p99_ms, 1),
            "probes": len(self.latencies),
            "probe_failures": len(self.failures),
            **self.readiness.row(),
            "load": round(os.getloadavg()[0], 1),
        }
        print("ABUSE", json.dumps(row))
        if out := os.environ.get("KILN_ABUSE_OUT"):
            with open(out, "a") as sink:
                sink.write(json.dumps(row) + "\n")

"""Many runtime pods' metrics from one loopback process: the operator benchmark's steady load.

Why it exists: measuring the autoscaler at 1,000 services needs a real Prometheus holding live
series for every service, but not 1,000 runtime processes on two CPUs. One HTTP server renders,
at every scrape, the metrics a `kiln_runtime` pod exports (the names, labels and buckets of
docs/metrics.md) for each pod of each service, with the labels the scrape config would attach
(`namespace`, `pod`, `inferenceservice`; Prometheus keeps them with `honor_labels`). The load
is steady: each pod answers `rate` requests per second, modulated by +-3 % over two minutes
(so the grouped query sees values move inside the status bands), in batches of 4 rows taking
`2 ms + 1 ms x rows`, with a fixed latency distribution (p99 about 24 ms).
"""

import math
import threading
import time
import zlib
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.0075,
    0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""The runtime's `kiln_request_duration_seconds` and `kiln_compute_duration_seconds` buckets."""
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)
LATENCY_SHARE_AT_OR_BELOW = {0.005: 0.2, 0.0075: 0.5, 0.01: 0.8, 0.015: 0.95, 0.025: 0.995}
"""Cumulative share of requests at or below each bound (1.0 from 0.05 s on)."""
ROWS_PER_BATCH = 4
BATCH_OVERHEAD_SECONDS = 0.002
ROW_SECONDS = 0.001
MODULATION = 0.03
PERIOD_SECONDS = 120.0


def _share(bound: float) -> float:
    if bound >= 0.05:
        return 1.0
    return max((s for b, s in LATENCY_SHARE_AT_OR_BELOW.items() if b <= bound), default=0.0)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class SyntheticRuntimes:
    """Serves /metrics for `pods_per_service` pods of each service on one loopback port."""

    def __init__(
        self,
        namespace: str,
        services: Sequence[str],
        *,
        pods_per_service: int = 1,
        rate: float = 20.0,
    ) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.pods = [
            (
                f'namespace="{namespace}",inferenceservice="{service}",'
                f'pod="{service}-{index}",model="{service}"',
                2 * math.pi * ((zlib.crc32(service.encode()) + index) % 997) / 997,
            )
            for service in services
            for index in range(pods_per_service)
        ]
        self.scrapes = 0
        self.failing = threading.Event()
        """While set, every scrape is answered 503, as a pod too busy to answer in time."""
        synthetic = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if synthetic.failing.is_set():
                    self.send_error(503)
                    return
                body = synthetic.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> "SyntheticRuntimes":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def requests(self, elapsed: float, phase: float) -> float:
        """Requests answered by one pod since the start: the integral of a rate of
        `rate x (1 + MODULATION x cos(2 pi t / PERIOD + phase))`."""
        omega = 2 * math.pi / PERIOD_SECONDS
        wave = (math.sin(omega * elapsed + phase) - math.sin(phase)) / omega
        return self.rate * (elapsed + MODULATION * wave)

    def render(self) -> str:
        """One scrape of every pod, family by family as the text format wants (counters from
        the elapsed time: monotonic, as a pod's)."""
        self.scrapes += 1
        elapsed = time.monotonic() - self.started
        batch_seconds = BATCH_OVERHEAD_SECONDS + ROWS_PER_BATCH * ROW_SECONDS
        pods = []
        for labels, phase in self.pods:
            answered = math.floor(self.requests(elapsed, phase))
            batches = answered // ROWS_PER_BATCH
            pods.append((labels, answered, batches))
        lines = ["# TYPE kiln_request_duration_seconds histogram"]
        for labels, answered, _ in pods:
            http = f'{labels},protocol="http"'
            for bound in (*LATENCY_BUCKETS, math.inf):
                count = math.floor(answered * _share(bound))
                lines.append(
                    f'kiln_request_duration_seconds_bucket{{{http},le="{_le(bound)}"}} {count}'
                )
            lines.append(f"kiln_request_duration_seconds_count{{{http}}} {answered}")
            lines.append(f"kiln_request_duration_seconds_sum{{{http}}} {answered * 0.008}")
        lines.append("# TYPE kiln_requests_total counter")
        for labels, answered, _ in pods:
            lines.append(f'kiln_requests_total{{{labels},protocol="http",code="ok"}} {answered}')
            lines.append(f'kiln_requests_total{{{labels},protocol="http",code="rejected"}} 0')
        lines.append("# TYPE kiln_batch_size histogram")
        for labels, _, batches in pods:
            for size in (*BATCH_SIZE_BUCKETS, math.inf):
                count = batches if size >= ROWS_PER_BATCH else 0
                lines.append(f'kiln_batch_size_bucket{{{labels},le="{_le(size)}"}} {count}')
            lines.append(f"kiln_batch_size_count{{{labels}}} {batches}")
            lines.append(f"kiln_batch_size_sum{{{labels}}} {batches * ROWS_PER_BATCH}")
        lines.append("# TYPE kiln_compute_duration_seconds histogram")
        for labels, _, batches in pods:
            for bound in (*LATENCY_BUCKETS, math.inf):
                count = batches if bound >= batch_seconds else 0
                lines.append(
                    f'kiln_compute_duration_seconds_bucket{{{labels},le="{_le(bound)}"}} {count}'
                )
            lines.append(f"kiln_compute_duration_seconds_count{{{labels}}} {batches}")
            lines.append(f"kiln_compute_duration_seconds_sum{{{labels}}} {batches * batch_seconds}")
        for gauge, value in (
            ("kiln_queue_depth", 0),
            ("kiln_inflight_requests", 1),
            ("kiln_ready", 1),
        ):
            lines.append(f"# TYPE {gauge} gauge")
            lines.extend(f"{gauge}{{{labels}}} {value}" for labels, _, _ in pods)
        return "\n".join(lines) + "\n"

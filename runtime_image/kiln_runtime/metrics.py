"""Prometheus metrics of one runtime; names and labels are documented in docs/metrics.md.

The autoscaler queries ``kiln_request_duration_seconds``, ``kiln_queue_depth``,
``kiln_inflight_requests`` and ``kiln_requests_total``: those names and labels are a contract
with the operator. Each runtime owns its registry, so several can live in one process (tests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Latency buckets from 50 us to 10 s: fine enough below a millisecond for the fast models,
# wide enough for a large model's tail.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.0075,
    0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)
STAGES = ("decode", "preprocess", "forward", "postprocess", "encode")
PROTOCOLS = ("http", "grpc")
CODES = ("ok", "invalid", "not_found", "rejected", "deadline", "error")


class RuntimeMetrics:
    """Every metric of one served model, pre-labelled so recording costs no label lookup."""

    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.model = model
        request_duration = Histogram(
            "kiln_request_duration_seconds",
            "End-to-end request latency inside the runtime, from the first byte decoded to "
            "the last byte encoded.",
            ["model", "protocol"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        requests = Counter(
            "kiln_requests_total",
            "Inference requests answered, by outcome.",
            ["model", "protocol", "code"],
            registry=r,
        )
        stage = Histogram(
            "kiln_stage_duration_seconds",
            "Time per stage: decode and encode per request; preprocess, forward and postprocess "
            "per batch.",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = {p: request_duration.labels(model, p) for p in PROTOCOLS}
        self.requests = {(p, c): requests.labels(model, p, c) for p in PROTOCOLS for c in CODES}
        self.stage = {s: stage.labels(model, s) for s in STAGES}
        self.queue_wait_seconds = Histogram(
            "kiln_queue_wait_seconds",
            "Time a request waited in the batcher queue before its batch started.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(model)
        self.compute_seconds = Histogram(
            "kiln_compute_duration_seconds",
            "Time to compute one batch (preprocess + forward + postprocess).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(model)
        self.batch_size = Histogram(
            "kiln_batch_size",
            "Rows per batch the model ran.",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        ).labels(model)
        self.queue_depth_gauge = Gauge(
            "kiln_queue_depth", "Requests waiting in the batcher queue.", ["model"], registry=r
        ).labels(model)
        self.inflight = Gauge(
            "kiln_inflight_requests",
            "Inference requests accepted and not yet answered.",
            ["model"],
            registry=r,
        ).labels(model)
        self.warmup_seconds = Gauge(
            "kiln_warmup_duration_seconds",
            "Seconds the internal warm-up took before the runtime reported ready.",
            ["model"],
            registry=r,
        ).labels(model)
        self.ready = Gauge(
            "kiln_ready",
            "1 while the runtime reports ready (model loaded, warmed up, not draining).",
            ["model"],
            registry=r,
        ).labels(model)

    # BatchObserver ------------------------------------------------------------------------

    def queue_depth(self, depth: int) -> None:
        self.queue_depth_gauge.set(depth)

    def queue_wait(self, seconds: float) -> None:
        self.queue_wait_seconds.observe(seconds)

    def batch_done(self, rows: int, compute_seconds: float) -> None:
        self.batch_size.observe(rows)
        self.compute_seconds.observe(compute_seconds)

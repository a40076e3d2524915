"""Prometheus metrics of one runtime; names and labels are documented in docs/metrics.md.

The autoscaler queries ``kiln_request_duration_seconds``, ``kiln_queue_depth``,
``kiln_inflight_requests`` and ``kiln_requests_total``: those names and labels are a contract
with the operator. Each runtime owns its registry, so several can live in one process (tests).

The histograms are observed several times per request, so they are ``FastHistogram``s: plain
counters without prometheus_client's per-value locks (under a profiler, those took about a
fifth of a small request's Python time). Each histogram is written by one thread only (the
event loop, or the model thread for the per-batch stages), so no lock is needed; a scrape may
see a sum and its count one observation apart, which is harmless. ``kiln_requests_total`` is
the request histograms' counts, and the inflight and queue-depth gauges are read at scrape
time, so a request updates no prometheus_client object at all.

The operator's warm-up gate sends each new pod real-shaped requests before the pod joins its
Service; they are not load, and the autoscaler must neither scale on them nor read their
latency as the service's. The gate marks them (the request parameter ``kiln_warmup``), and a
marked request the runtime reads before its first unmarked one is the gate's: it is counted in
``kiln_warmup_requests_total`` and ``kiln_warmup_request_duration_seconds`` instead of the
request metrics, and not in flight; from the first marked request to the first unmarked one
(``warming``) the queue depth reads 0 and no batch or queue wait is recorded (every request
queued meanwhile was the gate's). From then on every request is load, marked or not, so a
client that fakes the mark hides only what it sent before the pod served anyone else: the pod
joins its Service only after the gate passed, so that is the warm-up itself. A request the
runtime cannot read (its mark unknown) counts as load, as does a refusal by the transport.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kiln_runtime.errors import METRIC_CODES

# Latency buckets from 50 us to 10 s: fine enough below a millisecond for the fast models,
# wide enough for a large model's tail.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.0075,
    0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)
STAGES = ("decode", "preprocess", "forward", "postprocess", "encode")
PROTOCOLS = ("http", "grpc")


class FastHistogram:
    """One labelled histogram series: cumulative buckets rendered at scrape time."""

    __slots__ = ("_bounds", "_counts", "_les", "_sum", "labels")

    def __init__(self, bounds: Sequence[float], labels: Sequence[str]) -> None:
        self._bounds = tuple(float(b) for b in bounds)
        self._les = [_le(b) for b in (*self._bounds, float("inf"))]
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self.labels = list(labels)

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le = "<=")
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def buckets(self) -> list[tuple[str, float]]:
        total = 0
        cumulative = []
        for le, count in zip(self._les, list(self._counts), strict=True):
            total += count
            cumulative.append((le, float(total)))
        return cumulative

    @property
    def count(self) -> int:
        return sum(self._counts)

    @property
    def sum(self) -> float:
        return self._sum


def _le(bound: float) -> str:
    """A bucket bound written as prometheus_client writes it (``5e-05``, ``1.0``, ``+Inf``)."""
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


class _HistogramFamily(Collector):
    """A histogram metric whose series are ``FastHistogram``s, one per label value tuple."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bucket_bounds = tuple(buckets)
        self.series: list[FastHistogram] = []
        registry.register(self)

    def labels(self, *values: str) -> FastHistogram:
        series = FastHistogram(self.bucket_bounds, values)
        self.series.append(series)
        return series

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for series in self.series:
            buckets = series.buckets()
            family.add_metric(series.labels, buckets, series.sum)
        yield family


class _CountsOf(Collector):
    """A counter whose series are the counts of a histogram's series, same labels: every
    request is observed in ``kiln_request_duration_seconds`` once, so ``kiln_requests_total``
    costs the request nothing (prometheus_client's Counter takes a lock and a Python call)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        histograms: _HistogramFamily,
        registry: CollectorRegistry,
    ) -> None:
        self.name = name  # without ``_total``: the family adds it
        self.documentation = documentation
        self.histograms = histograms
        registry.register(self)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.histograms.labelnames)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for series in self.histograms.series:
            family.add_metric(series.labels, float(series.count))
        yield family


class RuntimeMetrics:
    """Every metric of one served model, pre-labelled so recording costs no label lookup."""

    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.model = model
        request_duration = _HistogramFamily(
            "kiln_request_duration_seconds",
            "End-to-end request latency inside the runtime, from the first byte decoded to "
            "the last byte encoded, by outcome (the same codes as kiln_requests_total).",
            ["model", "protocol", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        _CountsOf("kiln_requests", "Inference requests answered, by outcome.", request_duration, r)
        stage = _HistogramFamily(
            "kiln_stage_duration_seconds",
            "Time per stage: decode and encode per request; preprocess, forward and postprocess "
            "per batch.",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = {
            (p, c): request_duration.labels(model, p, c) for p in PROTOCOLS for c in METRIC_CODES
        }
        warmup_duration = _HistogramFamily(
            "kiln_warmup_request_duration_seconds",
            "Latency of the warm-up gate's requests, served before the runtime's first other "
            "request (not load: the autoscaler does not read them), by outcome.",
            ["model", "protocol", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        _CountsOf(
            "kiln_warmup_requests",
            "The warm-up gate's requests answered before the runtime's first other request.",
            warmup_duration,
            r,
        )
        self.warmup_request_duration = {
            (p, c): warmup_duration.labels(model, p, c) for p in PROTOCOLS for c in METRIC_CODES
        }
        self.load_seen = False
        """Whether a request without the warm-up mark has been read: from then on, every
        request is load."""
        self.warming = False
        """Whether requests have been read and all were the warm-up gate's: meanwhile the queue
        depth reads 0 and batches are not recorded."""
        self.stage = {s: stage.labels(model, s) for s in STAGES}
        self.queue_wait_seconds = _HistogramFamily(
            "kiln_queue_wait_seconds",
            "Time a request waited in the batcher queue before its batch started.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(model)
        self.compute_seconds = _HistogramFamily(
            "kiln_compute_duration_seconds",
            "Time to compute one batch (preprocess + forward + postprocess).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(model)
        self.batch_size = _HistogramFamily(
            "kiln_batch_size",
            "Rows per batch the model ran.",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        ).labels(model)
        self._queue_depth = 0  # read at scrape time: the batcher reports it on every change
        Gauge(
            "kiln_queue_depth", "Requests waiting in the batcher queue.", ["model"], registry=r
        ).labels(model).set_function(lambda: 0 if self.warming else self._queue_depth)
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
        self._queue_depth = depth

    def queue_wait(self, seconds: float) -> None:
        if not self.warming:
            self.queue_wait_seconds.observe(seconds)

    def batch_done(self, rows: int, compute_seconds: float) -> None:
        if not self.warming:  # meanwhile every batch holds only the gate's requests
            self.batch_size.observe(rows)
            self.compute_seconds.observe(compute_seconds)

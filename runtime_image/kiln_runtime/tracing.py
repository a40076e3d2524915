"""Per-request traces with OpenTelemetry: which stage a slow request spent its time in.

Why it exists: the stage histograms (`kiln_stage_duration_seconds`) say where time goes on
average; a trace says where one request's time went, and continues the caller's trace (W3C
`traceparent`, from an HTTP header or gRPC metadata) into the model. Each traced request is one
`kiln.infer` span (SERVER) with a child per stage:

- `decode`: from the start of decoding the request to its tensors;
- `queue`: from there (validation included) until its batch started computing;
- `compute`: its batch's preprocess, forward and postprocess, with a link to the batch's own
  `kiln.batch` span, which every request the batch served links to;
- `encode`: from encoding the answer to the end.

What is left between them is the hand-back from the model's thread to the event loop. A cache
hit has no `queue` or `compute`.

Off (`tracing` absent from the config, the default) nothing here runs: the data plane holds
None and pays one `is None` test per request and per batch. On, the data plane records the times
it already takes for the metrics, and only a sampled request makes spans, after it ended, from
those times (`start_time`/`end_time`): no span is open while the request waits. The sampling
decision is the parent's when a `traceparent` came (its sampled flag), else `sampling_ratio`.
Spans leave through the SDK's BatchSpanProcessor (a thread of its own, a bounded queue: spans
past it are dropped, never waited for) to the OTLP/HTTP endpoint.
"""

import random
import time

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kiln_runtime.config import TracingConfig
from kiln_runtime.tracetimes import BatchTimes, RequestTimes

EXPORT_TIMEOUT_SECONDS = 5
MAX_QUEUED_SPANS = 8192
"""Spans waiting for export; past it the SDK drops new ones (a slow backend costs spans, not
requests)."""


class Tracing:
    """The runtime's tracer: sampling, and spans made from a finished request's times."""

    def __init__(
        self, config: TracingConfig, model: str, exporter: SpanExporter | None = None
    ) -> None:
        self.ratio = config.sampling_ratio
        resource = Resource.create({"service.name": "kiln-runtime", "kiln.model": model})
        self._provider = TracerProvider(sampler=ALWAYS_ON, resource=resource)
        self._provider.add_span_processor(
            BatchSpanProcessor(
                exporter
                or OTLPSpanExporter(endpoint=config.otlp_endpoint, timeout=EXPORT_TIMEOUT_SECONDS),
                max_queue_size=MAX_QUEUED_SPANS,
                schedule_delay_millis=500,
            )
        )
        self._tracer = self._provider.get_tracer("kiln_runtime")
        self._propagator = TraceContextTextMapPropagator()
        self._model = model
        # perf_counter -> epoch nanoseconds, as spans want them
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def sampled(self, traceparent: str | None) -> bool:
        """Whether to trace a request: its caller's decision if it sent a valid `traceparent`,
        else the sampling ratio."""
        if traceparent:
            context = trace.get_current_span(self._parent(traceparent)).get_span_context()
            if context.is_valid:
                return bool(context.trace_flags & TraceFlags.SAMPLED)
        return random.random() < self.ratio

    def _parent(self, traceparent: str | None) -> Context:
        if not traceparent:
            return Context()
        return self._propagator.extract({"traceparent": traceparent})

    def _ns(self, seconds: float) -> int:
        return int(seconds * 1e9) + self._offset_ns

    def record(self, times: RequestTimes, traceparent: str | None) -> None:
        """The spans of one sampled request, made after it ended."""
        attributes = {
            "kiln.model": self._model,
            "rpc.system": times.protocol,
            "kiln.code": times.code,
        }
        root = self._tracer.start_span(
            "kiln.infer",
            context=self._parent(traceparent),
            kind=SpanKind.SERVER,
            start_time=self._ns(times.started),
            attributes=attributes,
        )
        if times.code != "ok":
            root.set_status(Status(StatusCode.ERROR, times.code))
        inside = trace.set_span_in_context(root)
        decoded = times.decoded or times.ended
        self._child("decode", inside, times.started, decoded)
        batch = times.batch
        if batch is not None:
            self._child("queue", inside, decoded, batch.started)
            link = Link(self._batch_span(batch))
            self._child("compute", inside, batch.started, batch.ended, link)
        if times.encode_started:
            self._child("encode", inside, times.encode_started, times.ended)
        root.end(end_time=self._ns(times.ended))

    def _child(
        self, name: str, parent: Context, start: float, end: float, link: Link | None = None
    ) -> None:
        span = self._tracer.start_span(
            name, context=parent, start_time=self._ns(start), links=[link] if link else None
        )
        span.end(end_time=self._ns(max(start, end)))

    def _batch_span(self, batch: BatchTimes) -> SpanContext:
        if batch.span is None:
            span = self._tracer.start_span(
                "kiln.batch",
                context=Context(),
                start_time=self._ns(batch.started),
                attributes={
                    "kiln.model": self._model,
                    "kiln.batch.rows": batch.rows,
                    "kiln.batch.requests": batch.requests,
                },
            )
            span.end(end_time=self._ns(batch.ended))
            batch.span = span.get_span_context()
        made: SpanContext = batch.span
        return made

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout), then stop."""
        self._provider.shutdown()

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

Since every time is known when a request ends, its spans are made finished: `ReadableSpan`s,
handed straight to the processor, not the SDK's live spans started and ended (with their locks,
attribute checks and sampler call), which cost about 10 µs each against about 1 µs: at 1 %
sampling on a 100 µs request path that was most of tracing's cost (`make bench-runtime`).
"""

import random
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
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
        self._resource = Resource.create({"service.name": "kiln-runtime", "kiln.model": model})
        self._scope = InstrumentationScope("kiln_runtime")
        self._processor = BatchSpanProcessor(
            exporter
            or OTLPSpanExporter(endpoint=config.otlp_endpoint, timeout=EXPORT_TIMEOUT_SECONDS),
            max_queue_size=MAX_QUEUED_SPANS,
            schedule_delay_millis=500,
        )
        self._propagator = TraceContextTextMapPropagator()
        self._model = model
        # perf_counter -> epoch nanoseconds, as spans want them
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def sampled(self, traceparent: str | None) -> bool:
        """Whether to trace a request: its caller's decision if it sent a valid `traceparent`,
        else the sampling ratio."""
        parent = self._parent(traceparent)
        if parent is not None:
            return bool(parent.trace_flags & TraceFlags.SAMPLED)
        return random.random() < self.ratio

    def _parent(self, traceparent: str | None) -> SpanContext | None:
        """The caller's span, if it sent a valid `traceparent`."""
        if not traceparent:
            return None
        context = trace.get_current_span(
            self._propagator.extract({"traceparent": traceparent})
        ).get_span_context()
        return context if context.is_valid else None

    def _ns(self, seconds: float) -> int:
        return int(seconds * 1e9) + self._offset_ns

    def record(self, times: RequestTimes, traceparent: str | None) -> None:
        """The spans of one sampled request, made after it ended."""
        parent = self._parent(traceparent)
        trace_id = parent.trace_id if parent is not None else _trace_id()
        root = _context(trace_id)
        decoded = times.decoded or times.ended
        batch = times.batch
        if batch is not None:
            self._child("queue", root, decoded, batch.started)
            self._child("compute", root, batch.started, batch.ended, Link(self._batch_span(batch)))
        self._child("decode", root, times.started, decoded)
        if times.encode_started:
            self._child("encode", root, times.encode_started, times.ended)
        self._finished(
            "kiln.infer",
            root,
            times.started,
            times.ended,
            parent=parent,
            attributes={
                "kiln.model": self._model,
                "rpc.system": times.protocol,
                "kiln.code": times.code,
            },
            kind=SpanKind.SERVER,
            status=None if times.code == "ok" else Status(StatusCode.ERROR, times.code),
        )

    def _child(
        self, name: str, parent: SpanContext, start: float, end: float, link: Link | None = None
    ) -> None:
        context = _context(parent.trace_id)
        self._finished(name, context, start, max(start, end), parent=parent, link=link)

    def _batch_span(self, batch: BatchTimes) -> SpanContext:
        if batch.span is None:
            context = _context(_trace_id())
            attributes: dict[str, str | int] = {
                "kiln.model": self._model,
                "kiln.batch.rows": batch.rows,
                "kiln.batch.requests": batch.requests,
            }
            self._finished("kiln.batch", context, batch.started, batch.ended, attributes=attributes)
            batch.span = context
        made: SpanContext = batch.span
        return made

    def _finished(
        self,
        name: str,
        context: SpanContext,
        start: float,
        end: float,
        *,
        parent: SpanContext | None = None,
        attributes: dict[str, str | int] | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status | None = None,
        link: Link | None = None,
    ) -> None:
        """One span, already ended, to the batch processor."""
        self._processor.on_end(
            ReadableSpan(
                name,
                context=context,
                parent=parent,
                resource=self._resource,
                attributes=attributes,
                links=(link,) if link else (),
                kind=kind,
                status=status or Status(StatusCode.UNSET),
                start_time=self._ns(start),
                end_time=self._ns(end),
                instrumentation_scope=self._scope,
            )
        )

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout), then stop."""
        self._processor.shutdown()  # type: ignore[no-untyped-call]


def _trace_id() -> int:
    return random.getrandbits(128) or 1  # 0 is the invalid trace ID


def _context(trace_id: int) -> SpanContext:
    """A new sampled span's context in ``trace_id`` (random span ID, never the invalid 0)."""
    return SpanContext(trace_id, random.getrandbits(64) or 1, False, TraceFlags(TraceFlags.SAMPLED))

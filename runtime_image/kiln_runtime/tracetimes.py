"""The times a traced request's spans are made of, and the tracer's interface.

Why it exists apart from `tracing`: the data plane (compiled, on every request's path) fills
these and calls a `Tracer`, without importing OpenTelemetry: with tracing off (the default) the
SDK is never imported, so it costs neither start-up time nor memory.
"""

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class BatchTimes:
    """One batch's compute, in `time.perf_counter()` seconds, shared by the requests it served;
    its span is made by the first sampled one and linked by the others."""

    started: float
    ended: float
    rows: int
    requests: int
    span: Any = None
    """The batch span's SpanContext once made."""


@dataclass
class RequestTimes:
    """One sampled request's times (`time.perf_counter()` seconds) and outcome."""

    protocol: str
    started: float
    decoded: float = 0.0
    encode_started: float = 0.0
    ended: float = 0.0
    code: str = "ok"
    batch: BatchTimes | None = None


class Tracer(Protocol):
    """What the data plane asks of `tracing.Tracing`."""

    def sampled(self, traceparent: str | None) -> bool: ...

    def record(self, times: RequestTimes, traceparent: str | None) -> None: ...

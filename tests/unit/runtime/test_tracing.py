"""Per-request traces through the data plane, exported by OpenTelemetry's own SDK into its
in-memory exporter: a span per request with a child per stage, the caller's traceparent as
parent, every request of a batch linking one batch span; the caller's "not sampled" and a ratio
of 0 trace nothing; off, the SDK is not even imported."""

import asyncio
import itertools
import subprocess
import sys

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.grpc import service_pb2_grpc

from kiln_runtime import errors
from kiln_runtime.config import TracingConfig, parse_config, parse_config_text, to_document
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.grpc import InferenceServicer
from kiln_runtime.protocol.grpcio_server import GrpcioServer
from kiln_runtime.protocol.grpcserver import GrpcServer
from kiln_runtime.protocol.types import InferRequest, InferResponse
from kiln_runtime.tracing import Tracing

from .fakes import Adder, config
from .test_dataplane import request
from .test_grpc_transports import infer_request

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
NOT_SAMPLED = f"00-{TRACE_ID}-00f067aa0ba902b7-00"


async def traced(ratio: float) -> tuple[DataPlane, Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig("http://127.0.0.1:1/v1/traces", ratio), "adder", exporter)
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    dp.trace_with(tracing)
    await dp.start(Adder)
    return dp, tracing, exporter


async def call(dp: DataPlane, traceparent: str | None, rows: int = 1) -> InferResponse:
    made: InferRequest = request(rows)
    return await dp.handle("http", lambda: made, lambda r: r, traceparent=traceparent)


def spans(tracing: Tracing, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    tracing.shutdown()  # flushes the batch processor
    return list(exporter.get_finished_spans())


async def test_a_request_is_a_server_span_under_the_callers_with_a_child_per_stage() -> None:
    dp, tracing, exporter = await traced(ratio=0.0)
    await call(dp, PARENT)
    await dp.stop()
    found = spans(tracing, exporter)
    by_name = {span.name: span for span in found}
    assert set(by_name) == {"kiln.infer", "decode", "queue", "compute", "encode", "kiln.batch"}
    root = by_name["kiln.infer"]
    assert root.context is not None and root.parent is not None
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    for stage in ("decode", "queue", "compute", "encode"):
        span = by_name[stage]
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert root.start_time is not None and root.end_time is not None
        assert span.start_time is not None and span.end_time is not None
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time
    stages = ["decode", "queue", "compute", "encode"]
    for before, after in itertools.pairwise(stages):
        assert by_name[before].end_time <= by_name[after].start_time  # type: ignore[operator]
    batch = by_name["kiln.batch"]
    assert batch.parent is None  # a trace of its own, linked from each request
    (link,) = by_name["compute"].links
    assert batch.context is not None and link.context.span_id == batch.context.span_id
    assert root.attributes is not None and root.attributes["kiln.code"] == "ok"


async def test_the_requests_of_one_batch_link_the_same_batch_span() -> None:
    dp, tracing, exporter = await traced(ratio=1.0)
    await asyncio.gather(*(call(dp, None, rows=2) for _ in range(3)))
    await dp.stop()
    found = spans(tracing, exporter)
    computes = [span for span in found if span.name == "compute"]
    batches = {
        span.context.span_id: span for span in found if span.name == "kiln.batch" and span.context
    }
    assert len(computes) == 3
    linked = [span.links[0].context.span_id for span in computes]
    assert set(linked) <= set(batches)
    # the first request is computed alone, the other two together (as the batcher batches)
    assert sorted(linked.count(s) for s in set(linked)) == [1, 2]
    sizes = [dict(span.attributes or {})["kiln.batch.requests"] for span in batches.values()]
    assert sorted(int(str(size)) for size in sizes) == [1, 2]


@pytest.mark.parametrize(("traceparent", "ratio"), [(NOT_SAMPLED, 1.0), (None, 0.0)])
async def test_a_request_not_sampled_makes_no_span(traceparent: str | None, ratio: float) -> None:
    dp, tracing, exporter = await traced(ratio=ratio)
    for _ in range(20):
        await call(dp, traceparent)
    await dp.stop()
    assert spans(tracing, exporter) == []
    assert dp._traced_batches == {}


async def test_a_failed_request_is_an_error_span() -> None:
    dp, tracing, exporter = await traced(ratio=1.0)
    wrong = InferRequest("no-such-model", request().inputs)
    with pytest.raises(errors.InferError):
        await dp.handle("grpc", lambda: wrong, lambda r: r, traceparent=None)
    await dp.stop()
    (root,) = [span for span in spans(tracing, exporter) if span.name == "kiln.infer"]
    assert root.status.status_code.name == "ERROR"
    assert root.attributes is not None and root.attributes["kiln.code"] == "invalid"


def test_the_config_reads_and_writes_the_tracing_section() -> None:
    document = to_document(config())
    assert "tracing" not in document
    document["tracing"] = {"otlpEndpoint": "http://collector:4318/v1/traces", "samplingRatio": 0.25}
    parsed = parse_config(document)
    assert parsed.tracing == TracingConfig("http://collector:4318/v1/traces", 0.25)
    assert to_document(parsed)["tracing"] == document["tracing"]
    for bad in (
        {"otlpEndpoint": "collector:4318"},
        {"otlpEndpoint": "http://c", "samplingRatio": 2},
    ):
        with pytest.raises(ValueError, match="tracing"):
            parse_config({**document, "tracing": bad})


def test_off_the_runtime_never_imports_opentelemetry() -> None:
    code = (
        "import sys, kiln_runtime.server, kiln_runtime.dataplane, kiln_runtime.protocol.grpc;"
        "print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_the_operator_renders_spec_runtime_tracing_as_the_runtime_reads_it() -> None:
    from kiln_operator.api.v1alpha1 import InferenceServiceSpec
    from kiln_operator.builders.runtime_config import render_runtime_config
    from tests.unit.operator.conftest import load_sample

    spec = load_sample("minimal")["spec"]
    spec["runtime"] = {
        **spec.get("runtime", {}),
        "tracing": {"otlpEndpoint": "http://otel:4318/v1/traces"},
    }
    rendered = render_runtime_config(InferenceServiceSpec.model_validate(spec), "svc")
    assert parse_config_text(rendered).tracing == TracingConfig("http://otel:4318/v1/traces", 0.01)
    del spec["runtime"]["tracing"]
    untraced = render_runtime_config(InferenceServiceSpec.model_validate(spec), "svc")
    assert parse_config_text(untraced).tracing is None


@pytest.mark.parametrize("transport", [GrpcServer, GrpcioServer], ids=["kiln", "grpcio"])
async def test_a_grpc_calls_traceparent_metadata_reaches_the_span_on_both_transports(
    transport: type[GrpcServer] | type[GrpcioServer],
) -> None:
    dp, tracing, exporter = await traced(ratio=0.0)
    server = transport(InferenceServicer(dp).service())
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        await stub.ModelInfer(infer_request(), timeout=5, metadata=(("traceparent", PARENT),))
        await stub.ModelInfer(infer_request(), timeout=5)  # none, and ratio 0: not traced
        await stub.ModelInfer(infer_request(), timeout=5, metadata=(("traceparent", NOT_SAMPLED),))
    await server.stop(0.5)
    await dp.stop()
    (root,) = [span for span in spans(tracing, exporter) if span.name == "kiln.infer"]
    assert root.context is not None and format(root.context.trace_id, "032x") == TRACE_ID
    assert root.attributes is not None and root.attributes["rpc.system"] == "grpc"

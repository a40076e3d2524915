"""Traces of real requests in a real trace backend: a runtime process on loopback with tracing
on exports over OTLP/HTTP to Jaeger's all-in-one (built from its Go module, e2e/gotools), and
requests sent with a W3C traceparent (an HTTP header, gRPC metadata) come back from Jaeger's
query API as a `kiln.infer` span under that parent, with its stage spans, the compute span
linking the batch's span; the stages add up to the request's span within the stated bound."""

import http.client
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from kiln_runtime.examples import write_example
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT
from tests.integration.runtime.runtime_process import HOST, Runtime, running
from tests.jaeger import (
    UNACCOUNTED_BOUND_SECONDS,
    running_jaeger,
    traceparent,
    uncovered_by_stages,
)

# the fixture may build Jaeger first (minutes on a fresh machine; e2e/gotools caches it)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)]


@pytest.fixture
def jaeger(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Jaeger all-in-one on loopback, traces in memory: (OTLP/HTTP traces URL, query URL)."""
    with running_jaeger(HOST, tmp_path) as urls:
        yield urls


@pytest.fixture
def traced_runtime(jaeger: tuple[str, str], tmp_path: Path) -> Iterator[tuple[Runtime, str]]:
    otlp, query = jaeger
    model = tmp_path / "mlp"
    write_example("mlp", model)
    config = json.loads((model / "config.json").read_text())
    config["tracing"] = {"otlpEndpoint": otlp, "samplingRatio": 0.0}
    (model / "config.json").write_text(json.dumps(config))
    with running(model, tmp_path) as runtime:
        yield runtime, query


def test_a_request_with_a_traceparent_is_traced_stage_by_stage_in_jaeger(
    traced_runtime: tuple[Runtime, str],
) -> None:
    runtime, query = traced_runtime
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT__0", "datatype": "FP32", "shape": [1, 512], "data": [0.5] * 512}
            ]
        }
    )
    sent: list[tuple[str, str]] = []
    connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=10)
    for n in range(5):
        trace_id, parent = f"{n + 1:032x}", f"{n + 1:016x}"
        connection.request(
            "POST",
            "/v2/models/mlp/infer",
            body=body,
            headers={"traceparent": traceparent(trace_id, parent)},
        )
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        sent.append((trace_id, parent))
    connection.close()
    client = triton_grpc.InferenceServerClient(runtime.grpc_url)
    tensor = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
    tensor.set_data_from_numpy(np.full((1, 512), 0.5, np.float32))
    grpc_trace, grpc_parent = "abcdef" + "0" * 26, "00000000000000aa"
    client.infer("mlp", [tensor], headers={"traceparent": traceparent(grpc_trace, grpc_parent)})
    client.close()
    sent.append((grpc_trace, grpc_parent))
    # one request without a traceparent: sampling ratio 0, so no trace of it
    untraced = http.client.HTTPConnection(HOST, runtime.http_port, timeout=10)
    untraced.request("POST", "/v2/models/mlp/infer", body=body)
    assert untraced.getresponse().status == 200
    untraced.close()

    gaps = uncovered_by_stages(query, sent, timeout=30)
    assert max(gaps) <= UNACCOUNTED_BOUND_SECONDS
    with urllib.request.urlopen(
        f"{query}/api/traces?service=kiln-runtime&limit=100", timeout=5
    ) as answer:
        traces = json.load(answer)["data"]
    # 6 requests traced + their batches' traces (one per batch), nothing for the unsampled one
    infer_traces = [
        t for t in traces if any(s["operationName"] == "kiln.infer" for s in t["spans"])
    ]
    assert len(infer_traces) == len(sent)

"""Large legal JSON bodies (a million numbers, flat, nested or gzipped) while others are served.

Issue 39, item 1: decoding such a body held the GIL for its whole parse, so no other request on
any port was answered meanwhile (a gRPC liveness call waited up to 2.4 s, a kubelet probe with
its 1 s timeout failed). The bodies are now decoded in the decoding process
(``protocol/decoding.py``). A runtime serves the MLP with ``maxBatchSize`` 2048, so one request
may carry 2048 rows (1,048,576 numbers, about 22 MB of JSON); each case sends such requests
back to back for a few seconds while ``abuse.Watch`` runs its inference probe, its RSS sampler
and the kubelet-like readiness probe (a new connection every 100 ms), and writes the row of
``docs/benchmarks/runtime-abuse.md`` (``KILN_ABUSE_OUT``).
"""

from __future__ import annotations

import gzip
import http.client
import json
import time
from collections.abc import Iterator

import numpy as np
import pytest

from .abuse import Watch
from .conftest import ModelFactory
from .runtime_process import HOST, Runtime, running

pytestmark = pytest.mark.integration

ROWS = 2048
SECONDS = 3.0
READY_MAX_MS = 1000  # the kubelet's default timeout; the target (250 ms) is the page's


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    model = example_model("mlp", batching={"maxBatchSize": ROWS})
    with running(model, tmp_path_factory.mktemp("logs")) as served:
        yield served


def body(nested: bool) -> bytes:
    values = np.random.default_rng(0).standard_normal((ROWS, 512)).astype(np.float32)
    data = values.astype(np.float64).tolist() if nested else values.reshape(-1).tolist()
    document = {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [ROWS, 512],
                            "data": data}]}  # fmt: skip
    return json.dumps(document).encode()


CASES = {
    "flat": "JSON body of 1,048,576 numbers ([2048, 512], flat list, {mb} MB), {n} request(s)",
    "nested": "the same as nested lists ([2048][512], {mb} MB), {n} request(s)",
    "gzip": "the flat body gzipped ({mb} MB inflating to 22 MB), {n} request(s)",
}


@pytest.mark.parametrize("case", CASES)
def test_a_large_json_body_leaves_probes_and_clients_served(runtime: Runtime, case: str) -> None:
    payload = body(nested=case == "nested")
    headers = {"Content-Type": "application/json"}
    if case == "gzip":
        payload = gzip.compress(payload, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    statuses: list[int] = []
    with Watch(runtime) as watch:
        deadline = time.monotonic() + SECONDS
        connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=60)
        while time.monotonic() < deadline and len(statuses) < 50:
            connection.request("POST", "/v2/models/mlp/infer", body=payload, headers=headers)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
        connection.close()
        time.sleep(0.3)
    mb = f"{len(payload) / 1e6:.1f}"
    outcome = f"every one 200 ({ROWS} rows each)" if set(statuses) == {200} else str(statuses)
    watch.report(CASES[case].format(mb=mb, n=len(statuses)), outcome)
    assert set(statuses) == {200}, statuses
    assert not watch.failures, watch.failures[:3]
    assert not watch.readiness.failures, watch.readiness.failures[:3]
    assert watch.readiness.row()["ready_max_ms"] < READY_MAX_MS

"""Concurrent requests to a real runtime process are batched: rows per batch above one, read
from the process's own ``kiln_batch_size`` on /metrics.

Why it exists: the batcher's unit tests run it in-process with a stub compute; only a real
process shows that the transports, the batcher and the model together put concurrent calls
into one batch (and give each call its own rows back).
"""

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ModelFactory
from .runtime_process import Runtime, running

pytestmark = pytest.mark.integration

CALLERS = 16
CALLS_PER_CALLER = 4
# Long enough that callers started together on a shared 2-core host meet in one batch.
QUEUE_DELAY_MICROSECONDS = 50_000


def batch_size_histogram(runtime: Runtime) -> dict[str, float]:
    """``kiln_batch_size``'s count, sum and the count of batches of one row."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(runtime.metrics()):
        if family.name != "kiln_batch_size":
            continue
        for sample in family.samples:
            if sample.name == "kiln_batch_size_count":
                values["batches"] = sample.value
            elif sample.name == "kiln_batch_size_sum":
                values["rows"] = sample.value
            elif sample.name == "kiln_batch_size_bucket" and float(sample.labels["le"]) == 1:
                values["single"] = sample.value
    return values


def row(i: int) -> np.ndarray:
    return np.full((1, 512), i / 64, dtype=np.float32)


def infer(client: triton_grpc.InferenceServerClient, i: int) -> np.ndarray:
    tensor = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
    tensor.set_data_from_numpy(row(i))
    result: np.ndarray | None = client.infer("mlp", [tensor], client_timeout=30.0).as_numpy(
        "OUTPUT__0"
    )
    assert result is not None
    return result


def test_concurrent_calls_are_batched(example_model: ModelFactory, tmp_path: Path) -> None:
    model = example_model(
        "mlp", batching={"maxBatchSize": 32, "maxQueueDelayMicroseconds": QUEUE_DELAY_MICROSECONDS}
    )
    calls = CALLERS * CALLS_PER_CALLER
    with running(model, tmp_path) as runtime:
        client = triton_grpc.InferenceServerClient(runtime.grpc_url)
        alone = [infer(client, i) for i in range(calls)]  # one at a time: batches of one
        before = batch_size_histogram(runtime)
        answers: dict[int, np.ndarray] = {}
        start = threading.Barrier(CALLERS)

        def caller(index: int) -> None:
            start.wait(timeout=30)
            for i in range(index, calls, CALLERS):
                answers[i] = infer(client, i)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        after = batch_size_histogram(runtime)
        client.close()

    assert sorted(answers) == list(range(calls))
    for i in range(calls):  # each call got its own rows back from the batch it was in
        np.testing.assert_allclose(answers[i], alone[i], rtol=1e-4, atol=1e-5)
    rows = after["rows"] - before["rows"]
    batches = after["batches"] - before["batches"]
    multi_row = batches - (after["single"] - before["single"])
    assert rows == calls
    assert multi_row >= 1, f"{batches:.0f} batches, every one of one row"
    assert rows / batches >= 2, f"{rows:.0f} rows in {batches:.0f} batches"

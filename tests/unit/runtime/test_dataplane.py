"""The data plane: validation with clear errors, readiness, metrics, drain."""

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest

from kiln_runtime import errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.types import InferRequest, RequestedOutput, Tensor

from .fakes import Adder, config


async def started(**batching: int) -> tuple[DataPlane, Adder]:
    model = Adder()
    dp = DataPlane(config(**batching), RuntimeMetrics("adder"), executor=None)
    await dp.start(lambda: model)
    return dp, model


def request(rows: int = 1, overrides: dict[str, Tensor] | None = None) -> InferRequest:
    tensors = {
        "A": Tensor("A", "FP32", np.ones((rows, 4), np.float32)),
        "B": Tensor("B", "INT64", np.arange(rows * 4, dtype=np.int64).reshape(rows, 4)),
        **(overrides or {}),
    }
    return InferRequest("adder", list(tensors.values()))


async def test_ready_only_after_warm_up_and_not_while_draining() -> None:
    model = Adder()
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    assert dp.live and not dp.ready
    with pytest.raises(errors.InferError) as cold:
        await dp.infer(request())
    assert cold.value.kind is errors.ErrorKind.UNAVAILABLE
    await dp.start(lambda: model)
    assert dp.ready and model.warmed == (1,)
    assert dp.warmup_seconds == 0.25
    dp.begin_drain()
    assert not dp.ready
    response = await dp.infer(request())  # accepted work still completes while draining
    assert response.outputs[0].name == "SUM"
    await dp.stop()


async def test_infer_returns_each_requests_rows() -> None:
    dp, _ = await started()
    response = await dp.infer(request(rows=3))
    assert [t.name for t in response.outputs] == ["SUM", "COUNT"]
    np.testing.assert_array_equal(response.outputs[0].data, 1 + np.arange(12).reshape(3, 4))
    await dp.stop()


async def test_concurrent_requests_are_batched_and_split_back() -> None:
    dp, model = await started()
    model.batches.clear()
    requests = [request(rows=1 + i % 3) for i in range(6)]
    responses = await asyncio.gather(*(dp.infer(r) for r in requests))
    for req, resp in zip(requests, responses, strict=True):
        rows = req.inputs[0].data.shape[0]
        assert resp.outputs[0].data.shape == (rows, 4)
        np.testing.assert_array_equal(resp.outputs[0].data, req.inputs[0].data + req.inputs[1].data)
    # the first (1 row) is computed at once; rows 2,3,1,2 fill 8; the last (3 rows) follows
    assert model.batches == [1, 8, 3]
    await dp.stop()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"A": Tensor("A", "FP16", np.ones((1, 4), np.float16))}, "datatype FP16, expected FP32"),
        ({"A": Tensor("A", "FP32", np.ones((1, 5), np.float32))}, r"shape \[1, 5\]"),
        ({"A": Tensor("A", "FP32", np.ones((4,), np.float32))}, "batch dimension first"),
        ({"A": Tensor("A", "FP32", np.ones((2, 4), np.float32))}, "disagree"),
        ({"C": Tensor("C", "FP32", np.ones((1, 4), np.float32))}, r"unknown: \['C'\]"),
        ({"A": Tensor("A", "FP32", np.ones((9, 4), np.float32)),
          "B": Tensor("B", "INT64", np.ones((9, 4), np.int64))}, r"outside 1\.\.8"),
    ],
)  # fmt: skip
async def test_bad_inputs_are_invalid_with_a_clear_message(
    overrides: dict[str, Tensor], message: str
) -> None:
    dp, _ = await started()
    with pytest.raises(errors.InferError, match=message) as failure:
        await dp.infer(request(overrides=overrides))
    assert failure.value.kind is errors.ErrorKind.INVALID
    await dp.stop()


async def test_missing_input_unknown_output_and_unknown_model() -> None:
    dp, _ = await started()
    only_a = InferRequest("adder", [request().inputs[0]])
    with pytest.raises(errors.InferError, match=r"missing: \['B'\]"):
        await dp.infer(only_a)
    wrong_output = request()
    wrong_output.outputs = [RequestedOutput("NOPE")]
    with pytest.raises(errors.InferError, match="unknown output"):
        await dp.infer(wrong_output)
    other = request()
    other.model_name = "other"
    with pytest.raises(errors.InferError) as unknown:
        await dp.infer(other)
    assert unknown.value.kind is errors.ErrorKind.NOT_FOUND
    versioned = request()
    versioned.model_version = "2"
    with pytest.raises(errors.InferError, match="version 2"):
        await dp.infer(versioned)
    await dp.stop()


async def test_requested_outputs_filter_the_response() -> None:
    dp, _ = await started()
    only_count = request()
    only_count.outputs = [RequestedOutput("COUNT", binary=False)]
    response = await dp.infer(only_count)
    assert [t.name for t in response.outputs] == ["COUNT"]
    assert response.binary == {"COUNT": False}
    await dp.stop()


async def test_metadata_reports_the_batch_dimension() -> None:
    dp, _ = await started()
    meta = dp.model_metadata("adder")
    assert meta["inputs"][0] == {"name": "A", "datatype": "FP32", "shape": [-1, 4]}
    assert dp.model_config("adder", "1")["max_batch_size"] == 8
    with pytest.raises(errors.InferError):
        dp.model_metadata("nope")
    await dp.stop()


async def test_accounting_feeds_the_contract_metrics_and_drain() -> None:
    dp, _ = await started()
    dp.request_started()
    assert not await dp.wait_idle(0.01)
    dp.request_finished("http", "ok", 0.001)
    assert await dp.wait_idle(1.0)
    dp.request_started()
    dp.request_finished("grpc", "overloaded", 0.002)
    text = generate_latest(dp.metrics.registry).decode()
    assert 'kiln_requests_total{code="ok",model="adder",protocol="http"} 1.0' in text
    assert 'kiln_requests_total{code="overloaded",model="adder",protocol="grpc"} 1.0' in text
    assert (
        'kiln_request_duration_seconds_count{code="overloaded",model="adder",protocol="grpc"} 1.0'
        in text
    )
    assert 'kiln_inflight_requests{model="adder"} 0.0' in text
    assert 'kiln_warmup_duration_seconds{model="adder"} 0.25' in text
    assert 'kiln_ready{model="adder"} 1.0' in text
    await dp.stop()


async def test_a_model_returning_wrong_rows_fails_the_batch_not_the_server() -> None:
    class Short(Adder):
        def forward(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
            return [out[:0] for out in super().forward(inputs)]

    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Short)
    with pytest.raises(errors.InferError) as failure:
        await dp.infer(request())
    assert failure.value.kind is errors.ErrorKind.INTERNAL
    await dp.stop()


async def test_inputs_in_another_order_are_matched_by_name_and_duplicates_refused() -> None:
    dp, _ = await started()
    a, b = request(rows=2).inputs
    response = await dp.infer(InferRequest("adder", [b, a]))
    np.testing.assert_array_equal(response.outputs[0].data, 1 + np.arange(8).reshape(2, 4))
    with pytest.raises(errors.InferError, match="more than once"):
        await dp.infer(InferRequest("adder", [a, a, b]))
    await dp.stop()


async def test_the_inflight_gauge_is_read_when_scraped() -> None:
    dp, _ = await started()
    dp.request_started()
    dp.request_started()
    assert (
        'kiln_inflight_requests{model="adder"} 2.0' in generate_latest(dp.metrics.registry).decode()
    )
    dp.request_finished("http", "ok", 0.001)
    dp.request_finished("http", "ok", 0.001)
    assert (
        'kiln_inflight_requests{model="adder"} 0.0' in generate_latest(dp.metrics.registry).decode()
    )
    await dp.stop()


async def test_start_up_tells_the_batcher_what_one_more_batch_costs() -> None:
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    assert math.isinf(dp._batcher.batch_overhead)  # unknown before warm-up: never halves
    await dp.start(Adder)
    assert 0 <= dp._batcher.batch_overhead < 0.01  # the adder's one timed size: microseconds
    await dp.stop()


class SlowAdder(Adder):
    """An adder whose every batch takes about 2 ms: over the short inline limit, under the long."""

    def forward(self, inputs: list[Any]) -> list[Any]:
        time.sleep(0.002)
        return super().forward(inputs)


@pytest.mark.parametrize(
    ("compute_threads", "cpus", "inline_rows"),
    [(1, 1, 8), (4, 4, 8), (1, 2, 0), (None, 1, 0), (1, None, 0)],
)
async def test_the_inline_limit_follows_whether_the_model_leaves_the_loop_a_cpu(
    compute_threads: int | None, cpus: int | None, inline_rows: int
) -> None:
    # a thread per CPU: every 2 ms batch inline (all 8 rows); a CPU left over, or either count
    # unknown: the 1 ms limit, and every batch in the model thread
    executor = ThreadPoolExecutor(max_workers=1)
    dp = DataPlane(
        config(), RuntimeMetrics("adder"), executor, compute_threads=compute_threads, cpus=cpus
    )
    await dp.start(SlowAdder)
    assert dp._batcher.inline_rows == inline_rows
    await dp.stop()
    executor.shutdown()


def _sample(text: str, series: str) -> float:
    """The value of one exposed series (its name and labels exactly as exposed)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exposed")


async def test_the_warm_up_gates_requests_are_no_load_until_a_client_request_arrives() -> None:
    class Slow(Adder):  # computes in the model thread, so later requests queue behind it
        def forward(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
            time.sleep(0.1)
            return super().forward(inputs)

    executor = ThreadPoolExecutor(max_workers=1)
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=executor)
    await dp.start(Slow)

    def marked(mark: bool) -> InferRequest:
        built = request()
        built.warmup = mark
        return built

    async def send(protocol: str, mark: bool) -> Any:
        return await dp.handle(protocol, lambda: marked(mark), lambda response: response)

    def scrape() -> str:
        return generate_latest(dp.metrics.registry).decode()

    warmups = [asyncio.ensure_future(send("grpc", True))]
    await asyncio.sleep(0.03)  # computing
    warmups += [asyncio.ensure_future(send("grpc", True)) for _ in range(2)]
    await asyncio.sleep(0.03)  # queued behind it
    text = scrape()
    assert dp.metrics._queue_depth >= 1  # queued indeed, and not load
    assert _sample(text, 'kiln_queue_depth{model="adder"}') == 0.0
    assert _sample(text, 'kiln_inflight_requests{model="adder"}') == 0.0
    await asyncio.gather(*warmups)
    text = scrape()
    grpc_ok = '{code="ok",model="adder",protocol="grpc"}'
    assert _sample(text, f"kiln_warmup_requests_total{grpc_ok}") == 3.0
    assert _sample(text, f"kiln_warmup_request_duration_seconds_count{grpc_ok}") == 3.0
    assert _sample(text, f"kiln_requests_total{grpc_ok}") == 0.0
    assert _sample(text, f"kiln_request_duration_seconds_count{grpc_ok}") == 0.0
    assert _sample(text, 'kiln_batch_size_count{model="adder"}') == 0.0
    assert _sample(text, 'kiln_queue_wait_seconds_count{model="adder"}') == 0.0

    # A client's request: load from now on, and a mark no longer hides anything.
    await send("grpc", False)
    await send("grpc", True)
    text = scrape()
    assert _sample(text, f"kiln_requests_total{grpc_ok}") == 2.0
    assert _sample(text, f"kiln_warmup_requests_total{grpc_ok}") == 3.0
    assert _sample(text, 'kiln_batch_size_count{model="adder"}') == 2.0
    assert dp.metrics.load_seen and not dp.metrics.warming
    await dp.stop()
    executor.shutdown()

"""Every request ends in exactly one outcome code, the same in the counter and the histogram."""

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from kiln_runtime import errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol import rest
from kiln_runtime.protocol.types import InferRequest, InferResponse, Tensor

from .fakes import Adder, config


class GatedAdder(Adder):
    """An adder whose batches wait for ``gate`` once it is closed (warm-up runs open).

    Each batch takes a few milliseconds, so the data plane computes in the model's thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def forward(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.entered.set()
        self.gate.wait(10)
        time.sleep(0.002)
        return super().forward(inputs)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=1)
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


async def gated(executor: ThreadPoolExecutor) -> tuple[DataPlane, GatedAdder]:
    model = GatedAdder()
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=executor)
    await dp.start(lambda: model)
    model.gate.clear()
    model.entered.clear()
    return dp, model


def request(timeout: float | None = None) -> InferRequest:
    inputs = [
        Tensor("A", "FP32", np.ones((1, 4), np.float32)),
        Tensor("B", "INT64", np.ones((1, 4), np.int64)),
    ]
    return InferRequest("adder", inputs, timeout_seconds=timeout)


def codes(dp: DataPlane) -> dict[str, tuple[float, int]]:
    """code -> (counter as scraped, histogram count), summed over protocols; only codes seen."""
    seen: dict[str, tuple[float, int]] = {}
    for code in errors.METRIC_CODES:
        counted = sum(
            dp.metrics.registry.get_sample_value(
                "kiln_requests_total", {"model": dp.metrics.model, "protocol": p, "code": code}
            )
            or 0.0
            for p in ("http", "grpc")
        )
        observed = sum(dp.metrics.request_duration[(p, code)].count for p in ("http", "grpc"))
        if counted or observed:
            seen[code] = (counted, observed)
    return seen


def identity(response: InferResponse) -> Any:
    return response


async def test_a_request_the_client_abandons_is_cancelled(executor: ThreadPoolExecutor) -> None:
    dp, model = await gated(executor)
    task = asyncio.create_task(dp.handle("http", request, identity))
    await asyncio.get_running_loop().run_in_executor(None, model.entered.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    model.gate.set()
    assert codes(dp) == {"cancelled": (1, 1)}
    assert dp.inflight == 0
    await dp.stop()


async def test_a_request_given_up_at_its_deadline_is_deadline(
    executor: ThreadPoolExecutor,
) -> None:
    dp, model = await gated(executor)
    # the first computes (and hangs); the second waits in the queue past its deadline
    computing = asyncio.create_task(dp.handle("grpc", lambda: request(timeout=0.05), identity))
    await asyncio.get_running_loop().run_in_executor(None, model.entered.wait, 5)
    queued = asyncio.create_task(dp.handle("grpc", lambda: request(timeout=0.05), identity))
    await asyncio.sleep(0.1)
    computing.cancel()  # what the gRPC transport does when the call's deadline passes
    with pytest.raises(asyncio.CancelledError):
        await computing
    model.gate.set()
    with pytest.raises(errors.InferError) as dropped:  # the batcher drops it, never computed
        await queued
    assert dropped.value.kind is errors.ErrorKind.DEADLINE
    assert codes(dp) == {"deadline": (2, 2)}
    await dp.stop()


async def test_a_bug_answers_internal_in_both_protocols_terms() -> None:
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)

    def broken_encoder(response: InferResponse) -> Any:
        raise RuntimeError("a bug in encoding")

    for protocol in ("http", "grpc"):
        with pytest.raises(errors.InferError) as failure:
            await dp.handle(protocol, request, broken_encoder)
        assert failure.value.kind is errors.ErrorKind.INTERNAL
        assert failure.value.kind.mapping.http_status == 500
    assert codes(dp) == {"internal": (2, 2)}
    await dp.stop()


async def test_a_failing_model_is_internal_and_the_next_request_ok() -> None:
    class Failing(Adder):
        fail = False

        def forward(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
            if self.fail:
                raise RuntimeError("CUDA error: an illegal memory access")
            return super().forward(inputs)

    model = Failing()
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(lambda: model)
    model.fail = True
    with pytest.raises(errors.InferError):
        await dp.handle("http", request, identity)
    model.fail = False
    await dp.handle("http", request, identity)
    assert codes(dp) == {"ok": (1, 1), "internal": (1, 1)}
    await dp.stop()


async def test_invalid_unknown_model_and_overloaded_codes() -> None:
    dp = DataPlane(config(maxQueueSize=1), RuntimeMetrics("adder"), executor=None)

    def unknown() -> InferRequest:
        other = request()
        other.model_name = "nope"
        return other

    def garbage() -> InferRequest:
        raise errors.invalid("request body is not valid JSON")

    for decode in (request, unknown, garbage):  # the model is not loaded yet: overloaded (503)
        with pytest.raises(errors.InferError):
            await dp.handle("http", decode, identity)
    assert codes(dp) == {"overloaded": (1, 1), "invalid": (2, 2)}


async def test_a_request_decoded_off_the_loop_is_counted_once() -> None:
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)

    async def elsewhere() -> InferRequest:
        await asyncio.sleep(0.01)  # the decoding process's time
        return request()

    def never() -> InferRequest:
        raise AssertionError("decoded on the loop")

    await dp.handle("http", never, identity, decode_off_loop=elsewhere)
    assert codes(dp) == {"ok": (1, 1)}
    await dp.stop()


async def test_an_answer_json_cannot_carry_is_internal_not_the_clients_fault() -> None:
    """The model produced NaN and the client asked for JSON: the answer is unchanged (the
    REST adapter's error), but the request counts ``internal``, never ``invalid``."""
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)

    def nan_input() -> InferRequest:
        nan = request()
        nan.inputs[0] = Tensor("A", "FP32", np.full((1, 4), np.nan, np.float32))
        return nan

    with pytest.raises(errors.InferError) as failure:
        await dp.handle("http", nan_input, rest.encode_infer)
    assert "NaN" in failure.value.message
    assert codes(dp) == {"internal": (1, 1)}
    await dp.stop()


def test_requests_refused_before_the_data_plane_count_once_and_are_never_in_flight() -> None:
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    dp.refused("http", "invalid")
    dp.refused("grpc", "overloaded", 0.002)
    dp.refused("http", "deadline")
    assert codes(dp) == {"invalid": (1, 1), "overloaded": (1, 1), "deadline": (1, 1)}
    assert dp.metrics.request_duration[("grpc", "overloaded")].sum == 0.002
    assert dp.inflight == 0

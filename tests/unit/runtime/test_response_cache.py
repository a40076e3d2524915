"""The response cache in the data plane: what hits, what misses, single flight, the bounds,
and the shared tier's value format (a poisoned or truncated value is a miss)."""

import asyncio
import hashlib
import threading
import time
import tracemalloc
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tritonclient.grpc import service_pb2

from kiln_runtime import errors
from kiln_runtime.config import ConfigError, parse_config, to_document
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.types import InferRequest, RequestedOutput, Tensor
from kiln_runtime.redis_cache import decode_value, encode_value
from kiln_runtime.response_cache import CacheStats, ResponseCache, canonical_parameters

from .fakes import Adder, config

OUTPUTS = {"SUM": "FP32", "COUNT": "INT32"}


def cached_config(**cache: Any) -> Any:
    document = to_document(config())
    document["cache"] = {"maxBytes": 1 << 20, "ttlSeconds": 60, **cache}
    return parse_config(document)


async def started(model: Any = None, executor: Any = None, **cache: Any) -> tuple[DataPlane, Any]:
    model = model or Adder()
    dp = DataPlane(cached_config(**cache), RuntimeMetrics("adder"), executor=executor)
    await dp.start(lambda: model)
    return dp, model


def request(
    a: float = 1.0,
    *,
    rows: int = 1,
    outputs: Sequence[str] = (),
    parameters: Any = None,
    b: npt.NDArray[Any] | None = None,
) -> InferRequest:
    if b is None:
        b = np.arange(rows * 4, dtype=np.int64).reshape(rows, 4)
    inputs = [Tensor("A", "FP32", np.full((rows, 4), a, np.float32)), Tensor("B", "INT64", b)]
    return InferRequest(
        "adder", inputs, outputs=[RequestedOutput(o) for o in outputs], parameters=parameters
    )


async def test_an_identical_request_hits_and_never_reaches_the_model() -> None:
    dp, model = await started()
    first = await dp.infer(request())
    batches = list(model.batches)
    again = await dp.infer(request())
    assert model.batches == batches  # the hit never entered the batcher
    assert dp.cache is not None and dp.cache.stats.hits_local == 1
    for one, two in zip(first.outputs, again.outputs, strict=True):
        assert (one.name, one.datatype) == (two.name, two.datatype)
        np.testing.assert_array_equal(one.data, two.data)
    assert not again.outputs[0].data.flags.writeable  # a hit's arrays cannot be changed
    stats = dp.statistics()["inference_stats"]
    assert stats["cache_hit"]["count"] == 1 and stats["cache_miss"]["count"] == 1
    await dp.stop()


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(request(2.0), id="input bytes"),
        pytest.param(request(b=np.arange(1, 5, dtype=np.int64).reshape(1, 4)), id="one byte"),
        pytest.param(request(rows=2), id="shape"),
        pytest.param(request(outputs=["SUM"]), id="outputs"),
        pytest.param(request(outputs=["COUNT"]), id="other outputs"),
        pytest.param(request(parameters={"temperature": 0.5}), id="parameters"),
    ],
)
async def test_any_change_of_inputs_outputs_or_parameters_misses(changed: InferRequest) -> None:
    dp, model = await started()
    await dp.infer(request(parameters={"temperature": 0.7}))
    await dp.infer(request())
    computed = len(model.batches)
    response = await dp.infer(changed)
    assert len(model.batches) == computed + 1
    assert dp.cache is not None and dp.cache.stats.hits == 0
    wanted = [o.name for o in changed.outputs] or ["SUM", "COUNT"]
    assert [t.name for t in response.outputs] == wanted
    await dp.stop()


async def test_delivery_parameters_are_not_in_the_key() -> None:
    dp, model = await started()
    await dp.infer(request(parameters={"timeout": 5_000_000, "binary_data_output": True}))
    computed = len(model.batches)
    await dp.infer(request(parameters={"timeout": 9_000_000}))
    assert len(model.batches) == computed
    await dp.stop()


def test_grpc_and_http_parameters_key_alike() -> None:
    grpc_parameters = service_pb2.ModelInferRequest(
        parameters={
            "k": service_pb2.InferParameter(int64_param=3),
            "s": service_pb2.InferParameter(string_param="x"),
            "timeout": service_pb2.InferParameter(int64_param=10),
        }
    ).parameters
    assert canonical_parameters(grpc_parameters) == canonical_parameters({"s": "x", "k": 3})
    assert canonical_parameters({"k": 3}) != canonical_parameters({"k": 4})
    assert canonical_parameters({"timeout": 1}) == canonical_parameters(None) == b""
    assert canonical_parameters({"k": object()}) is None  # not keyable: not cached


async def test_a_request_that_cannot_be_keyed_is_computed_not_cached() -> None:
    dp, model = await started()
    computed = len(model.batches)
    for _ in range(2):
        await dp.infer(request(parameters={"k": object()}))
    assert len(model.batches) == computed + 2
    assert dp.cache is not None and dp.cache.stats.not_cacheable == 2
    await dp.stop()


class SlowAdder(Adder):
    """Computes in the model thread for 50 ms, so identical requests arrive meanwhile."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.calls = 0
        self.lock = threading.Lock()

    def forward(self, inputs: list[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        with self.lock:
            self.calls += 1
        if self.warmed:
            time.sleep(0.05)
            if self.fail:
                self.fail = False
                raise RuntimeError("the first computation fails")
        return super().forward(inputs)

    @property
    def computes_on_cpu(self) -> bool:
        return False  # never inline: each batch runs in the model thread


async def test_64_identical_concurrent_misses_compute_once() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    dp, model = await started(SlowAdder(), executor)
    before = model.calls
    answers = await asyncio.gather(*(dp.infer(request(7.0)) for _ in range(64)))
    assert model.calls - before == 1
    assert dp.cache is not None
    assert (dp.cache.stats.misses, dp.cache.stats.hits_inflight) == (1, 63)
    for answer in answers:
        np.testing.assert_array_equal(answer.outputs[0].data, answers[0].outputs[0].data)
    await dp.stop()
    executor.shutdown()


async def test_when_the_first_computation_fails_the_others_compute_their_own() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    dp, model = await started(SlowAdder(), executor)
    model.fail = True
    results = await asyncio.gather(
        *(dp.infer(request(3.0)) for _ in range(4)), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, errors.InferError)]
    assert len(failed) == 1  # only the request whose computation failed
    await dp.stop()
    executor.shutdown()


async def test_a_waiter_keeps_its_own_deadline() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    dp, _ = await started(SlowAdder(), executor)
    leader = asyncio.ensure_future(dp.infer(request(4.0)))
    await asyncio.sleep(0.01)
    hurried = request(4.0)
    hurried.timeout_seconds = 0.005
    with pytest.raises(errors.InferError) as late:
        await dp.infer(hurried)
    assert late.value.kind is errors.ErrorKind.DEADLINE
    await leader
    await dp.stop()
    executor.shutdown()


async def test_entries_expire_after_the_ttl() -> None:
    dp, model = await started(ttlSeconds=0.05)
    await dp.infer(request())
    await asyncio.sleep(0.06)
    computed = len(model.batches)
    await dp.infer(request())
    assert len(model.batches) == computed + 1
    assert dp.cache is not None and dp.cache.stats.evicted_expired == 1
    await dp.stop()


async def test_an_answer_larger_than_max_entry_bytes_is_not_kept() -> None:
    dp, model = await started(maxEntryBytes=600)
    computed = len(model.batches)
    for _ in range(2):
        await dp.infer(request())
    assert len(model.batches) == computed + 2
    assert dp.cache is not None and dp.cache.stats.too_large == 2 and dp.cache.entries == 0
    await dp.stop()


def _answers(count: int, cache: ResponseCache) -> None:
    """``count`` distinct answers of 1 KiB stored, each a view of a whole batch, as the batcher
    hands them over."""
    batch = [np.ones((64, 256), np.float32), np.ones((64, 1), np.int32)]
    for i in range(count):
        key = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).digest()
        row = i % 64
        outputs = [
            Tensor("SUM", "FP32", batch[0][row : row + 1]),
            Tensor("COUNT", "INT32", batch[1][row : row + 1]),
        ]
        cache.store(key, outputs)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_memory_stays_within_the_bound_under_100000_distinct_keys() -> None:
    """What the LRU counts is at least what its entries take (tracemalloc, 2,000 entries), it
    never counts more than maxBytes, and the process grows by about maxBytes, not by the
    ~180 MB 100,000 answers of 1 KiB would take unbounded."""
    measured = ResponseCache(cached_config(), cached_config(maxBytes=16 << 20).cache, CacheStats())
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        _answers(2000, measured)
        taken = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert measured.stats.evicted_size == 0 and measured.entries == 2000
    assert taken <= measured.nbytes, (taken, measured.nbytes)
    del measured

    bound = 32 << 20
    cache = ResponseCache(cached_config(), cached_config(maxBytes=bound).cache, CacheStats())
    before = _rss_bytes()
    _answers(100_000, cache)
    grown = _rss_bytes() - before
    assert cache.nbytes <= bound
    assert cache.entries + cache.stats.evicted_size == 100_000
    assert cache.entries > 10_000  # it is full, not emptied
    assert grown <= bound + (8 << 20), grown


def test_a_shared_value_round_trips_and_anything_else_is_a_miss() -> None:
    key = hashlib.blake2b(b"k", digest_size=32).digest()
    outputs = [
        Tensor("SUM", "FP32", np.arange(8, dtype=np.float32).reshape(2, 4)),
        Tensor("COUNT", "INT32", np.array([[2], [2]], np.int32)),
    ]
    value = encode_value(key, outputs)
    decoded = decode_value(value, key, OUTPUTS)
    assert decoded is not None
    for one, two in zip(outputs, decoded, strict=True):
        assert (one.name, one.datatype) == (two.name, two.datatype)
        np.testing.assert_array_equal(one.data, two.data)
    other_key = hashlib.blake2b(b"other", digest_size=32).digest()
    flipped = bytearray(value)
    flipped[-1] ^= 1
    assert decode_value(bytes(flipped), key, OUTPUTS) is None  # poisoned
    assert decode_value(value[:-3], key, OUTPUTS) is None  # truncated
    assert decode_value(value + b"\0", key, OUTPUTS) is None  # grown
    assert decode_value(value, other_key, OUTPUTS) is None  # another entry's value
    assert decode_value(b"garbage", key, OUTPUTS) is None
    assert decode_value(value, key, {"SUM": "FP32"}) is None  # not this model's outputs


def test_cache_config_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"cache\.maxEntryBytes"):
        cached_config(maxBytes=1 << 16, maxEntryBytes=1 << 20)
    with pytest.raises(ConfigError, match=r"cache\.redis\.address"):
        cached_config(redis={"address": "no-port"})
    parsed = cached_config(redis={"address": "[::1]:6380", "timeoutMilliseconds": 5})
    assert parsed.cache.redis.host == "::1" and parsed.cache.redis.timeout_seconds == 0.005
    assert parse_config(to_document(parsed)) == parsed


def test_a_strided_input_keys_as_its_contiguous_copy() -> None:
    cache = ResponseCache(cached_config(), cached_config().cache, CacheStats())
    wide = np.arange(16, dtype=np.float32).reshape(2, 8)
    strided = wide[:, ::2]
    b = np.zeros((2, 4), np.int64)
    key = cache.key(request(), [strided, b])
    assert key == cache.key(request(), [np.ascontiguousarray(strided), b])
    assert key != cache.key(request(), [wide[:, :4].copy(), b])


async def test_the_bypass_parameter_computes_every_time_and_keeps_nothing() -> None:
    """The warm-up gate's requests: each must reach the model it times."""
    from kiln_runtime.response_cache import BYPASS_PARAMETER

    dp, model = await started()
    computed = len(model.batches)
    for _ in range(3):
        await dp.infer(request(parameters={BYPASS_PARAMETER: True}))
    assert len(model.batches) == computed + 3
    assert dp.cache is not None and dp.cache.entries == 0
    grpc_bypass = service_pb2.ModelInferRequest(
        parameters={BYPASS_PARAMETER: service_pb2.InferParameter(bool_param=True)}
    ).parameters
    assert canonical_parameters(grpc_bypass) is None
    await dp.stop()

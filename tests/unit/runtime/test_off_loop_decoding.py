"""Large and compressed JSON bodies are decoded without holding the event loop (issue 39, 1).

A worker thread was not enough: orjson and numpy hold the GIL for the whole body, so the loop
waited as long as the parse (0.3-0.5 s for these bodies). The bodies now go to the decoding
process (``protocol/decoding.py``); these tests decode real bodies through the REST adapter
while a task on the loop ticks every 5 ms, and look at the longest gap between its ticks.
"""

import asyncio
import gzip
import os
from collections.abc import AsyncIterator

import numpy as np
import orjson
import pytest

from kiln_runtime.config import parse_config
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol import decoding
from kiln_runtime.protocol.rest import RestAdapter

from .fakes import Adder

VALUES = 2_000_000  # about 38 MB of JSON; 0.5 s to parse on the loop on the development host
# A gap the loop may show while the body is handed over and its tensors come back: the copy
# of the body into the pipe and the tensors out of it (tens of ms on a loaded host). Parsing
# on the loop, as before, stalls it for the whole parse.
MAX_GAP_SECONDS = 0.2


def variable_config() -> object:
    return parse_config(
        {
            "model": {
                "name": "adder", "version": "1",
                "inputs": [{"name": "A", "datatype": "FP32", "shape": [-1]},
                           {"name": "B", "datatype": "INT64", "shape": [-1]}],
                "outputs": [{"name": "SUM", "datatype": "FP32", "shape": [-1]},
                            {"name": "COUNT", "datatype": "INT32", "shape": [1]}],
            },
            "batching": {"maxBatchSize": 8},
        }
    )  # fmt: skip


@pytest.fixture
async def adapter() -> AsyncIterator[RestAdapter]:
    dp = DataPlane(variable_config(), RuntimeMetrics("adder"), executor=None)  # type: ignore[arg-type]
    await dp.start(Adder)
    yield RestAdapter(dp)
    await dp.stop()


def body(values: int, nested: bool = False) -> bytes:
    a = np.arange(values, dtype=np.float64) / 7
    b = np.arange(values, dtype=np.int64)
    data_a = a.reshape(1, -1, 10) if nested else a.reshape(1, -1)
    return orjson.dumps(
        {"inputs": [
            {"name": "A", "datatype": "FP32", "shape": [1, values], "data": data_a},
            {"name": "B", "datatype": "INT64", "shape": [1, values], "data": b.reshape(1, -1)},
        ], "outputs": [{"name": "COUNT", "parameters": {"binary_data": False}}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )  # fmt: skip


async def longest_gap(work: asyncio.Future[object] | asyncio.Task[object]) -> float:
    loop = asyncio.get_running_loop()
    gap, last = 0.0, loop.time()
    while not work.done():
        await asyncio.sleep(0.005)
        now = loop.time()
        gap, last = max(gap, now - last), now
    return gap


@pytest.mark.parametrize("form", ["flat", "nested", "gzip"])
async def test_a_large_body_is_decoded_while_the_loop_keeps_turning(
    adapter: RestAdapter, form: str
) -> None:
    await adapter.handle("GET", "/v2/health/ready", {}, b"")  # a warm loop
    payload, headers = body(VALUES, nested=form == "nested"), {}
    if form == "gzip":
        payload, headers = gzip.compress(payload, compresslevel=1), {"content-encoding": "gzip"}
    warm = asyncio.ensure_future(adapter.handle("POST", "/v2/models/adder/infer", {}, body(16)))
    assert (await warm).status == 200  # small: decoded on the loop

    infer = asyncio.ensure_future(
        adapter.handle("POST", "/v2/models/adder/infer", headers, payload)
    )
    gap = await longest_gap(infer)
    response = await infer
    assert response.status == 200, response.body
    assert orjson.loads(response.body[0])["outputs"][0]["data"] == [1]
    assert gap < MAX_GAP_SECONDS, f"the loop stalled {gap * 1000:.0f} ms"


async def test_errors_come_back_from_the_decoding_process(adapter: RestAdapter) -> None:
    bad = b'{"inputs": [' + b"1," * 200_000 + b"1]}"  # large, and not a tensor list
    response = await adapter.handle("POST", "/v2/models/adder/infer", {}, bad)
    assert response.status == 400
    assert b"malformed infer request" in response.body[0]
    deep = b"[" * 300_000 + b"]" * 300_000
    response = await adapter.handle("POST", "/v2/models/adder/infer", {}, deep)
    assert response.status == 400
    assert b"nested too deeply" in response.body[0]


async def test_a_killed_decoding_process_fails_one_request_and_is_replaced(
    adapter: RestAdapter,
) -> None:
    process = adapter.dataplane.decoding
    assert (await adapter.handle("POST", "/v2/models/adder/infer", {}, body(100_000))).status == 200
    child = process._child
    assert child is not None
    os.kill(child.pid, 9)  # as the kernel's OOM killer would
    response = await adapter.handle("POST", "/v2/models/adder/infer", {}, body(100_000))
    assert response.status == 503  # this request fails
    assert b"retry" in response.body[0]
    assert (await adapter.handle("POST", "/v2/models/adder/infer", {}, body(100_000))).status == 200
    assert isinstance(process, decoding.DecodingProcess)


async def test_the_decoding_process_returns_the_request_as_the_loop_would_decode_it() -> None:
    """Everything the loop's decoder reads comes back from the process, the request's
    parameters included: the response cache keys on them and the warm-up gate's marks ride
    in them, so a large body must not lose them."""
    from kiln_runtime.protocol import rest

    document = orjson.loads(body(1_000))
    document["id"] = "r1"
    document["parameters"] = {
        "kiln_cache_bypass": True, "kiln_warmup": True, "timeout": 5_000_000, "tag": "x"
    }  # fmt: skip
    payload = orjson.dumps(document)
    process = decoding.DecodingProcess()
    try:
        got = await process.decode("adder", "1", {}, payload, 1 << 30)
    finally:
        process.close()
    want = rest.decode_infer("adder", "1", {}, payload, 1 << 30)
    assert got.parameters == want.parameters == document["parameters"]
    assert (got.id, got.timeout_seconds, got.binary_output) == ("r1", 5.0, False)
    assert got.warmup is want.warmup is True
    assert [(o.name, o.binary) for o in got.outputs] == [("COUNT", False)]
    for ours, theirs in zip(got.inputs, want.inputs, strict=True):
        assert (ours.name, ours.datatype) == (theirs.name, theirs.datatype)
        np.testing.assert_array_equal(ours.data, theirs.data)

"""Infer requests the HTTP/1.1 server refuses before the data plane sees them are counted in
``kiln_requests_total`` once, under the code of the refusal; other requests are not."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from kiln_runtime.config import parse_config
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.httpserver import HttpServer
from kiln_runtime.protocol.rest import RestAdapter

from .fakes import Adder
from .test_outcome_codes import codes

BODY = (
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]},'
    b'{"name":"B","datatype":"INT64","shape":[1,4],"data":[1,2,3,4]}]}'
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[DataPlane, int]]:
    document = {
        "model": {
            "name": "adder", "version": "1",
            "inputs": [{"name": "A", "datatype": "FP32", "shape": [4]},
                       {"name": "B", "datatype": "INT64", "shape": [4]}],
            "outputs": [{"name": "SUM", "datatype": "FP32", "shape": [4]},
                        {"name": "COUNT", "datatype": "INT32", "shape": [1]}],
        },
        "http": {"maxHeaderBytes": 4096, "headerTimeoutSeconds": 0.2, "bodyTimeoutSeconds": 0.2},
    }  # fmt: skip
    dp = DataPlane(parse_config(document), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)
    server = HttpServer(RestAdapter(dp))
    port = await server.start("127.0.0.1", 0)
    yield dp, port
    await server.stop()
    await dp.stop()


async def exchange(port: int, data: bytes, wait: float = 2.0) -> bytes:
    """Send ``data``, read until the server closes (or answers a kept-alive request)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(1 << 16), wait)
    finally:
        writer.close()


def post(length: int | None = None, path: bytes = b"/v2/models/adder/infer") -> bytes:
    size = len(BODY) if length is None else length
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path, size)


@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        (post(10**9), b"413", "invalid"),
        (post()[:-2] + b"X-Big: " + b"v" * 8000 + b"\r\n", b"431", "invalid"),  # still coming
        (post() + BODY[:10], b"408", "deadline"),  # the rest of the body never comes
        (b"POST /v2/models/adder/infer HTTP/1.1\r\nHost: x\r\n", b"408", "deadline"),
        (post(-5), b"400", "invalid"),
    ],
    ids=["body-too-large", "headers-too-large", "body-timeout", "header-timeout", "malformed"],
)
async def test_refused_infer_requests_are_counted_once(
    served: tuple[DataPlane, int], data: bytes, status: bytes, code: str
) -> None:
    dp, port = served
    answer = await exchange(port, data)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    await asyncio.sleep(0.3)  # past every timer: nothing else is counted
    assert codes(dp) == {code: (1, 1)}
    assert dp.inflight == 0


async def test_answered_requests_count_once_and_other_refusals_not_at_all(
    served: tuple[DataPlane, int],
) -> None:
    dp, port = served
    assert (await exchange(port, post() + BODY)).startswith(b"HTTP/1.1 200")
    refused_probe = b"GET /v2/health/ready HTTP/1.1\r\nX-Big: " + b"v" * 8000 + b"\r\n"
    assert (await exchange(port, refused_probe)).startswith(b"HTTP/1.1 431")
    assert codes(dp) == {"ok": (1, 1)}

"""Error messages quote at most a bounded prefix of what the client sent (issue 39, item 7)."""

from collections.abc import AsyncIterator

import orjson
import pytest

from kiln_runtime import errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.rest import RestAdapter

from .fakes import Adder, config

LONG = "m" * 100_000


@pytest.fixture
async def adapter() -> AsyncIterator[RestAdapter]:
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)
    yield RestAdapter(dp)
    await dp.stop()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", f"/v2/models/{LONG}", b""),  # unknown model: 404
        ("GET", f"/{LONG}", b""),  # no route: 404
        ("DELETE", f"/v2/{LONG}", b""),  # 405
        ("POST", f"/v2/models/{LONG}/infer",  # infer on an unknown model
         orjson.dumps({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]})),
        ("POST", "/v2/models/adder/infer",  # an unknown input's name
         orjson.dumps({"inputs": [{"name": LONG, "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]})),
    ],
    ids=["model", "route", "method", "infer-model", "input-name"],
)  # fmt: skip
async def test_an_error_quotes_a_bounded_prefix(
    adapter: RestAdapter, method: str, path: str, body: bytes
) -> None:
    response = await adapter.handle(method, path, {}, body)
    assert 400 <= response.status < 500
    message = orjson.loads(b"".join(bytes(part) for part in response.body))["error"]
    assert "mmmm" in message  # the value is quoted...
    assert len(message) <= errors.MAX_MESSAGE_CHARS + 64  # ...but not whole
    assert "characters)" in message


def test_clip_keeps_short_values_whole() -> None:
    assert errors.clip("mlp") == "mlp"
    assert errors.clip("x" * 200) == "x" * errors.QUOTE_CHARS + "... (200 characters)"

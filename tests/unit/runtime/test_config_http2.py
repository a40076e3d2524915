"""The ``http2`` section of the runtime config: the gRPC port's limits (``Http2Limits``)."""

import re
from typing import Any

import pytest

from kiln_runtime.config import ConfigError, Http2Limits, parse_config, to_document


def document(**http2: Any) -> dict[str, Any]:
    tensor = {"name": "x", "datatype": "FP32", "shape": [4]}
    return {"model": {"name": "m", "inputs": [tensor], "outputs": [tensor]}, "http2": http2}


def test_every_limit_has_a_default() -> None:
    config = parse_config(document())
    assert config.http2 == Http2Limits()
    assert "http2" not in to_document(config)  # the defaults are not written out


def test_limits_are_read_and_written_back() -> None:
    config = parse_config(document(maxConnections=10, idleTimeoutSeconds=5, resetsPerSecond=1.5))
    assert config.http2.max_connections == 10
    assert config.http2.idle_timeout_seconds == 5.0
    assert config.http2.resets_per_second == 1.5
    assert parse_config(to_document(config)) == config


def test_the_health_budget_may_be_zero() -> None:
    assert parse_config(document(healthConnections=0)).http2.health_connections == 0
    assert Http2Limits().health_connections == 32


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"maxConnections": 0}, "http2.maxConnections"),
        ({"maxConnections": 1.5}, "http2.maxConnections"),
        ({"healthConnections": -1}, "http2.healthConnections"),
        ({"idleTimeoutSeconds": 0}, "http2.idleTimeoutSeconds"),
        ({"maxConnection": 3}, "http2: unknown key"),
        ({"maxHeaderListSize": 2 << 20}, "http2.maxHeaderListSize"),
        ({"processBufferBytes": 1 << 20}, "http2.processBufferBytes"),
    ],
)
def test_a_bad_limit_is_named(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(document(**section))

"""The runtime config: the contract the operator renders; bad documents name their field."""

import json
import re
from typing import Any

import pytest

from kiln_runtime.config import ConfigError, parse_config, parse_config_text, to_document


def minimal() -> dict[str, Any]:
    return {
        "model": {
            "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
            "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
        }
    }


def test_the_contract_example_parses_with_every_field() -> None:
    document = {
        "model": {
            "name": "mlp", "version": "1", "format": "torchscript",
            "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}],
            "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}],
        },
        "optimization": {"mode": "eager", "precision": "fp32", "cudaGraphs": False,
                         "device": "auto"},
        "batching": {"maxBatchSize": 32, "maxQueueDelayMicroseconds": 2000, "maxQueueSize": 256},
        "warmup": {"batchSizes": [1, 8, 32]},
        "drain": {"timeoutSeconds": 30},
        "connections": {"maxAgeSeconds": 30, "maxAgeGraceSeconds": 10},
        "http": {"maxConnections": 100, "healthConnections": 4, "maxHeaderBytes": 8192,
                 "maxPipelinedRequests": 4, "connectionBufferBytes": 1048576,
                 "processBufferBytes": 67108864, "maxDecompressedBytes": 0,
                 "offLoopDecodeBytes": 65536, "headerTimeoutSeconds": 5.0,
                 "bodyTimeoutSeconds": 30.0, "keepAliveTimeoutSeconds": 60.0,
                 "writeTimeoutSeconds": 20.0},
    }  # fmt: skip
    config = parse_config(document)
    assert config.model.name == "mlp"
    assert config.model.inputs[0].shape == (512,)
    assert config.batching.max_queue_delay_microseconds == 2000
    assert config.warmup_batch_sizes() == (1, 8, 32)
    assert config.connections.max_age_seconds == 30
    assert config.http.max_connections == 100 and config.http.header_timeout_seconds == 5
    assert to_document(config) == {
        **document,
        "drain": {"timeoutSeconds": 30.0},
        "connections": {"maxAgeSeconds": 30.0, "maxAgeGraceSeconds": 10.0},
    }


def test_defaults_fill_everything_but_inputs_and_outputs() -> None:
    config = parse_config(minimal(), model_name="m")
    assert config.model.name == "m"
    assert config.model.format == "torchscript"
    assert config.optimization.mode == "eager"
    assert config.batching.max_batch_size == 32
    assert config.drain.timeout_seconds == 30.0


def test_command_line_name_wins_over_document_name() -> None:
    document = minimal()
    document["model"]["name"] = "from-doc"
    assert parse_config(document, model_name="from-cli").model.name == "from-cli"
    assert parse_config(document).model.name == "from-doc"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"batching": {"maxBatchSize": 0}}, "batching.maxBatchSize"),
        ({"batching": {"maxBatchSize": True}}, "batching.maxBatchSize"),
        ({"batching": {"maxQueueSiz": 3}}, "batching: unknown key"),
        ({"optimization": {"mode": "turbo"}}, "optimization.mode"),
        ({"optimization": {"cudaGraphs": "yes"}}, "optimization.cudaGraphs"),
        ({"warmup": {"batchSizes": [1, -2]}}, "warmup.batchSizes[1]"),
        ({"drain": {"timeoutSeconds": -1}}, "drain.timeoutSeconds"),
        ({"connections": {"maxAgeSeconds": -5}}, "connections.maxAgeSeconds"),
        ({"connections": {"maxAgeGraceSeconds": 0}}, "connections.maxAgeGraceSeconds"),
        ({"connections": {"maxAge": 5}}, "connections: unknown key"),
        ({"http": {"maxConnections": 0}}, "http.maxConnections"),
        ({"http": {"maxHeaderBytes": 10}}, "http.maxHeaderBytes"),
        ({"http": {"headerTimeoutSeconds": 0}}, "http.headerTimeoutSeconds"),
        ({"http": {"maxConns": 5}}, "http: unknown key"),
    ],
)
def test_a_bad_field_is_named(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        parse_config({**minimal(), **patch}, model_name="m")


@pytest.mark.parametrize(
    ("tensor", "field"),
    [
        ({"name": "x", "datatype": "FP8", "shape": [1]}, "datatype"),
        ({"name": "x", "datatype": "FP32", "shape": [0]}, r"shape\[0\]"),
        ({"name": "x", "datatype": "FP32", "shape": "512"}, "shape"),
        ({"name": "", "datatype": "FP32", "shape": [1]}, "name"),
    ],
)
def test_a_bad_tensor_is_named(tensor: dict[str, Any], field: str) -> None:
    document = minimal()
    document["model"]["inputs"] = [tensor]
    with pytest.raises(ConfigError, match=rf"model\.inputs\[0\]\.{field}"):
        parse_config(document, model_name="m")


def test_inputs_are_required_and_names_unique() -> None:
    with pytest.raises(ConfigError, match=r"model\.inputs"):
        parse_config({"model": {"outputs": minimal()["model"]["outputs"]}}, model_name="m")
    document = minimal()
    document["model"]["inputs"] *= 2
    with pytest.raises(ConfigError, match="duplicate"):
        parse_config(document, model_name="m")
    with pytest.raises(ConfigError, match=r"model\.name"):
        parse_config(minimal())


def test_text_that_is_not_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config_text("{model:", model_name="m")
    assert parse_config_text(json.dumps(minimal()), model_name="m").model.name == "m"


def test_warmup_sizes_are_capped_at_the_batch_size_and_deduplicated() -> None:
    document = {**minimal(), "batching": {"maxBatchSize": 8}, "warmup": {"batchSizes": [32, 1, 8]}}
    assert parse_config(document, model_name="m").warmup_batch_sizes() == (1, 8)


def test_request_size_limit_follows_the_largest_batch() -> None:
    config = parse_config({**minimal(), "batching": {"maxBatchSize": 4}}, model_name="m")
    assert config.max_request_bytes() == 4 * 512 * 24 + (64 << 10)
    document = minimal()
    document["model"]["inputs"][0]["shape"] = [-1, 3]
    assert parse_config(document, model_name="m").max_request_bytes() == 64 << 20


def test_a_section_from_a_newer_operator_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_config({**minimal(), "autoscalingHints": {"x": 1}}, model_name="m")
    assert config.model.name == "m"
    assert "autoscalingHints" in caplog.text

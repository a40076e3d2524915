"""Limits derived from the container's own (``kiln_runtime/container.py``, issue 39 item 5)."""

import resource
from pathlib import Path

from kiln_runtime import container
from kiln_runtime.config import Http2Limits, HttpLimits, parse_config

from .fakes import config

GiB = 1 << 30


def test_without_container_limits_the_defaults_stand() -> None:
    fit = container.fit(config(), memory_limit=None, open_files=1 << 20)
    assert fit.config.http == HttpLimits()
    assert fit.config.http2 == Http2Limits()
    assert fit.metrics_connections == container.METRICS_CONNECTIONS


def test_request_buffers_take_a_quarter_of_the_memory_limit() -> None:
    fit = container.fit(config(), memory_limit=2 * GiB, open_files=1 << 20)
    http, grpc = fit.config.http, fit.config.http2
    assert http.process_buffer_bytes == grpc.process_buffer_bytes == 256 << 20  # 1/8 each
    assert http.process_buffer_bytes + grpc.process_buffer_bytes == 2 * GiB // 4
    assert grpc.connection_buffer_bytes <= grpc.process_buffer_bytes
    assert fit.report["http"]["process_buffer_bytes"] == 256 << 20
    assert fit.report["memory_limit_bytes"] == 2 * GiB


def test_a_buffer_always_holds_one_largest_request() -> None:
    fit = container.fit(config(), memory_limit=64 << 20, open_files=1 << 20)
    floor = config().max_request_bytes() + (1 << 20)
    assert fit.config.http.process_buffer_bytes == max(8 << 20, floor)


def test_connection_caps_fit_in_1024_descriptors() -> None:
    fit = container.fit(config(), memory_limit=None, open_files=1024)
    http, grpc = fit.config.http, fit.config.http2
    used = (
        http.max_connections + http.health_connections + grpc.max_connections
        + grpc.health_connections + fit.metrics_connections + container.FD_RESERVE
    )  # fmt: skip
    assert used <= 1024
    assert http.health_connections == grpc.health_connections == 32
    assert http.max_connections == grpc.max_connections > 400
    assert fit.report["grpc"]["max_connections"] == grpc.max_connections


def test_limits_the_config_sets_are_kept() -> None:
    document = {
        "model": {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                  "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}]},
        "http": {"processBufferBytes": GiB, "maxConnections": 2000},
        "http2": {"maxConnections": 3000},
    }  # fmt: skip
    fit = container.fit(parse_config(document), memory_limit=GiB, open_files=1024)
    assert fit.config.http.process_buffer_bytes == GiB
    assert fit.config.http.max_connections == 2000
    assert fit.config.http2.max_connections == 3000
    assert fit.config.http2.process_buffer_bytes == GiB // 8  # not set: derived
    assert fit.report["explicit"] == [
        "http.maxConnections", "http.processBufferBytes", "http2.maxConnections",
    ]  # fmt: skip


def test_the_cgroup_limit_is_read_v2_then_v1(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert container.read_memory_limit((v2, v1)) is None  # neither readable
    v1.write_text("9223372036854771712\n")  # v1's "no limit"
    assert container.read_memory_limit((v2, v1)) is None
    v1.write_text("1073741824\n")
    assert container.read_memory_limit((v2, v1)) == GiB
    v2.write_text("max\n")
    assert container.read_memory_limit((v2, v1)) is None
    v2.write_text("536870912\n")
    assert container.read_memory_limit((v2, v1)) == 512 << 20


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        raised = container.raise_open_files()
        assert raised == (1 << 20 if hard == resource.RLIM_INFINITY else hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (raised, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

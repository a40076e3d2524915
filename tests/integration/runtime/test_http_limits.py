"""HTTP/1.1 against hostile and careless clients: each limit trips, everyone else is served.

A real runtime process on loopback, with its limits lowered so each attack is short. During
every attack a probe client sends MLP inferences every 10 ms: all must succeed, and their p99
and the runtime's peak RSS are printed (``ABUSE | …`` lines; the table in
docs/benchmarks/runtime.md). Every attack is bounded in time and bytes.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .abuse import PROBE_BODY, Watch, rss_bytes
from .conftest import ModelFactory
from .runtime_process import HOST, Runtime, running

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 40
HEALTH_CONNECTIONS = 4
PROCESS_BUFFER_BYTES = 64 << 20
WRITE_TIMEOUT_SECONDS = 2.0
LIMITS = {
    "maxConnections": MAX_CONNECTIONS,
    "healthConnections": HEALTH_CONNECTIONS,
    "maxHeaderBytes": 16384,
    "headerTimeoutSeconds": 1.0,
    "bodyTimeoutSeconds": 1.0,
    "keepAliveTimeoutSeconds": 1.0,
    "writeTimeoutSeconds": WRITE_TIMEOUT_SECONDS,
    "maxPipelinedRequests": 8,
    "connectionBufferBytes": 1 << 20,
    "processBufferBytes": PROCESS_BUFFER_BYTES,
}
# What the runtime may grow by during an attack: buffers the limits allow, plus the Python heap
# a few hundred requests leave behind. The MLP's own memory is in the starting RSS.
RSS_GROWTH_BUDGET = PROCESS_BUFFER_BYTES + (64 << 20)
ATTACK_SECONDS = 2.5


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    model = example_model("mlp", http=LIMITS)
    with running(model, tmp_path_factory.mktemp("logs")) as served:
        yield served


def connect(runtime: Runtime) -> socket.socket:
    return socket.create_connection((HOST, runtime.http_port), timeout=5)


def get(runtime: Runtime, path: str, method: str = "GET") -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=5)
    connection.request(method, path)
    response = connection.getresponse()
    body = response.read()
    return response.status, json.loads(body) if body else {}


def read_until_closed(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def assert_survived(watch: Watch, attack: str, result: str) -> None:
    watch.report(attack, result)
    assert watch.failures == [], watch.failures[:5]
    assert len(watch.latencies) > 20
    assert watch.peak_rss - watch.start_rss < RSS_GROWTH_BUDGET
    assert watch.p99_ms < 1000  # the event loop never stalled for seconds, as it once did


# ------------------------------------------------------------------ compatibility


def test_health_endpoints_answer_triton_codes_with_kserve_bodies(runtime: Runtime) -> None:
    assert get(runtime, "/v2/health/live") == (200, {"live": True})
    assert get(runtime, "/v2/health/ready") == (200, {"ready": True})
    assert get(runtime, "/v2/models/mlp/ready") == (200, {"name": "mlp", "ready": True})


def test_an_h2c_upgrade_is_ignored_and_the_request_answered(runtime: Runtime) -> None:
    with connect(runtime) as sock:
        sock.sendall(
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        received = read_until_closed(sock, 5)
    assert re.findall(rb"HTTP/1\.1 (\d{3})", received) == [b"200", b"200"]
    assert b"101" not in received.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("method", "path", "extension"),
    [
        ("GET", "/v2/repository/index", "model repository"),
        ("POST", "/v2/repository/models/mlp/load", "model repository"),
        ("GET", "/v2/systemsharedmemory/status", "system shared memory"),
        ("POST", "/v2/cudasharedmemory/region/r/unregister", "CUDA shared memory"),
        ("GET", "/v2/trace/setting", "trace"),
        ("POST", "/v2/models/mlp/trace/setting", "trace"),
        ("GET", "/v2/logging", "logging"),
    ],
)
def test_triton_extensions_kiln_lacks_are_404_naming_them(
    runtime: Runtime, method: str, path: str, extension: str
) -> None:
    status, body = get(runtime, path, method)
    assert status == 404
    assert f"the {extension} extension is not supported" in str(body["error"])


def test_statistics_extension_counts_what_the_runtime_served(runtime: Runtime) -> None:
    import tritonclient.http as triton_http

    connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=5)
    for _ in range(3):
        connection.request("POST", "/v2/models/mlp/infer", body=PROBE_BODY)
        assert connection.getresponse().read()
    connection.request("POST", "/v2/models/mlp/infer", body=b"{")
    assert connection.getresponse().status == 400
    stats = triton_http.InferenceServerClient(runtime.http_url).get_inference_statistics("mlp")
    (model,) = stats["model_stats"]
    assert model["name"] == "mlp"
    inference = model["inference_stats"]
    assert inference["success"]["count"] >= 3 and inference["success"]["ns"] > 0
    assert inference["fail"]["count"] >= 1
    assert model["execution_count"] >= 1 and model["inference_count"] >= 3
    assert inference["compute_infer"]["count"] == model["execution_count"]
    assert model["last_inference"] > 0
    assert get(runtime, "/v2/models/nope/stats")[0] == 404
    # gRPC ModelStatistics answers the same document, from the same counters
    import tritonclient.grpc as triton_grpc

    grpc_client = triton_grpc.InferenceServerClient(runtime.grpc_url)
    (over_grpc,) = grpc_client.get_inference_statistics("mlp", as_json=True)["model_stats"]
    now = triton_http.InferenceServerClient(runtime.http_url).get_inference_statistics("mlp")
    (model,) = now["model_stats"]
    assert over_grpc["name"] == "mlp" and over_grpc["version"] == model["version"]
    for outcome in ("success", "fail"):  # as_json writes 64-bit integers as strings
        assert (
            int(over_grpc["inference_stats"][outcome]["count"])
            == (model["inference_stats"][outcome]["count"])
        )
    assert int(over_grpc["execution_count"]) == model["execution_count"]
    with pytest.raises(triton_grpc.InferenceServerException, match="unknown model"):
        grpc_client.get_inference_statistics("nope")
    grpc_client.close()


def test_deep_json_is_400_and_a_gzip_bomb_is_refused_without_stalling(runtime: Runtime) -> None:
    deep = b'{"inputs":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    bomb = gzip.compress(b" " * (60 << 20), compresslevel=9)  # ~60 KB inflating to 60 MiB
    with Watch(runtime) as watch:
        deadline = time.monotonic() + ATTACK_SECONDS
        sent = 0
        while time.monotonic() < deadline and sent < 2000:
            connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=10)
            body, headers = (deep, {}) if sent % 2 else (bomb, {"Content-Encoding": "gzip"})
            connection.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
            response = connection.getresponse()
            error = json.loads(response.read())["error"]
            assert response.status == 400, error
            assert ("nested too deeply" if sent % 2 else "exceeds") in error
            sent += 1
    assert_survived(
        watch,
        f"gzip bombs (60 KB -> 60 MiB) alternating with 200k-deep JSON, {sent} requests",
        "every one 400 (inflation stops at the limit; parsing off the event loop)",
    )
    assert 'code="invalid"' in runtime.metrics()


# ------------------------------------------------------------------ limits


def test_a_header_that_never_ends_is_cut_at_the_limit(runtime: Runtime) -> None:
    """131 MB headers are refused after the first ~16 KiB: the rest is never read."""
    largest = 0
    attempts = 0
    with Watch(runtime) as watch:
        deadline = time.monotonic() + ATTACK_SECONDS
        while time.monotonic() < deadline and attempts < 50:
            attempts += 1
            with connect(runtime) as sock:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Long: ")
                sent = 0
                chunk = b"a" * 65536
                try:
                    while sent < 131 << 20:
                        sock.sendall(chunk)
                        sent += len(chunk)
                except OSError:
                    pass  # the server closed: the rest is not wanted
                received = read_until_closed(sock, 2)
            assert received.startswith(b"HTTP/1.1 431"), received[:100]
            largest = max(largest, sent)
            time.sleep(ATTACK_SECONDS / 50)  # spread over the attack, so the probe sees it
    assert largest < 16 << 20  # closed long before 131 MB (kernel buffers absorb a few MB)
    assert_survived(
        watch,
        f"131 MB header, {attempts} times",
        f"431 and closed after at most {largest >> 20} MiB sent (kernel buffers)",
    )


def test_slowloris_is_timed_out_and_the_port_keeps_serving(runtime: Runtime) -> None:
    """More slow connections than the cap: health probes still served, every one cut."""
    socks: list[socket.socket] = []
    total = MAX_CONNECTIONS + HEALTH_CONNECTIONS + 10
    with Watch(runtime) as watch:
        started = time.monotonic()
        for _ in range(total):
            sock = connect(runtime)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # never finished
            socks.append(sock)
        # every connection is taken: a probe (the kubelet's) is still answered
        assert get(runtime, "/v2/health/live") == (200, {"live": True})
        endings = [read_until_closed(sock, 3) for sock in socks]
        waited = time.monotonic() - started
    for sock in socks:
        sock.close()
    timed_out = sum(ending.startswith(b"HTTP/1.1 408") for ending in endings)
    refused = sum(ending.startswith(b"HTTP/1.1 503") for ending in endings)
    evicted = sum(ending == b"" for ending in endings)  # made room for a probe
    assert timed_out + refused + evicted == total
    assert timed_out >= MAX_CONNECTIONS - 1  # the probe holds one connection
    assert waited < 4  # the 1 s header timeout cut them all
    assert_survived(
        watch,
        f"slowloris: {total} connections (cap {MAX_CONNECTIONS} + {HEALTH_CONNECTIONS} health) "
        "never finishing their headers",
        f"{timed_out} cut by 408 at the 1 s header timeout, {refused} refused 503, "
        f"{evicted} evicted for a health probe; health probe answered while full",
    )


def test_a_body_that_never_arrives_and_an_idle_keep_alive_are_closed(runtime: Runtime) -> None:
    with connect(runtime) as slow_body:
        slow_body.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        assert read_until_closed(slow_body, 3).startswith(b"HTTP/1.1 408")
    with connect(runtime) as idle:
        idle.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        answer = read_until_closed(idle, 4)
        assert answer.startswith(b"HTTP/1.1 200")
        assert 0.8 < time.monotonic() - started < 3  # closed by the 1 s keep-alive timeout


def test_pipelining_without_reading_is_paused_then_dropped(runtime: Runtime) -> None:
    """Requests pipelined on connections that never read their answers: reading pauses at
    the high-water mark, memory stays bounded, the server lets go of every such connection
    (write timeout, or the timeout of the request left half-sent), the probe is served."""
    request = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(PROBE_BODY), PROBE_BODY)
    )
    pushed = 0
    with Watch(runtime) as watch:
        sockets_before = open_sockets(runtime)
        attackers = [connect(runtime) for _ in range(8)]
        for sock in attackers:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
        started = time.monotonic()
        sockets_during = 0
        while time.monotonic() < started + ATTACK_SECONDS and pushed < 200_000:
            for sock in attackers:
                with contextlib.suppress(OSError):  # BlockingIOError: the server stopped reading
                    pushed += sock.send(request * 16) // len(request)
            if not sockets_during and time.monotonic() > started + 0.3:
                sockets_during = open_sockets(runtime)  # before any timeout could fire
            time.sleep(0.005)
        rss_during = rss_bytes(runtime.process.pid)
        time.sleep(WRITE_TIMEOUT_SECONDS + 0.5)
        sockets_after = open_sockets(runtime)
    for sock in attackers:
        sock.close()
    assert sockets_during >= sockets_before + len(attackers) - 1  # the attack did hold them
    assert sockets_after <= sockets_before  # and the server let go of every one
    assert rss_during - watch.start_rss < RSS_GROWTH_BUDGET
    assert_survived(
        watch,
        f"pipelining without reading answers: 8 connections, {pushed} requests sent",
        f"reading paused at the high-water mark; the server closed all 8 within "
        f"{WRITE_TIMEOUT_SECONDS + 0.5:.1f} s; RSS {(rss_during - watch.start_rss) >> 20} MiB "
        "above the start at the end of the attack",
    )


def open_sockets(runtime: Runtime) -> int:
    """Sockets the runtime process holds open (listeners, clients, its metrics server)."""
    fds = Path(f"/proc/{runtime.process.pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


def test_an_oversized_body_is_413_before_it_is_read(runtime: Runtime) -> None:
    connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=5)
    connection.putrequest("POST", "/v2/models/mlp/infer")
    connection.putheader("Content-Length", str(1 << 30))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert "exceeds the limit" in json.loads(response.read())["error"]

"""The response cache in real runtime processes, through tritonclient: hits over HTTP (binary
and JSON) and gRPC, misses on any change, and a real redis-server shared by two runtimes,
poisoned, then killed mid-load without one failed request."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from kiln_localcluster.processes import free_ports
from kiln_runtime.examples import build
from tests.sessioncluster import missing_component

from .conftest import ModelFactory
from .runtime_process import HOST, Runtime, running, start

pytestmark = pytest.mark.integration

REFERENCE, _ = build("mlp")
PASSWORD = "kiln-test-password"


def expected(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return REFERENCE(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def batch(seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 512)).astype(np.float32)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def http_infer(
    runtime: Runtime, x: np.ndarray, *, binary: bool = True, **options: object
) -> np.ndarray:
    client = triton_http.InferenceServerClient(runtime.http_url)
    tensor = triton_http.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("mlp", [tensor], **options)
    output: np.ndarray = result.as_numpy("OUTPUT__0")
    client.close()
    return output


def grpc_infer(runtime: Runtime, x: np.ndarray) -> np.ndarray:
    client = triton_grpc.InferenceServerClient(runtime.grpc_url)
    tensor = triton_grpc.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    output: np.ndarray = client.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
    client.close()
    return output


def test_identical_requests_hit_over_http_and_grpc_and_changes_miss(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    model = example_model("mlp", cache={"maxBytes": 1 << 20, "ttlSeconds": 60})
    with running(model, tmp_path) as runtime:
        x = batch(1)
        want = expected(x)
        np.testing.assert_allclose(http_infer(runtime, x), want, rtol=1e-4, atol=1e-5)
        batches = metric(runtime.metrics(), "kiln_batch_size_count")
        for answer in (
            http_infer(runtime, x),  # binary tensors
            http_infer(runtime, x, binary=False),  # JSON: the same values, the same key
            grpc_infer(runtime, x),
        ):
            np.testing.assert_allclose(answer, want, rtol=1e-4, atol=1e-5)
        text = runtime.metrics()
        assert metric(text, "kiln_cache_hits_total", source="local") == 3
        assert metric(text, "kiln_cache_misses_total") == 1
        assert metric(text, "kiln_batch_size_count") == batches  # no hit entered a batch

        changed = x.copy()
        changed.view(np.uint32)[0, 100] ^= 1  # one bit of one input
        requested = triton_http.InferRequestedOutput("OUTPUT__0", binary_data=True)
        http_infer(runtime, changed)
        http_infer(runtime, x, outputs=[requested])
        http_infer(runtime, x, parameters={"variant": "b"})
        http_infer(runtime, batch(1, rows=2)[:1].copy())  # same values: a hit
        text = runtime.metrics()
        assert metric(text, "kiln_cache_misses_total") == 4
        assert metric(text, "kiln_cache_hits_total", source="local") == 4
        assert metric(text, "kiln_cache_bytes") > 0
        assert metric(text, "kiln_cache_lookup_duration_seconds_count") == 8


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, password=PASSWORD, socket_timeout=5)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        missing_component("redis-server is not installed (e2e/system-deps.sh installs it)")
    assert binary is not None
    (port,) = free_ports(1)
    command = [
        binary, "--bind", HOST, "--port", str(port), "--requirepass", PASSWORD,
        "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
    ]  # fmt: skip
    log = (tmp_path / "redis.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = RedisServer(process, port)
    deadline = time.monotonic() + 10
    while True:
        try:
            server.client().ping()
            break
        except redis.RedisError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((tmp_path / "redis.log").read_text()) from None
            time.sleep(0.05)
    try:
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        log.close()


def _shared_runtimes(
    example_model: ModelFactory, tmp_path: Path, server: RedisServer
) -> tuple[Runtime, Runtime]:
    cache = {
        "maxBytes": 1 << 20,
        "ttlSeconds": 60,
        "keyPrefix": "kiln:test/mlp:",
        # generous: this host runs other tests beside (a real deployment's Redis: ~1 ms)
        "redis": {"address": f"{HOST}:{server.port}", "timeoutMilliseconds": 250},
    }
    model = example_model("mlp", cache=cache)
    env = {"KILN_CACHE_REDIS_PASSWORD": PASSWORD}
    first, second = (
        start(model / "model.pt", tmp_path, config=model / "config.json", name="mlp", env=env)
        for _ in range(2)
    )
    for runtime in (first, second):
        runtime.wait_for("/v2/health/ready", 200, seconds=60)
    return first, second


def test_replicas_share_answers_through_redis_and_a_poisoned_value_is_a_miss(
    example_model: ModelFactory, tmp_path: Path, redis_server: RedisServer
) -> None:
    first, second = _shared_runtimes(example_model, tmp_path, redis_server)
    try:
        x = batch(2)
        want = expected(x)
        np.testing.assert_allclose(http_infer(first, x), want, rtol=1e-4, atol=1e-5)
        client = redis_server.client()
        deadline = time.monotonic() + 5
        while not (keys := client.keys("kiln:test/mlp:*")) and time.monotonic() < deadline:
            time.sleep(0.01)  # the write goes out after the answer
        assert len(keys) == 1
        np.testing.assert_allclose(grpc_infer(second, x), want, rtol=1e-4, atol=1e-5)
        assert metric(second.metrics(), "kiln_cache_hits_total", source="redis") == 1

        y = batch(3)
        http_infer(first, y)
        deadline = time.monotonic() + 5
        while len(keys := client.keys("kiln:test/mlp:*")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for key in keys:  # poison every stored answer: flip its last byte
            stored = client.get(key)
            assert isinstance(stored, bytes)
            value = bytearray(stored)
            value[-1] ^= 0x40
            client.set(key, bytes(value))
        np.testing.assert_allclose(http_infer(second, y), expected(y), rtol=1e-4, atol=1e-5)
        text = second.metrics()
        assert metric(text, "kiln_cache_redis_errors_total", operation="get", reason="corrupt") == 1
        assert metric(text, "kiln_cache_misses_total") == 1
    finally:
        for runtime in (first, second):
            runtime.terminate()


def test_redis_killed_mid_load_fails_no_request(
    example_model: ModelFactory, tmp_path: Path, redis_server: RedisServer
) -> None:
    """8 clients, 150 requests each on two runtimes sharing Redis, half of them over 40 popular
    inputs (hits), half new ones (misses, which ask Redis); Redis is SIGKILLed a third of the
    way through. Every request is answered, right."""
    runtimes = _shared_runtimes(example_model, tmp_path, redis_server)
    inputs = [batch(100 + i) for i in range(40)]
    answers = [expected(x) for x in inputs]
    failures: list[str] = []
    done = [0]
    lock = threading.Lock()

    def client(index: int) -> None:
        runtime = runtimes[index % 2]
        rng = np.random.default_rng(index)
        http = triton_http.InferenceServerClient(runtime.http_url, network_timeout=30)
        for n in range(150):
            i = int(rng.integers(2 * len(inputs)))
            if i < len(inputs):
                x, want = inputs[i], answers[i]
            else:
                x = batch(10_000 + 1000 * index + n)
                want = expected(x)
            tensor = triton_http.InferInput("INPUT__0", [1, 512], "FP32")
            tensor.set_data_from_numpy(x)
            try:
                got = http.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            except Exception as error:  # every failure is counted
                with lock:
                    failures.append(repr(error))
            with lock:
                done[0] += 1
        http.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        shared = redis_server.client()
        while (done[0] < 400 or shared.dbsize() < 40) and time.monotonic() < deadline:
            time.sleep(0.01)  # a third done, and Redis in use: it holds answers
        redis_server.process.send_signal(signal.SIGKILL)
        redis_server.process.wait(10)
        killed_at = done[0]
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert done[0] == 8 * 150 and killed_at < done[0]
        texts = [runtime.metrics() for runtime in runtimes]
        errors = sum(metric(t, "kiln_cache_redis_errors_total") for t in texts)
        assert errors >= (8 * 150 - killed_at) / 4  # the loss was seen and counted, not hidden
        assert sum(metric(t, "kiln_cache_hits_total", source="redis") for t in texts) > 0
        assert sum(metric(t, "kiln_requests_total", code="ok") for t in texts) == 8 * 150
    finally:
        for runtime in runtimes:
            runtime.terminate()


def test_nothing_listens_where_redis_was_said_to_be(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    """A Redis that was never there: every request is served, each lookup counted failed."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        cache = {"redis": {"address": f"{HOST}:{port}", "timeoutMilliseconds": 20}}
        model = example_model("mlp", cache=cache)
        with running(model, tmp_path) as runtime:
            for seed in range(5):
                x = batch(200 + seed)
                answer = http_infer(runtime, x)
                np.testing.assert_allclose(answer, expected(x), rtol=1e-4, atol=1e-5)
            text = runtime.metrics()
            assert metric(text, "kiln_cache_misses_total") == 5
            assert metric(text, "kiln_cache_redis_errors_total", operation="get") == 5

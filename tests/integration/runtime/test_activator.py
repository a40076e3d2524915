"""The activator as a real process on loopback, in front of a real runtime process: a held
request (HTTP, and gRPC through tritonclient) is answered by the runtime once the runtime is
reported ready; beyond the count or past the deadline a client is told at once that the service
is waking; the demand and the metrics say what happened."""

import asyncio
import concurrent.futures
import http.client
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from kiln_localcluster.processes import free_ports
from kiln_operator.k8s import activator as activator_module
from kiln_operator.k8s.activator import Activators
from kiln_runtime.examples import build

from .conftest import ModelFactory
from .runtime_process import HOST, Runtime, running

pytestmark = pytest.mark.integration

MAX_HELD = 3
HOLD_SECONDS = 4.0
REFERENCE, _ = build("mlp")


@dataclass
class ActivatorProcess:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    control_port: int
    log: Path

    def control(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(HOST, self.control_port, timeout=10)
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload)
        answer = connection.getresponse()
        return answer.status, answer.read()

    def demand(self) -> dict[str, int]:
        status, body = self.control("GET", "/v1/demand")
        assert status == 200
        return {f"{s['namespace']}/{s['name']}": s["held"] for s in json.loads(body)["services"]}

    def wait_held(self, service: str, count: int, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while self.demand().get(service, 0) < count:
            assert time.monotonic() < deadline, f"{service} never held {count}: {self.demand()}"
            time.sleep(0.02)

    def report(self, service: str, runtime: Runtime | None) -> None:
        namespace, name = service.split("/")
        backends: dict[str, list[str]] = {"http": [], "grpc": []}
        if runtime is not None:
            backends = {"http": [runtime.http_url], "grpc": [runtime.grpc_url]}
        status, body = self.control("PUT", f"/v1/services/{namespace}/{name}/backends", backends)
        assert status == 204, body

    def metrics(self) -> str:
        return self.control("GET", "/metrics")[1].decode()


@contextmanager
def started_activator(log_dir: Path, *flags: str) -> Iterator[ActivatorProcess]:
    http_port, grpc_port, control_port = free_ports(3)
    log = log_dir / f"activator-{http_port}.log"
    command = [
        sys.executable, "-m", "kiln_runtime.activator", "--host", HOST,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--control-port", str(control_port), *flags,
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    started = ActivatorProcess(process, http_port, grpc_port, control_port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if started.control("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield started
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(15) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()


@pytest.fixture(scope="module")
def activator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActivatorProcess]:
    flags = [
        "--max-held-requests", str(MAX_HELD), "--hold-timeout-seconds", str(HOLD_SECONDS),
        "--max-held-bytes", str(1 << 20),
    ]  # fmt: skip
    with started_activator(tmp_path_factory.mktemp("activator"), *flags) as started:
        yield started


@pytest.fixture(scope="module")
def runtime(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    with running(example_model("mlp"), tmp_path_factory.mktemp("logs")) as served:
        yield served


def rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 512)).astype(np.float32)


def expected(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return REFERENCE(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def post_infer(
    port: int, host: str, x: np.ndarray, timeout: float = 30
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """An infer request over HTTP/1.1 naming the service by Host, as in-cluster DNS would."""
    document = {
        "inputs": [
            {"name": "INPUT__0", "datatype": "FP32", "shape": list(x.shape),
             "data": x.ravel().tolist()}
        ]
    }  # fmt: skip
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    connection.request(
        "POST", "/v2/models/mlp/infer", body=json.dumps(document),
        headers={"Host": host, "Content-Type": "application/json"},
    )  # fmt: skip
    answer = connection.getresponse()
    return answer.status, dict(answer.getheaders()), json.loads(answer.read())


def grpc_client(activator: ActivatorProcess, service: str) -> triton_grpc.InferenceServerClient:
    namespace, name = service.split("/")
    return triton_grpc.InferenceServerClient(
        f"{HOST}:{activator.grpc_port}",
        channel_args=[("grpc.default_authority", f"{name}.{namespace}.svc:8001")],
    )


def grpc_infer(
    client: triton_grpc.InferenceServerClient, x: np.ndarray, timeout: float
) -> triton_grpc.InferResult:
    tensor = triton_grpc.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("mlp", [tensor], client_timeout=timeout)


def test_a_held_http_request_is_answered_by_the_pod_reported_ready(
    activator: ActivatorProcess, runtime: Runtime
) -> None:
    x = rows(2, seed=1)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answer = pool.submit(post_infer, activator.http_port, "mlp.http-a.svc.cluster.local", x)
        activator.wait_held("http-a/mlp", 1)
        time.sleep(0.3)  # still held: no pod yet
        assert not answer.done()
        activator.report("http-a/mlp", runtime)
        status, headers, body = answer.result(timeout=30)
    assert status == 200, body
    assert headers.get("Via") == "1.1 kiln-activator"  # the answer says how it came
    got = np.array(body["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
    np.testing.assert_allclose(got, expected(x), rtol=1e-4, atol=1e-5)
    assert activator.demand() == {}
    # with a ready pod reported, the next request goes straight through
    assert post_infer(activator.http_port, "mlp.http-a", x)[0] == 200
    metrics = activator.metrics()
    assert "kiln_activator_wake_seconds_count 1.0" in metrics
    assert "kiln_activator_held_seconds_count" in metrics


def test_a_held_grpc_call_from_tritonclient_is_answered_by_the_pod_reported_ready(
    activator: ActivatorProcess, runtime: Runtime
) -> None:
    x = rows(3, seed=2)
    client = grpc_client(activator, "grpc-a/mlp")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answer = pool.submit(grpc_infer, client, x, 30.0)
        activator.wait_held("grpc-a/mlp", 1)
        assert not answer.done()
        activator.report("grpc-a/mlp", runtime)
        result = answer.result(timeout=30)
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT__0"),
        expected(x),
        rtol=1e-4,
        atol=1e-5,
    )
    client.close()


def test_beyond_the_count_clients_hear_at_once_that_the_service_wakes(
    activator: ActivatorProcess, runtime: Runtime
) -> None:
    x = rows(1, seed=3)
    with concurrent.futures.ThreadPoolExecutor(MAX_HELD) as pool:
        held = [
            pool.submit(post_infer, activator.http_port, "mlp.full", x) for _ in range(MAX_HELD)
        ]
        activator.wait_held("full/mlp", MAX_HELD)
        started = time.monotonic()
        status, headers, body = post_infer(activator.http_port, "mlp.full", x)
        assert time.monotonic() - started < 1.0
        assert status == 503 and int(headers["Retry-After"]) >= 1
        assert "is waking" in body["error"]
        client = grpc_client(activator, "full/mlp")
        with pytest.raises(InferenceServerException, match="is waking") as refused:
            grpc_infer(client, x, 10.0)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        client.close()
        activator.report("full/mlp", runtime)
        assert [future.result(timeout=30)[0] for future in held] == [200] * MAX_HELD
    assert 'kiln_activator_refused_total{reason="requests"} 2.0' in activator.metrics()


def test_a_request_held_past_its_deadline_is_told_the_service_wakes(
    activator: ActivatorProcess,
) -> None:
    x = rows(1, seed=4)
    started = time.monotonic()
    status, headers, body = post_infer(activator.http_port, "mlp.asleep", x)
    waited = time.monotonic() - started
    assert HOLD_SECONDS <= waited < HOLD_SECONDS + 2
    assert status == 503 and "no pod passed its warm-up gate" in body["error"]
    assert int(headers["Retry-After"]) >= 1
    # a gRPC client's own shorter deadline is kept: the call ends at it, not at the hold's
    client = grpc_client(activator, "asleep/mlp")
    started = time.monotonic()
    with pytest.raises(InferenceServerException):
        grpc_infer(client, x, 1.0)
    assert time.monotonic() - started < 2.0
    client.close()
    assert activator.demand() == {}


def test_a_host_without_a_namespace_is_refused_with_how_to_name_the_service(
    activator: ActivatorProcess,
) -> None:
    status, _, body = post_infer(activator.http_port, "mlp:8000", rows(1, seed=5))
    assert status == 404 and "NAME.NAMESPACE" in body["error"]


async def test_the_operator_reads_the_held_demand_and_reports_the_ready_pods(
    activator: ActivatorProcess, runtime: Runtime
) -> None:
    """kiln_operator.k8s.activator against the activator process: the demand the autoscaler
    wakes a service from, and the report that releases the held requests."""
    activators = Activators(f"{HOST}:{activator.control_port}")
    try:
        assert await activators.held(("op-a", "mlp")) == 0  # answered: nothing held
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post_infer, activator.http_port, "mlp.op-a", rows(1, seed=6))
            await asyncio.to_thread(activator.wait_held, "op-a/mlp", 1)
            await asyncio.sleep(1.1)  # past the cached read's age
            assert await activators.held(("op-a", "mlp")) == 1
            await activators.report(("op-a", "mlp"), [runtime.http_url], [runtime.grpc_url])
            assert (await asyncio.to_thread(answer.result, 30))[0] == 200
        # back at zero: new requests wait again
        await activators.report(("op-a", "mlp"), [], [])
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            again = pool.submit(post_infer, activator.http_port, "mlp.op-a", rows(1, seed=7))
            await asyncio.to_thread(activator.wait_held, "op-a/mlp", 1)
            await activators.report(("op-a", "mlp"), [runtime.http_url], [runtime.grpc_url])
            assert (await asyncio.to_thread(again.result, 30))[0] == 200
    finally:
        await activators.close()
    (unanswered,) = free_ports(1)
    silent = Activators(f"{HOST}:{unanswered}", timeout=1.0)
    try:
        assert await silent.held(("op-a", "mlp")) is None  # unknown, never taken for zero
    finally:
        await silent.close()


async def test_the_operator_hears_of_a_services_first_held_request_at_once(
    activator: ActivatorProcess, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demand long poll: the operator's watch is told of a service at zero as soon as its
    first request is held, not at the service's next pass (polling is made 60 s apart here,
    so only the long poll can tell it within the test)."""
    monkeypatch.setattr(activator_module, "RETRY_SECONDS", 60.0)
    activators = Activators(f"{HOST}:{activator.control_port}")
    woken: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    watch = asyncio.create_task(activators.watch_demand(woken.put_nowait))
    try:
        await asyncio.sleep(0.5)  # the first answer came; the long poll is open
        assert woken.empty()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post_infer, activator.http_port, "mlp.op-b", rows(1, seed=8))
            assert await asyncio.wait_for(woken.get(), 10) == ("op-b", "mlp")
            await activators.report(("op-b", "mlp"), [runtime.http_url], [runtime.grpc_url])
            assert (await asyncio.to_thread(answer.result, 30))[0] == 200
        await activators.report(("op-b", "mlp"), [], [])
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await activators.close()
    status, body = activator.control("GET", "/v1/demand?after=1&wait=3600")
    assert status == 400 and b"wait is 0 to 30 seconds" in body


def test_released_requests_are_paced_to_the_pods_bounded_queue(
    example_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """40 held requests released to a pod whose batching queue holds 8: sent all at once the
    pod would refuse most as overloaded; the activator keeps 4 in flight, and all 40 succeed."""
    logs = tmp_path_factory.mktemp("paced")
    small_queue = example_model("mlp", batching={"maxQueueSize": 8, "maxBatchSize": 4})
    with (
        running(small_queue, logs) as pod,
        started_activator(logs, "--max-held-requests", "40", "--max-in-flight-per-pod", "4")
        as paced,
    ):  # fmt: skip
        x = rows(1, seed=8)
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            answers = [pool.submit(post_infer, paced.http_port, "mlp.paced", x) for _ in range(40)]
            paced.wait_held("paced/mlp", 40)
            paced.report("paced/mlp", pod)
            statuses = [answer.result(timeout=60)[0] for answer in answers]
    assert statuses == [200] * 40


def test_grpc_channels_are_drained_gracefully_and_no_call_fails(
    runtime: Runtime, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With connections aged at 1 s, a call held for 2.5 s outlives its connection's GOAWAY and
    is answered; the channel then reconnects by itself, call after call, without one failing
    (in a cluster, through the Service: to the pods once the service is awake)."""
    logs = tmp_path_factory.mktemp("aged")
    with started_activator(logs, "--max-connection-age-seconds", "1") as aged:
        client = grpc_client(aged, "aged/mlp")
        x = rows(1, seed=9)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(grpc_infer, client, x, 30.0)
            aged.wait_held("aged/mlp", 1)
            time.sleep(2.5)  # past the connection's age: it has been sent its GOAWAY
            aged.report("aged/mlp", runtime)
            first = held.result(timeout=30)
        np.testing.assert_allclose(first.as_numpy("OUTPUT__0"), expected(x), rtol=1e-4, atol=1e-5)
        started, answered = time.monotonic(), 0
        while time.monotonic() - started < 4.0 and answered < 200:  # several connection ages
            grpc_infer(client, x, 10.0)
            answered += 1
            time.sleep(0.05)
        assert answered >= 20
        client.close()

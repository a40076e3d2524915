"""The warm-up probe against a real kiln_runtime process: tritonclient over gRPC, else HTTP."""

import asyncio
import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from kiln_localcluster.processes import free_ports
from kiln_operator.warmup import plan as warmup
from kiln_operator.warmup.budget import ByteBudget
from kiln_operator.warmup.probe import run_attempt
from kiln_runtime.examples import write_example
from tests.integration.runtime.runtime_process import HOST, Runtime, running

pytestmark = pytest.mark.integration

PLAN = warmup.WarmupPlan(
    model_name="mlp",
    inputs=(warmup.TensorPlan("INPUT__0", "FP32", (1, 512)),),
    outputs=("OUTPUT__0",),
    requests=64,
    concurrency=8,
    p99_bound_ms=5_000.0,
    attempt_timeout_s=30.0,
    retries=0,
)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    model = tmp_path_factory.mktemp("mlp")
    write_example("mlp", model)
    with running(model, tmp_path_factory.mktemp("logs")) as server:
        yield server


def counted(runtime: Runtime, metric: str, protocol: str, code: str = "ok") -> float:
    """The runtime's count of ``metric`` (a counter) for ``protocol`` and ``code``."""
    for line in runtime.metrics().splitlines():
        if (
            line.startswith(metric + "{")
            and f'protocol="{protocol}"' in line
            and f'code="{code}"' in line
        ):
            return float(line.split()[-1])
    return 0.0


def served(runtime: Runtime, protocol: str) -> float:
    """Successful requests the runtime counted for ``protocol``: as load or as warm-up."""
    return counted(runtime, "kiln_requests_total", protocol) + counted(
        runtime, "kiln_warmup_requests_total", protocol
    )


def sample(runtime: Runtime, series: str) -> float:
    """The value of one exposed series, named with its labels exactly as exposed."""
    for line in runtime.metrics().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exposed")


async def test_warm_runtime_passes_over_grpc(runtime: Runtime) -> None:
    before = served(runtime, "grpc")
    result = await run_attempt(PLAN, HOST, runtime.grpc_port, runtime.http_port)
    verdict = warmup.judge(PLAN, result)
    assert verdict.passed, verdict.message
    assert len(result.latencies_ms) == PLAN.requests
    assert served(runtime, "grpc") - before == PLAN.requests


async def test_http_carries_the_attempt_when_grpc_is_silent(runtime: Runtime) -> None:
    before = served(runtime, "http")
    result = await run_attempt(PLAN, HOST, free_ports(1)[0], runtime.http_port)
    assert warmup.judge(PLAN, result).passed
    assert served(runtime, "http") - before == PLAN.requests


async def test_an_impossible_bound_fails_with_the_measured_p99(runtime: Runtime) -> None:
    strict = dataclasses.replace(PLAN, p99_bound_ms=0.001)
    verdict = warmup.judge(
        strict, await run_attempt(strict, HOST, runtime.grpc_port, runtime.http_port)
    )
    assert verdict.reason == warmup.REASON_P99_OVER_BOUND
    assert verdict.p99_ms is not None and verdict.p99_ms > 0.001


async def test_wrong_tensor_shape_counts_as_request_errors(runtime: Runtime) -> None:
    wrong = dataclasses.replace(PLAN, inputs=(warmup.TensorPlan("INPUT__0", "FP32", (1, 7)),))
    result = await run_attempt(wrong, HOST, runtime.grpc_port, runtime.http_port)
    verdict = warmup.judge(wrong, result)
    assert verdict.reason == warmup.REASON_REQUEST_ERRORS
    assert result.errors == PLAN.requests


async def test_requests_past_the_attempts_timeout_are_unanswered_not_errors(
    runtime: Runtime,
) -> None:
    endless = dataclasses.replace(PLAN, requests=100_000, concurrency=2, attempt_timeout_s=1.0)
    result = await run_attempt(endless, HOST, runtime.grpc_port, runtime.http_port)
    verdict = warmup.judge(endless, result)
    assert verdict.reason == warmup.REASON_ATTEMPT_TIMED_OUT, verdict.message
    assert result.errors == 0 and result.first_error == ""
    assert 0 < len(result.latencies_ms) < endless.requests
    assert len(result.latencies_ms) + result.unanswered == endless.requests
    assert f"{len(result.latencies_ms)} of 100000 warm-up requests answered" in verdict.message


async def test_no_runtime_times_out_as_not_ready() -> None:
    quick = dataclasses.replace(PLAN, attempt_timeout_s=1.0)
    grpc_port, http_port = free_ports(2)
    result = await run_attempt(quick, HOST, grpc_port, http_port)
    assert warmup.judge(quick, result).reason == warmup.REASON_RUNTIME_NOT_READY


async def test_attempts_sharing_a_small_budget_all_pass_and_never_exceed_it(
    runtime: Runtime,
) -> None:
    sized = dataclasses.replace(PLAN, input_bytes=512 * 4, output_bytes=10 * 4)
    budget = ByteBudget(sized.attempt_bytes(3))  # one attempt at 3 in flight, not two
    before = served(runtime, "grpc")
    results = await asyncio.gather(
        *(run_attempt(sized, HOST, runtime.grpc_port, runtime.http_port, budget) for _ in range(3))
    )
    assert all(warmup.judge(sized, result).passed for result in results)
    assert served(runtime, "grpc") - before == 3 * PLAN.requests
    assert budget.peak_held == sized.attempt_bytes(3)  # the concurrency shrank from 8 to 3
    assert budget.held == 0


async def test_the_gates_requests_are_not_load_until_a_client_request_arrives(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A fresh runtime, as the gate finds it: the attempt's requests (over gRPC, and over HTTP
    when gRPC is silent) are counted as warm-up, and none of the autoscaler's series move; a
    client's request then starts the load metrics, and from then on a mark hides nothing."""
    model = tmp_path_factory.mktemp("mlp")
    write_example("mlp", model)
    with running(model, tmp_path_factory.mktemp("logs")) as fresh:
        for grpc_port in (fresh.grpc_port, free_ports(1)[0]):  # gRPC, then HTTP
            result = await run_attempt(PLAN, HOST, grpc_port, fresh.http_port)
            assert warmup.judge(PLAN, result).passed
        for protocol in ("grpc", "http"):
            assert counted(fresh, "kiln_warmup_requests_total", protocol) == PLAN.requests
            assert counted(fresh, "kiln_requests_total", protocol) == 0
            ok = f'{{code="ok",model="mlp",protocol="{protocol}"}}'
            assert sample(fresh, f"kiln_request_duration_seconds_count{ok}") == 0
        assert sample(fresh, 'kiln_batch_size_count{model="mlp"}') == 0
        assert sample(fresh, 'kiln_queue_wait_seconds_count{model="mlp"}') == 0

        client = httpclient.InferenceServerClient(f"{HOST}:{fresh.http_port}")
        try:
            tensor = httpclient.InferInput("INPUT__0", [1, 512], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
            client.infer("mlp", [tensor])
        finally:
            client.close()
        assert counted(fresh, "kiln_requests_total", "http") == 1
        assert sample(fresh, 'kiln_batch_size_count{model="mlp"}') == 1
        result = await run_attempt(PLAN, HOST, fresh.grpc_port, fresh.http_port)
        assert warmup.judge(PLAN, result).passed
        assert counted(fresh, "kiln_requests_total", "grpc") == PLAN.requests
        assert counted(fresh, "kiln_warmup_requests_total", "grpc") == PLAN.requests

"""Send a pod its warm-up requests with tritonclient and measure them.

Why it exists: the gate must see what a client sees — the same protocol, the same library, the
pod's own address — so the latencies it judges are real. gRPC is tried first (what production
clients use); when the gRPC port does not answer, HTTP carries the attempt. Every wait is bounded
by the attempt's timeout. The request tensors are built once and shared by every request of
every attempt of one plan running at once (the pods of a service warming up together); each
attempt holds its bytes of the operator's warm-up budget while it sends (waiting for them does
not count against its timeout), at a lower concurrency if the spec's would not fit.
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import tritonclient.grpc.aio as triton_grpc
import tritonclient.http.aio as triton_http
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from kiln_operator.warmup.budget import ByteBudget
from kiln_operator.warmup.plan import WarmupPlan, WarmupResult

WARMUP_PARAMETER = "kiln_warmup"
"""The request parameter that marks the gate's requests as warm-up: the runtime counts them
apart from its load metrics, so the autoscaler neither scales on them nor reads their latency
as the service's (a contract with the runtime: docs/metrics.md)."""
MARK = {WARMUP_PARAMETER: True}

READY_POLL_SECONDS = 0.25
GRPC_GRACE_SECONDS = 3.0
"""How long gRPC may stay silent after HTTP reports ready before HTTP carries the attempt."""


class _Client(Protocol):
    async def is_server_ready(self) -> bool: ...
    async def close(self) -> None: ...


NOISE_CHUNK_ELEMENTS = 4096
"""Float32 noise drawn at a time for a float type numpy cannot draw in directly (FP16): the one
temporary beside the tensor, 16 KiB whatever the tensor's size."""


def synthetic_inputs(plan: WarmupPlan, seed: int) -> list[np.ndarray[Any, Any]]:
    """Tensors of the declared shapes and dtypes: normal noise for floats, small ints else.

    Each is made in its own dtype, never through a wider copy (numpy's default float64 then a
    cast held 2.5 times the bytes the warm-up budget counts, for a moment, per tensor)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for tensor in plan.inputs:
        # numpy has no bfloat16; tritonclient takes BF16 data as float32
        dtype = np.dtype(
            np.float32 if tensor.datatype == "BF16" else triton_to_np_dtype(tensor.datatype)
        )
        if dtype.kind == "f":
            arrays.append(_normal_noise(rng, tensor.shape, dtype))
        else:
            high = 2 if dtype.kind == "b" else 16  # BOOL: False and True
            arrays.append(rng.integers(0, high, tensor.shape, dtype=dtype))
    return arrays


def _normal_noise(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    """Standard normal noise in `dtype`: drawn in it where numpy can (float32, float64), else
    drawn as float32 a chunk at a time into the tensor."""
    if dtype in (np.float32, np.float64):
        return rng.standard_normal(shape, dtype=dtype)
    noise = np.empty(shape, dtype)
    flat = noise.reshape(-1)  # a view: the tensor is contiguous
    for start in range(0, flat.size, NOISE_CHUNK_ELEMENTS):
        stop = min(start + NOISE_CHUNK_ELEMENTS, flat.size)
        flat[start:stop] = rng.standard_normal(stop - start, dtype=np.float32)
    return noise


async def _wait_ready(client: _Client, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            if await asyncio.wait_for(client.is_server_ready(), READY_POLL_SECONDS * 4):
                return True
        except (InferenceServerException, OSError, TimeoutError):
            pass
        await asyncio.sleep(READY_POLL_SECONDS)
    return False


BYPASS_CACHE = {"kiln_cache_bypass": True}
"""Every warm-up request is the same one: without this parameter a response cache
(spec.runtime.cache) would answer all but the first, and the gate would judge the cache, not
the warmed model. The runtime neither looks such a request up nor keeps its answer."""
GATE_PARAMETERS = {**MARK, **BYPASS_CACHE}
"""What every gate request carries: counted apart from load, and never answered from a cache."""


async def _drive(
    plan: WarmupPlan, send: Callable[[], Awaitable[None]], deadline: float, in_flight: int
) -> WarmupResult:
    """Run ``plan.requests`` calls of ``send`` with ``in_flight`` at once."""
    latencies: list[float] = []
    errors: list[str] = []
    remaining = plan.requests
    loop = asyncio.get_running_loop()
    # timeout_at reads the loop's clock, which need not be time.monotonic's
    deadline_on_loop = loop.time() + (deadline - time.monotonic())

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.monotonic() < deadline:
            remaining -= 1
            started = time.perf_counter()
            try:
                async with asyncio.timeout_at(deadline_on_loop) as attempt_deadline:
                    await send()
            except (InferenceServerException, OSError, TimeoutError) as error:
                if not attempt_deadline.expired():  # its own error, a client timeout included
                    errors.append(str(error) or type(error).__name__)
            else:
                latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return WarmupResult(
        latencies_ms=tuple(latencies),
        errors=len(errors),
        first_error=errors[0] if errors else "",
        # cut in flight by the deadline, or never sent
        unanswered=plan.requests - len(latencies) - len(errors),
    )


def _request(plan: WarmupPlan, protocol: ModuleType) -> tuple[list[Any], list[Any]]:
    """The inputs and requested outputs in ``protocol``'s classes: tritonclient.grpc and
    tritonclient.http share one API; HTTP sends tensors in Triton's binary extension."""
    binary = {"binary_data": True} if protocol is triton_http else {}
    inputs = []
    for tensor, array in zip(plan.inputs, synthetic_inputs(plan, seed=0), strict=True):
        infer_input = protocol.InferInput(tensor.name, list(tensor.shape), tensor.datatype)
        infer_input.set_data_from_numpy(array, **binary)
        inputs.append(infer_input)
    outputs = [protocol.InferRequestedOutput(name, **binary) for name in plan.outputs]
    return inputs, outputs


_PREPARED: dict[tuple[WarmupPlan, str], tuple[list[Any], list[Any], int]] = {}
"""Request tensors by plan and protocol, with the number of attempts using them: the pods of
one service warming up at once share one copy (tritonclient only reads them per call)."""


@contextlib.contextmanager
def _shared_request(
    plan: WarmupPlan, protocol: ModuleType
) -> Iterator[tuple[list[Any], list[Any]]]:
    key = (plan, protocol.__name__)
    held = _PREPARED.get(key)
    inputs, outputs, users = held if held is not None else (*_request(plan, protocol), 0)
    _PREPARED[key] = (inputs, outputs, users + 1)
    try:
        yield inputs, outputs
    finally:
        inputs, outputs, users = _PREPARED[key]
        if users == 1:
            del _PREPARED[key]
        else:
            _PREPARED[key] = (inputs, outputs, users - 1)


async def run_attempt(
    plan: WarmupPlan,
    host: str,
    grpc_port: int,
    http_port: int,
    budget: ByteBudget | None = None,
) -> WarmupResult:
    """One warm-up attempt against ``host``: wait until the runtime is ready (model loaded,
    internal warm-up done), then send the plan's requests over gRPC, or HTTP if gRPC is silent,
    holding the attempt's bytes of ``budget`` (None: unbounded) while the tensors exist."""
    deadline = time.monotonic() + plan.attempt_timeout_s
    in_flight = plan.concurrency if budget is None else plan.in_flight_within(budget.capacity)
    http = triton_http.InferenceServerClient(f"{host}:{http_port}", conn_limit=in_flight)
    grpc = triton_grpc.InferenceServerClient(f"{host}:{grpc_port}")
    try:
        if not await _wait_ready(http, deadline):
            return WarmupResult(latencies_ms=(), runtime_ready=False)
        use_grpc = await _wait_ready(grpc, min(deadline, time.monotonic() + GRPC_GRACE_SECONDS))
        client, protocol = (grpc, triton_grpc) if use_grpc else (http, triton_http)
        queued = time.monotonic()
        async with (
            budget.hold(plan.attempt_bytes(in_flight)) if budget else contextlib.nullcontext()
        ):
            deadline += time.monotonic() - queued  # waiting for the budget does not count
            with _shared_request(plan, protocol) as (inputs, outputs):

                async def send() -> None:
                    await client.infer(
                        plan.model_name, inputs, outputs=outputs, parameters=GATE_PARAMETERS
                    )

                return await _drive(plan, send, deadline, in_flight)
    finally:
        await grpc.close()
        await http.close()

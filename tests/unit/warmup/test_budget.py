"""The warm-up byte budget: never more than its capacity held, waiters served in arrival order,
a cancelled waiter leaves nothing behind, and an attempt's concurrency shrinks to fit."""

import asyncio

import pytest

from kiln_operator.api.validation import warmup_attempt_bytes
from kiln_operator.warmup.budget import ByteBudget
from kiln_operator.warmup.plan import WarmupPlan


async def test_holders_never_exceed_the_capacity_and_are_served_in_order() -> None:
    budget = ByteBudget(100)
    order: list[str] = []
    release = asyncio.Event()

    async def holder(name: str, size: int) -> None:
        async with budget.hold(size):
            order.append(name)
            assert budget.held <= budget.capacity
            await release.wait()

    first = asyncio.create_task(holder("a", 70))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(holder("b", 50)), asyncio.create_task(holder("c", 10))]
    await asyncio.sleep(0.01)
    # "c" would fit now, but "b" came first: it is not overtaken (no starvation of large ones)
    assert order == ["a"] and budget.held == 70
    release.set()
    await asyncio.gather(first, *waiting)
    assert order == ["a", "b", "c"]
    assert budget.held == 0
    assert budget.peak_held == 70


async def test_a_cancelled_waiter_leaves_nothing_held_and_lets_the_next_in() -> None:
    budget = ByteBudget(100)
    async with budget.hold(60):
        big = asyncio.create_task(budget.hold(80).__aenter__())
        await asyncio.sleep(0)
        small_got_in = asyncio.Event()

        async def small() -> None:
            async with budget.hold(30):
                small_got_in.set()

        behind = asyncio.create_task(small())
        await asyncio.sleep(0.01)
        assert not small_got_in.is_set()
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        await asyncio.wait_for(behind, 1)
    assert budget.held == 0


async def test_a_size_above_the_capacity_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="can never fit"):
        async with ByteBudget(10).hold(11):
            pass
    with pytest.raises(ValueError):
        ByteBudget(0)


def plan(concurrency: int, input_bytes: int, output_bytes: int) -> WarmupPlan:
    return WarmupPlan(
        model_name="m", inputs=(), outputs=(), requests=100, concurrency=concurrency,
        p99_bound_ms=10, attempt_timeout_s=10, retries=0, input_bytes=input_bytes,
        output_bytes=output_bytes,
    )  # fmt: skip


def test_an_attempt_runs_at_the_concurrency_that_fits_the_budget() -> None:
    large = plan(concurrency=8, input_bytes=64 * 2**20, output_bytes=2**20)
    assert large.attempt_bytes(1) == warmup_attempt_bytes(64 * 2**20, 2**20, 1)
    assert large.attempt_bytes(2) == 64 * 2**20 + 2 * 2 * 65 * 2**20
    assert large.in_flight_within(large.attempt_bytes(3)) == 3
    assert large.in_flight_within(large.attempt_bytes(3) - 1) == 2
    assert large.in_flight_within(2**40) == 8
    assert plan(concurrency=4, input_bytes=100, output_bytes=10).in_flight_within(10**6) == 4


def test_attempts_of_one_plan_share_one_copy_of_the_request_tensors() -> None:
    import tritonclient.grpc.aio as triton_grpc
    import tritonclient.http.aio as triton_http

    from kiln_operator.warmup.plan import TensorPlan
    from kiln_operator.warmup.probe import _PREPARED, _shared_request

    sized = WarmupPlan(
        model_name="m", inputs=(TensorPlan("x", "FP32", (1, 4)),), outputs=("y",), requests=4,
        concurrency=2, p99_bound_ms=10, attempt_timeout_s=10, retries=0, input_bytes=16,
    )  # fmt: skip
    with _shared_request(sized, triton_grpc) as (first, _):
        with _shared_request(sized, triton_grpc) as (second, _):
            assert first is second  # the second pod's attempt built nothing
        with _shared_request(sized, triton_http) as (over_http, _):
            assert over_http is not first  # HTTP encodes its own way
        assert len(_PREPARED) == 1
    assert _PREPARED == {}  # the last attempt to finish lets the tensors go

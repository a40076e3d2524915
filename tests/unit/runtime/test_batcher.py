"""The batching contract: one item in, one result out; failures stay inside their batch."""

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from kiln_runtime import errors
from kiln_runtime.batcher import DynamicBatcher


class Recorder:
    def __init__(self) -> None:
        self.depths: list[int] = []
        self.waits: list[float] = []
        self.batches: list[int] = []

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def queue_wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def batch_done(self, rows: int, compute_seconds: float) -> None:
        self.batches.append(rows)


def make(
    process: Callable[[Sequence[int]], Sequence[int | errors.InferError]],
    executor: ThreadPoolExecutor | None = None,
    *,
    max_rows: int = 8,
    max_queue: int = 64,
    delay: float = 0.0,
) -> tuple[DynamicBatcher[int, int], Recorder]:
    recorder = Recorder()
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        process,
        max_batch_rows=max_rows,
        max_delay_seconds=delay,
        max_queue_size=max_queue,
        executor=executor,
        observer=recorder,
    )
    batcher.start()
    return batcher, recorder


def doubled(items: Sequence[int]) -> list[int]:
    return [2 * item for item in items]


class Gate:
    """A process function that blocks its first batch until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.seen: list[list[int]] = []

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.seen.append(list(items))
        self.entered.set()
        assert self.release.wait(10), "test never released the batch"
        return doubled(items)


async def wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 (the batcher exposes no event for its depth)
            await asyncio.sleep(0.001)


async def test_each_caller_gets_its_own_result() -> None:
    batcher, recorder = make(doubled)
    results = await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(20)))
    assert results == [2 * i for i in range(20)]
    # Inline: the first of a burst from idle is computed at once, in its caller's turn; the
    # others, submitted in the same loop turn, are batched together.
    assert recorder.batches == [1, 8, 8, 3]
    await batcher.stop()


async def test_requests_arriving_during_a_batch_form_the_next_batch() -> None:
    gate = Gate()
    with ThreadPoolExecutor(1) as pool:
        batcher, recorder = make(gate, pool, max_rows=8)
        first = asyncio.ensure_future(batcher.submit(100, rows=1))
        await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, 5)
        rest = [asyncio.ensure_future(batcher.submit(i, rows=1)) for i in range(10)]
        await wait_until(lambda: batcher.depth == 10)
        gate.release.set()
        assert await first == 200
        assert [await r for r in rest] == [2 * i for i in range(10)]
        assert gate.seen == [[100], list(range(8)), [8, 9]]
        assert recorder.batches == [1, 8, 2]
        await batcher.stop()


async def test_a_full_queue_refuses_at_once_and_recovers() -> None:
    gate = Gate()
    with ThreadPoolExecutor(1) as pool:
        batcher, _ = make(gate, pool, max_queue=3)
        running = asyncio.ensure_future(batcher.submit(0, rows=1))
        await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, 5)
        queued = [asyncio.ensure_future(batcher.submit(i, rows=1)) for i in (1, 2, 3)]
        await wait_until(lambda: batcher.depth == 3)
        with pytest.raises(errors.InferError) as refused:
            await batcher.submit(4, rows=1)
        assert refused.value.kind is errors.ErrorKind.REJECTED
        gate.release.set()
        assert await running == 0
        assert [await q for q in queued] == [2, 4, 6]
        assert await batcher.submit(5, rows=1) == 10
        await batcher.stop()


async def test_an_expired_deadline_fails_without_computing() -> None:
    gate = Gate()
    with ThreadPoolExecutor(1) as pool:
        batcher, _ = make(gate, pool)
        running = asyncio.ensure_future(batcher.submit(0, rows=1))
        await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, 5)
        loop_now = time.monotonic()  # the batcher's default clock
        late = asyncio.ensure_future(batcher.submit(7, rows=1, deadline=loop_now - 1))
        on_time = asyncio.ensure_future(batcher.submit(8, rows=1, deadline=loop_now + 60))
        await wait_until(lambda: batcher.depth == 2)
        gate.release.set()
        await running
        with pytest.raises(errors.InferError) as expired:
            await late
        assert expired.value.kind is errors.ErrorKind.DEADLINE
        assert await on_time == 16
        assert [7] not in gate.seen and [7, 8] not in gate.seen
        await batcher.stop()


async def test_a_failing_batch_fails_its_requests_and_the_batcher_goes_on() -> None:
    calls = 0

    def flaky(items: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("CUDA out of memory")
        return doubled(items)

    batcher, _ = make(flaky)
    with pytest.raises(errors.InferError) as failed:
        await batcher.submit(1, rows=1)
    assert failed.value.kind is errors.ErrorKind.INTERNAL
    assert "out of memory" in failed.value.message
    assert await batcher.submit(2, rows=1) == 4
    await batcher.stop()


async def test_a_per_item_error_fails_only_that_item() -> None:
    def picky(items: Sequence[int]) -> list[int | errors.InferError]:
        return [errors.invalid("odd") if i % 2 else 2 * i for i in items]

    batcher, _ = make(picky)
    results = await asyncio.gather(
        *(batcher.submit(i, rows=1) for i in range(4)), return_exceptions=True
    )
    assert results[0] == 0 and results[2] == 4
    assert isinstance(results[1], errors.InferError) and isinstance(results[3], errors.InferError)
    await batcher.stop()


async def test_a_wrong_number_of_results_is_an_error_not_a_hang() -> None:
    batcher, _ = make(lambda items: [1] * (len(items) + 1))
    results = await asyncio.gather(
        *(batcher.submit(i, rows=1) for i in range(3)), return_exceptions=True
    )
    assert all(
        isinstance(r, errors.InferError) and r.kind is errors.ErrorKind.INTERNAL for r in results
    )
    await batcher.stop()


async def test_items_with_other_shapes_wait_for_their_own_batch() -> None:
    gate = Gate()
    with ThreadPoolExecutor(1) as pool:
        batcher, _ = make(gate, pool)
        first = asyncio.ensure_future(batcher.submit(0, rows=1, key="a"))
        await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, 5)
        items = [
            asyncio.ensure_future(batcher.submit(i, rows=1, key="ab"[i % 2])) for i in range(1, 5)
        ]
        await wait_until(lambda: batcher.depth == 4)
        gate.release.set()
        await first
        await asyncio.gather(*items)
        assert gate.seen == [[0], [1, 3], [2, 4]]
        await batcher.stop()


async def test_rows_are_counted_and_too_many_refused() -> None:
    batcher, recorder = make(doubled, max_rows=8)
    with pytest.raises(errors.InferError) as too_big:
        await batcher.submit(1, rows=9)
    assert too_big.value.kind is errors.ErrorKind.INVALID
    assert await batcher.submit(1, rows=8) == 2
    assert recorder.batches == [8]
    await batcher.stop()


async def test_stop_fails_queued_items_as_unavailable() -> None:
    gate = Gate()
    with ThreadPoolExecutor(1) as pool:
        batcher, _ = make(gate, pool)
        running = asyncio.ensure_future(batcher.submit(0, rows=1))
        await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, 5)
        queued = asyncio.ensure_future(batcher.submit(1, rows=1))
        await wait_until(lambda: batcher.depth == 1)
        await batcher.stop()
        with pytest.raises(errors.InferError) as stopped:
            await queued
        assert stopped.value.kind is errors.ErrorKind.UNAVAILABLE
        gate.release.set()
        running.cancel()


async def test_the_wait_cap_bounds_queueing_at_high_load() -> None:
    batcher, recorder = make(doubled, max_rows=32, delay=0.005)
    for _ in range(5):  # teach the policy that batches are large
        await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(32)))
    started = asyncio.get_running_loop().time()
    assert await batcher.submit(3, rows=1) == 6
    assert asyncio.get_running_loop().time() - started < 1.0
    assert max(recorder.waits) < 1.0
    await batcher.stop()


async def test_an_item_arriving_while_a_batch_fills_joins_it() -> None:
    batcher, recorder = make(doubled, max_rows=4, delay=5.0)
    await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(5)))  # 1 + 4: batches of 4
    await asyncio.sleep(0.2)  # a gap: the policy expects the next three ~40 ms apart
    first = asyncio.ensure_future(batcher.submit(10, rows=1))
    await asyncio.sleep(0.01)  # the batcher waits for company (~120 ms, capped at 5 s)
    assert not first.done()
    rest = [asyncio.ensure_future(batcher.submit(i, rows=1)) for i in (11, 12, 13)]
    async with asyncio.timeout(2):
        assert await first == 20
        assert [await r for r in rest] == [22, 24, 26]
    assert recorder.batches == [1, 4, 4]
    await batcher.stop()


async def test_when_clients_leave_the_server_idle_batches_are_halves() -> None:
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        doubled,
        max_batch_rows=4,
        max_delay_seconds=5.0,
        max_queue_size=64,
        executor=None,
        observer=(recorder := Recorder()),
        cpu_clock=lambda: 0.0,  # the process uses no CPU between arrivals: every gap is idle
    )
    batcher.start()
    batcher.set_batch_overhead(0.001)  # splitting a batch costs 1 ms, far under the gaps
    await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(5)))  # 1 + 4: batches of 4
    await asyncio.sleep(1.0)  # idle: the clients are slow
    await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(4)))  # it learns the idle time
    await asyncio.sleep(1.0)
    first = asyncio.ensure_future(batcher.submit(10, rows=1))
    await asyncio.sleep(0.05)  # alone: under half the batch, it waits ~0.3 s for company
    assert not first.done()
    second = asyncio.ensure_future(batcher.submit(11, rows=1))
    await asyncio.sleep(0.05)  # half the batch: it goes, not waiting for two more
    assert first.done() and second.done()
    assert [first.result(), second.result()] == [20, 22]
    # Four at once (an asyncio client answering a batch's replies in a burst): two batches of
    # two, so the first two answers go out while the other two compute.
    assert await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(4))) == [0, 2, 4, 6]
    assert recorder.batches == [1, 4, 4, 2, 2, 2]
    await batcher.stop()


async def test_an_inline_batchs_answers_leave_before_the_next_inline_batch_computes() -> None:
    written: list[int] = []
    written_when_computing: list[list[int]] = []

    def process(items: Sequence[int]) -> list[int]:
        written_when_computing.append(sorted(written))
        return doubled(items)

    batcher, recorder = make(process, max_rows=8)
    loop = asyncio.get_running_loop()

    async def caller(item: int) -> None:
        answer = await batcher.submit(item, rows=1)
        loop.call_soon(written.append, answer)  # as a transport writes: at the end of the turn

    await asyncio.gather(*(caller(i) for i in range(17)))
    assert recorder.batches == [1, 8, 8]
    # The second batch's answers were out before the third batch blocked the loop: its
    # clients did not also wait for the next batch's compute.
    assert written_when_computing[2] == [2 * i for i in range(9)]
    await batcher.stop()


async def test_a_batch_that_does_not_fill_leaves_when_its_wait_is_up() -> None:
    batcher, recorder = make(doubled, max_rows=8, delay=0.02)
    await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(9)))  # 1 + 8
    started = time.monotonic()
    assert await batcher.submit(5, rows=1) == 10  # alone: waits at most the 20 ms cap
    assert time.monotonic() - started < 1.0
    assert recorder.batches == [1, 8, 1]
    await batcher.stop()


async def test_a_lone_request_at_low_load_is_computed_in_its_callers_turn() -> None:
    batcher, recorder = make(doubled, delay=0.05)
    assert await batcher.submit(1, rows=1) == 2
    assert recorder.batches == [1]
    assert recorder.depths == []  # it never queued
    await batcher.stop()
    with ThreadPoolExecutor(1) as pool:
        threaded, threaded_recorder = make(doubled, pool, delay=0.05)
        assert await threaded.submit(1, rows=1) == 2
        assert threaded_recorder.depths[0] == 1  # a model in its own thread: through the queue
        await threaded.stop()


async def test_under_load_requests_are_not_computed_alone() -> None:
    batcher, recorder = make(doubled, max_rows=4, delay=5.0)
    await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(5)))  # 1 + 4: load
    await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(4)))
    assert recorder.batches == [1, 4, 4]  # the policy waits for company: no batch of one
    await batcher.stop()


async def test_batches_up_to_the_inline_rows_compute_on_the_loop_larger_ones_in_the_thread() -> (
    None
):
    threads: list[tuple[int, str]] = []

    def process(items: Sequence[int]) -> list[int]:
        threads.append((len(items), threading.current_thread().name))
        return doubled(items)

    with ThreadPoolExecutor(1, thread_name_prefix="model") as pool:
        batcher, recorder = make(process, pool, max_rows=8)
        batcher.run_inline(2)
        assert batcher.inline_rows == 2
        assert await batcher.submit(1, rows=1) == 2  # alone, small: in its caller's turn
        assert recorder.depths == []
        assert await asyncio.gather(*(batcher.submit(i, rows=1) for i in range(8))) == [
            2 * i for i in range(8)
        ]
        await batcher.stop()
    loop_thread = threading.current_thread().name
    assert threads[0] == (1, loop_thread)
    assert all(name.startswith("model") for rows, name in threads[1:] if rows > 2)
    assert any(rows > 2 for rows, _ in threads[1:])

"""Dynamic batching: callers submit one item and await one result; the model sees a batch.

Contract (as Triton's dynamic batcher and Ray's ``@serve.batch``):
- the queue is bounded: beyond ``max_queue_size`` items a submit fails at once (REJECTED);
- an item whose deadline passed before its batch ran fails with DEADLINE and is not computed;
- ``process`` gets the payloads of one batch and returns one result per payload, each either a
  value or an ``InferError`` for that item alone; if ``process`` raises, every item of that
  batch fails with that error, and the batcher goes on serving.

Only one batch computes at a time (the model has one worker thread); the next batch collects
while the current one runs. How long to wait for a batch to fill is ``batch_policy``'s call.

A batch that computes quickly (``batch_policy.inline_limit_seconds``) may run inline on the
event loop: no thread hop, and requests parsed in the same loop turn still meet in one batch,
because the batcher task forms it only after they have all been submitted. The decision is
per batch, by its rows (``run_inline``): a model may compute small batches inline and large
ones in its thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from typing import Generic, Protocol, TypeVar

from kiln_runtime import batch_policy, errors

P = TypeVar("P")
R = TypeVar("R")

log = logging.getLogger(__name__)


class BatchObserver(Protocol):
    """Receives what the batcher measures (the metrics module implements it)."""

    def queue_depth(self, depth: int) -> None: ...

    def queue_wait(self, seconds: float) -> None: ...

    def batch_done(self, rows: int, compute_seconds: float) -> None: ...


class _Item(Generic[P, R]):
    """One request waiting in the queue: its payload, rows, batch key, times and future."""

    def __init__(
        self,
        payload: P,
        *,
        rows: int,
        key: Hashable,
        enqueued: float,
        deadline: float | None,
        future: asyncio.Future[R | errors.InferError],
    ) -> None:
        self.payload = payload
        self.rows = rows
        self.key = key
        self.enqueued = enqueued
        self.deadline = deadline
        self.future = future


class DynamicBatcher(Generic[P, R]):
    """Collects items into batches and runs ``process`` on each batch in ``executor``.

    ``process`` runs in the executor (a single thread for the model) unless ``executor`` is
    None, then inline on the event loop, which suits only batches that take microseconds
    (see ``run_inline``).
    """

    def __init__(
        self,
        process: Callable[[Sequence[P]], Sequence[R | errors.InferError]],
        *,
        max_batch_rows: int,
        max_delay_seconds: float,
        max_queue_size: int,
        executor: Executor | None,
        observer: BatchObserver,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._process = process
        self._max_rows = max_batch_rows
        self._max_delay = max_delay_seconds
        self._max_queue = max_queue_size
        self._executor = executor
        self._inline_rows = max_batch_rows if executor is None else 0  # batches up to it: inline
        self._observer = observer
        self._clock = clock
        self._cpu_clock = cpu_clock  # the event loop's CPU time: it reads every request
        self._batch_overhead = math.inf  # never split a batch until the model's cost is known
        self._threaded_seconds = 0.0  # time the model computed in its thread, batches done
        self._threaded_since: float | None = None  # when the batch computing there started
        self._queue: collections.deque[_Item[P, R]] = collections.deque()
        self._stats = batch_policy.TrafficStats()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._computing = False
        self._free_since = -math.inf  # when the model last finished a batch
        self._turn_taken = False  # a request of this loop turn was computed in its caller's turn

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def inline_rows(self) -> int:
        return self._inline_rows

    def run_inline(self, up_to_rows: int | None = None) -> None:
        """Compute batches of at most ``up_to_rows`` rows (all, if None) on the event loop
        from now on: they are too fast to pay a thread hop."""
        self._inline_rows = self._max_rows if up_to_rows is None else up_to_rows

    @property
    def batch_overhead(self) -> float:
        return self._batch_overhead

    def set_batch_overhead(self, seconds: float) -> None:
        """The fixed part of a batch's compute time (``batch_policy.batch_overhead``): what
        splitting a batch in two costs, weighed against the server's idle time per batch."""
        self._batch_overhead = seconds

    @property
    def idle(self) -> bool:
        return not self._queue and not self._computing

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="kiln-batcher")

    async def stop(self) -> None:
        """Stop collecting; items still queued fail as UNAVAILABLE."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._queue:
            item = self._queue.popleft()
            _settle(item, errors.InferError(errors.ErrorKind.UNAVAILABLE, "server is stopping"))
        self._observer.queue_depth(0)

    async def submit(
        self, payload: P, *, rows: int, key: Hashable = None, deadline: float | None = None
    ) -> R:
        """Queue one item and wait for its result; raises ``InferError`` if it failed."""
        if rows > self._max_rows:
            raise errors.invalid(f"batch of {rows} exceeds the maximum batch size {self._max_rows}")
        if len(self._queue) >= self._max_queue:
            raise errors.InferError(
                errors.ErrorKind.REJECTED,
                f"queue is full ({self._max_queue} requests waiting); retry later",
            )
        now = self._clock()
        self._stats = batch_policy.observe_arrival(self._stats, now)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R | errors.InferError] = loop.create_future()
        item = _Item(payload, rows=rows, key=key, enqueued=now, deadline=deadline, future=future)
        if self._dispatches_now(item):
            # Alone, at low load, on a model that runs inline: the batcher task would form
            # this same batch of one, two loop turns later. Requests that arrive in this loop
            # turn still queue for the batcher task and batch together.
            self._turn_taken = True
            loop.call_soon(self._end_turn)
            self._observer.queue_wait(0.0)
            self._observe_dispatch(item.rows, item.rows, self._plan())
            await self._compute([item])  # inline: completes without suspending
        else:
            self._queue.append(item)
            self._observer.queue_depth(len(self._queue))
            self._arrived.set()
        result = await future
        if isinstance(result, errors.InferError):
            raise result
        return result

    def _dispatches_now(self, item: _Item[P, R]) -> bool:
        if (
            item.rows > self._inline_rows
            or self._task is None
            or self._turn_taken
            or self._queue
            or self._computing
            or (item.deadline is not None and item.enqueued >= item.deadline)
        ):
            return False
        wait = self._wait_seconds(item.rows, self._plan(), item.enqueued, now=item.enqueued)
        return wait <= 0

    def _busy_seconds(self, now: float) -> float:
        """The server's busy time so far: the event loop's CPU, inline batches included, and
        the model's time in its thread (for a GPU model, that thread mostly waits on the GPU)."""
        busy = self._cpu_clock() + self._threaded_seconds
        if self._threaded_since is not None:
            busy += now - self._threaded_since
        return busy

    def _observe_dispatch(self, rows: int, waiting_rows: int, plan: batch_policy.BatchPlan) -> None:
        """Tell the policy of a batch of ``rows`` taken when ``waiting_rows`` were queued (it
        learns the load from these, not from the batch, which a plan of halves caps)."""
        now = self._clock()
        self._stats = batch_policy.observe_dispatch(
            self._stats,
            now=now,
            busy_seconds=self._busy_seconds(now),
            rows=rows,
            waiting_rows=waiting_rows,
            plan=plan,
        )

    def _plan(self) -> batch_policy.BatchPlan:
        return batch_policy.batch_plan(self._stats, self._max_rows, self._batch_overhead)

    def _wait_seconds(
        self, queued_rows: int, plan: batch_policy.BatchPlan, oldest_arrival: float, now: float
    ) -> float:
        """The policy's wait for a batch of ``queued_rows`` whose oldest item arrived then."""
        return batch_policy.batch_wait_seconds(
            queued_rows=queued_rows,
            target_rows=plan.target_rows,
            stats=self._stats,
            max_delay_seconds=self._max_delay,
            window_start=max(oldest_arrival, self._free_since),
            now=now,
        )

    def _end_turn(self) -> None:
        self._turn_taken = False

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            waiting_rows, plan = await self._collect()
            batch = self._take_batch(plan.max_rows)
            if batch:
                rows = sum(item.rows for item in batch)
                self._observe_dispatch(rows, waiting_rows, plan)
                await self._compute(batch)
                if rows <= self._inline_rows:
                    await self._deliver_before_next_batch()

    async def _deliver_before_next_batch(self) -> None:
        """Give the loop the turns an inline batch's answers need to leave, and the requests
        that arrived while it computed the turns to be read, before the next batch forms.

        The loop was blocked while computing. In the first turn the answered callers resume
        and hand their answers to their transports, which write what a turn produced at the
        end of it (``http2.state``: one write per connection per turn); in the second those
        writes happen. Forming the next batch in the first turn would compute it inline
        before the writes, and the clients this batch answered would wait for that batch's
        compute too, then get both batches' answers at once: the two halves of a split batch
        (``batch_policy.batch_plan``) would reach the clients together, and the clients
        would answer and send them together, so the server and its clients work in turn
        instead of at once. A turn with nothing to do costs microseconds.
        """
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def _collect(self) -> tuple[int, batch_policy.BatchPlan]:
        """Wait while the policy expects the batch to fill, within the delay cap. Returns the
        rows then waiting (of the first request's shapes) and the plan to take them by."""
        while True:
            head_key = self._queue[0].key
            queued_rows = sum(item.rows for item in self._queue if item.key == head_key)
            plan = self._plan()
            wait = self._wait_seconds(queued_rows, plan, self._queue[0].enqueued, self._clock())
            if wait <= 0:
                return queued_rows, plan
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=wait)
            except TimeoutError:
                return queued_rows, plan

    def _take_batch(self, max_rows: int) -> list[_Item[P, R]]:
        now = self._clock()
        batch: list[_Item[P, R]] = []
        rows = 0
        head_key = self._queue[0].key if self._queue else None
        kept: collections.deque[_Item[P, R]] = collections.deque()
        while self._queue:
            item = self._queue.popleft()
            if item.future.done():  # the caller went away (cancelled)
                continue
            if item.deadline is not None and now >= item.deadline:
                _settle(
                    item,
                    errors.InferError(errors.ErrorKind.DEADLINE, "deadline exceeded while queued"),
                )
                continue
            if item.key != head_key or (batch and rows + item.rows > max_rows):
                kept.append(item)
                if item.key == head_key:
                    break  # the batch is full; keep arrival order for the rest
                continue
            batch.append(item)
            rows += item.rows
            self._observer.queue_wait(now - item.enqueued)
        kept.extend(self._queue)
        self._queue = kept
        self._observer.queue_depth(len(self._queue))
        return batch

    async def _compute(self, batch: list[_Item[P, R]]) -> None:
        payloads = [item.payload for item in batch]
        rows = sum(item.rows for item in batch)
        self._computing = True
        started = self._clock()
        try:
            if self._executor is None or rows <= self._inline_rows:
                results = self._process(payloads)
            else:
                loop = asyncio.get_running_loop()
                self._threaded_since = started
                results = await loop.run_in_executor(self._executor, self._process, payloads)
            if len(results) != len(batch):
                raise errors.InferError(
                    errors.ErrorKind.INTERNAL,
                    f"model returned {len(results)} results for a batch of {len(batch)}",
                )
        except errors.InferError as error:
            results = [error] * len(batch)
        except Exception as bug:  # one name per type: mypyc (setup.py)
            log.exception("batch of %d requests failed", len(batch))
            failure = errors.InferError(errors.ErrorKind.INTERNAL, f"batch failed: {bug}")
            results = [failure] * len(batch)
        finally:
            self._computing = False
            self._free_since = self._clock()
            if self._threaded_since is not None:
                self._threaded_seconds += self._free_since - self._threaded_since
                self._threaded_since = None
        self._observer.batch_done(rows, self._free_since - started)
        for item, result in zip(batch, results, strict=True):
            _settle(item, result)


def _settle(item: _Item[P, R], result: R | errors.InferError) -> None:
    if not item.future.done():
        item.future.set_result(result)

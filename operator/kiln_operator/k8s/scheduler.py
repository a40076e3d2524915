"""One operator-wide scheduler of the periodic work on each InferenceService.

Why it exists: a kopf daemon or timer costs, per object, a task, a logger, a stopper and a parsed
copy of the object kept for it (about 54 MB with two of them on 1,000 services), and makes kopf
put a finalizer on every InferenceService (one more write per new service, and a deletion that
waits for a running operator). One task keeps a heap of due times instead. The InferenceService
watch handler tracks every live service and untracks a deleted one; every job (the autoscaler's
evaluation, the periodic resync) has one entry per tracked service, and each pass returns the
seconds until the service's next one, so every service keeps its own interval. Passes run as
tasks, at most `concurrency` at once; a pass of a job and service never overlaps the previous
one.

`run_soon` brings a service's next pass of a job forward to now (the activator's news that a
service at zero holds a request): the entry it replaces is skipped, so every service keeps one
due pass per job.

Peering: only the active replica acts. While kopf has paused the operator (`Pausing`: kopf's own
pause state, see `k8s.peering.kopf_pause_state`), the scheduler starts nothing, cancels the
passes in flight and forgets every service, as kopf stops its daemons. The listing kopf's watches
make when it resumes tracks each existing service anew, so a service deleted meanwhile is never
taken up again.
"""

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name)."""


class Pausing(Protocol):
    """Whether the operator is paused, and a wait for it to become so (or not)."""

    def is_on(self) -> bool: ...

    async def wait_for(self, state: bool, /) -> None: ...


@dataclass(frozen=True)
class Job:
    """Periodic work on each tracked service.

    `run` does one pass and returns the seconds until the next (counted from this pass's start);
    `first_delay` is the seconds from a service's tracking to its first pass; `lag`, if set, is
    told how late each later pass started; `forget` drops what the job kept for a service once
    it is untracked (or the operator paused) and no pass of it runs; a pass that raises is
    logged and tried again after `retry_seconds`."""

    name: str
    run: Callable[[str, str], Awaitable[float]]
    first_delay: Callable[[str, str], float]
    retry_seconds: float
    lag: Callable[[float], None] | None = None
    forget: Callable[[str, str], None] | None = None


@dataclass(order=True, frozen=True)
class _Entry:
    due: float
    sequence: int
    job: str
    key: Key
    generation: int
    first: bool


class Scheduler:
    """Due times of every job on every tracked service, and the task that runs them."""

    def __init__(self, paused: Pausing, *, concurrency: int = 16) -> None:
        self._paused = paused
        self._slots = asyncio.Semaphore(concurrency)
        self._jobs: dict[str, Job] = {}
        self._tracked: dict[Key, int] = {}
        """Each tracked service's generation: entries of an earlier tracking are stale."""
        self._heap: list[_Entry] = []
        self._due: dict[tuple[str, Key], int] = {}
        """The sequence of each job and service's one live entry: any other is superseded."""
        self._again: set[tuple[str, Key]] = set()
        """Passes asked for while one of the job and service ran: the next starts at its end."""
        self._running: dict[tuple[str, Key], asyncio.Task[None]] = {}
        self._sequence = itertools.count()
        self._generations = itertools.count(1)
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        """Services tracked."""
        return len(self._tracked)

    def add_job(self, job: Job) -> None:
        """Run `job` on every service tracked now or later."""
        self._jobs[job.name] = job
        for key, generation in self._tracked.items():
            self._push(self._now() + job.first_delay(*key), job.name, key, generation, first=True)
        self._wakeup.set()

    def track(self, namespace: str, name: str) -> None:
        """The service exists: schedule every job's first pass, unless it is tracked already.
        Ignored while the operator is paused (the listing after it resumes tracks it)."""
        key = (namespace, name)
        if key in self._tracked or self._paused.is_on():
            return
        generation = next(self._generations)
        self._tracked[key] = generation
        now = self._now()
        for job in self._jobs.values():
            self._push(now + job.first_delay(*key), job.name, key, generation, first=True)
        self._wakeup.set()

    def run_soon(self, job: str, namespace: str, name: str) -> None:
        """Start the job's pass of a tracked service now (or, if one runs, right after it)
        instead of when it is due. Ignored for a service not tracked (or while paused)."""
        key = (namespace, name)
        generation = self._tracked.get(key)
        if generation is None or job not in self._jobs or self._paused.is_on():
            return
        if (job, key) in self._running:
            self._again.add((job, key))
            return
        self._push(self._now(), job, key, generation, first=True)
        self._wakeup.set()

    def untrack(self, namespace: str, name: str) -> None:
        """The service is gone or going: cancel its passes in flight, run no more of them, and
        forget what the jobs kept for it."""
        key = (namespace, name)
        if self._tracked.pop(key, None) is None:
            return
        for job in self._jobs.values():
            self._due.pop((job.name, key), None)
            self._again.discard((job.name, key))
            task = self._running.get((job.name, key))
            if task is None:
                _forget(job, key)
            else:
                task.cancel()  # its end forgets

    def start(self) -> None:
        """Start the scheduling task (on the running event loop)."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._loop(), name="kiln-scheduler"),
            loop.create_task(self._watch_pausing(), name="kiln-scheduler-pausing"),
        ]
        for task in self._tasks:
            task.add_done_callback(_report_end)

    async def close(self) -> None:
        """Stop scheduling and cancel the passes in flight."""
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self._cancel_passes()

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _push(self, due: float, job: str, key: Key, generation: int, *, first: bool) -> None:
        sequence = next(self._sequence)
        self._due[(job, key)] = sequence
        heapq.heappush(self._heap, _Entry(due, sequence, job, key, generation, first))

    async def _watch_pausing(self) -> None:
        """Wake the scheduling loop as soon as kopf pauses the operator."""
        while True:
            await self._paused.wait_for(True)
            self._wakeup.set()
            await self._paused.wait_for(False)

    async def _loop(self) -> None:
        while True:
            if self._paused.is_on():
                await self._pause()
                continue
            self._wakeup.clear()
            if not self._heap or self._heap[0].due > self._now():
                timeout = self._heap[0].due - self._now() if self._heap else None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wakeup.wait()
                continue
            entry = heapq.heappop(self._heap)
            if self._tracked.get(entry.key) != entry.generation or entry.job not in self._jobs:
                continue  # untracked (or tracked anew) since
            if self._due.get((entry.job, entry.key)) != entry.sequence:
                continue  # superseded by run_soon
            if (entry.job, entry.key) in self._running:  # a cancelled pass still ending
                self._push(self._now() + 1.0, entry.job, entry.key, entry.generation, first=True)
                continue
            job = self._jobs[entry.job]
            self._running[(entry.job, entry.key)] = asyncio.get_running_loop().create_task(
                self._pass(job, entry), name=f"kiln-{job.name}-{entry.key[0]}/{entry.key[1]}"
            )

    async def _pass(self, job: Job, entry: _Entry) -> None:
        key, next_due = entry.key, None
        try:
            async with self._slots:
                started = self._now()
                if job.lag is not None and not entry.first:
                    job.lag(max(0.0, started - entry.due))
                next_due = started + await job.run(*key)
        except Exception:  # the next pass decides afresh; cancellation is not caught
            logger.exception("%s of %s/%s failed", job.name, *key)
            next_due = self._now() + job.retry_seconds
        finally:
            self._running.pop((job.name, key), None)
            again = (job.name, key) in self._again
            self._again.discard((job.name, key))
            if key not in self._tracked:
                _forget(job, key)
            elif self._tracked[key] == entry.generation and next_due is not None:
                if again:
                    self._push(self._now(), job.name, key, entry.generation, first=True)
                else:
                    self._push(next_due, job.name, key, entry.generation, first=False)
                self._wakeup.set()

    async def _pause(self) -> None:
        """kopf paused the operator: act no more until it resumes."""
        logger.info("paused: no autoscaler pass or resync until the operator resumes")
        forgotten = list(self._tracked)
        self._tracked.clear()
        self._heap.clear()
        self._due.clear()
        self._again.clear()
        for key in forgotten:
            for job in self._jobs.values():
                if (job.name, key) not in self._running:  # a pass in flight forgets at its end
                    _forget(job, key)
        await self._cancel_passes()
        await self._paused.wait_for(False)
        logger.info("resumed: services are tracked again as the watches list them")

    async def _cancel_passes(self) -> None:
        await cancel_and_wait(list(self._running.values()))


async def cancel_and_wait(tasks: "list[asyncio.Task[None]]") -> None:
    """Cancel the tasks and wait until every one has ended (an error of one is its own to log)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _report_end(task: "asyncio.Task[None]") -> None:
    """The scheduling tasks run until the operator stops: an end by an error is a bug, said
    loudly (no pass or resync would run any more)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error(
            "%s ended: no more autoscaler passes or resyncs", task.get_name(), exc_info=error
        )


def _forget(job: Job, key: Key) -> None:
    if job.forget is not None:
        job.forget(*key)

"""A deduplicating work queue of InferenceServices to reconcile, as controller-runtime's.

Why it exists: watch events only say *which* object to look at. A handler that reconciled
inline would hold kopf's per-object worker, and every event arriving meanwhile (each a full
object body) would wait in kopf's queue: with 1000 services created at once that backlog, not
the work, is what fills memory and delays the status writes. Handlers therefore only add the
object's key here and return. A fixed number of workers take keys in order (priority, then arrival)
and reconcile from the watch-fed cache; a key already waiting is not added twice (its reconcile
will see the newest state anyway), and a key added while its reconcile runs is taken again
after it. Keys come in two priorities, as in controller-runtime's priority queue: a change of an
InferenceService itself (a new service, a new spec) and a retry go before the rest (a child's
status moving on, the periodic resync, the listing after a start), so a burst of new services
gets its children and first status without waiting behind the status refreshes of the
services created just before it; a waiting key is promoted when an urgent trigger comes. A
failed reconcile is added again after an exponential backoff (1, 2, 4 ... s, at most
`cap_seconds`), reset by the next success. While kopf has paused the operator (`paused`:
another replica is active) a key taken from the queue is dropped, not reconciled: the listing
kopf's watches make when it resumes queues every existing object afresh. A reconcile already
running when the pause comes finishes, as kopf's own handlers do.
"""

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kiln_operator import telemetry
from kiln_operator.k8s.scheduler import Pausing, cancel_and_wait

logger = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name)."""


URGENT_TRIGGERS = frozenset({"spec", "retry"})
"""Triggers taken before the others: the object itself changed, or its reconcile failed."""


@dataclass
class Request:
    """Why a key is queued: the first trigger's name (or the urgent one's that promoted it), and
    whether any asked for a fresh read."""

    trigger: str
    fresh: bool
    urgent: bool = False
    """Whether any of its triggers was urgent (URGENT_TRIGGERS)."""


Work = Callable[[str, str, Request], Coroutine[Any, Any, None]]
"""Reconciles one object; raising means "try again later"."""


class WorkQueue:
    """Keys waiting to be reconciled, and the workers that reconcile them."""

    def __init__(
        self,
        work: Work,
        *,
        workers: int,
        base_seconds: float = 1.0,
        cap_seconds: float = 300.0,
        paused: Pausing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._work = work
        self._clock = clock
        self._paused = paused
        self._workers = workers
        self._base = base_seconds
        self._cap = cap_seconds
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._order = itertools.count()
        self._waiting: dict[Key, Request] = {}
        self._since: dict[Key, float] = {}
        """When each waiting key was queued (the clock's time), for the oldest's age."""
        self._active: set[Key] = set()
        self._again: dict[Key, Request] = {}
        self._failures: dict[Key, int] = {}
        self._delayed: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        """Keys waiting (not those being reconciled)."""
        return len(self._waiting)

    @property
    def active(self) -> int:
        """Keys being reconciled now."""
        return len(self._active)

    def oldest_seconds(self) -> float:
        """How long the longest-waiting key has waited; 0 when none waits."""
        if not self._since:
            return 0.0
        return max(0.0, self._clock() - min(self._since.values()))

    def start(self) -> None:
        """Start the workers (on the running event loop)."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._worker(), name=f"kiln-reconcile-{n}")
            for n in range(self._workers)
        ]

    def add(self, namespace: str, name: str, *, trigger: str, fresh: bool = False) -> None:
        """Queue the object, unless it waits already (then only a fresh read is remembered)."""
        key = (namespace, name)
        if key in self._active:
            pending = self._again.get(key)
            self._again[key] = _merged(pending, trigger, fresh)
            return
        waiting = self._waiting.get(key)
        merged = _merged(waiting, trigger, fresh)
        self._waiting[key] = merged
        if waiting is None:
            self._since[key] = self._clock()
            telemetry.WORKQUEUE_ADDS.labels(trigger).inc()
        if waiting is None or (merged.urgent and not waiting.urgent):
            # a promoted key is queued again ahead; its older entry then finds it taken
            self._queue.put_nowait((0 if merged.urgent else 1, next(self._order), key))

    def forget(self, namespace: str, name: str) -> None:
        """The object is gone: drop its backoff and any delayed retry."""
        key = (namespace, name)
        self._failures.pop(key, None)
        if (handle := self._delayed.pop(key, None)) is not None:
            handle.cancel()

    def delay_after(self, failures: int) -> float:
        """Seconds before the retry that follows `failures` failures in a row."""
        return float(min(self._cap, self._base * 2 ** max(0, failures - 1)))

    async def _worker(self) -> None:
        while True:
            _, _, key = await self._queue.get()
            request = self._waiting.pop(key, None)
            if request is None:
                continue
            self._since.pop(key, None)
            if self._paused is not None and self._paused.is_on():
                self.forget(*key)  # another replica acts; the listing after the resume re-adds
                continue
            self._active.add(key)
            try:
                await self._work(*key, request)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the retry reads everything afresh
                self._retry_later(key, request, error)
            else:
                self.forget(*key)
            finally:
                self._active.discard(key)
                again = self._again.pop(key, None)
                if again is not None:
                    self.add(*key, trigger=again.trigger, fresh=again.fresh)

    def _retry_later(self, key: Key, request: Request, error: Exception) -> None:
        telemetry.WORKQUEUE_RETRIES.inc()
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.delay_after(failures)
        logger.warning(
            "reconcile of %s/%s failed (%s); retry in %g s", key[0], key[1], error, delay
        )
        if key not in self._delayed:
            loop = asyncio.get_running_loop()
            self._delayed[key] = loop.call_later(delay, self._retry_now, key, request)

    def _retry_now(self, key: Key, request: Request) -> None:
        self._delayed.pop(key, None)
        self.add(*key, trigger="retry", fresh=request.fresh)

    async def close(self) -> None:
        """Stop the workers and drop delayed retries."""
        for handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
        await cancel_and_wait(self._tasks)
        self._tasks = []


def _merged(pending: Request | None, trigger: str, fresh: bool) -> Request:
    urgent = trigger in URGENT_TRIGGERS
    if pending is None:
        return Request(trigger, fresh, urgent)
    if (fresh and not pending.fresh) or (urgent and not pending.urgent):
        return Request(trigger, fresh or pending.fresh, urgent or pending.urgent)
    return pending

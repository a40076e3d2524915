"""A deduplicating work queue of InferenceServices to reconcile, as controller-runtime's.

Why it exists: watch events only say *which* object to look at. A handler that reconciled
inline would hold kopf's per-object worker, and every event arriving meanwhile (each a full
object body) would wait in kopf's queue: with 1000 services created at once that backlog, not
the work, is what fills memory and delays the status writes. Handlers therefore only add the
object's key here and return. A fixed number of workers take keys in arrival order and
reconcile from the watch-fed cache; a key already waiting is not added twice (its reconcile
will see the newest state anyway), and a key added while its reconcile runs is taken again
after it. A failed reconcile is added again after an exponential backoff (1, 2, 4 ... s, at
most `cap_seconds`), reset by the next success. While kopf has paused the operator (`paused`:
another replica is active) a key taken from the queue is dropped, not reconciled: the listing
kopf's watches make when it resumes queues every existing object afresh. A reconcile already
running when the pause comes finishes, as kopf's own handlers do.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kiln_operator.k8s.scheduler import Pausing, cancel_and_wait

logger = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name)."""


@dataclass
class Request:
    """Why a key is queued: the first trigger's name, and whether any asked for a fresh read."""

    trigger: str
    fresh: bool


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
    ) -> None:
        self._work = work
        self._paused = paused
        self._workers = workers
        self._base = base_seconds
        self._cap = cap_seconds
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._waiting: dict[Key, Request] = {}
        self._active: set[Key] = set()
        self._again: dict[Key, Request] = {}
        self._failures: dict[Key, int] = {}
        self._delayed: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        """Keys waiting (not those being reconciled)."""
        return len(self._waiting)

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
        self._waiting[key] = _merged(waiting, trigger, fresh)
        if waiting is None:
            self._queue.put_nowait(key)

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
            key = await self._queue.get()
            request = self._waiting.pop(key, None)
            if request is None:
                continue
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
    if pending is None:
        return Request(trigger, fresh)
    if fresh and not pending.fresh:
        return Request(trigger, True)
    return pending

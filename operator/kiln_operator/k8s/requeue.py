"""Run a failed reconcile again later, with exponential backoff per object.

Why it exists: the reconcile loop is driven by watch events (level-based, as controller-runtime),
and kopf does not retry an event handler that failed. A reconcile that failed on a transient API
error (a timeout, a 409 that outlasted its retries, a 5xx) must not wait for the next resync:
like controller-runtime's rate-limited work queue, it is queued again after 1, 2, 4 ... seconds,
at most `cap_seconds`, and the backoff resets when a reconcile of that object succeeds.
"""

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

Key = tuple[str, str]
"""(namespace, name)."""


class Requeue:
    """Schedules `run(namespace, name)` again after a failure; one pending retry per object."""

    def __init__(
        self,
        run: Callable[[str, str], Coroutine[Any, Any, None]],
        *,
        base_seconds: float = 1.0,
        cap_seconds: float = 300.0,
    ) -> None:
        self._run = run
        self._base = base_seconds
        self._cap = cap_seconds
        self._failures: dict[Key, int] = {}
        self._pending: dict[Key, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Task[None]] = set()

    def delay_after(self, failures: int) -> float:
        """Seconds before the retry that follows `failures` failures in a row."""
        return float(min(self._cap, self._base * 2 ** max(0, failures - 1)))

    def failed(self, namespace: str, name: str) -> float:
        """Count a failure and schedule a retry (unless one is pending); returns its delay."""
        key = (namespace, name)
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.delay_after(failures)
        if key not in self._pending:
            loop = asyncio.get_running_loop()
            self._pending[key] = loop.call_later(delay, self._fire, key)
        return delay

    def succeeded(self, namespace: str, name: str) -> None:
        """The object converged: forget its failures and any retry still pending."""
        key = (namespace, name)
        self._failures.pop(key, None)
        if (handle := self._pending.pop(key, None)) is not None:
            handle.cancel()

    def _fire(self, key: Key) -> None:
        self._pending.pop(key, None)
        task = asyncio.get_running_loop().create_task(self._run(*key), name=f"requeue {key}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def close(self) -> None:
        """Cancel pending retries and wait for running ones to stop."""
        for handle in self._pending.values():
            handle.cancel()
        self._pending.clear()
        for task in list(self._running):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

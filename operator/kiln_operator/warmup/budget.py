"""A byte budget shared by every warm-up the operator runs at once.

Why it exists: a warm-up holds its request and response tensors in the operator's memory, and
their size is the spec's to choose. Without a bound, one tenant's large inputs (or many services
warming up together) grow the operator past its memory limit, and an OOM-killed operator stops
reconciling every InferenceService in the cluster. Each attempt holds its bytes from this budget
for as long as it runs; attempts that do not fit wait, first come first served, so a large one
is not starved by a stream of small ones. It never allocates anything itself.
"""

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class ByteBudget:
    """At most `capacity` bytes held at once, by any number of holders."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"a byte budget must be positive, not {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.peak_held = 0
        """The most bytes held at once so far (for the benchmark and the operator's logs)."""

    @property
    def held(self) -> int:
        """Bytes held now."""
        return self.capacity - self._free

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        """Hold `size` bytes for the block, waiting until they are free. A size above the
        capacity can never be held: ValueError (validation refuses such specs first)."""
        if not 0 <= size <= self.capacity:
            raise ValueError(f"{size} bytes can never fit a budget of {self.capacity} bytes")
        if not self._waiting and size <= self._free:
            self._take(size)
        else:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (size, granted)
            self._waiting.append(entry)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._give_back(size)  # granted just as the waiter was cancelled
                else:
                    self._waiting.remove(entry)
                    self._grant()  # a smaller waiter behind it may fit now
                raise
        try:
            yield
        finally:
            self._give_back(size)

    def _take(self, size: int) -> None:
        self._free -= size
        self.peak_held = max(self.peak_held, self.held)

    def _give_back(self, size: int) -> None:
        self._free += size
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._waiting[0][0] <= self._free:
            size, granted = self._waiting.popleft()
            self._take(size)
            granted.set_result(None)

"""The two kinds of budget that bound what a client may cost: memory and floods.

Why it exists: memory is bounded across every connection of a port (``MemoryBudget``, shared),
floods of cheap frames per connection (``FloodBudget``, a token bucket), as Go, nginx and Envoy
bound them. Both are plain counters; the connection decides what to do when one runs out
(stop reading, or GOAWAY ENHANCE_YOUR_CALM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from kiln_runtime.protocol.http2.state import ConnectionState

FLOOD_BURST_SECONDS = 10.0  # each flood budget holds this many seconds of its rate


class MemoryBudget:
    """Bytes that every connection of a port holds (request bodies, unsent responses).

    A connection over it reopens no receive window and starts no request; it waits here and
    is resumed when another connection releases memory.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._waiting: set[ConnectionState] = set()

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def charge(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def release(self, size: int) -> None:
        self.used -= size
        if self._waiting and not self.exhausted:
            waiting, self._waiting = self._waiting, set()
            for connection in waiting:
                connection.budget_freed()

    def wait(self, connection: ConnectionState) -> None:
        self._waiting.add(connection)

    def forget(self, connection: ConnectionState) -> None:
        self._waiting.discard(connection)


class Evictable(Protocol):
    """A connection the health reserve can drop: whether it serves anything, and how to end it."""

    @property
    def idle(self) -> bool: ...

    def evict(self) -> None: ...


C = TypeVar("C", bound=Evictable)


class HealthReserve(Generic[C]):
    """The connections a port admits past ``maxConnections`` for health checks only.

    So that the kubelet's probe is served even when clients hold every connection:
    ``healthConnections`` more are admitted, each limited to ``paths`` (other calls on it are
    refused and the connection told to go away); when those are full too, the oldest one not
    serving anything is dropped to admit the new one. Shared by a port's connections, oldest
    first (a dict keeps insertion order); both ports, HTTP/1.1 and gRPC, keep one.
    """

    def __init__(self, paths: frozenset[bytes] = frozenset()) -> None:
        self.paths = paths
        self.connections: dict[C, None] = {}
        # What the port did at its cap (the port's saturation, for metrics, log and readiness):
        # idle connections closed to admit new ones, connections refused (none was idle), and
        # when the last one was refused (the loop's clock; 0: never).
        self.evicted = 0
        self.refused = 0
        self.refused_at = 0.0

    def evict_idle(self) -> bool:
        """Drop the oldest health-budget connection with no open request; False if none."""
        for connection in self.connections:
            if connection.idle:
                connection.evict()
                self.evicted += 1
                return True
        return False


class FloodBudget:
    """A token bucket: ``rate`` events a second, a burst of ``FLOOD_BURST_SECONDS`` of them."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._burst = rate * FLOOD_BURST_SECONDS
        self._tokens = self._burst
        self._at = 0.0

    def spend(self, now: float) -> bool:
        """Count one event at ``now``; False once the budget is spent."""
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate) - 1
        self._at = now
        return self._tokens >= 0

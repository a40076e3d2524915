"""The activator's hold: requests for a service without a ready pod wait here, bounded.

Why it exists: a service at zero (or waking) has no pod to answer; the activator keeps each
request until the operator reports the first pod that passed its warm-up gate, then releases
them all to it. What may wait is bounded per service, in requests and in bytes, and each
request waits at most its deadline: beyond any of them the caller answers at once that the
service is waking (HTTP 503 with Retry-After, gRPC UNAVAILABLE), so one service's burst never
takes the memory another's requests need. The number of services held for is bounded too.
Each service's first held request is news the operator waits for (``next_demand``: it wakes
the service at once, not at its autoscaler's next pass). Pure asyncio, no I/O: the fronts
(``fronts``) and the control endpoint (``control``) use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field

ServiceKey = tuple[str, str]
"""(namespace, InferenceService name)."""


@dataclass(frozen=True)
class HoldLimits:
    """How much one service may hold, and for how long."""

    max_requests: int = 1000
    """Requests held per service at once; one more is refused."""
    max_bytes: int = 256 << 20
    """Request bytes held per service at once; a request that would pass it is refused."""
    timeout_seconds: float = 120.0
    """The longest a request waits for a ready pod (a shorter client deadline wins)."""
    max_services: int = 10_000
    """Services the activator holds requests for at once."""


class Refused(Exception):
    """The request cannot be held or was not released in time; ``reason`` names which bound
    (``requests``, ``bytes``, ``services``, ``deadline``), the message says so for the client."""

    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


@dataclass
class _Service:
    held: int = 0
    held_bytes: int = 0
    backends: tuple[str, ...] = ()
    grpc_backends: tuple[str, ...] = ()
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    waiting_since: float | None = None
    """When the first request of the current wait arrived (wake latency's start)."""
    turn: itertools.count[int] = field(default_factory=itertools.count)


@dataclass(frozen=True)
class Release:
    """Where a released request goes, and how long it was held."""

    address: str
    held_seconds: float


class Holds:
    """Every service's held requests and the ready backends the operator reported."""

    def __init__(self, limits: HoldLimits) -> None:
        self.limits = limits
        self._services: dict[ServiceKey, _Service] = {}
        self.wakes: list[float] = []
        """Wake latencies (first held request to the first ready pod) not yet observed."""
        self.generation = 0
        """Counts the waits begun: a service's first held request while it has no pod."""
        self._news = asyncio.Event()

    async def next_demand(self, after: int, wait_seconds: float) -> int:
        """The generation once it differs from ``after`` (at once if it does already), or
        ``after`` when ``wait_seconds`` pass without a new wait."""
        if self.generation == after:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_seconds):
                    await self._news.wait()
        return self.generation

    def demand(self) -> dict[ServiceKey, int]:
        """Requests held now, per service that holds any: what the autoscaler reads."""
        return {key: s.held for key, s in self._services.items() if s.held}

    def addresses(self) -> set[str]:
        """Every backend (HTTP and gRPC) of every service."""
        return {a for s in self._services.values() for a in (*s.backends, *s.grpc_backends)}

    def grpc_addresses(self) -> set[str]:
        """Every gRPC backend of every service (the channels worth keeping open)."""
        return {address for s in self._services.values() for address in s.grpc_backends}

    def set_backends(
        self, key: ServiceKey, http: tuple[str, ...], grpc: tuple[str, ...] = ()
    ) -> None:
        """The service's ready pods (``host:port`` of its HTTP and gRPC ports): non-empty
        releases every held request; empty makes new requests wait again."""
        service = self._services.get(key)
        if service is None:
            if not http and not grpc:
                return
            service = self._services[key] = _Service()
        service.backends, service.grpc_backends = http, grpc
        if http or grpc:
            if service.waiting_since is not None:
                self.wakes.append(time.monotonic() - service.waiting_since)
                service.waiting_since = None
            service.ready.set()
        else:
            service.ready = asyncio.Event()
        self._forget_if_idle(key, service)

    async def wait(self, key: ServiceKey, size: int, grpc: bool, deadline: float | None) -> Release:
        """Hold one request of ``size`` bytes until the service has a ready backend (the
        ``grpc`` port's if ``grpc``); ``deadline`` is the client's own (monotonic), if any.
        Raises ``Refused`` at once when a bound is passed, or at the deadline."""
        limits = self.limits
        service = self._services.get(key)
        if service is None:
            if len(self._services) >= limits.max_services:
                raise Refused(
                    "services",
                    f"the activator holds requests for {limits.max_services} services already; "
                    f"{key[0]}/{key[1]} is waking, retry shortly",
                    retry_after=5,
                )
            service = self._services[key] = _Service()
        picked = self._pick(service, grpc)
        if picked is not None:
            return Release(picked, 0.0)
        if service.held + 1 > limits.max_requests:
            raise Refused(
                "requests",
                f"service {key[0]}/{key[1]} is waking and {service.held} requests wait for it "
                f"already (the activator's limit); retry shortly",
                retry_after=self._retry_after(service),
            )
        if service.held_bytes + size > limits.max_bytes:
            raise Refused(
                "bytes",
                f"service {key[0]}/{key[1]} is waking and the requests waiting for it hold "
                f"{service.held_bytes} bytes (the activator's limit is {limits.max_bytes}); "
                "retry shortly",
                retry_after=self._retry_after(service),
            )
        now = time.monotonic()
        until = now + limits.timeout_seconds
        if deadline is not None:
            until = min(until, deadline)
        if service.waiting_since is None:
            service.waiting_since = now
            self.generation += 1
            self._news.set()
            self._news = asyncio.Event()
        service.held += 1
        service.held_bytes += size
        try:
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    await service.ready.wait()
                picked = self._pick(service, grpc)
                if picked is not None:
                    return Release(picked, time.monotonic() - now)
                # released to the other protocol's pods only: wait for this protocol's
                service.ready = asyncio.Event()
        except TimeoutError:
            raise Refused(
                "deadline",
                f"service {key[0]}/{key[1]} is waking: no pod passed its warm-up gate within "
                f"{time.monotonic() - now:.0f} s; retry shortly",
                retry_after=self._retry_after(service),
            ) from None
        finally:
            service.held -= 1
            service.held_bytes -= size
            if service.held == 0 and not service.ready.is_set():
                service.waiting_since = None
            self._forget_if_idle(key, service)

    def _pick(self, service: _Service, grpc: bool) -> str | None:
        backends = service.grpc_backends if grpc else service.backends
        if not backends:
            return None
        return backends[next(service.turn) % len(backends)]

    def _retry_after(self, service: _Service) -> int:
        """Seconds a refused client should wait: what is left of the longest wait, at least 1."""
        if service.waiting_since is None:
            return 1
        waited = time.monotonic() - service.waiting_since
        return max(1, int(self.limits.timeout_seconds - waited) // 4)

    def _forget_if_idle(self, key: ServiceKey, service: _Service) -> None:
        if service.held == 0 and not service.backends and not service.grpc_backends:
            self._services.pop(key, None)

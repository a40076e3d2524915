"""The response cache: an answer computed once serves every identical request after it.

Why it exists: inputs repeat (popular queries, one item ranked for many users, retries), and a
repeated request otherwise costs a batch slot and counts against the replica's capacity. With
``spec.runtime.cache`` the data plane asks this cache before the batcher (``DataPlane.infer``):

- a hit is answered from the pod's memory and never enters the batcher;
- a miss is computed, then stored (a copy of the requested outputs, read-only);
- identical misses that arrive while the first is computed wait for its answer (single
  flight): the model computes it once. If that computation fails, each waiter computes its own;
- with Redis (``redis_cache``, shared by the service's replicas) a local miss asks Redis within
  a bounded time before computing; whatever Redis does, the request is served.

The key is a SHA-256 of the service's key prefix and the model (name, version, format,
declared tensors, optimization), then of every input's name, datatype, shape and bytes, the
requested outputs and the request's parameters, less the few that only change how or when the
answer is delivered (``DELIVERY_PARAMETERS``). A request whose parameters cannot be written
canonically is not cached. Memory is bounded in bytes (``maxBytes``, an LRU that counts each
entry's tensors and its bookkeeping), each entry lives ``ttlSeconds`` at most, and an answer
larger than ``maxEntryBytes`` is not stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kiln_runtime import errors
from kiln_runtime.config import CacheConfig, RuntimeConfig
from kiln_runtime.metrics import FastHistogram, _HistogramFamily
from kiln_runtime.protocol.types import InferRequest, Tensor

BYPASS_PARAMETER = "kiln_cache_bypass"
"""A request parameter: true, the request is computed, neither looked up nor kept (the
operator's warm-up gate sends it: it must time the model, not the cache)."""
DELIVERY_PARAMETERS = frozenset({"timeout", "priority", "binary_data_output"})
"""Request parameters that change when or in which encoding the answer arrives, not what it
holds: left out of the key, so a retry with another timeout still hits."""
ENTRY_OVERHEAD_BYTES = 512
"""What one entry costs besides its tensors' data: the key, the LRU's link, the entry, its list
(measured under tracemalloc by the 100,000-key test, with margin)."""
TENSOR_OVERHEAD_BYTES = 256
"""What one stored tensor costs besides its data: the ndarray and the Tensor around it."""

LOOKUP_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2)
"""A lookup takes microseconds: finer than the request buckets."""

Compute = Callable[[], Awaitable[list[Tensor]]]


class Remote(Protocol):
    """A shared tier behind the pod's own (``redis_cache.RedisTier``). Neither method raises:
    a failure is a miss (``get`` returns None) or a skipped write, counted in ``CacheStats``."""

    async def get(self, key: bytes) -> list[Tensor] | None: ...

    def put(self, key: bytes, outputs: list[Tensor]) -> None: ...

    async def close(self) -> None: ...


class CacheStats:
    """The cache's counters, read at scrape time (``CacheCollector``): a request updates plain
    integers, never a prometheus_client object."""

    def __init__(self) -> None:
        self.hits_local = 0
        self.hits_redis = 0
        self.hits_inflight = 0
        self.misses = 0
        self.hit_seconds = 0.0
        self.miss_seconds = 0.0
        self.evicted_size = 0
        self.evicted_expired = 0
        self.not_cacheable = 0
        self.too_large = 0
        # (operation, reason) -> count; redis_cache fills it
        self.redis_errors: dict[tuple[str, str], int] = {}

    @property
    def hits(self) -> int:
        return self.hits_local + self.hits_redis + self.hits_inflight

    def redis_error(self, operation: str, reason: str) -> None:
        key = (operation, reason)
        self.redis_errors[key] = self.redis_errors.get(key, 0) + 1


class _Entry:
    __slots__ = ("expires", "nbytes", "outputs")

    def __init__(self, outputs: list[Tensor], nbytes: int, expires: float) -> None:
        self.outputs = outputs
        self.nbytes = nbytes
        self.expires = expires


class ResponseCache:
    """The pod's bytes-bounded LRU with a TTL, single flight, and an optional shared tier."""

    def __init__(
        self,
        config: RuntimeConfig,
        cache: CacheConfig,
        stats: CacheStats,
        lookup_seconds: FastHistogram | None = None,
    ) -> None:
        self._max_bytes = cache.max_bytes
        self._max_entry_bytes = cache.max_entry_bytes
        self._ttl = cache.ttl_seconds
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._bytes = 0
        self._flights: dict[bytes, list[asyncio.Future[list[Tensor] | None]]] = {}
        self._inputs = [
            _field(spec.name.encode()) + _field(spec.datatype.encode())
            for spec in config.model.inputs
        ]
        # SHA-256: with the CPU's SHA extensions (OpenSSL uses them) about three times the
        # speed of BLAKE2b on tensors; the model's part hashed once, copied per request.
        self._seed = hashlib.sha256(model_fingerprint(config, cache.key_prefix))
        self.stats = stats
        self._lookup_seconds = lookup_seconds
        self.remote: Remote | None = None

    # ------------------------------------------------------------------------ reading

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._entries)

    def key(self, request: InferRequest, arrays: list[npt.NDArray[Any]]) -> bytes | None:
        """The request's key, or None when it cannot be cached. ``arrays`` are the validated
        inputs in the declared order (their names and datatypes are the declared ones)."""
        parameters = canonical_parameters(request.parameters)
        if parameters is None:
            return None
        digest = self._seed.copy()
        for named, array in zip(self._inputs, arrays, strict=True):
            shape = array.shape
            digest.update(named + _SHAPES[len(shape)].pack(len(shape), *shape, array.nbytes))
            try:
                digest.update(array)  # type: ignore[arg-type]
            except ValueError:  # numpy: "not C-contiguous" (rare): its bytes in order
                digest.update(np.ascontiguousarray(array))  # type: ignore[arg-type]
        if request.outputs or parameters:
            outputs = sorted({o.name for o in request.outputs})
            tail = [struct.pack("<H", len(outputs)), *(_field(o.encode()) for o in outputs)]
            digest.update(b"".join(tail) + _field(parameters))
        else:
            digest.update(_NO_OUTPUTS_NO_PARAMETERS)
        return digest.digest()

    def lookup(self, key: bytes) -> list[Tensor] | None:
        """The pod's own entry for ``key``, if it has a fresh one (and marks it recently used)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= time.monotonic():
            del self._entries[key]
            self._bytes -= entry.nbytes
            self.stats.evicted_expired += 1
            return None
        self._entries.move_to_end(key)
        return entry.outputs

    async def answer(
        self,
        request: InferRequest,
        arrays: list[npt.NDArray[Any]],
        compute: Compute,
        deadline: float | None,
    ) -> list[Tensor]:
        """The requested outputs: from the cache, from an identical request being computed,
        from the shared tier, or from ``compute`` (then stored). ``deadline`` (monotonic)
        bounds only the wait for another request's computation; ``compute`` keeps its own."""
        started = time.perf_counter()
        key = self.key(request, arrays)
        if key is None:
            self.stats.not_cacheable += 1
            return await compute()
        outputs = self.lookup(key)
        looked_up = time.perf_counter() - started
        if self._lookup_seconds is not None:
            self._lookup_seconds.observe(looked_up)
        if outputs is not None:
            self.stats.hits_local += 1
            self.stats.hit_seconds += looked_up
            return outputs
        self.stats.miss_seconds += looked_up
        waiters = self._flights.get(key)
        if waiters is not None:
            return await self._follow(waiters, compute, deadline)
        waiters = []
        self._flights[key] = waiters
        result: list[Tensor] | None = None
        try:
            if self.remote is not None:
                result = await self.remote.get(key)
                if result is not None:
                    self.stats.hits_redis += 1
                    self.store(key, result, copy=False)
                    return result
            self.stats.misses += 1
            result = await compute()
            stored = self.store(key, result)
            if stored and self.remote is not None:
                self.remote.put(key, result)
            return result
        finally:
            del self._flights[key]
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(result)

    async def _follow(
        self,
        waiters: list[asyncio.Future[list[Tensor] | None]],
        compute: Compute,
        deadline: float | None,
    ) -> list[Tensor]:
        """Wait for the identical request being computed; compute alone if it failed."""
        waiter: asyncio.Future[list[Tensor] | None] = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        if deadline is None:
            result = await waiter
        else:
            try:
                result = await asyncio.wait_for(waiter, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise errors.InferError(
                    errors.ErrorKind.DEADLINE,
                    "deadline exceeded while waiting for an identical request's answer",
                ) from None
        if result is None:
            self.stats.misses += 1
            return await compute()
        self.stats.hits_inflight += 1
        return result

    # ------------------------------------------------------------------------ writing

    def store(self, key: bytes, outputs: list[Tensor], *, copy: bool = True) -> bool:
        """Keep ``outputs`` under ``key`` (a read-only copy unless ``copy`` is False: the
        caller's arrays may view a whole batch), evicting the least recently used entries
        beyond ``maxBytes``. False if the answer is larger than ``maxEntryBytes``."""
        nbytes = ENTRY_OVERHEAD_BYTES
        for tensor in outputs:
            nbytes += TENSOR_OVERHEAD_BYTES + tensor.data.nbytes
        if nbytes > self._max_entry_bytes:
            self.stats.too_large += 1
            return False
        kept = [Tensor(t.name, t.datatype, _frozen(t.data)) for t in outputs] if copy else outputs
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[key] = _Entry(kept, nbytes, time.monotonic() + self._ttl)
        self._bytes += nbytes
        while self._bytes > self._max_bytes:
            _, victim = self._entries.popitem(last=False)
            self._bytes -= victim.nbytes
            self.stats.evicted_size += 1
        return True

    async def close(self) -> None:
        if self.remote is not None:
            await self.remote.close()


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    copy = np.array(array, copy=True, order="C")
    copy.flags.writeable = False
    return copy


_SHAPES = [struct.Struct(f"<B{n}qQ") for n in range(34)]
"""Each input's rank, dimensions and byte count, by rank (numpy allows 32 dimensions; the
batch's one more is refused before it gets here)."""
_NO_OUTPUTS_NO_PARAMETERS = b"\0\0\0\0\0\0"
"""The usual tail: no outputs named (all of them), no parameters (an empty field)."""


def _field(data: bytes) -> bytes:
    """``data`` length-prefixed: no two different sequences of fields hash alike."""
    return struct.pack("<I", len(data)) + data


def model_fingerprint(config: RuntimeConfig, key_prefix: str) -> bytes:
    """What makes two pods' answers interchangeable: the service (its key prefix), the model
    (name, version, format, declared tensors) and how it is computed (the optimization: int8
    answers are not fp32 answers). Pods of a rollout that changes any of it share no entry."""
    model, optimization = config.model, config.optimization
    document = {
        "prefix": key_prefix,
        "name": model.name,
        "version": model.version,
        "format": model.format,
        "inputs": [[s.name, s.datatype, list(s.shape)] for s in model.inputs],
        "outputs": [[s.name, s.datatype, list(s.shape)] for s in model.outputs],
        "optimization": [
            optimization.mode,
            optimization.precision,
            optimization.cuda_graphs,
            optimization.device,
        ],
    }
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def canonical_parameters(parameters: Any) -> bytes | None:
    """The request's parameters as canonical bytes (keys sorted; gRPC's InferParameter read as
    its one value, so HTTP and gRPC write the same parameters alike), without the
    ``DELIVERY_PARAMETERS``; None if they cannot be written, or ask to bypass the cache (the
    request is computed, not cached)."""
    if not parameters:
        return b""
    if not isinstance(parameters, dict) and not hasattr(parameters, "items"):
        return None
    plain: dict[str, Any] = {}
    for name, given in parameters.items():
        if name in DELIVERY_PARAMETERS:
            continue
        value = given
        if hasattr(given, "WhichOneof"):  # gRPC's InferParameter: its one value
            choice = given.WhichOneof("parameter_choice")
            value = None if choice is None else getattr(given, choice)
        if name == BYPASS_PARAMETER and value is True:
            return None
        plain[name] = value
    if not plain:
        return b""
    try:
        return orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None


class CacheCollector(Collector):
    """The cache's metrics (docs/metrics.md), read from ``CacheStats`` and the cache at scrape."""

    def __init__(self, model: str, cache: ResponseCache, registry: CollectorRegistry) -> None:
        self.model = model
        self.cache = cache
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected at scrape only (no duplicate-name check needed)

    def collect(self) -> Iterator[Metric]:
        s, m = self.cache.stats, self.model
        hits = CounterMetricFamily(
            "kiln_cache_hits",
            "Requests answered by the response cache, by where the answer came from: local "
            "(this pod), redis (the service's shared cache), inflight (an identical request "
            "being computed). Hits never enter the batcher.",
            labels=["model", "source"],
        )
        for source, count in (
            ("local", s.hits_local),
            ("redis", s.hits_redis),
            ("inflight", s.hits_inflight),
        ):
            hits.add_metric([m, source], count)
        yield hits
        misses = CounterMetricFamily(
            "kiln_cache_misses", "Requests the response cache sent to the model.", labels=["model"]
        )
        misses.add_metric([m], s.misses)
        yield misses
        evictions = CounterMetricFamily(
            "kiln_cache_evictions",
            "Entries removed: size (the least recently used, past maxBytes), expired (past "
            "ttlSeconds, found on a lookup).",
            labels=["model", "reason"],
        )
        evictions.add_metric([m, "size"], s.evicted_size)
        evictions.add_metric([m, "expired"], s.evicted_expired)
        yield evictions
        skipped = CounterMetricFamily(
            "kiln_cache_skipped",
            "Requests or answers the cache did not keep: not_cacheable (parameters that cannot "
            "be keyed, or kiln_cache_bypass: true), too_large (an answer over maxEntryBytes).",
            labels=["model", "reason"],
        )
        skipped.add_metric([m, "not_cacheable"], s.not_cacheable)
        skipped.add_metric([m, "too_large"], s.too_large)
        yield skipped
        held = GaugeMetricFamily(
            "kiln_cache_bytes",
            "Bytes the pod's response cache holds (tensors and bookkeeping), at most maxBytes.",
            labels=["model"],
        )
        held.add_metric([m], self.cache.nbytes)
        yield held
        entries = GaugeMetricFamily(
            "kiln_cache_entries", "Answers the pod's response cache holds.", labels=["model"]
        )
        entries.add_metric([m], self.cache.entries)
        yield entries
        redis = CounterMetricFamily(
            "kiln_cache_redis_errors",
            "Shared-cache operations that failed and were served without it: operation get or "
            "set; reason timeout, error (connection refused, reset, auth), corrupt (a value "
            "whose checksum or layout is wrong: a miss), skipped (not tried: Redis failed within "
            "the last second, or maxConnections operations or 64 writes are under way).",
            labels=["model", "operation", "reason"],
        )
        for (operation, reason), count in sorted(s.redis_errors.items()):
            redis.add_metric([m, operation, reason], count)
        yield redis


def lookup_histogram(model: str, registry: CollectorRegistry) -> FastHistogram:
    """``kiln_cache_lookup_duration_seconds``: the key's hash and the pod's lookup."""
    return _HistogramFamily(
        "kiln_cache_lookup_duration_seconds",
        "Time to key a request (hash its inputs and parameters) and look it up in the pod's "
        "response cache, hit or miss.",
        ["model"],
        buckets=LOOKUP_BUCKETS,
        registry=registry,
    ).labels(model)

"""The response cache's shared tier: one Redis for every replica of a service.

Why it exists: each pod's cache (``response_cache``) warms alone, so a popular answer is
computed once per replica, and again after each rollout. With ``spec.runtime.cache.redis`` a
pod's miss asks Redis before computing, and a computed answer is written there for the others.

Redis must never cost a request its answer. Every operation is bounded by
``timeoutMilliseconds`` (connecting included); a failed one is a miss (get) or a dropped write
(set), counted in ``kiln_cache_redis_errors_total``, and for the next second the pod does not
ask Redis at all, so a dead Redis costs one timeout per second, not one per request. Writes go
out after the answer, at most ``MAX_PENDING_WRITES`` at once; at most ``maxConnections``
operations are under way at once, and a request past that is served without asking (counted
``skipped``), never queued for a connection.

What is read is bounded and checked: at most the largest value this runtime writes
(``GETRANGE``), then a magic, a checksum (HMAC-SHA-256 keyed with the entry's own key: a value
copied under another key, truncated or altered fails it), and a layout whose names, datatypes
and sizes must be the model's declared outputs. Anything else is a miss, counted ``corrupt``.

Keys are ``<keyPrefix><hex of the 256-bit key>``: the operator renders the prefix as
``kiln:<namespace>/<name>:``, and the key's hash covers it too (``response_cache``), so two
services never answer each other; the credentials are the service's own (a Secret's
``username`` and ``password``, in the environment), so Redis ACLs can confine each service to
its prefix (docs/runtime.md).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import struct
import time
from collections.abc import Mapping

import numpy as np
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from kiln_runtime.config import CacheConfig, RedisConfig, TensorSpec
from kiln_runtime.datatypes import numpy_carrier
from kiln_runtime.protocol.types import Tensor
from kiln_runtime.response_cache import ENTRY_OVERHEAD_BYTES, CacheStats

log = logging.getLogger(__name__)

MAGIC = b"KLNC\x01"
CHECKSUM_BYTES = 32
HEADER_BYTES = len(MAGIC) + CHECKSUM_BYTES
BACKOFF_SECONDS = 1.0
"""After a failure, how long the pod serves without asking Redis."""
MAX_PENDING_WRITES = 64
ENV_USERNAME = "KILN_CACHE_REDIS_USERNAME"
ENV_PASSWORD = "KILN_CACHE_REDIS_PASSWORD"


class RedisTier:
    """``response_cache.Remote`` over a Redis server."""

    def __init__(
        self,
        redis: RedisConfig,
        cache: CacheConfig,
        outputs: tuple[TensorSpec, ...],
        stats: CacheStats,
        *,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self._timeout = redis.timeout_seconds
        self._ttl_ms = max(1, int(cache.ttl_seconds * 1000))
        self._prefix = cache.key_prefix.encode()
        # A stored value is never larger than the entry bound plus its header and layout.
        self._max_value = cache.max_entry_bytes + HEADER_BYTES + ENTRY_OVERHEAD_BYTES
        self._outputs = {spec.name: spec.datatype for spec in outputs}
        self._stats = stats
        self._skip_until = 0.0
        self._writes: set[asyncio.Task[None]] = set()
        # Operations under way, at most one per connection: past it a request does not wait
        # for a connection (nor does redis-py's pool refuse one, which would read as a failure)
        self._busy = 0
        self._max_busy = redis.max_connections
        self._client = Redis(
            host=redis.host,
            port=redis.port,
            username=username or None,
            password=password or None,
            socket_timeout=redis.timeout_seconds,
            socket_connect_timeout=redis.timeout_seconds,
            max_connections=redis.max_connections,
            retry=Retry(NoBackoff(), 0),  # a retry is another timeout the request would wait
            health_check_interval=0,
        )

    async def connect(self, timeout_seconds: float = 5.0) -> bool:
        """Open the first connection before traffic (connecting and authenticating take longer
        than a lookup may); False, logged, if Redis does not answer: requests then go on
        without it, and each lookup tries again after the usual second."""
        try:
            async with asyncio.timeout(timeout_seconds):
                await self._client.ping()
        except Exception as error:  # an unreachable Redis is no reason to stop
            log.warning("response cache: Redis does not answer (%r); serving without it", error)
            return False
        log.info("response cache: Redis connected")
        return True

    def _name(self, key: bytes) -> bytes:
        return self._prefix + key.hex().encode()

    def _failed(self, operation: str, reason: str, error: BaseException | None) -> None:
        self._stats.redis_error(operation, reason)
        now = time.monotonic()
        if now >= self._skip_until and reason != "corrupt":
            log.warning("response cache: Redis %s failed (%s: %r); serving without it for "
                        "%.0f s", operation, reason, error, BACKOFF_SECONDS)  # fmt: skip
            self._skip_until = now + BACKOFF_SECONDS

    def _skipping(self, operation: str) -> bool:
        if time.monotonic() < self._skip_until or self._busy >= self._max_busy:
            self._stats.redis_error(operation, "skipped")
            return True
        return False

    async def get(self, key: bytes) -> list[Tensor] | None:
        if self._skipping("get"):
            return None
        self._busy += 1
        try:
            async with asyncio.timeout(self._timeout):
                value = await self._client.getrange(self._name(key), 0, self._max_value - 1)
        except TimeoutError as error:  # asyncio's, and redis-py's own (a subclass)
            self._failed("get", "timeout", error)
            return None
        except Exception as error:  # whatever Redis does, the request is served
            self._failed("get", "error", error)
            return None
        finally:
            self._busy -= 1
        if not isinstance(value, bytes) or not value:  # bytes: decode_responses is off
            return None
        outputs = decode_value(value, key, self._outputs)
        if outputs is None:
            self._failed("get", "corrupt", None)
        return outputs

    def put(self, key: bytes, outputs: list[Tensor]) -> None:
        if self._skipping("set"):
            return
        if len(self._writes) >= MAX_PENDING_WRITES:
            self._stats.redis_error("set", "skipped")
            return
        value = encode_value(key, outputs)
        self._busy += 1  # from now: a connection this write will take
        task = asyncio.get_running_loop().create_task(self._set(self._name(key), value))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _set(self, name: bytes, value: bytes) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._client.set(name, value, px=self._ttl_ms)
        except TimeoutError as error:
            self._failed("set", "timeout", error)
        except Exception as error:  # a lost write is a later miss, nothing more
            self._failed("set", "error", error)
        finally:
            self._busy -= 1  # taken in put

    async def close(self) -> None:
        for task in list(self._writes):  # a write cancelled before it started gives nothing back
            task.cancel()
        await asyncio.gather(*self._writes, return_exceptions=True)
        await self._client.aclose()


def open_redis_tier(
    cache: CacheConfig,
    outputs: tuple[TensorSpec, ...],
    stats: CacheStats,
    environ: Mapping[str, str] = os.environ,
) -> RedisTier:
    """The tier for ``cache.redis``, with the credentials the pod's environment holds."""
    assert cache.redis is not None
    return RedisTier(
        cache.redis,
        cache,
        outputs,
        stats,
        username=environ.get(ENV_USERNAME),
        password=environ.get(ENV_PASSWORD),
    )


def _checksum(key: bytes, payload: bytes | memoryview) -> bytes:
    return hmac.digest(key, payload, "sha256")


def encode_value(key: bytes, outputs: list[Tensor]) -> bytes:
    """``MAGIC``, checksum, then each tensor: name, datatype, shape, raw bytes."""
    parts = [struct.pack("<H", len(outputs))]
    for tensor in outputs:
        name, datatype = tensor.name.encode(), tensor.datatype.encode()
        shape = tensor.data.shape
        parts.append(struct.pack("<H", len(name)) + name)
        parts.append(struct.pack("<B", len(datatype)) + datatype)
        parts.append(struct.pack(f"<B{len(shape)}q", len(shape), *shape))
        parts.append(np.ascontiguousarray(tensor.data).tobytes())
    payload = b"".join(parts)
    return MAGIC + _checksum(key, payload) + payload


def decode_value(value: bytes, key: bytes, outputs: Mapping[str, str]) -> list[Tensor] | None:
    """The tensors ``encode_value`` wrote under ``key``, or None if ``value`` is anything else.
    The arrays view ``value`` (read-only): nothing is copied."""
    if len(value) < HEADER_BYTES + 2 or not value.startswith(MAGIC):
        return None
    view = memoryview(value)
    payload = view[HEADER_BYTES:]
    if not hmac.compare_digest(value[len(MAGIC) : HEADER_BYTES], _checksum(key, payload)):
        return None
    try:
        (count,) = struct.unpack_from("<H", value, HEADER_BYTES)
        offset = HEADER_BYTES + 2
        tensors: list[Tensor] = []
        for _ in range(count):
            (length,) = struct.unpack_from("<H", value, offset)
            name = value[offset + 2 : offset + 2 + length].decode()
            offset += 2 + length
            (length,) = struct.unpack_from("<B", value, offset)
            datatype = value[offset + 1 : offset + 1 + length].decode()
            offset += 1 + length
            if outputs.get(name) != datatype:
                return None
            (ndim,) = struct.unpack_from("<B", value, offset)
            shape = struct.unpack_from(f"<{ndim}q", value, offset + 1)
            offset += 1 + 8 * ndim
            if any(d < 0 for d in shape):
                return None
            dtype = numpy_carrier(datatype)
            size = math.prod(shape) * dtype.itemsize
            if offset + size > len(value):
                return None
            data = np.frombuffer(value, dtype=dtype, count=math.prod(shape), offset=offset)
            tensors.append(Tensor(name, datatype, data.reshape(shape)))
            offset += size
    except (struct.error, UnicodeDecodeError, ValueError):
        return None
    if offset != len(value):
        return None
    return tensors
